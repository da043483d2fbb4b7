"""Pilot tests of the app with other models (issue 28): a session recorded with another model offers that model and
opens on it (through the loader too), and the status bar says what --quant auto chose, a session keeping its mode.
Each runs at 80x24 and wide (160x45) where the size matters."""
import pytest

from app_support import _inside, _text_of, idle, notes, ready, say, start, wait_for  # noqa: F401
from tinychat.tui.app import make_app

SIZES = [(80, 24), (160, 45)]


# -- 4: a session recorded with another model -------------------------------------------------------------------
class _Named:
    """A ChatFactory whose chats carry another model name (another model, as far as sessions can tell)."""

    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def __call__(self, ref):
        from support import tokenizer as tok
        inner = self.inner
        kw = dict(model_name=self.name, max_len=512)
        chat = inner.cls(inner.model, tok(), inner.settings, **kw) if ref is None else \
            inner.cls.restore(ref, inner.model, tok(), **kw)
        inner.chats.append(chat)
        return chat


@pytest.mark.parametrize("size", SIZES)
async def test_opening_another_models_session_offers_that_model_and_opens_it(factory, size):
    from support import make_chat_model
    from tinychat.tui.screens.dialogs import ConfirmDialog
    here = factory(max_new=3, temperature=0.0)
    other = _Named(factory(max_new=3, temperature=0.0), "smollm2")
    other.inner.model = make_chat_model(seed=3)
    recorded = other(None)
    recorded.send("hello from the other model")
    sid = recorded.session.id
    recorded.close()
    app = make_app(here, others={"smollm2": other}, blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await say(pilot, "hello here")
        mine = app.chat.session.id
        app.prompt.load_text(f"/load {sid}")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the offer")
        assert _inside(app, app.screen.query_one("Label"))            # wrapped in the dialog, not cut
        offer = " ".join(_text_of(app.screen.query_one("Label")).split())
        assert "'smollm2'" in offer and offer.endswith("(this chat stays saved)") and not notes(app, "error")
        assert _inside(app, app.screen.query_one(".dialog"))
        await pilot.press("y")
        await idle(pilot)
        assert app.chat.model_name == "smollm2" and app.chat.session.id == sid
        assert [u.text for u in app.view.query("UserMessage")] == ["hello from the other model"]
        assert app.status_bar.values["model"] == "smollm2"
        assert any("switched to smollm2" in str(n.render()) for n in app.view.query("NoticeMessage"))
        await say(pilot, "and on it goes")                       # the chat goes on, on that model
        assert app.chat.session.n_turns == 2
        app.open_session(mine)                                   # and back: offered the first model again? no:
        await idle(pilot)                                        # "tiny-test" is not among the others here
        assert app.chat.session.id == sid
        assert any("recorded with another model (tiny-test)" in n for n in notes(app, "error"))


async def test_declining_the_offer_keeps_the_chat(factory):
    from support import make_chat_model
    from tinychat.tui.screens.dialogs import ConfirmDialog
    here = factory(max_new=3, temperature=0.0)
    other = _Named(factory(max_new=3), "smollm2")
    other.inner.model = make_chat_model(seed=3)
    recorded = other(None)
    recorded.send("hello")
    recorded.close()
    app = make_app(here, others={"smollm2": other}, blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        before = app.chat
        app.open_session(recorded.session.id)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the offer")
        await pilot.press("n")
        await pilot.pause()
        assert app.chat is before and app.busy is None
        assert any("stays closed" in n for n in notes(app))


async def test_the_real_backend_switches_to_the_imported_model_a_session_names(tmp_path):
    """Through the loader: the app runs the model folder `first`; a session recorded with the imported model
    `other` opens on `other`, loaded in place of `first`."""
    import os
    from pathlib import Path
    from support import make_chat_model, tokenizer
    from tinychat.chat.runtime import ChatSettings
    from tinychat.loading import load_runtime, open_chat
    from tinychat.tui.app import TinyChatApp
    from tinychat.tui.runtime import Backend
    from tinychat.tui.screens.dialogs import ConfirmDialog
    first = tmp_path / "first"
    make_chat_model().save_pretrained(first)
    tokenizer().save(first / "tokenizer.json")
    other = Path(os.environ["TINYCHAT_HOME"]) / "models" / "other"
    make_chat_model(seed=4).save_pretrained(other)
    tokenizer().save(other / "tokenizer.json")
    rt = load_runtime(other)
    chat = open_chat(rt, "none", "cpu", ChatSettings(max_new=3, temperature=0.0), {})
    chat.send("hello from other")
    chat.close()
    app = TinyChatApp(Backend(model=first, settings=ChatSettings(max_new=3)), blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        assert app.chat.model_name == "first"
        app.open_session(chat.session.id)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmDialog), what="the offer")
        await pilot.press("y")
        await idle(pilot)
        assert app.chat.model_name == "other" and app.chat.session.id == chat.session.id
        assert app.backend.model_path == other and not notes(app, "error")


# -- --quant auto in the app --------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_the_status_bar_says_what_auto_chose_and_a_session_keeps_its_mode(tmp_path, size):
    from support import make_chat_model, tokenizer
    from tinychat.chat.runtime import ChatSettings
    from tinychat.engine import native
    from tinychat.loading import load_runtime, open_chat
    from tinychat.tui.app import TinyChatApp
    from tinychat.tui.runtime import Backend
    folder = tmp_path / "m"
    make_chat_model().save_pretrained(folder)
    tokenizer().save(folder / "tokenizer.json")
    fp32 = open_chat(load_runtime(folder), "none", "cpu", ChatSettings(max_new=3), {})   # a session made in fp32
    fp32.send("hello in fp32")
    fp32.close()
    want = "int8" if native.load() is not None else "none"
    app = TinyChatApp(Backend(model=folder, settings=ChatSettings(max_new=3)), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        assert app.chat.quant == want and app.chat.quant_auto
        bar = app.status_bar.render().plain
        wide = size[0] >= 100                           # the compact line below 100 columns
        names = {"int8": ("auto → fast-int8", "auto:int8"), "none": ("auto → eager fp32", "auto:eager fp32")}
        assert names[want][0 if wide else 1] in bar
        app.open_session(fp32.session.id)
        await idle(pilot)
        assert app.chat.session.id == fp32.session.id and app.chat.quant == "none"
        assert names["none"][0 if wide else 1] in app.status_bar.render().plain
        await say(pilot, "and on")
        assert app.chat.session.quant == "none" and app.chat.session.messages[-1].settings.get("step") is None
        await app.run_command("/info")
        await pilot.pause()
        assert any("auto: the mode the session was recorded with" in n for n in notes(app))
