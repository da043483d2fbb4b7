"""Alternatives in the app (issue #14): regenerate keeps the old reply as a sibling, the reply shows "‹ 2/2 ›", a key,
a click or /alt moves between them; bad switches are one line and change nothing."""
import asyncio

from app_support import click_on, idle, notes, ready, say, start, wait_for
from tinychat.tui.app import make_app
from tinychat.tui.widgets.chat_view import AltSwitch

SIZE = (130, 40)


async def _regen(pilot):
    app = pilot.app
    n = app.chat.alternatives()[1]
    await pilot.press("ctrl+r")
    await wait_for(pilot, lambda: app.busy is None and app.chat.session.n_turns and app.chat.alternatives()[1] == n + 1,
                   what="the new reply")
    await idle(pilot)



async def _story_then_regenerated(pilot):
    """A reply, then Ctrl+R: returns the first reply's message (the second is the active one)."""
    await ready(pilot)
    await say(pilot, "tell me a story")
    first = pilot.app.chat.session.messages[-1]
    await _regen(pilot)
    return first

async def test_regenerate_then_switch_back_and_forth_with_the_key_and_a_click(factory):
    app = make_app(factory(temperature=1.0, max_new=12), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        first = await _story_then_regenerated(pilot)
        second = app.chat.session.messages[-1]
        assert second is not first and app.chat.alternatives() == (2, 2)
        [reply] = app.view.replies()
        assert reply.alts == (2, 2) and str(reply.query_one(AltSwitch).render()) == "‹ 2/2 ›"
        await pilot.press("alt+left")
        await wait_for(pilot, lambda: app.chat.session.messages[-1] is first and app.busy is None,
                       what="switched back")
        [reply] = app.view.replies()
        assert reply.text == first.content and reply.alts == (1, 2)
        assert "reply 1/2" in notes(app)
        alt = app.view.replies()[0].query_one(AltSwitch)
        await click_on(pilot, alt)
        await wait_for(pilot, lambda: app.chat.session.messages[-1] is second and app.busy is None,
                       what="switched by a click")
        assert app.view.replies()[0].alts == (2, 2)



async def test_the_app_is_idle_only_once_the_view_shows_the_switch(factory):
    """`busy is None` is the idle signal that keys and tests wait on: after a switch it must not come before the
    rebuilt view (a slow rebuild here, as on a loaded machine; the old order let a test exit mid-rebuild)."""
    app = make_app(factory(temperature=1.0, max_new=12), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        first = await _story_then_regenerated(pilot)
        rebuild = app.show_history

        async def slow_rebuild(note: str = "") -> None:
            await asyncio.sleep(0.3)
            await rebuild(note)
        app.show_history = slow_rebuild
        app.action_prev_alt()           # as the key does, without pilot.press's wait for the app's queues
        await wait_for(pilot, lambda: app.chat.session.messages[-1] is first, what="the switch in the chat")
        await wait_for(pilot, lambda: app.busy is None, what="idle")
        [reply] = app.view.replies()
        assert reply.text == first.content and reply.alts == (1, 2)

async def test_bad_switches_are_one_line_errors_and_change_nothing(factory):
    app = make_app(factory(temperature=1.0, max_new=40, delay=0.02), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "tell me a story")
        await pilot.press("alt+right")
        await pilot.pause()
        assert any("no alternatives" in n for n in notes(app))
        await _regen(pilot)
        active = app.chat.session.messages[-1]
        await start(pilot, "/alt 9")
        await pilot.pause()
        assert any("no alternative 9: this reply has 2" in n for n in notes(app, "error"))
        await start(pilot, "and then?")              # a reply streams: a switch waits for it
        await pilot.press("alt+left")
        await pilot.pause()
        assert any("wait for the reply to finish" in n for n in notes(app, "error"))
        await idle(pilot)
        assert app.chat.session.messages[-3] is active and app.chat.session.n_turns == 2


async def test_edit_an_earlier_message_sends_it_as_a_new_branch(factory):
    from tinychat.tui.widgets import UserMessage
    app = make_app(factory(temperature=0.0, max_new=8), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first message")
        await say(pilot, "second message")
        await start(pilot, "/edit 9")
        await pilot.pause()
        assert any("no message 9 to edit (this chat has 2)" in n for n in notes(app, "error"))
        app.prompt.load_text("/edit 1")
        app.prompt.submit()
        await wait_for(pilot, lambda: app.prompt.text == "first message", what="the message in the input")
        app.prompt.load_text("a different first message")
        app.prompt.submit()
        await wait_for(pilot, lambda: app.busy is None and app.chat.session.n_turns == 1
                       and app.chat.session.messages[-2].content == "a different first message", what="the edit")
        await idle(pilot)
        assert len(app.view.query(UserMessage)) == 1 and len(app.view.replies()) == 1
        sess = app.chat.session
        assert [m.content for m in sess.branches if m.role == "user"] == ["first message", "second message"]
        await say(pilot, "and on")                   # edit mode ended: a normal send
        assert app.chat.session.n_turns == 2
        # the edited message shows its place among its edits; a click on it brings the original branch back
        edited = app.view.query(UserMessage).first()
        assert edited.alts == (2, 2) and "‹ 2/2 ›" in str(edited.border_subtitle)
        await click_on(pilot, edited)
        await wait_for(pilot, lambda: app.busy is None and app.chat.session.messages[1].content == "first message",
                       what="the original branch")
        await idle(pilot)
        assert [u.text for u in app.view.query(UserMessage)] == ["first message", "second message"]
        assert app.view.query(UserMessage).first().alts == (1, 2) and "message 1/2" in notes(app)
        assert len(app.view.replies()) == 2


async def test_edit_a_reply_keeps_it_as_written_and_the_user_types_on(factory):
    from tinychat.tui.widgets import UserMessage
    app = make_app(factory(temperature=0.0, max_new=8), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first message")
        await say(pilot, "second message")
        first_reply = app.chat.session.messages[2].content
        await start(pilot, "/edit r9")
        await pilot.pause()
        assert any("no reply 9 to edit (this chat has 2)" in n for n in notes(app, "error"))
        app.prompt.load_text("/edit r1")
        app.prompt.submit()
        await wait_for(pilot, lambda: app.prompt.text == first_reply, what="the reply in the input")
        app.prompt.load_text("the cat sleeps all day")
        app.prompt.submit()
        await wait_for(pilot, lambda: app.busy is None and len(app.chat.session.messages) == 3
                       and app.chat.session.messages[-1].content == "the cat sleeps all day", what="the edit")
        await idle(pilot)
        assert app.chat.session.messages[-1].finish == "edited"
        assert len(app.view.query(UserMessage)) == 1 and [r.text for r in app.view.replies()] == [
            "the cat sleeps all day"]
        assert app.view.replies()[0].alts == (2, 2)
        await say(pilot, "and on")
        assert app.chat.session.n_turns == 2 and app.chat.session.messages[2].finish == "edited"
