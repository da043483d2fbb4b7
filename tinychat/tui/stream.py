"""The reply being written: its widget and live figures, the token batches the decode thread posts (TokensReady)
into it, the live inspector and status figures, then the finished turn (TurnFinished). A part of TinyChatApp
(`app.stream`), on the UI thread."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..textsafe import plural
from .messages import TokensReady, TurnFinished
from .state import LiveFigures
from .widgets import AssistantMessage, UserMessage
from .widgets.inspector import Counters

if TYPE_CHECKING:
    from ..chat.runtime import TurnResult

INSPECTOR_S = 0.25          # the live inspector shows the newest token at most this often (faster is unreadable,
                            # and the panel is the costliest repaint)


class ReplyStream:
    def __init__(self, app):
        self.app = app
        self.current: AssistantMessage | None = None    # the reply being written
        self.live = LiveFigures()
        self._ui_cpu: float | None = None               # UI thread CPU time at the last batch
        self._status_at = 0.0                           # when the status bar last showed live figures
        self._inspector_at = 0.0                        # when the inspector last showed a live token

    def open(self, reply: AssistantMessage) -> AssistantMessage:
        """`reply` (not yet mounted) is the one being written from now on."""
        self.current = reply
        self.live = LiveFigures()
        return reply

    def close(self) -> AssistantMessage | None:
        """No reply is being written any more; the one that was (None if none)."""
        reply, self.current = self.current, None
        return reply

    async def tokens(self, msg: TokensReady) -> None:
        app = self.app
        m = self.current
        if m is None or msg.turn_id != app.state.turn_id:
            return
        cpu = time.thread_time()
        if self._ui_cpu is not None:
            app.pace.observe(cpu - self._ui_cpu)
        self._ui_cpu = cpu
        live = self.live
        text = []
        last = None
        for it in msg.items:
            m.add_token(it.index, it.token, it.text, it.trace, app.piece(it.token))
            text.append(it.text)
            if it.token >= 0:
                live.add(it.ms)
            if it.trace is not None:
                last = it
        await m.add_text("".join(text))
        now = time.monotonic()
        if last is not None and app.inspector.display and now - self._inspector_at >= INSPECTOR_S:
            self._inspector_at = now
            app.inspector.show_trace(last.trace, app.strings, Counters.from_traces(m.traces.values()),
                                     f"token #{last.index} · live")
        if now - self._status_at >= 0.5:            # live figures twice a second: a full-width line to repaint
            self._status_at = now
            app.status_bar.update_status(tok_s=live.tok_s, ttft_ms=live.ttft, **(msg.cache or {}))

    async def finished(self, msg: TurnFinished) -> None:
        app, ctl = self.app, self.app.controller
        if msg.turn_id != app.state.turn_id or self.current is None:
            return
        r, m = msg.result, self.close()
        self._ui_cpu = None
        m.stats = Counters.from_stats(r.stats, r.n_tokens)
        await m.finish(turn_meta(r))
        chat = ctl.chat
        if ctl.replay_sess is None:
            m.index = len(chat.session.messages) - 1
            app.state.remember(chat.session.id, chat.session.messages[m.index].id, m.tokens, m.traces, m.stats,
                               m.meta)
            m.set_alternatives(*chat.alternatives(m.index))
            users = list(app.view.query(UserMessage))
            if users:                       # this turn's message: after an edit, one of several
                users[-1].index = m.index - 1
                users[-1].set_alternatives(*chat.alternatives(m.index - 1))
        ctl.set_busy(None)
        app.update_status(msg.status, tok_s=r.decode_tok_s or None, ttft_ms=r.ttft_ms, activity="")
        if r.traces and app.inspector.display:
            last = r.traces[-1]
            app.inspector.show_trace(last, app.strings, m.stats, f"token #{last.index} · last of the reply")
        if r.dropped_turns:
            app.notify(f"context full: dropped the {r.dropped_turns} oldest turn(s)", severity="warning")
        if msg.warning:
            app.notify(msg.warning, severity="warning", timeout=10)
        if msg.notice:
            app.notify(msg.notice, timeout=10)
        ctl.apply_pending()


def turn_meta(r: TurnResult) -> str:
    """The line under a finished reply."""
    parts = [plural(r.n_tokens, "token")]
    if r.n_tokens > 1 and r.decode_tok_s > 0:       # a rate needs two tokens
        parts.append(f"{r.decode_tok_s:.0f} tok/s")
    if r.n_tokens:                                  # no first token, no time to it
        parts.append(f"TTFT {r.ttft_ms:.0f} ms")
    if r.finish == "cancelled":
        parts.append("stopped" if r.n_tokens else "stopped before the first token")
    elif r.finish == "length":
        parts.append("cut off at max-new")
    s = r.stats
    if s.banned_steps:
        parts.append(f"ban fired {s.banned_steps}×")
    if s.lifts:
        parts.append(plural(s.lifts, "lift"))
    if r.dropped_turns:
        parts.append(f"dropped {plural(r.dropped_turns, 'old turn')}")
    return " · ".join(parts)
