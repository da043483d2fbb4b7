"""Replay playback (`tinychat replay ID --play`): the recorded session regenerated turn by turn on the chat thread
(tinychat.replay), tokens streamed at their recorded pace (or a chosen speed), the inspector live, and every
turn that departs from the record highlighted from its first differing token."""
from __future__ import annotations

import time

from textual import work

from ..textsafe import plural
from .messages import ReplayFinished, ReplayTurnFinished, ReplayTurnStarted, TokensReady
from .runtime import TokenBatcher, cache_figures
from .state import LiveFigures
from .widgets import AssistantMessage, NoticeMessage, UserMessage
from .widgets.format import token_label
from .widgets.inspector import Counters


class StopPlayback(Exception):
    """Raised on the replay thread when the user stops the playback."""


class PlaybackMixin:
    """The TinyChatApp part that plays a session back."""

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="replay")
    def _replay(self, chat, sess, speed: float) -> None:
        from ..chat.replay import replay
        msgs = sess.messages
        first = 1 if msgs and msgs[0].role == "system" else 0
        pairs = [(msgs[i], msgs[i + 1]) for i in range(first, len(msgs) - 1, 2)]
        tok = chat.tok
        state = {"turn": 0, "t0": 0.0, "rec": [], "batcher": None}
        stop = self._stop_replay

        def start(n: int) -> None:
            user, rec = pairs[n - 1]
            state.update(turn=n, t0=time.perf_counter(), rec=list(rec.timing_ms or []))
            state["batcher"] = TokenBatcher(lambda items: self.post_message(TokensReady(-n, items, cache_figures(chat))),
                                            self.pace)
            self.post_message(ReplayTurnStarted(n, user.content, tok.content_ids(rec.role, rec.token_ids)))

        def on_token(n, idx, token, text, trace, ms):
            if stop.is_set():
                raise StopPlayback
            if n != state["turn"]:
                start(n)
            if speed > 0 and token >= 0 and idx < len(state["rec"]):
                due = state["t0"] + sum(state["rec"][:idx + 1]) / 1000 / speed
                while not stop.is_set():
                    left = due - time.perf_counter()
                    if left <= 0:
                        break
                    if state["batcher"].items:
                        state["batcher"].flush()      # show what is due before waiting
                    time.sleep(min(left, 0.05))
            state["batcher"](idx, token, text, trace, ms)

        def on_turn(tr):
            if tr.turn != state["turn"]:
                start(tr.turn)
            state["batcher"].flush()
            self.post_message(ReplayTurnFinished(tr.turn, tr))

        try:
            report = replay(chat, sess, on_turn=on_turn, on_token=on_token)
        except StopPlayback:
            if state["batcher"] is not None:
                state["batcher"].items.clear()
            self.post_message(ReplayFinished(state["turn"], [], stopped=True))     # the chat is a throwaway now
            return
        self.post_message(ReplayFinished(len(report.turns), [d.describe() for d in report.divergences],
                                         status=chat.status()))

    async def on_replay_turn_started(self, msg: ReplayTurnStarted) -> None:
        await self.view.mount(UserMessage(msg.user_text, classes="message user"))
        self.state.turn_id = -msg.turn
        self.state.live = LiveFigures()
        m = AssistantMessage(streaming=True, title=f"replay · turn {msg.turn}", classes="message assistant")
        m.recorded = list(msg.recorded)
        self.state.current = m
        await self.view.mount(m)
        self.view.anchor()

    async def on_replay_turn_finished(self, msg: ReplayTurnFinished) -> None:
        m = self.state.current
        if m is None or self.state.turn_id != -msg.turn:
            return
        tr = msg.replay
        self.state.current = None
        m.divergence = tr.divergence
        m.stats = Counters.from_traces(tr.traces)
        if tr.divergence is None:
            meta = f"✓ token-exact: {len(tr.tokens)} tokens as recorded"
        else:
            d = tr.divergence
            m.first_divergence = d.position
            m.add_class("diverged")

            def tk(t, p):
                return "(end)" if t is None else f"«{token_label(self._piece(t), 16)}»" + \
                    (f" p={p:.3f}" if p is not None else "")
            meta = (f"✗ diverges at token {d.position}: recorded {tk(d.recorded, d.p_recorded)}, "
                    f"replayed {tk(d.replayed, d.p_replayed)}")
        await m.finish(meta)
        live = self.state.live
        self.status_bar.update_status(tok_s=live.tok_s, ttft_ms=live.ttft)

    async def on_replay_finished(self, msg: ReplayFinished) -> None:
        self.replay_summary = msg
        with self._idle_after():
            if self.state.current is not None:
                await self.state.current.finish("stopped")
                self.state.current = None
        if msg.stopped:
            text = f"replay stopped at turn {msg.turns}"
        elif msg.divergences:
            text = f"replay: {plural(msg.turns, 'turn')}, {len(msg.divergences)} diverge:\n" + "\n".join(msg.divergences)
        else:
            text = f"replay: {plural(msg.turns, 'turn')}, token-exact"
        await self.view.mount(NoticeMessage(text, error=bool(msg.divergences), classes="notice"))
        self._update_status(msg.status, activity="replay stopped" if msg.stopped else "replay done")
        self.view.scroll_end(animate=False)
