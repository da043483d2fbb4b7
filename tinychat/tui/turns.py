"""The TinyChatApp part that runs turns: send, regenerate, undo (and the other chat operations) on the one chat
thread, the streamed tokens into the reply being written, the live inspector and status figures, the finished turn.

The decode thread only posts messages (TokensReady in batches paced by runtime.Pace, TurnFinished, JobDone); every
widget change happens here, on the UI thread."""
from __future__ import annotations

import time
from typing import Any

from textual import work

from .messages import ChatOpened, JobDone, TokensReady, TurnFinished
from .runtime import TokenBatcher
from .widgets import AssistantMessage, PromptArea, UserMessage
from .widgets.inspector import Counters

INSPECTOR_S = 0.25          # the live inspector shows the newest token at most this often (faster is unreadable,
                            # and the panel is the costliest repaint)


class TurnsMixin:
    """Turns and the other chat-thread operations of TinyChatApp."""

    # -- sending --------------------------------------------------------------------------------------------------
    async def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        text = event.text
        if text.lstrip().startswith("/") and "\n" not in text.strip():
            event.area.clear_input()
            await self.run_command(text.strip())
            return
        if not self._can_run("send"):
            return
        event.area.clear_input()
        await self.send(text)

    async def send(self, text: str) -> None:
        self._set_busy("send")              # at once: the awaits below let other keys in
        view = self.view
        await view.mount(UserMessage(text, classes="message user"))
        await self._start_turn("send", text)

    async def _start_turn(self, kind: str, text: str = "") -> None:
        for r in self.view.replies():                # earlier replies back to markdown
            if r.token_view.display:
                r.show_tokens(False)
        self._turn_id += 1
        self._job_text = text
        self._live = {"n": 0, "ms": 0.0, "ttft": None}
        msg = AssistantMessage(streaming=True, classes="message assistant")
        self._current = msg
        await self.view.mount(msg)
        self.view.anchor()
        self._set_busy(kind)
        self.status_bar.update_status(activity="generating… (Esc stops)", tok_s=None, ttft_ms=None)
        # start decoding once the new message is on screen: mounting and the first layout pass cost the UI thread
        # tens of ms, which would otherwise stall the first tokens (the two threads share the GIL)
        # traces only while the inspector is shown: tracing costs ~10-25 % of a fast decode step
        self.call_after_refresh(self._job, self.chat, kind, text, self._turn_id, self.inspector.display)

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job(self, chat, kind: str, arg: Any = None, turn_id: int = 0, trace: bool = True) -> None:
        """Every chat operation, on the one chat thread."""
        if kind in ("send", "regen"):
            batcher = TokenBatcher(lambda items: self.post_message(TokensReady(turn_id, items)), self.pace)
            if kind == "send":
                r = chat.send(arg, on_token=batcher, trace=trace)
            else:
                r = chat.regenerate(on_token=batcher, trace=trace)
            batcher.flush()
            self.post_message(TurnFinished(turn_id, r, chat.status()))
        elif kind == "undo":
            user = chat.undo()
            self.post_message(JobDone("undo", user.content, chat.status()))
        elif kind == "new":
            chat.new_session()
            self.post_message(JobDone("new", None, chat.status()))
        elif kind == "set":
            for k, v in arg.items():
                chat.set(k, v)
            applied = {f: getattr(chat.settings, f) for f in map(chat.settings.field_name, arg)}
            self.post_message(JobDone("set", applied, chat.status()))
        elif kind == "open":
            new = self.backend.open(arg)
            if new is not chat:
                chat.close()                # its session's lock: another process may open it now
            note = f"session {new.session.id}: {new.session.title or 'untitled'} ({new.session.n_turns} turns)" \
                if arg else ""
            self.post_message(ChatOpened(new, note, new.status()))
        elif kind == "save":
            path = chat.save(arg)
            self.post_message(JobDone("save", str(path) if path else None, chat.status()))
        else:
            raise ValueError(f"unknown job {kind}")

    async def on_tokens_ready(self, msg: TokensReady) -> None:
        m = self._current
        if m is None or msg.turn_id != self._turn_id:
            return
        cpu = time.thread_time()
        if self._ui_cpu is not None:
            self.pace.observe(cpu - self._ui_cpu)
        self._ui_cpu = cpu
        live = self._live
        text = []
        last = None
        for it in msg.items:
            m.add_token(it.index, it.token, it.text, it.trace, self._piece(it.token))
            text.append(it.text)
            if it.token >= 0:
                live["n"] += 1
                if live["ttft"] is None:
                    live["ttft"] = it.ms
                else:
                    live["ms"] += it.ms
            if it.trace is not None:
                last = it
        await m.add_text("".join(text))
        now = time.monotonic()
        if last is not None and self.inspector.display and now - self._inspector_at >= INSPECTOR_S:
            self._inspector_at = now
            self.inspector.show_trace(last.trace, self.strings, Counters.from_traces(m.traces.values()),
                                      f"token #{last.index} · live")
        if now - self._status_at >= 0.5:            # live figures twice a second: a full-width line to repaint
            self._status_at = now
            tok_s = (live["n"] - 1) / (live["ms"] / 1000) if live["n"] > 1 and live["ms"] > 0 else None
            self.status_bar.update_status(tok_s=tok_s, ttft_ms=live["ttft"])

    async def on_turn_finished(self, msg: TurnFinished) -> None:
        if msg.turn_id != self._turn_id or self._current is None:
            return
        r, m = msg.result, self._current
        self._current = None
        self._ui_cpu = None
        m.stats = Counters.from_stats(r.stats, r.n_tokens)
        await m.finish(turn_meta(r))
        self._set_busy(None)
        self._update_status(msg.status, tok_s=r.decode_tok_s or None, ttft_ms=r.ttft_ms, activity="")
        if r.traces and self.inspector.display:
            last = r.traces[-1]
            self.inspector.show_trace(last, self.strings, m.stats, f"token #{last.index} · last of the reply")
        if r.dropped_turns:
            self.notify(f"context full: dropped the {r.dropped_turns} oldest turn(s)", severity="warning")
        if getattr(r, "save_warning", None):
            self.notify(r.save_warning, severity="warning", timeout=10)
        await self._apply_pending()

    async def _trim_to_session(self) -> None:
        """Remove the conversation's last user messages (and what follows them) that the session no longer holds
        (after an undo, or a turn that failed). Call only while the chat is idle."""
        users = list(self.view.query(UserMessage))
        while users and len(users) > self.chat.session.n_turns:
            children = list(self.view.children)
            for w in children[children.index(users.pop()):]:
                await w.remove()

    def action_stop(self) -> None:
        if self.busy in ("send", "regen") and self.chat is not None:
            self.chat.cancel()
            self.status_bar.update_status(activity="stopping…")
        elif self.busy == "replay":
            self._stop_replay.set()
            self.status_bar.update_status(activity="stopping replay…")

    async def action_regenerate(self) -> None:
        if not self._can_run("regenerate"):
            return
        if not self.chat.session.n_turns:
            self.notify("no reply to regenerate yet")
            return
        self._set_busy("regen")
        replies = self.view.replies()
        if replies:
            await replies[-1].remove()
        await self._start_turn("regen")

    def action_undo(self) -> None:
        if not self._can_run("undo"):
            return
        if not self.chat.session.n_turns:
            self.notify("no turn to undo")
            return
        self._set_busy("undo")
        self._job(self.chat, "undo")

    async def on_job_done(self, msg: JobDone) -> None:
        self._set_busy(None)
        self._update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        if msg.kind == "undo":
            await self._trim_to_session()
            if not self.prompt.text and len(msg.value) <= 4000:
                self.prompt.set_input(msg.value)
            self.inspector.show_text("The last turn was taken back.")
            self.notify("took back the last turn (its text is back in the input)")
            if getattr(self.chat, "save_warning", None):
                self.notify(self.chat.save_warning, severity="warning", timeout=10)
        elif msg.kind == "new":
            await self._show_history()
            self.notify(f"new chat · session {self.chat.session.id}")
        elif msg.kind == "set":
            names = ", ".join(f"{k.replace('_', '-')} = {v!r}" for k, v in msg.value.items())
            self.notify(f"{names} (from the next turn)")
        elif msg.kind == "save":
            self.notify(f"saved {msg.value}" if msg.value else "nothing to save yet")
        self.prompt.focus()
        await self._apply_pending()


def turn_meta(r: Any) -> str:
    """The line under a finished reply."""
    parts = [f"{r.n_tokens} tokens", f"{r.decode_tok_s:.0f} tok/s", f"TTFT {r.ttft_ms:.0f} ms"]
    if r.finish == "cancelled":
        parts.append("stopped")
    elif r.finish == "length":
        parts.append("cut off at max-new")
    s = r.stats
    if s.banned_steps:
        parts.append(f"ban fired {s.banned_steps}×")
    if s.lifts:
        parts.append(f"{s.lifts} lifts")
    if r.dropped_turns:
        parts.append(f"dropped {r.dropped_turns} old turns")
    return " · ".join(parts)
