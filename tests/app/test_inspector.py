"""The sampler inspector: live while decoding, and for any selected token of a finished reply (keys and mouse);
banned candidates struck through with the 3-gram that banned them, penalised ones marked."""
from rich.text import Text

from app_support import ready, say
from tinychat.sampler import Candidate, TokenTrace
from tinychat.tui.app import TinyChatApp
from tinychat.tui.runtime import FactoryBackend
from tinychat.tui.widgets import TokenView
from tinychat.tui.widgets.inspector import Counters, render_trace

SIZE = (140, 44)
STRINGS = [f"t{i}" for i in range(10)]


def styles_of(text: Text, word: str) -> set[str]:
    at = text.plain.index(word)
    return {str(s.style) for s in text.spans if s.start <= at < s.end}


def test_render_trace_marks_banned_penalised_and_chosen():
    tr = TokenTrace(index=4, token=3, rank=1, p_raw=0.2, p_final=0.3, candidates=[
        Candidate(5, 0.5, 0.0, banned_by=(1, 2)),
        Candidate(3, 0.2, 0.3),
        Candidate(7, 0.2, 0.25, penalised=True),
        Candidate(8, 0.1, 0.05, in_nucleus=False)], banned=[5], banned_mass=0.5)
    t = render_trace(tr, STRINGS, Counters(5, 1, 1, 0.5, 0, 3), "token #4")
    plain = t.plain
    assert "chosen «t3»  rank 1  p 0.300" in plain
    assert "banned: «t1 t2 t5» said before" in plain
    assert "strike red" in styles_of(t, "t5 ")
    assert "▸ t3" in plain
    row7 = next(line for line in plain.splitlines() if line.strip().startswith("t7"))
    assert "↓" in row7 and "yellow" in " ".join(styles_of(t, "t7 "))
    row8 = next(line for line in plain.splitlines() if line.strip().startswith("t8"))
    assert "○" in row8
    assert "1 banned in 1 step ·" in plain and "0 lifts" in plain and "mass removed 0.50" in plain and "3 ids penalised" in plain
    lifted = TokenTrace(index=0, token=5, rank=0, p_raw=0.9, p_final=0.9, candidates=[Candidate(5, 0.9, 0.9)],
                        lifted=True)
    assert "bans lifted" in render_trace(lifted, STRINGS, None).plain


async def test_inspector_live_then_selected_token_shows_ban_and_penalty(factory):
    """Greedy, the same message twice: the second reply runs into the 3-grams of the first, so the ban fires."""
    live = []

    class Spy(TinyChatApp):
        def on_tokens_ready(self, msg):
            live.append(self.inspector.trace)
    app = Spy(FactoryBackend(factory(temperature=0.0, max_new=30, seed=1)), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.inspector.display                               # wide terminal: on by default
        await say(pilot, "hello tell me about the cat")
        assert any(t is not None for t in live)                     # it followed the stream
        await say(pilot, "hello tell me about the cat")
        reply = app.view.replies()[-1]
        banned_at = [i for i, tr in reply.traces.items() if any(c.banned_by for c in tr.candidates)]
        pen_at = [i for i, tr in reply.traces.items() if any(c.penalised for c in tr.candidates)]
        assert banned_at and pen_at, "the tiny model's second greedy reply must hit the ban and the penalty"
        assert reply.marks.get(banned_at[0]) == "banned"
        # keyboard: Ctrl+T selects the last token of the last reply; Home, then → to the banned step
        await pilot.press("ctrl+t")
        assert isinstance(app.focused, TokenView) and app.focused.cursor == len(reply.tokens) - 1
        await pilot.press("home", *["right"] * banned_at[0])
        await pilot.pause(0.01)
        tr = reply.traces[banned_at[0]]
        assert app.inspector.trace is tr
        shown = app.inspector.rendered.plain
        banned = next(c for c in tr.candidates if c.banned_by)
        assert f"token #{banned_at[0]}" in shown and "banned: «" in shown and "✗" in shown
        assert "said before" in shown and f"rank {tr.rank}" in shown
        # the 3-gram shown really was said in the first reply
        first = app.view.replies()[0].tokens
        gram = [*banned.banned_by, banned.token]
        assert any(first[j:j + 3] == gram for j in range(len(first) - 2))
        await pilot.press("right")
        assert app.inspector.trace is reply.traces[banned_at[0] + 1]
        # a penalised candidate is marked
        await pilot.press("home", *["right"] * pen_at[0])
        assert "↓" in app.inspector.rendered.plain
        # ↑ moves to the previous reply's tokens; Enter returns to the prompt
        await pilot.press("up")
        assert app.focused is app.view.replies()[0].token_view
        await pilot.press("enter")
        assert app.focused is app.prompt
        # mouse: click a reply, then its first token
        await pilot.click(app.view.replies()[-1].query_one("Markdown"))
        await pilot.pause(0.01)
        tv = reply.token_view
        assert tv.display and app.focused is tv
        await pilot.click(tv, offset=(0, 0))
        await pilot.pause(0.01)
        assert tv.cursor == 0 and app.inspector.trace is reply.traces[0]


async def test_inspector_toggle_and_traces_only_while_shown(factory):
    app = TinyChatApp(FactoryBackend(factory(max_new=3)), blink=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert not app.inspector.display                           # narrow: off by default
        await say(pilot, "hello")
        assert app.view.replies()[-1].tokens and not app.view.replies()[-1].traces    # hidden: no tracing cost
        await pilot.press("f3")
        assert app.inspector.display
        await say(pilot, "hello")
        assert len(app.view.replies()[-1].traces) == len(app.view.replies()[-1].tokens)
        await pilot.press("ctrl+t", "home")                           # a reply without traces says why
        assert app.view.replies()[-1].token_view.has_focus
        await pilot.press("up")
        assert "no trace recorded" in app.inspector.rendered.plain
        await pilot.press("escape", "f3")
        assert not app.inspector.display
        app.prompt.load_text("/trace on")
        await pilot.press("enter")
        assert app.inspector.display
