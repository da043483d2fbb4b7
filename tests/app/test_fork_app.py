"""Fork at a token from the inspector (issue #14): in the token view, Tab (or a digit) moves into the selected
token's candidates, ↑/↓ pick, Enter forks (a click picks a row, a second click forks); the reply is cut there, the
token forced, the rest streams like a regenerate, and the reply shows its place among the alternatives."""
from app_support import idle, notes, ready, say, start, wait_for
from support import tokenizer
from tinychat.tui.app import make_app
from tinychat.tui.widgets import TokenView
from tinychat.tui.widgets.chat_view import AltSwitch
from tinychat.tui.widgets.inspector import Inspector, InspectorBody

SIZE = (140, 44)


def _content(m) -> list[int]:
    return tokenizer().content_ids(m.role, m.token_ids)


def _row_y(app, body, row: int) -> int:
    """The line of the inspector body where candidate `row` is drawn (what a click there hits)."""
    r = body.region
    return next(y for y in range(r.height)
                if app.screen.get_style_at(r.x + 4, r.y + y).meta.get("candidate") == row)


async def _forked(pilot, n: int):
    app = pilot.app
    await wait_for(pilot, lambda: app.busy is None and app.chat.alternatives()[1] == n, what="the forked reply")
    await idle(pilot)


async def test_fork_from_the_inspector_with_keys_then_with_clicks(factory):
    app = make_app(factory(temperature=1.0, max_new=14, seed=7), blink=False)     # seeded: a reply of >= 3 tokens
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "tell me a story")
        old = app.chat.session.messages[-1]
        [reply] = app.view.replies()
        assert len(reply.tokens) >= 3
        await pilot.press("ctrl+t", "home", "right", "right")           # token #2
        tr = reply.traces[2]
        await pilot.press("tab")
        ins = app.inspector
        assert app.focused is ins and ins.pickable
        chosen = [i for i, c in enumerate(tr.candidates) if c.token == tr.token]
        assert ins.pick == (chosen or [0])[0]                           # it starts on the chosen candidate
        assert "Enter forks here" in ins.rendered.plain
        row = next(i for i, c in enumerate(tr.candidates) if c.token != tr.token
                   and c.token not in tokenizer().special_ids)
        await pilot.press("escape")                                     # Esc: back to the tokens, nothing forked
        assert isinstance(app.focused, TokenView) and ins.pick is None
        await pilot.press(str(row + 1))                                 # a digit picks that row
        assert app.focused is ins and ins.pick == row
        await pilot.press("down", "up")
        assert ins.pick == row or row == len(tr.candidates) - 1
        await pilot.press(str(row + 1))
        target = tr.candidates[row].token
        await pilot.press("enter")
        await _forked(pilot, 2)
        new = app.chat.session.messages[-1]
        assert new.fork == {"position": 2, "token": target}
        ids = _content(new)
        assert ids[:2] == _content(old)[:2] and ids[2] == target
        [reply] = app.view.replies()
        assert reply.tokens == ids and reply.alts == (2, 2)
        assert str(reply.query_one(AltSwitch).render()) == "‹ 2/2 ›"
        assert reply.marks[2] == "forked" and set(reply.traces) >= {0, 1} and 3 in reply.traces
        assert old in app.chat.session.branches
        # the mouse: open the new reply's tokens, token #1, click a candidate row, then click it again
        await pilot.press("ctrl+t", "home", "right")
        tr = reply.traces[1]
        row = next(i for i, c in enumerate(tr.candidates) if c.token != tr.token
                   and c.token not in tokenizer().special_ids)
        body = ins.query_one(InspectorBody)
        await pilot.click(body, offset=(4, _row_y(app, body, row)))
        await pilot.pause(0.01)
        assert app.focused is ins and ins.pick == row and app.busy is None
        await pilot.click(body, offset=(4, _row_y(app, body, row)))
        await _forked(pilot, 3)
        assert app.chat.session.messages[-1].fork == {"position": 1, "token": tr.candidates[row].token}
        assert app.view.replies()[0].alts == (3, 3)


async def test_fork_is_refused_while_a_reply_streams_and_for_a_reply_without_traces(factory):
    app = make_app(factory(temperature=1.0, max_new=40, delay=0.03, seed=7), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "tell me a story")
        first = app.chat.session.messages[-1]
        await start(pilot, "and then?")
        await wait_for(pilot, lambda: app.stream.current is not None and app.stream.current.tokens, what="streaming")
        await pilot.press("ctrl+t", "home", "tab", "enter")             # the first reply's token #0, while streaming
        await pilot.pause()
        assert any("wait for the reply to finish" in n for n in notes(app, "error")), (notes(app), app.focused)
        await idle(pilot)
        assert app.chat.session.messages[2] is first and app.chat.session.branches == []
        await pilot.press("escape")
        await start(pilot, "/fork 99 5")                                # checked on the idle chat: one line
        await pilot.pause()
        assert any("no token 99 in this reply" in n for n in notes(app, "error"))
        assert app.busy is None and app.chat.session.branches == [] and len(app.view.replies()) == 2
        await pilot.press("f3")                                          # hidden: replies record no candidates
        await say(pilot, "one more")
        await pilot.press("ctrl+t", "tab")
        await pilot.pause()
        assert any("no candidates recorded" in n for n in notes(app, "warning"))
        await pilot.press("escape")
        await start(pilot, "/fork 0 5")                                  # /fork needs no trace
        await wait_for(pilot, lambda: app.busy is None and app.chat.alternatives()[1] == 2, what="the fork")
        assert app.chat.session.messages[-1].fork == {"position": 0, "token": 5}
        assert isinstance(app.query_one("#inspector"), Inspector)
