"""The app side of issue #16: a failed save shows the reply and a warning; a session another process holds is
named as what could not be opened."""
import os
from pathlib import Path

from app_support import notes, ready, say

from tinychat.sessions import session as S
from tinychat.tui.app import make_app

SIZE = (130, 40)


async def test_a_failed_save_shows_the_reply_and_a_one_line_warning(factory):
    sessions = Path(os.environ["TINYCHAT_HOME"]) / "sessions"
    sessions.parent.mkdir(parents=True, exist_ok=True)
    sessions.write_text("a file where the sessions folder should be")
    app = make_app(factory(temperature=0.0, max_new=6), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello there")
        [reply] = app.view.replies()
        assert reply.finished and reply.text == app.chat.session.messages[-1].content
        warnings = [n for n in notes(app, "warning") if n.startswith("not saved:")]
        assert len(warnings) == 1 and "\n" not in warnings[0]
        assert app.chat.session.n_turns == 1


async def test_a_session_open_in_another_process_is_reported_as_such(factory):
    held = S.SessionLocked("session 20260101-000000-000-abcdef is open in another tinychat (pid 42): close it "
                           "there first", "20260101-000000-000-abcdef", 42)
    app = make_app(factory(fail=held), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.load_error.startswith("could not open the session: session 20260101-000000-000-abcdef is open")


async def test_commands_with_non_ascii_digits_are_one_line_errors_and_the_app_goes_on(factory):
    """Issue #33 item 7: "²".isdigit() is true but int("²") raises; `/edit ²` ended the app with a traceback."""
    from app_support import start
    app = make_app(factory(temperature=0.0, max_new=4), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello there")
        for line in ("/edit ²", "/edit r²", "/edit ١", "/alt ²", "/alt ١", "/fork ² 5"):
            await start(pilot, line)
            await pilot.pause()
        errors = notes(app, "error")
        assert sum("usage: /edit" in n for n in errors) == 3 and sum("usage: /alt" in n for n in errors) == 2
        assert any("usage: /fork" in n for n in errors) and all("\n" not in n for n in errors)
        assert app.is_running and app.chat.session.n_turns == 1
