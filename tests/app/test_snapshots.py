"""Snapshots (pytest-textual-snapshot) of the main screen, the inspector, the settings and the sessions screens.
Deterministic: the tiny model decodes greedily, speed figures are frozen (FrozenChat), session ids and times are
fixed, the cursor does not blink, times show in UTC. Update with `pytest tests/app --snapshot-update` and look at
the SVGs before committing them."""
import time

import pytest

from app_support import ChatFactory, FrozenChat, ready, say
from tinychat.sessions import session as S
from tinychat.tui.app import make_app

SIZE = (130, 36)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def frozen_app(chat_model, **kw):
    # every sampler setting the replies depend on is pinned: the snapshots do not move with the app's defaults
    f = ChatFactory(chat_model, cls=FrozenChat, temperature=0.0, penalty=1.1, max_new=kw.pop("max_new", 24), seed=1)
    return make_app(f, blink=False, **kw)


async def two_turns(pilot):
    await ready(pilot)
    await say(pilot, "hello tell me about the cat")
    await say(pilot, "hello tell me about the cat")


def test_main_screen(snap_compare, chat_model):
    async def run(pilot):
        await ready(pilot)
        await say(pilot, "Hello! Tell me about the cat.")
    assert snap_compare(frozen_app(chat_model), terminal_size=SIZE, run_before=run)


def test_inspector_on_a_banned_token(snap_compare, chat_model):
    async def run(pilot):
        await two_turns(pilot)
        reply = pilot.app.view.replies()[-1]
        at = min(i for i, tr in reply.traces.items() if any(c.banned_by for c in tr.candidates))
        await pilot.press("ctrl+t", "home", *["right"] * at)
        await pilot.pause(0.01)
    assert snap_compare(frozen_app(chat_model, max_new=16), terminal_size=(140, 40), run_before=run)


def test_settings_screen(snap_compare, chat_model):
    async def run(pilot):
        await ready(pilot)
        await pilot.press("f2")
        await pilot.pause()
    assert snap_compare(frozen_app(chat_model), terminal_size=SIZE, run_before=run)


def test_sessions_screen(snap_compare, chat_model, utc):
    from support import tokenizer
    tok = tokenizer()
    base = 1767268800.0                                   # 2026-01-01 12:00 UTC
    for i, (title, turns) in enumerate([("Cats and dogs", 2), ("A poem about the river", 1),
                                        ("Why is the sky blue", 3)]):
        sess = S.Session(id=f"20260101-1200{i:02d}-000-abc{i:03d}", title=title, created=base + i * 3600,
                         updated=base + i * 3600 + 60)
        for t in range(turns):
            sess.messages += [S.Message("user", f"question {t}", tok.message_ids("user", f"question {t}"),
                                        created=base),
                              S.Message("assistant", "answer", tok.generation_prompt_ids() + tok.encode("answer")
                                        + tok.end_ids(), created=base, settings={}, seed=1, finish="stop")]
        S.save(sess, touch=False)

    async def run(pilot):
        await ready(pilot)
        await pilot.press("ctrl+s")
        await pilot.pause()
    assert snap_compare(frozen_app(chat_model), terminal_size=SIZE, run_before=run)


def test_reply_with_alternatives(snap_compare, chat_model):
    async def run(pilot):
        from app_support import idle, wait_for
        app = pilot.app
        await ready(pilot)
        await pilot.press("f3")              # the inspector off: its background runs split by timing (see test_ab)
        assert not app.inspector.display
        await say(pilot, "Hello! Tell me about the cat.")
        app.chat.set("seed", "2")
        app.chat.set("temperature", "1.0")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.busy is None and app.chat.session.n_turns == 1
                       and app.chat.alternatives() == (2, 2), what="the second reply")
        await idle(pilot)
        await pilot.press("alt+left")
        await wait_for(pilot, lambda: app.busy is None and app.chat.alternatives() == (1, 2), what="the switch")
        await idle(pilot)
        app.clear_notifications()            # the toast's timing is not what this snapshot is about
        await pilot.pause(0.01)
    assert snap_compare(frozen_app(chat_model), terminal_size=SIZE, run_before=run)


def test_ab_screen(snap_compare, chat_model):
    async def run(pilot):
        from app_support import idle, start, wait_for
        from tinychat.tui.screens.ab import ABScreen
        app = pilot.app
        await two_turns(pilot)
        await pilot.press("f3")              # the inspector off: its background rendering split varies by timing
        assert not app.inspector.display
        await start(pilot, "/ab ban=off")
        await wait_for(pilot, lambda: isinstance(app.screen, ABScreen) and app.screen.result is not None,
                       what="the A/B result")
        await idle(pilot)                    # the worker done and the screen filled (a loaded machine lags here)
        app.clear_notifications()
        await pilot.pause(0.1)
    assert snap_compare(frozen_app(chat_model, max_new=16), terminal_size=(140, 40), run_before=run)
