"""The TinyChatApp part that runs turns: send, regenerate, undo (and the other chat operations) on the one chat
thread, the streamed tokens into the reply being written, the live inspector and status figures, the finished turn.

The decode thread only posts messages (TokensReady in batches paced by runtime.Pace, TurnFinished, JobDone); every
widget change happens here, on the UI thread."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual import work

from ..numbers import is_count
from ..settings import ChatError
from ..textsafe import plural
from .messages import ChatOpened, JobDone, TokensReady, TurnFinished
from .runtime import TokenBatcher, cache_figures
from .state import Busy, LiveFigures
from .widgets import AssistantMessage, PromptArea, UserMessage
from .widgets.inspector import Counters

if TYPE_CHECKING:
    from ..chat.runtime import Chat, TurnResult

INSPECTOR_S = 0.25          # the live inspector shows the newest token at most this often (faster is unreadable,
                            # and the panel is the costliest repaint)


class TurnsMixin:
    """Turns and the other chat-thread operations of TinyChatApp."""

    # -- sending --------------------------------------------------------------------------------------------------
    async def on_prompt_area_submitted(self, event: PromptArea.Submitted) -> None:
        self.input_box.clear_note()
        text = event.text
        if text.lstrip().startswith("/") and "\n" not in text.strip():
            event.area.clear_input()
            await self.run_command(text.strip())
            return
        if self.chat is None and not self.load_error and self.replay_sess is None:
            if self.state.queued is not None:
                self.notify("a message is already queued: it goes when the model is loaded", severity="warning")
                return
            self.state.queued = text                 # Enter while the model loads: sent once it is ready
            event.area.clear_input()
            self.input_box.show_note("queued: sent as soon as the model is loaded (Esc takes it back)", error=False)
            return
        if not self._can_run("send"):
            return
        event.area.clear_input()
        if self.state.edit_index is not None:
            await self.send_edit(text)
            return
        await self.send(text)

    def start_edit(self, args: list[str]) -> None:
        """/edit [N]: your Nth message (default the last) into the input; the next send replaces it as a new branch.
        /edit off leaves that mode."""
        if args == ["off"]:
            self.end_edit()
            self.notify("editing off: Enter sends a new message")
            return
        if self.chat is not None and self.busy is not None and self.busy.decoding:
            self.notify("wait for the reply to finish (Esc stops it), then edit", severity="error")
            return
        if not self._can_run("edit"):
            return
        reply = bool(args) and args[0].lower().startswith("r")       # /edit rN: the Nth reply
        num = args[0][1:] if reply else (args[0] if args else "")
        role, what = ("assistant", "reply") if reply else ("user", "message")
        at = [i for i, m in enumerate(self.chat.session.messages) if m.role == role]
        if len(args) > 1 or (num and not is_count(num)):
            self.notify("usage: /edit [N] (your Nth message), /edit r[N] (the Nth reply) or /edit off",
                        severity="error")
            return
        n = int(num) if num else len(at)
        if not at or not 1 <= n <= len(at):
            self.notify(f"no {what} {n} to edit (this chat has {len(at)})" if at else f"no {what} to edit yet",
                        severity="error")
            return
        self.state.edit_index = at[n - 1]
        self.prompt.set_input(self.chat.session.messages[at[n - 1]].content)
        self.input_box.set_mode(f" editing your message {n} · Enter: new branch · /edit off: cancel "
                                if not reply else f" editing reply {n} · Enter: keep as written · /edit off: cancel ")
        self.notify(f"editing message {n}: Enter sends it as a new branch from there (/edit off: cancel)" if not reply
                    else f"editing reply {n}: Enter keeps it as written, a new branch you continue from "
                         f"(/edit off: cancel)")

    def end_edit(self) -> None:
        """Leave /edit's mode (Enter sends a new message again)."""
        self.state.edit_index = None
        self.input_box.set_mode(None)

    async def send_edit(self, text: str) -> None:
        """Send `text` in place of the message /edit opened; the view drops that message and what followed it."""
        if not self._can_run("send"):
            return
        index = self.state.edit_index
        self.end_edit()
        if self.chat.session.messages[index].role == "assistant":
            self._alt_what = "reply"
            self._set_busy(Busy.ALT)            # no decoding: the view is rebuilt when it is done
            self._job_edit_reply(self.chat, index, text)
            return
        self._set_busy(Busy.EDIT)
        users = list(self.view.query(UserMessage))
        n = sum(m.role == "user" for m in self.chat.session.messages[:index])
        if n < len(users):
            children = list(self.view.children)
            for w in children[children.index(users[n]):]:
                await w.remove()
        await self.view.mount(UserMessage(text, classes="message user"))
        self.state.edit_at = index
        await self._start_turn(Busy.EDIT, text)

    async def send(self, text: str) -> None:
        self._set_busy(Busy.SEND)              # at once: the awaits below let other keys in
        view = self.view
        await view.mount(UserMessage(text, classes="message user"))
        await self._start_turn(Busy.SEND, text)

    async def _start_turn(self, kind: Busy, text: str = "") -> None:
        for r in self.view.replies():                # earlier replies back to markdown
            if r.token_view.display:
                r.show_tokens(False)
        self.state.turn_id += 1
        self.state.job_text = text
        self.state.live = LiveFigures()
        msg = AssistantMessage(streaming=True, classes="message assistant")
        self.state.current = msg
        await self.view.mount(msg)
        self.view.anchor()
        self._set_busy(kind)
        self.status_bar.update_status(activity="generating… (Esc stops)", tok_s=None, ttft_ms=None)
        # start decoding once the new message is on screen: mounting and the first layout pass cost the UI thread
        # tens of ms, which would otherwise stall the first tokens (the two threads share the GIL)
        # traces only while the inspector is shown: tracing costs ~10-25 % of a fast decode step
        self.call_after_refresh(self._job_turn, self.chat, kind, text, self.state.turn_id, self.inspector.display)

    # -- the chat thread: one worker per operation (group "chat": one at a time), each posting its result --------
    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_turn(self, chat: Chat, kind: Busy, text: str, turn_id: int, trace: bool) -> None:
        """A turn: send `text`, an edit, a fork, or regenerate the last reply; tokens posted in batches, then
        TurnFinished."""
        batcher = TokenBatcher(lambda items: self.post_message(TokensReady(turn_id, items, cache_figures(chat))),
                               self.pace)
        if kind is Busy.SEND:
            r = chat.send(text, on_token=batcher, trace=trace)
        elif kind is Busy.EDIT:
            r = chat.edit(self.state.edit_at, text, on_token=batcher, trace=trace)
        elif kind is Busy.FORK:
            index, position, token = self.state.fork_at
            r = chat.fork(position, token, index, on_token=batcher, trace=trace)
        else:
            r = chat.regenerate(on_token=batcher, trace=trace)
        batcher.flush()
        self.post_message(TurnFinished(turn_id, r, chat.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_undo(self, chat: Chat) -> None:
        user = chat.undo()
        self.post_message(JobDone(Busy.UNDO, user.content, chat.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_edit_reply(self, chat: Chat, index: int, text: str) -> None:
        place = chat.edit_reply(index, text)
        self.post_message(JobDone(Busy.ALT, place, chat.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_alt(self, chat: Chat, which: str, index: int | None) -> None:
        place = chat.switch_alternative(which, index)
        self.post_message(JobDone(Busy.ALT, place, chat.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_new(self, chat: Chat) -> None:
        chat.new_session()
        self.post_message(JobDone(Busy.NEW, None, chat.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_set(self, chat: Chat, changes: dict[str, str]) -> None:
        for k, v in changes.items():
            chat.set(k, v)
        st = chat.settings
        applied = {f: getattr(st, f) for f in map(st.field_name, changes)}
        self.post_message(JobDone(Busy.SET, applied, chat.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_open(self, session_ref: str | None) -> None:
        new = self.backend.open(session_ref)
        if self.chat is not None and new is not self.chat:
            self.chat.close()               # its session's lock: another process may open it now
        note = f"session {new.session.id}: {new.session.title or 'untitled'} ({plural(new.session.n_turns, 'turn')})" \
            if session_ref else ""
        self.post_message(ChatOpened(new, note, new.status()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_switch(self, where, session_ref: str) -> None:
        """Load another model (backend.find_model's `where`) and open session_ref on it."""
        old = self.chat
        if old is not None:
            old.close()                     # its session's lock (a failed switch keeps it open but unlocked)
        new = self.backend.switch(where, session_ref)
        note = f"switched to {new.model_name or 'the model'} · session {new.session.id}: " \
               f"{new.session.title or 'untitled'} ({plural(new.session.n_turns, 'turn')})"
        self.post_message(ChatOpened(new, note, new.status(), self.backend.token_strings()))

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_save(self, chat: Chat, title: str | None) -> None:
        path = chat.save(title)
        self.post_message(JobDone(Busy.SAVE, str(path) if path else None, chat.status()))

    async def on_tokens_ready(self, msg: TokensReady) -> None:
        m = self.state.current
        if m is None or msg.turn_id != self.state.turn_id:
            return
        cpu = time.thread_time()
        if self._ui_cpu is not None:
            self.pace.observe(cpu - self._ui_cpu)
        self._ui_cpu = cpu
        live = self.state.live
        text = []
        last = None
        for it in msg.items:
            m.add_token(it.index, it.token, it.text, it.trace, self._piece(it.token))
            text.append(it.text)
            if it.token >= 0:
                live.add(it.ms)
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
            self.status_bar.update_status(tok_s=live.tok_s, ttft_ms=live.ttft, **(msg.cache or {}))

    async def on_turn_finished(self, msg: TurnFinished) -> None:
        if msg.turn_id != self.state.turn_id or self.state.current is None:
            return
        r, m = msg.result, self.state.current
        self.state.current = None
        self._ui_cpu = None
        m.stats = Counters.from_stats(r.stats, r.n_tokens)
        await m.finish(turn_meta(r))
        if self.replay_sess is None:
            m.index = len(self.chat.session.messages) - 1
            self.state.remember(self.chat.session.id, self.chat.session.messages[m.index].id, m.tokens, m.traces,
                                m.stats, m.meta)
            m.set_alternatives(*self.chat.alternatives(m.index))
            users = list(self.view.query(UserMessage))
            if users:                       # this turn's message: after an edit, one of several
                users[-1].index = m.index - 1
                users[-1].set_alternatives(*self.chat.alternatives(m.index - 1))
        self._set_busy(None)
        self._update_status(msg.status, tok_s=r.decode_tok_s or None, ttft_ms=r.ttft_ms, activity="")
        if r.traces and self.inspector.display:
            last = r.traces[-1]
            self.inspector.show_trace(last, self.strings, m.stats, f"token #{last.index} · last of the reply")
        if r.dropped_turns:
            self.notify(f"context full: dropped the {r.dropped_turns} oldest turn(s)", severity="warning")
        if getattr(r, "save_warning", None):
            self.notify(r.save_warning, severity="warning", timeout=10)
        if getattr(r, "notice", None):
            self.notify(r.notice, timeout=10)
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
        self.input_box.clear_note()
        if self.state.queued is not None:              # a message queued while the model loads: back to the input
            text, self.state.queued = self.state.queued, None
            if not self.prompt.text:
                self.prompt.restore(text)
            self.notify("took the queued message back")
            return
        if self.busy in (Busy.SEND, Busy.REGEN, Busy.EDIT, Busy.FORK) and self.chat is not None:
            self.chat.cancel()
            self.status_bar.update_status(activity="stopping…")
        elif self.busy is Busy.REPLAY:
            self._stop_replay.set()
            self.status_bar.update_status(activity="stopping replay…")

    async def action_regenerate(self) -> None:
        self.input_box.clear_note()
        if not self._can_run("regenerate"):
            return
        if not self.chat.session.n_turns:
            self.notify("no reply to regenerate yet")
            return
        self._set_busy(Busy.REGEN)
        replies = self.view.replies()
        if replies:
            await replies[-1].remove()
        await self._start_turn(Busy.REGEN)

    def action_next_alt(self) -> None:
        self.switch_alt("next")

    def action_prev_alt(self) -> None:
        self.switch_alt("prev")

    def switch_alt(self, which: str, index: int | None = None) -> None:
        """Show another alternative of a reply (default: the last one): "next", "prev" or a 1-based number. Checked
        here first, so a bad number or a switch while a reply streams is one line and changes nothing."""
        self.input_box.clear_note()
        if self.chat is not None and self.busy is not None and self.busy.decoding:
            self.notify("wait for the reply to finish (Esc stops it), then switch alternatives", severity="error")
            return
        if not self._can_run("switching alternatives"):
            return
        try:
            place, n = self.chat.alternatives(index)
        except ChatError as e:
            self.notify(str(e), severity="error")
            return
        is_reply = index is None or self.chat.session.messages[index].role == "assistant"
        what, how = ("reply", "Ctrl+R") if is_reply else ("message", "/edit")
        self._alt_what = what
        if is_count(which) and not 1 <= int(which) <= n:
            self.notify(f"no alternative {which}: this {what} has {n} (1..{n})" if n > 1 else
                        f"no alternative {which}: this {what} has no others ({how} makes one)", severity="error")
            return
        if n < 2:
            self.notify(f"this {what} has no alternatives yet ({how} makes one)")
            return
        self._set_busy(Busy.ALT)
        self._job_alt(self.chat, which, index)

    def action_undo(self) -> None:
        self.input_box.clear_note()
        if not self._can_run("undo"):
            return
        if not self.chat.session.n_turns:
            self.notify("no turn to undo")
            return
        self._set_busy(Busy.UNDO)
        self._job_undo(self.chat)

    async def on_job_done(self, msg: JobDone) -> None:
        self._update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        with self._idle_after():
            await self._show_job(msg)
        self.prompt.focus()
        await self._apply_pending()

    async def _show_job(self, msg: JobDone) -> None:
        """What a finished job (not a turn) changes in the view, and says."""
        if msg.kind is Busy.UNDO:
            self.end_edit()                         # the message it named may be gone
            await self._trim_to_session()
            if not self.prompt.text:
                self.prompt.restore(msg.value)
            self.inspector.show_text("The last turn was taken back.")
            self.notify("took back the last turn (its text is back in the input)")
            if getattr(self.chat, "save_warning", None):
                self.notify(self.chat.save_warning, severity="warning", timeout=10)
        elif msg.kind is Busy.NEW:
            await self._show_history()
            self.notify(f"new chat · session {self.chat.session.id}")
        elif msg.kind is Busy.SET:
            names = ", ".join(f"{k.replace('_', '-')} = {v!r}" for k, v in msg.value.items())
            self.notify(f"{names} (from the next turn)")
        elif msg.kind is Busy.ALT:
            await self._show_history()
            place, n = msg.value
            self.notify(f"{getattr(self, '_alt_what', 'reply')} {place}/{n}")
            if getattr(self.chat, "save_warning", None):
                self.notify(self.chat.save_warning, severity="warning", timeout=10)
        elif msg.kind is Busy.SAVE:
            self.notify(f"saved {msg.value}" if msg.value else "nothing to save yet")


def turn_meta(r: TurnResult) -> str:
    """The line under a finished reply."""
    parts = [plural(r.n_tokens, "token"), f"{r.decode_tok_s:.0f} tok/s", f"TTFT {r.ttft_ms:.0f} ms"]
    if r.finish == "cancelled":
        parts.append("stopped")
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
