"""The view side of the chat's operations: sending (a message queued while the model loads, /edit's mode), the new
reply put on screen before its turn starts, regenerate and stop, and what a finished job (undo, a new chat, a
switch of alternatives, ...) or a failed turn changes in the view. A part of TinyChatApp (`app.turns`), on the UI
thread; the controller runs the operations, the reply being written is stream.py's."""
from __future__ import annotations


from ..numbers import is_count
from .messages import JobDone
from .state import Busy
from .widgets import AssistantMessage, PromptArea, UserMessage


class Turns:
    def __init__(self, app):
        self.app = app

    @property
    def ctl(self):
        return self.app.controller

    # -- sending --------------------------------------------------------------------------------------------------
    async def submitted(self, event: PromptArea.Submitted) -> None:
        app, ctl, state = self.app, self.ctl, self.app.state
        app.input_box.clear_note()
        text = event.text
        if text.lstrip().startswith("/") and "\n" not in text.strip():
            event.area.clear_input()
            await app.run_command(text.strip())
            return
        if ctl.chat is None and not ctl.load_error and ctl.replay_sess is None:
            if state.queued is not None:
                app.notify("a message is already queued: it goes when the model is loaded", severity="warning")
                return
            state.queued = text                 # Enter while the model loads: sent once it is ready
            event.area.clear_input()
            app.input_box.show_note("queued: sent as soon as the model is loaded (Esc takes it back)", error=False)
            return
        if not ctl.can_run("send"):
            return
        event.area.clear_input()
        if state.edit_index is not None:
            await self.send_edit(text)
            return
        await self.send(text)

    def start_edit(self, args: list[str]) -> None:
        """/edit [N]: your Nth message (default the last) into the input; the next send replaces it as a new branch.
        /edit off leaves that mode."""
        app, ctl = self.app, self.ctl
        if args == ["off"]:
            self.end_edit()
            app.notify("editing off: Enter sends a new message")
            return
        if ctl.streaming("edit") or not ctl.can_run("edit"):
            return
        reply = bool(args) and args[0].lower().startswith("r")       # /edit rN: the Nth reply
        num = args[0][1:] if reply else (args[0] if args else "")
        role, what = ("assistant", "reply") if reply else ("user", "message")
        at = [i for i, m in enumerate(ctl.chat.session.messages) if m.role == role]
        if len(args) > 1 or (num and not is_count(num)):
            app.notify("usage: /edit [N] (your Nth message), /edit r[N] (the Nth reply) or /edit off",
                       severity="error")
            return
        n = int(num) if num else len(at)
        if not at or not 1 <= n <= len(at):
            app.notify(f"no {what} {n} to edit (this chat has {len(at)})" if at else f"no {what} to edit yet",
                       severity="error")
            return
        app.state.edit_index = at[n - 1]
        app.prompt.set_input(ctl.chat.session.messages[at[n - 1]].content)
        app.input_box.set_mode(f" editing your message {n} · Enter: new branch · /edit off: cancel "
                               if not reply else f" editing reply {n} · Enter: keep as written · /edit off: cancel ")
        app.notify(f"editing message {n}: Enter sends it as a new branch from there (/edit off: cancel)" if not reply
                   else f"editing reply {n}: Enter keeps it as written, a new branch you continue from "
                        f"(/edit off: cancel)")

    def end_edit(self) -> None:
        """Leave /edit's mode (Enter sends a new message again)."""
        self.app.state.edit_index = None
        self.app.input_box.set_mode(None)

    async def send_edit(self, text: str) -> None:
        """Send `text` in place of the message /edit opened; the view drops that message and what followed it."""
        app, ctl = self.app, self.ctl
        if not ctl.can_run("send"):
            return
        index = app.state.edit_index
        self.end_edit()
        if ctl.chat.session.messages[index].role == "assistant":
            ctl.edit_reply(index, text)
            return
        ctl.set_busy(Busy.EDIT)
        users = list(app.view.query(UserMessage))
        n = sum(m.role == "user" for m in ctl.chat.session.messages[:index])
        if n < len(users):
            children = list(app.view.children)
            for w in children[children.index(users[n]):]:
                await w.remove()
        await app.view.mount(UserMessage(text, classes="message user"))
        await self.start_turn(Busy.EDIT, text, edit_at=index)

    async def send(self, text: str) -> None:
        self.ctl.set_busy(Busy.SEND)              # at once: the awaits below let other keys in
        await self.app.view.mount(UserMessage(text, classes="message user"))
        await self.start_turn(Busy.SEND, text)

    async def start_turn(self, kind: Busy, text: str = "", edit_at: int | None = None,
                         fork_at: tuple[int, int, int] | None = None) -> AssistantMessage:
        """Put the new reply on screen, then start its turn; the reply (being written)."""
        app = self.app
        for r in app.view.replies():                # earlier replies back to markdown
            if r.token_view.display:
                r.show_tokens(False)
        # traces only while the inspector is shown: tracing costs ~10-25 % of a fast decode step
        job = self.ctl.turn(kind, text, app.inspector.display, edit_at, fork_at)
        msg = app.stream.open(AssistantMessage(streaming=True, classes="message assistant"))
        await app.view.mount(msg)
        app.view.anchor()
        app.status_bar.update_status(activity="generating… (Esc stops)", tok_s=None, ttft_ms=None)
        # start decoding once the new message is on screen: mounting and the first layout pass cost the UI thread
        # tens of ms, which would otherwise stall the first tokens (the two threads share the GIL)
        app.call_after_refresh(self.ctl.start, job)
        return msg

    async def regenerate(self) -> None:
        app, ctl = self.app, self.ctl
        app.input_box.clear_note()
        if not ctl.can_run("regenerate"):
            return
        if not ctl.chat.session.n_turns:
            app.notify("no reply to regenerate yet")
            return
        ctl.set_busy(Busy.REGEN)
        replies = app.view.replies()
        if replies:
            await replies[-1].remove()
        await self.start_turn(Busy.REGEN)

    def stop(self) -> None:
        """Esc: a message queued while the model loads back to the input; else the reply or replay stops."""
        app = self.app
        app.input_box.clear_note()
        queued = self.ctl.take_queued()
        if queued is not None:
            if not app.prompt.text:
                app.prompt.restore(queued)
            app.notify("took the queued message back")
            return
        activity = self.ctl.stop()
        if activity:
            app.status_bar.update_status(activity=activity)

    async def trim_to_session(self) -> None:
        """Remove the conversation's last user messages (and what follows them) that the session no longer holds
        (after an undo, or a turn that failed). Call only while the chat is idle."""
        app = self.app
        users = list(app.view.query(UserMessage))
        while users and len(users) > app.chat.session.n_turns:
            children = list(app.view.children)
            for w in children[children.index(users.pop()):]:
                await w.remove()

    # -- how operations end ---------------------------------------------------------------------------------------
    async def job_done(self, msg: JobDone) -> None:
        app = self.app
        app.update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        with self.ctl.idle_after():
            await self._show_job(msg)
        app.prompt.focus()
        self.ctl.apply_pending()

    async def _show_job(self, msg: JobDone) -> None:
        """What a finished job (not a turn) changes in the view, and says."""
        app = self.app
        if msg.kind is Busy.UNDO:
            self.end_edit()                         # the message it named may be gone
            await self.trim_to_session()
            if not app.prompt.text:
                app.prompt.restore(msg.value)
            app.inspector.show_text("The last turn was taken back.")
            app.notify("took back the last turn (its text is back in the input)")
        elif msg.kind is Busy.NEW:
            await app.show_history()
            app.notify(f"new chat · session {app.chat.session.id}")
        elif msg.kind is Busy.SET:
            names = ", ".join(f"{k.replace('_', '-')} = {v!r}" for k, v in msg.value.items())
            app.notify(f"{names} (from the next turn)")
        elif msg.kind is Busy.ALT:
            await app.show_history()
            place, n = msg.value
            app.notify(f"{self.ctl.alt_what} {place}/{n}")
        elif msg.kind is Busy.SAVE:
            app.notify(f"saved {msg.value}" if msg.value else "nothing to save yet")
        if msg.warning:
            app.notify(msg.warning, severity="warning", timeout=10)

    async def failed(self, kind: Busy) -> None:
        """A turn failed (its error is notified); the chat is idle and holds what it held before: the view follows,
        a message sent or edited goes back to the input."""
        app = self.app
        if kind in (Busy.SEND, Busy.REGEN):
            # drop what the session does not hold, give a failed message back to the input
            reply = app.stream.close()
            if reply is not None:
                await reply.remove()
            await self.trim_to_session()
            if kind is Busy.SEND and not app.prompt.text:
                app.prompt.restore(app.state.job_text)
        elif kind in (Busy.EDIT, Busy.FORK):
            # the chat put the old branch back: show it (and the edited text back in the input)
            app.stream.close()
            await app.show_history()
            if kind is Busy.EDIT and not app.prompt.text:
                app.prompt.restore(app.state.job_text)
