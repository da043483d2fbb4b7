"""Pilot tests of the app as a daily driver (issue 28): pastes, stats that belong to their reply, narrow terminals,
Ctrl+C, the status bar while a reply streams, errors that stay, Enter while loading, and the conveniences around
them. Each runs at 80x24 (the smallest terminal people use) and wide (160x45) where the size matters."""
import pytest
from textual import events

from app_support import _inside, _text_of, idle, notes, ready, say, start, wait_for  # noqa: F401
from tinychat.tui.app import make_app

SIZES = [(80, 24), (160, 45)]


async def paste(pilot, text: str) -> None:
    """A bracketed paste as the terminal sends it: one Paste event to the focused input."""
    pilot.app.prompt.post_message(events.Paste(text))
    await pilot.pause()


# -- 1, 2: pastes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_a_paste_goes_into_the_input_once(factory, size):
    app = make_app(factory(), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await paste(pilot, "hello world")
        assert app.prompt.text == "hello world"
        await paste(pilot, " and more")
        assert app.prompt.text == "hello world and more"
        app.prompt.clear_input()
        await paste(pilot, "alpha\nbeta")
        assert app.prompt.text == "alpha\nbeta"
        app.prompt.clear_input()
        long = "x" * 2500
        await paste(pilot, long)
        assert app.prompt.text == "[paste #1: 2,500 chars, 1 line]"
        assert app.prompt.expanded() == long


@pytest.mark.parametrize("size", SIZES)
async def test_pasted_carriage_returns_become_line_breaks(factory, size):
    app = make_app(factory(max_new=4, temperature=0.0), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await paste(pilot, "one\rtwo\r\nthree")
        assert app.prompt.text == "one\ntwo\nthree"
        app.prompt.clear_input()
        big = "\r".join(["a"] * 121)
        await paste(pilot, big)
        assert app.prompt.text == f"[paste #1: {len(big):,} chars, 121 lines]"
        await pilot.press("enter")
        await idle(pilot)
        sent = app.chat.session.messages[-2]
        assert sent.role == "user" and "\r" not in sent.content and sent.content.count("\n") == 120


# -- 3, 11: a reply's figures are its own -------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_opening_another_session_never_shows_this_chats_figures(factory, chat_model, size):
    from support import make_chat
    other = make_chat(model=chat_model, temperature=0.0, max_new=3)
    other.send("the moon")                               # saved: its reply is message 3, as the app's first will be
    f = factory(temperature=0.9, max_new=20, seed=1)
    app = make_app(f, blink=False, inspector=True)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await say(pilot, "tell me a story about the cat")
        [mine] = app.view.replies()
        assert "tok/s" in mine.meta and mine.stats is not None
        app.open_session(other.session.id)
        await idle(pilot)
        await pilot.pause(0.1)
        assert app.chat.session.id == other.session.id
        assert app.inspector.rendered.plain.startswith("Send a message")     # not a token of the view's replies
        [shown] = app.view.replies()
        n = len(shown.tokens)
        assert shown.meta == f"{n} token{'s' if n != 1 else ''} · cut off at max-new · restored (no trace)" \
            or shown.meta == f"{n} token{'s' if n != 1 else ''} · restored (no trace)"
        assert shown.stats is None and not shown.traces
        await pilot.press("ctrl+t")
        await pilot.pause()
        line = app.inspector.rendered.plain
        assert "this turn" not in line


def test_a_replys_record_is_recalled_for_that_reply_only():
    """Message ids count from 1 in every session (a deleted session's reply 3 and a new chat's reply 3): a record
    answers for its session id, message id and tokens together."""
    from tinychat.tui.state import ChatState
    st = ChatState()
    st.remember("s1", 3, [5, 6, 7], {0: "trace"}, "counters", "80 tokens · 30 tok/s")
    assert st.recall("s1", 3, [5, 6, 7]) == ({0: "trace"}, "counters", "80 tokens · 30 tok/s")
    assert st.recall("s2", 3, [5, 6, 7]) is None                  # another session's message 3
    assert st.recall("s1", 3, [5, 6]) is None                     # the same place, another reply
    assert st.recall("s1", 5, [5, 6, 7]) is None


async def test_a_reply_written_with_edit_says_so(factory):
    app = make_app(factory(temperature=0.0, max_new=6), blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
        await app.run_command("/edit r1")
        app.prompt.load_text("I wrote this reply myself.")
        await pilot.press("enter")
        await idle(pilot)
        [r] = app.view.replies()
        assert "written by hand" in r.meta and "restored" not in r.meta
        assert app.chat.session.messages[-1].finish == "edited"


# -- 6, 7: help, settings, sessions and dialogs fit the terminal ------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_help_lists_every_command_with_its_description_and_fits(factory, size):
    from tinychat.tui.commands import COMMANDS
    from tinychat.tui.screens.help import HelpScreen
    app = make_app(factory(), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert _inside(app, app.screen.query_one("#help"))
        tables = [w for w in app.screen.query("#help-body Static") if w.size.height > 3]
        text = " ".join(" ".join(_text_of(w).split()) for w in tables)
        for name, args, what in COMMANDS:       # "/alt next|prev|N" and "/edit [N|rN]" keep their descriptions
            assert " ".join(f"{name} {args}".split()) in text
            assert " ".join(what.split())[:30] in text
        assert "closes" in _text_of(app.screen.query_one(".title"))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.parametrize("size", SIZES)
async def test_settings_fit_and_save_is_in_view(factory, size):
    app = make_app(factory(), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await pilot.pause()
        assert _inside(app, app.screen.query_one("#settings"))
        for button in ("#save", "#cancel"):
            assert _inside(app, app.screen.query_one(button))
        app.screen.query_one("#set-temperature").value = "0.3"
        await pilot.click("#save")
        await idle(pilot)
        assert app.chat.settings.temperature == 0.3


@pytest.mark.parametrize("size", SIZES)
async def test_sessions_screen_and_its_delete_confirmation_fit(factory, size):
    from tinychat.tui.screens.dialogs import ConfirmDialog
    app = make_app(factory(max_new=3), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await say(pilot, "a chat with a rather long first message so that its title is long too")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert _inside(app, app.screen.query_one("#sessions"))
        table = app.screen.query_one("#sessions-table")
        assert sum(c.get_render_width(table) for c in table.columns.values()) <= table.size.width
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        dialog = app.screen.query_one(".dialog")
        assert _inside(app, dialog)
        question = app.screen.query_one("Label")
        assert _inside(app, question)
        shown = " ".join(_text_of(question).split())                  # wrapped, every word of it in view
        assert shown.startswith("Delete “a chat with a rather long") and shown.endswith("is saved again at its next turn)?")
        for button in ("#yes", "#no"):
            assert _inside(app, app.screen.query_one(button))


# -- the sessions screen ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_down_from_the_filter_box_moves_into_the_list(factory, size):
    app = make_app(factory(max_new=3), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("slash")
        assert app.screen.query_one("#sessions-filter").has_focus
        await pilot.press("down")
        assert app.screen.query_one("#sessions-table").has_focus


async def test_export_writes_where_the_user_says_and_asks_before_replacing(factory, tmp_path, monkeypatch):
    from tinychat.tui.screens.dialogs import ConfirmDialog, TextDialog
    monkeypatch.chdir(tmp_path)
    app = make_app(factory(max_new=3), blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await say(pilot, "hello")
        sid = app.chat.session.id
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, TextDialog)
        box = app.screen.query_one("Input")
        assert box.value == str(tmp_path / f"tinychat-{sid}.md")       # shown before anything is written
        assert not list(tmp_path.glob("*.md"))
        target = tmp_path / "exports"
        target.mkdir()
        box.value = str(target)                                       # a folder: the file goes in it
        await pilot.press("enter")
        await pilot.pause()
        out = target / f"tinychat-{sid}.md"
        assert out.is_file() and "hello" in out.read_text()
        assert any(str(out) in n for n in notes(app))
        out.write_text("keep me")
        await pilot.press("e")
        await pilot.pause()
        app.screen.query_one("Input").value = str(out)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("n")
        await pilot.pause()
        assert out.read_text() == "keep me"


@pytest.mark.parametrize("size", SIZES)
async def test_the_sessions_list_shows_each_sessions_model(factory, chat_model, size):
    from support import make_chat
    from support import tokenizer as tok
    from tinychat.chat.runtime import Chat
    other = Chat(chat_model, tok(), model_name="other-model", max_len=512)
    other.send("from another model")
    mine = make_chat(model=chat_model, max_new=3)
    mine.send("from the test model")
    app = make_app(factory(max_new=3), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
        table = app.screen.query_one("#sessions-table")
        rows = {table.get_row(k)[0].strip("● ").strip(): table.get_row(k)[1] for k in table.rows}
        assert rows == {"from another model": "other-model", "from the test model": "tiny-test"}
        note = _text_of(app.screen.query_one("#sessions-note"))
        if size[0] < 100:                                    # no id column: the selected one's id under the list
            assert f"id {app.screen.selected().id}" in note
        else:
            assert "id" in [c.label.plain for c in table.columns.values()]


# -- 8: the inspector follows the terminal's width ----------------------------------------------------------------
async def test_the_inspector_follows_the_width_both_ways_until_toggled(factory):
    app = make_app(factory(), blink=False)
    async with app.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        assert app.inspector.display
        await pilot.resize_terminal(100, 30)
        await pilot.pause()
        assert not app.inspector.display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not app.inspector.display
        await pilot.resize_terminal(150, 40)
        await pilot.pause()
        assert app.inspector.display
        await pilot.resize_terminal(90, 24)
        await pilot.pause()
        assert not app.inspector.display
        await pilot.press("f3")                        # by hand: it stays as the user set it
        assert app.inspector.display
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.inspector.display


# -- 9: Ctrl+C ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_ctrl_c_stops_a_streaming_reply_and_says_how_to_quit_in_plain_words(factory, size):
    f = factory(temperature=0.0, max_new=300, delay=0.01)
    app = make_app(f, blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+c")
        await pilot.pause()
        said = notes(app)[-1]
        assert "Ctrl+Q" in said and "[" not in said
        await start(pilot, "hello")
        await wait_for(pilot, lambda: app.stream.current is not None and len(app.stream.current.tokens) >= 3,
                       what="tokens")
        await pilot.press("ctrl+c")
        await idle(pilot)
        assert app.chat.session.messages[-1].finish == "cancelled"
        assert "Ctrl+Q" in notes(app)[-1] and app.is_running


# -- 11: the status bar while a reply streams -----------------------------------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_the_status_bar_shows_the_cache_filling_while_the_first_reply_streams(factory, size):
    f = factory(temperature=0.0, max_new=300, delay=0.02)
    app = make_app(f, blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        assert app.status_bar.values["cache_tokens"] == 0
        await start(pilot, "hello there, tell me about the cat")
        await wait_for(pilot, lambda: app.status_bar.values["cache_tokens"] > 0, what="a live cache figure")
        live = app.status_bar.values["cache_tokens"]
        assert app.busy is not None                                    # still streaming
        assert app.status_bar.values["cache_bytes"] > 0
        await pilot.press("escape")
        await idle(pilot)
        assert app.status_bar.values["cache_tokens"] >= live


async def test_the_status_bar_shows_the_cache_filling_during_a_replay(factory, chat_model):
    from support import make_chat
    chat = make_chat(model=chat_model, temperature=0.0, max_new=20)
    chat.send("hello there")
    sess = chat.session
    rec = sess.messages[-1]
    import dataclasses
    sess.messages[-1] = dataclasses.replace(rec, timing_ms=[300.0] * len(rec.timing_ms))   # slow playback
    app = make_app(factory(), replay=sess, replay_speed=1.0, blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.stream.current is not None and app.stream.current.tokens, what="a token")
        await wait_for(pilot, lambda: app.status_bar.values.get("cache_tokens", 0) > 0, what="a live cache figure")
        assert app.replay_summary is None                              # still playing
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.replay_summary is not None, what="the stop")


# -- the app's preferences (reopen the last chat on start; saving one-shots) --------------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_the_preferences_are_set_in_the_settings_screen_and_saved_at_once(factory, size):
    from tinychat.prefs import load_prefs
    app = make_app(factory(), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await pilot.pause()
        switch = app.screen.query_one("#pref-reopen_last")
        switch.scroll_visible(animate=False)
        await pilot.pause()
        assert _inside(app, switch) and switch.value is False
        switch.value = True
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert load_prefs()[0].reopen_last is True and load_prefs()[0].save_one_shots is True
        assert any("reopen-last = on" in n for n in notes(app))
        assert app.chat.settings.temperature == 0.7 and not app.state.pending_settings   # settings untouched


# -- errors that stay; Enter while the model loads; the edit mode; replay's footer ------------------------------
@pytest.mark.parametrize("size", SIZES)
async def test_a_failed_send_keeps_the_text_and_its_reason_until_the_next_action(factory, size):
    import asyncio
    app = make_app(factory(max_new=8), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        long = " ".join(["the cat sees the dog"] * 150)              # beyond the 512-token context
        await start(pilot, long)
        await idle(pilot)
        assert app.prompt.text == long and app.chat.session.n_turns == 0
        hint = app.input_box.query_one("#hint")
        reason = _text_of(hint)
        assert "send failed: message too long" in " ".join(reason.split()) and hint.has_class("error")
        assert _inside(app, hint)
        await asyncio.sleep(0.3)
        await pilot.press("end", "x")                                 # editing the text: the reason stays
        assert "message too long" in " ".join(_text_of(hint).split())
        await pilot.press("escape")                                   # the next action clears it
        await pilot.pause()
        assert "message too long" not in _text_of(hint) and not hint.has_class("error")


async def test_enter_while_the_model_loads_queues_the_message_and_sends_it_when_ready(factory):
    import time
    inner = factory(max_new=4, temperature=0.0)

    def slow(ref):
        time.sleep(1.5)
        return inner(ref)
    app = make_app(slow, blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.chat is None
        app.prompt.load_text("hello while loading")
        await pilot.press("enter")
        await pilot.pause()
        assert app.prompt.text == "" and "queued" in _text_of(app.input_box.query_one("#hint"))
        await ready(pilot)
        await wait_for(pilot, lambda: app.chat.session.n_turns == 1 and app.busy is None, what="the queued send")
        assert app.chat.session.messages[-2].content == "hello while loading"
        assert "queued" not in _text_of(app.input_box.query_one("#hint"))


async def test_esc_takes_a_queued_message_back(factory):
    import time
    inner = factory(max_new=4)

    def slow(ref):
        time.sleep(1.5)
        return inner(ref)
    app = make_app(slow, blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.prompt.load_text("never mind")
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert app.prompt.text == "never mind" and app.state.queued is None
        await ready(pilot)
        await pilot.pause(0.2)
        assert app.chat.session.n_turns == 0


@pytest.mark.parametrize("size", SIZES)
async def test_edit_mode_shows_on_the_input_until_it_ends(factory, size):
    app = make_app(factory(max_new=4, temperature=0.0), blink=False)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        await say(pilot, "first")
        await say(pilot, "second")
        await app.run_command("/edit 1")
        await pilot.pause()
        assert "editing your message 1" in app.prompt.border_title and app.prompt.has_class("editing")
        await pilot.pause(1.0)                                         # lasting, not a toast
        assert "editing your message 1" in app.prompt.border_title
        await app.run_command("/edit off")
        assert not app.prompt.border_title and not app.prompt.has_class("editing")
        await app.run_command("/edit r2")
        assert "editing reply 2" in app.prompt.border_title
        app.prompt.load_text("a reply I wrote")
        await pilot.press("enter")
        await idle(pilot)
        assert not app.prompt.border_title and app.chat.session.messages[-1].content == "a reply I wrote"
        await app.run_command("/edit 1")
        await pilot.press("ctrl+n")                                   # a new chat ends it too
        await idle(pilot)
        assert not app.prompt.border_title and app.state.edit_index is None


async def test_replay_footer_offers_only_what_a_replay_does(factory, chat_model):
    from support import make_chat
    chat = make_chat(model=chat_model, temperature=0.0, max_new=6)
    chat.send("hello there")
    app = make_app(factory(), replay=chat.session, replay_speed=0, blink=False)
    async with app.run_test(size=(160, 45)) as pilot:
        await wait_for(pilot, lambda: app.replay_summary is not None, what="the replay")
        await pilot.pause()
        keys = {k.description for k in app.screen.query("FooterKey")}
        assert {"Stop", "Tokens", "Quit"} <= keys
        assert not keys & {"Regen", "Undo", "New", "Sessions", "Settings"}
        await pilot.press("ctrl+r", "ctrl+b")
        assert app.chat.session.n_turns == 1
    live = make_app(factory(), blink=False)
    async with live.run_test(size=(160, 45)) as pilot:
        await ready(pilot)
        assert {"Regen", "Undo"} <= {k.description for k in live.screen.query("FooterKey")}


async def test_the_status_bar_keeps_what_matters_within_80_columns(factory):
    app = make_app(factory(max_new=3), blink=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        app.status_bar.update_status(model="default", mode="fast-int8", auto="the native int8 kernels run here",
                                     quant="int8", device="cpu", tok_s=84.0, ttft_ms=4732.0, cache_tokens=1170,
                                     max_len=2048, cache_bytes=3 << 20, autosave="autosaved")
        await pilot.pause()
        bar = _text_of(app.status_bar)
        assert bar.strip() == "default │ auto:int8 │ 84 tok/s │ TTFT 4.7 s │ cache 1170/2048 │ autosaved"
        app.status_bar.update_status(activity="generating… (Esc stops)")
        await pilot.pause()
        assert "generating… (Esc stops)" in _text_of(app.status_bar)
