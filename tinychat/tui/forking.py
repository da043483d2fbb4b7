"""The TinyChatApp part that forks a reply at a token (issue #14). In a token view, Tab (or a digit: that row) moves
into the inspector's candidates of the selected token; ↑/↓ pick one, Enter (or a second click on a row) forks: the
reply and what followed it leave the view, a new reply streams from the kept tokens and the forced one on (the
chat's fork on the chat thread: turns.py's `_job_turn`, Busy.FORK), and it ends with its place among the
alternatives (‹ 2/3 ›). `/fork POSITION TOKEN` does the same for the last reply. The old reply stays in the session,
one Alt+←/→ away."""
from __future__ import annotations

from ..settings import ChatError
from .state import Busy
from .widgets import AssistantMessage, TokenView
from .widgets.inspector import Inspector


class ForkMixin:
    """Forking of TinyChatApp: the candidates in the inspector, then the fork streamed like a regenerate."""

    def _reply_of(self, view: TokenView) -> AssistantMessage | None:
        return next((r for r in self.view.replies() if r.token_view is view), None)

    def on_token_view_pick(self, msg: TokenView.Pick) -> None:
        reply = self._reply_of(msg.view)
        if reply is None or not reply.tokens:
            return
        if self.busy is not None and self.busy.decoding:     # the live inspector follows the stream meanwhile
            self.notify("wait for the reply to finish (Esc stops it), then fork", severity="error")
            return
        if reply.traces.get(msg.index) is None:
            self.notify("no candidates recorded for this token (a restored reply, or one decoded while the inspector "
                        "was hidden); /fork POSITION TOKEN forks the last reply by id or text", severity="warning")
            return
        if not self.inspector.display:
            self.inspector.display = True
        if self.state.inspected != (reply, msg.index) or not self.inspector.pickable:
            self.on_token_view_selected(TokenView.Selected(msg.view, msg.index))
        self.inspector.start_pick(msg.row)

    def on_inspector_back(self, msg: Inspector.Back) -> None:
        reply = self.state.inspected[0] if self.state.inspected else None
        if reply is not None and reply.is_attached and reply.token_view.display:
            reply.token_view.focus()
        else:
            self.prompt.focus()

    async def on_inspector_picked(self, msg: Inspector.Picked) -> None:
        if self.state.inspected is None:
            return
        reply, position = self.state.inspected
        await self.fork_reply(reply, position, msg.token)

    async def fork_command(self, position: int, token: str) -> None:
        """/fork POSITION TOKEN: the last reply."""
        replies = [r for r in self.view.replies() if r.finished and r.index is not None]
        if self.chat is None or not replies or replies[-1].index != len(self.chat.session.messages) - 1:
            self.notify("no reply to fork yet", severity="error")
            return
        await self.fork_reply(replies[-1], position, token)

    async def fork_reply(self, reply: AssistantMessage, position: int, token: int | str) -> None:
        """Fork `reply` at its token `position` with `token` (an id, or the text of one token). Checked first on the
        idle chat, so a bad fork, or one while a reply streams, is one line and changes nothing."""
        if self.chat is not None and self.busy is not None and self.busy.decoding:
            self.notify("wait for the reply to finish (Esc stops it), then fork", severity="error")
            return
        if not self._can_run("fork"):
            return
        if reply.index is None or not reply.is_attached:
            self.notify("this reply cannot be forked here", severity="error")
            return
        try:
            tok_id = self.chat.check_fork(position, token, reply.index)
        except ChatError as e:
            self.notify(str(e), severity="error")
            return
        self._set_busy(Busy.FORK)
        self.state.fork_at = (reply.index, position, tok_id)
        self.state.inspected = None
        kept = {i: tr for i, tr in reply.traces.items() if i < position}     # the kept tokens' draws are the same
        marks = {i: m for i, m in reply.marks.items() if i < position}
        children = list(self.view.children)
        for w in children[children.index(reply):]:
            await w.remove()
        self.prompt.focus()
        await self._start_turn(Busy.FORK)
        m = self.state.current
        m.traces.update(kept)
        m.marks.update(marks)
        m.marks[position] = "forked"
        self.notify(f"forking the reply at token {position}: «{self._piece(tok_id)}» forced, the rest sampled again")
