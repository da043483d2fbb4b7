"""Pilot tests of the app as a daily driver (issue 28): pastes, stats that belong to their reply, narrow terminals,
Ctrl+C, the status bar while a reply streams, errors that stay, Enter while loading, and the conveniences around
them. Each runs at 80x24 (the smallest terminal people use) and wide (160x45) where the size matters."""
import pytest
from textual import events

from app_support import idle, ready
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
