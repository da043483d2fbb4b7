"""The sampler A/B screen (issue #14): `/ab KEY=VALUE ...` typed in the app opens it, both sides decode on the chat
worker, the differing token and the cause show; a keeps A, b keeps B, s keeps B and adopts its settings; bad input
is one line and opens nothing."""
from app_support import idle, notes, ready, say, start, wait_for
from tinychat.tui.app import make_app
from tinychat.tui.screens.ab import ABScreen

SIZE = (130, 40)
Q = "hello tell me about the cat"


async def _ab(pilot, line: str) -> ABScreen:
    app = pilot.app
    await start(pilot, line)
    await wait_for(pilot, lambda: isinstance(app.screen, ABScreen) and app.screen.result is not None,
                   what="the A/B result")
    await pilot.pause()
    return app.screen


def _app(factory):
    return make_app(factory(temperature=0.0, penalty=1.0, max_new=12, seed=1), blink=False)


async def test_keep_a_leaves_a_active_and_b_an_alternative(factory):
    app = _app(factory)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, Q)
        await say(pilot, Q)
        screen = await _ab(pilot, "/ab ban=off")
        r = screen.result
        assert r.diff is not None and "banned on side A" in str(screen.query_one("#ab-cause").render())
        assert r.a.token_text in str(screen.query_one("#ab-a-text").render())
        await pilot.press("a")
        await wait_for(pilot, lambda: not isinstance(app.screen, ABScreen), what="the screen to close")
        await idle(pilot)
        assert app.chat.session.messages[-1].id == r.a.message_id and app.chat.alternatives() == (2, 3)
        assert app.view.replies()[-1].text == r.a.text and app.view.replies()[-1].alts == (2, 3)
        assert app.chat.settings.ban is True
        reply = app.view.replies()[-1]                      # rebuilt from the session, its traces kept
        assert reply.tokens and set(range(len(reply.tokens))) <= set(reply.traces)
        assert "A/B side A" in reply.meta and "no trace" not in reply.meta


async def test_keep_b_switches_to_it_and_s_also_adopts_its_settings(factory):
    app = _app(factory)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, Q)
        await say(pilot, Q)
        r = (await _ab(pilot, "/ab ban=off")).result
        await pilot.press("b")
        await wait_for(pilot, lambda: app.busy is None and app.chat.session.messages[-1].id == r.b.message_id,
                       what="B active")
        await idle(pilot)
        assert app.view.replies()[-1].text == r.b.text and app.chat.alternatives() == (3, 3)
        assert app.chat.settings.ban is True                 # kept, not adopted
        reply = app.view.replies()[-1]
        assert set(range(len(reply.tokens))) <= set(reply.traces) and "A/B side B" in reply.meta
        assert reply.traces[r.diff] is r.b.traces[r.diff]    # B's own draw where the sides part
        r2 = (await _ab(pilot, "/ab penalty=3"))
        await pilot.click("#keep-b-settings")
        await wait_for(pilot, lambda: app.busy is None and app.chat.settings.penalty == 3.0
                       and app.chat.session.messages[-1].id == r2.result.b.message_id, what="B kept and adopted")


async def test_bad_ab_input_is_one_line_and_opens_nothing(factory):
    app = _app(factory)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await start(pilot, "/ab top-p=0.5")
        await pilot.pause()
        assert any("no reply to compare yet" in n for n in notes(app, "error"))
        await say(pilot, Q)
        for line, message in [("/ab top-p", "usage: /ab KEY=VALUE"), ("/ab warmth=2", "unknown setting 'warmth'"),
                              ("/ab seed=3", "/ab cannot vary seed")]:
            await start(pilot, line)
            await wait_for(pilot, lambda m=message: any(m in n for n in notes(app, "error")), what=message)
            await idle(pilot)
            assert not isinstance(app.screen, ABScreen)
        assert app.chat.alternatives() == (1, 1) and app.chat.session.n_turns == 1
