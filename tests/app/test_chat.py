"""Pilot tests of the chat screen: send and stream, stop, regenerate, undo, settings, input behaviour."""
import dataclasses

from app_support import idle, notes, ready, say, start, wait_for
from tinychat.tui.app import TinyChatApp, make_app
from tinychat.tui.runtime import FactoryBackend
from tinychat.tui.messages import TokensReady
from tinychat.tui.widgets import UserMessage
from tinychat.tui.widgets.format import visible

SIZE = (130, 40)


def replies(app):
    return [r for r in app.view.replies()]


async def test_send_streams_tokens_in_batches_and_matches_headless(factory, chat_model):
    f = factory(temperature=0.8, seed=7, max_new=24)
    batches, texts = [], []

    class Spy(TinyChatApp):
        # Textual calls this, then TinyChatApp's own handler (handlers run for every class of the MRO)
        def on_tokens_ready(self, msg: TokensReady):
            batches.append([it.token for it in msg.items])
            if self.stream.current is not None:
                texts.append(self.stream.current.query_one("Markdown").source)     # as of the previous batch
    app = Spy(FactoryBackend(f), blink=False)
    app.pace.fixed = 0.0                          # one update per token: the stream is observable
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hello, tell me about the cat")
        chat = app.chat
        reply = chat.session.messages[-1]
        [r] = replies(app)
        assert r.finished and r.text == reply.content
        n = len(r.tokens)
        assert 0 < n <= 24
        assert len(batches) >= n // 2                       # streamed, not delivered at the end
        assert r.query_one("Markdown").source == visible(reply.content)
        assert len(set(texts)) > 1                          # the markdown grew while decoding
        assert [u.text for u in app.view.query(UserMessage)] == ["hello, tell me about the cat"]
        assert "tok/s" in r.meta and f"{n} tokens" in r.meta
        assert app.status_bar.values["cache_tokens"] == chat.status()["cache_tokens"] > 0
        assert app.status_bar.values["autosave"] == "autosaved"
    # the same model, settings and seed headless: the same reply
    from support import make_chat
    other = make_chat(model=chat_model, temperature=0.8, seed=7, max_new=24, penalty=f.settings.penalty, autosave=False)
    assert other.send("hello, tell me about the cat").text == reply.content


async def test_escape_stops_generation_mid_turn_and_chat_goes_on(factory):
    f = factory(temperature=0.0, max_new=300, delay=0.01)
    app = make_app(f, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await start(pilot, "hello")
        await wait_for(pilot, lambda: app.stream.current is not None and len(app.stream.current.tokens) >= 3,
                       what="tokens")
        await pilot.press("escape")
        await idle(pilot)
        last = app.chat.session.messages[-1]
        assert last.finish == "cancelled"
        [r] = replies(app)
        assert 3 <= len(r.tokens) < 300 and "stopped" in r.meta
        assert app.busy is None
        f.chats[0].delay = 0
        f.chats[0].settings = dataclasses.replace(f.chats[0].settings, max_new=5)
        await say(pilot, "and again")
        assert app.chat.session.n_turns == 2 and app.chat.session.messages[-1].finish in ("stop", "length")


async def test_cursor_stops_blinking_while_a_reply_streams(factory):
    """A blink repaints the input: while a reply streams the cursor stays still (the UI thread's time is the
    decode thread's, through the GIL), and blinks again afterwards."""
    f = factory(temperature=0.0, max_new=300, delay=0.01)
    app = make_app(f, blink=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert app.prompt.cursor_blink
        await start(pilot, "hello")
        await wait_for(pilot, lambda: app.stream.current is not None and len(app.stream.current.tokens) >= 3,
                       what="tokens")
        assert not app.prompt.cursor_blink
        await pilot.press("escape")
        await idle(pilot)
        assert app.prompt.cursor_blink


async def test_regenerate_replaces_the_last_reply(factory):
    f = factory(temperature=1.0, max_new=16)
    app = make_app(f, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "tell me a story")
        first = app.chat.session.messages[-1]
        await pilot.press("ctrl+r")
        await pilot.pause()
        await idle(pilot)
        sess = app.chat.session
        assert sess.n_turns == 1
        again = sess.messages[-1]
        assert again.seed != first.seed
        [r] = replies(app)
        assert r.text == again.content
        assert len(list(app.view.query(UserMessage))) == 1


async def test_undo_takes_back_the_last_turn_and_returns_its_text(factory):
    app = make_app(factory(temperature=0.0, max_new=8), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "first message")
        await say(pilot, "second message")
        assert app.chat.session.n_turns == 2
        await pilot.press("ctrl+b")
        await idle(pilot)
        assert app.chat.session.n_turns == 1
        assert [u.text for u in app.view.query(UserMessage)] == ["first message"]
        assert len(replies(app)) == 1
        assert app.prompt.text == "second message"
        # the cache was truncated to the first turn: sending again continues from there
        await say(pilot, "second message")
        assert app.chat.session.n_turns == 2


async def test_settings_screen_applies_from_the_next_turn(factory):
    app = make_app(factory(temperature=0.7, max_new=30, seed=3), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "one")
        await pilot.press("f2")
        await pilot.pause()
        screen = app.screen
        assert type(screen).__name__ == "SettingsScreen"
        screen.query_one("#set-temperature").value = "0"
        screen.query_one("#set-max_new").value = "5"
        screen.query_one("#set-ban").value = False
        await pilot.press("ctrl+s")
        await pilot.pause()
        await idle(pilot)
        assert app.chat.settings.temperature == 0.0 and app.chat.settings.max_new == 5 and not app.chat.settings.ban
        first = app.chat.session.messages[-1]
        assert first.settings["max_new"] == 30 and first.settings["temperature"] == 0.7
        await say(pilot, "two")
        rec = app.chat.session.messages[-1]
        assert rec.settings["temperature"] == 0.0 and rec.settings["max_new"] == 5 and rec.settings["ban"] is False
        assert len(replies(app)[-1].tokens) <= 5


async def test_settings_screen_rejects_bad_values_inline(factory):
    app = make_app(factory(max_new=5), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f2")
        await pilot.pause()
        screen = app.screen
        screen.query_one("#set-top_p").value = "7"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.screen is screen                                   # still open
        assert "top-p" in str(screen.query_one("#settings-error").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.chat.settings.top_p == 0.9


async def test_slash_set_while_decoding_applies_to_the_next_turn(factory):
    f = factory(temperature=0.0, max_new=200, delay=0.01)
    app = make_app(f, blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await start(pilot, "hello")
        await wait_for(pilot, lambda: app.stream.current is not None and app.stream.current.tokens, what="tokens")
        await start(pilot, "/set max-new 3")
        assert app.busy == "send" and app.chat.settings.max_new == 200      # queued, not applied mid-turn
        await pilot.press("escape")
        await idle(pilot)
        assert app.chat.session.messages[-1].settings["max_new"] == 200
        assert app.chat.settings.max_new == 3
        assert ("information", "max-new = 3 (from the next turn)") in app.notices     # the parsed value
        f.chats[0].delay = 0
        await say(pilot, "again")
        assert app.chat.session.messages[-1].settings["max_new"] == 3
        assert len(replies(app)[-1].tokens) <= 3


async def test_input_keys_newline_history_completion_and_hint(factory):
    app = make_app(factory(temperature=0.0, max_new=4), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press(*"ab", "ctrl+j", *"cd")
        assert app.prompt.text == "ab\ncd"
        await pilot.press("enter")
        await idle(pilot)
        assert app.chat.session.messages[-2].content == "ab\ncd"
        await say(pilot, "second")
        await pilot.press("up")
        assert app.prompt.text == "second"
        await pilot.press("up")
        assert app.prompt.text == "ab\ncd"
        await pilot.press("down")
        assert app.prompt.text == "second"
        await pilot.press("down")
        assert app.prompt.text == ""
        await pilot.press(*"/se")
        hint = str(app.query_one("#hint").render())
        assert "/set" in hint and "/sessions" in hint and "/settings" in hint
        await pilot.press(*"t", "tab")
        assert app.prompt.text in ("/set", "/set ")  # common prefix of /set, /settings
        app.prompt.load_text("/bogus")
        await pilot.press("enter")
        await pilot.pause()
        assert any("unknown command /bogus" in n for n in notes(app, "error"))


async def test_copy_new_chat_and_help(factory):
    app = make_app(factory(temperature=0.0, max_new=6), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hi")
        text = app.chat.session.messages[-1].content
        await pilot.press("ctrl+o")
        assert app.clipboard == text
        old = app.chat.session.id
        await pilot.press("ctrl+n")
        await idle(pilot)
        assert app.chat.session.id != old and app.chat.session.n_turns == 0
        assert not replies(app)
        await pilot.press("f1")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ != "HelpScreen"


async def test_paste_of_100kb_stays_responsive_sends_everything_and_comes_back_whole_on_failure(factory):
    from work import Lines
    app = make_app(factory(temperature=0.0, max_new=4), blink=False)
    big = "\n".join(f"line {i} " + "the quick brown fox jumps over the lazy dog " * 2 for i in range(1100))
    assert len(big) > 100_000
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await say(pilot, "hi")
        from textual import events
        with Lines() as lines:                # responsive: the paste costs no work per line or character of it
            app.prompt.post_message(events.Paste(big))
            await pilot.pause()
            await pilot.press("x")
        assert app.prompt.text.startswith("[paste #1: ") and app.prompt.text.endswith("x")
        assert len(app.prompt.text) < 100     # the input holds a placeholder, not 100 KB for the widget to lay out
        assert app.prompt.expanded() == big + "x"
        assert lines.count < 1_000, lines.count            # 34 now; a loop over the paste's 1,100 lines fails
        await pilot.press("enter")
        await pilot.pause()
        await idle(pilot)
        # the tiny model's 512-token context cannot take it: a notification, not a crash; nothing recorded
        assert any("too long" in n for n in notes(app, "error"))
        assert app.chat.session.n_turns == 1
        assert [u.text for u in app.view.query(UserMessage)] == ["hi"]       # the failed turn left nothing behind
        assert len(replies(app)) == 1 and replies(app)[0].traces               # the earlier reply kept its traces
        # the failed message is back in the input as it was typed: its placeholder, standing for all of it
        assert app.prompt.text.startswith("[paste #1: ") and app.prompt.expanded() == big + "x"
        app.prompt.clear_input()
        await pilot.press("up")                                                  # and in the history, whole
        assert app.prompt.text.startswith("[paste #1: ") and app.prompt.expanded() == big + "x"
        app.prompt.clear_input()
        await say(pilot, "short one")
        assert app.chat.session.n_turns == 2


def test_pace_adapts_the_batch_interval_to_ui_cost_decode_stalls_and_speed():
    from tinychat.tui.runtime import Pace, TokenBatcher
    p = Pace(stall=0.05, ui_duty=0.05, lo=0.03, hi=0.5, ui_hi=0.25)
    for _ in range(20):
        p.observe(0.004)                          # 4 ms of UI work per update: 80 ms apart
    assert abs(p.interval - 0.08) < 1e-3
    for _ in range(20):
        p.observe(0.5)                            # an overloaded UI: capped
    assert abs(p.interval - 0.25) < 1e-3
    p = Pace(stall=0.05, lo=0.03, hi=0.5)
    for _ in range(2000):
        p.step(5.0)                               # an even decode: no reason to slow the updates
    assert p.interval == 0.03 and not p.fast
    for i in range(2000):
        p.step(60.0 if i % 10 == 0 else 5.0)      # every 10th step stalls for an update: back off
    assert p.interval == 0.5
    for _ in range(4000):
        p.step(5.0)                               # stalls gone: back to smooth updates
    assert p.interval == 0.03
    for _ in range(100):
        p.step(1.2)                               # 800 tok/s: one update a second, whatever else
    assert p.fast and p.interval == p.hi_fast == 1.0
    for _ in range(100):
        p.step(20.0)                              # 50 tok/s again: smooth updates
    assert not p.fast and p.interval == 0.03
    p.fixed = 0.0
    posted = []
    b = TokenBatcher(posted.append, p)
    for i in range(3):
        b(i, i, "x", None, 1.0)
    assert [len(x) for x in posted] == [1, 1, 1]
    p.fixed = 10.0
    b = TokenBatcher(posted.append, p)
    b(0, 0, "x", None, 1.0)
    b(1, 1, "y", None, 1.0)
    assert [len(x) for x in posted] == [1, 1, 1]
    b.flush()
    assert [it.text for it in posted[-1]] == ["x", "y"]


def test_a_turns_first_words_are_posted_at_once_whatever_the_pace():
    from tinychat.tui.runtime import Pace, TokenBatcher
    p = Pace(lo=0.0)
    p.ui_interval = p.stall_interval = 10.0       # a slow pace: one update every 10 s
    posted = []
    b = TokenBatcher(posted.append, p)
    b(0, 5, "Hello", None, 30.0)                   # the first token: on screen now
    assert [[it.text for it in x] for x in posted] == [["Hello"]]
    b(1, 6, " there", None, 1.0)
    b(2, 7, "!", None, 1.0)                        # then the pace holds the rest
    assert len(posted) == 1
    b.flush()
    assert [it.text for it in posted[-1]] == [" there", "!"]


def test_replies_parse_markdown_links_but_not_bare_urls():
    """Replies use one shared parser without linkify (a streaming reply is re-parsed on every update, and linkify
    made that 16x slower): [text](url) links still link, a bare URL stays text."""
    from tinychat.tui.widgets.chat_view import AssistantMessage, StreamMarkdown, reply_parser

    def links(text):
        return [t for tok in reply_parser().parse(text) for t in (tok.children or []) if t.type == "link_open"]

    assert links("see [the docs](https://example.com)") and not links("see https://example.com today")
    assert reply_parser() is reply_parser()
    body = next(iter(AssistantMessage("hi").compose()))
    assert isinstance(body, StreamMarkdown) and body._parser_factory is reply_parser


async def test_startup_objects_leave_the_cyclic_gc_while_the_app_runs(factory):
    """Once the model is loaded, what exists (torch, the model, Textual) is frozen out of the cyclic GC, so a full
    collection during a turn scans only what the turns add (it paused the UI 140-185 ms every few turns); the app
    hands them back when it ends, so a process that runs apps one after another (tests) frees their cycles."""
    import gc
    assert gc.get_freeze_count() == 0
    app = make_app(factory(max_new=4), blink=False)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert gc.get_freeze_count() > 1000
        await say(pilot, "hello")
        assert gc.get_freeze_count() > 1000
    assert gc.get_freeze_count() == 0


def test_stream_markdown_replaces_textuals_paragraph_block():
    """StreamParagraph (layout only when a paragraph's height changes) is plugged in through Markdown.BLOCKS; if
    Textual renames or moves its paragraph block this fails instead of silently re-laying out on every update."""
    from textual.widgets import Markdown
    from textual.widgets.markdown import MarkdownBlock

    from tinychat.tui.widgets.chat_view import StreamMarkdown, StreamParagraph
    assert "paragraph_open" in Markdown.BLOCKS
    assert StreamMarkdown.BLOCKS["paragraph_open"] is StreamParagraph
    assert issubclass(StreamParagraph, Markdown.BLOCKS["paragraph_open"]) and issubclass(StreamParagraph, MarkdownBlock)


def test_live_figures_and_busy_states():
    from tinychat.tui.state import Busy, ChatState, LiveFigures
    live = LiveFigures()
    assert live.tok_s is None
    for ms in (30.0, 10.0, 10.0, 20.0):            # the first token's time is the TTFT, not a step
        live.add(ms)
    assert (live.n, live.ttft, live.ms) == (4, 30.0, 40.0) and live.tok_s == 75.0
    assert ChatState().busy is Busy.LOAD and Busy.SEND == "send" and Busy("regen") is Busy.REGEN
    assert {b for b in Busy if b.decoding} == {Busy.SEND, Busy.REGEN, Busy.EDIT, Busy.FORK, Busy.REPLAY}
