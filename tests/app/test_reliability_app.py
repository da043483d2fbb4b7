"""The app side of issue #16: a failed save shows the reply and a warning; a session another process holds is
named as what could not be opened."""
import os
from pathlib import Path

from app_support import notes, ready, say

from tinychat import session as S
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
