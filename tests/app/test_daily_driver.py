"""Pilot tests of the app as a daily driver (issue 28): pastes, stats that belong to their reply, narrow terminals,
Ctrl+C, the status bar while a reply streams, errors that stay, Enter while loading, and the conveniences around
them. Each runs at 80x24 (the smallest terminal people use) and wide (160x45) where the size matters."""
import pytest
from textual import events

from app_support import idle, notes, ready, say, start, wait_for  # noqa: F401  (some used further down)
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
        assert app.chat.session.id == other.session.id
        [shown] = app.view.replies()
        n = len(shown.tokens)
        assert shown.meta == f"{n} token{'s' if n != 1 else ''} · cut off at max-new · restored (no trace)" \
            or shown.meta == f"{n} token{'s' if n != 1 else ''} · restored (no trace)"
        assert shown.stats is None and not shown.traces
        await pilot.press("ctrl+t")
        await pilot.pause()
        line = app.inspector.rendered.plain
        assert "this turn" not in line


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
