"""Forking a reply at a token (issue #14). In a token view, Tab (or a digit: that row) moves into the inspector's
candidates of the selected token; ↑/↓ pick one, Enter (or a second click on a row) forks: the reply and what
followed it leave the view, a new reply streams from the kept tokens and the forced one on (the chat's fork on the
chat thread: jobs.Turn, Busy.FORK), and it ends with its place among the alternatives (‹ 2/3 ›). `/fork POSITION
TOKEN` does the same for the last reply. The old reply stays in the session, one Alt+←/→ away. A part of
TinyChatApp (`app.forking`), on the UI thread."""
from __future__ import annotations


from ..settings import ChatError
from .state import Busy
from .widgets import AssistantMessage, TokenView
from .widgets.inspector import Inspector


class Forking:
    def __init__(self, app):
        self.app = app

    def pick(self, msg: TokenView.Pick) -> None:
        app, tokens = self.app, self.app.tokens
        reply = tokens.reply_of(msg.view)
        if reply is None or not reply.tokens:
            return
        if app.busy is not None and app.busy.decoding:     # the live inspector follows the stream meanwhile
            app.notify("wait for the reply to finish (Esc stops it), then fork", severity="error")
            return
        if reply.traces.get(msg.index) is None:
            app.notify("no candidates recorded for this token (a restored reply, or one decoded while the inspector "
                       "was hidden); /fork POSITION TOKEN forks the last reply by id or text", severity="warning")
            return
        if not app.inspector.display:
            app.inspector.display = True
        if tokens.inspected != (reply, msg.index) or not app.inspector.pickable:
            tokens.selected(TokenView.Selected(msg.view, msg.index))
        app.inspector.start_pick(msg.row)

    async def picked(self, msg: Inspector.Picked) -> None:
        if self.app.tokens.inspected is None:
            return
        reply, position = self.app.tokens.inspected
        await self.fork_reply(reply, position, msg.token)

    async def command(self, position: int, token: str) -> None:
        """/fork POSITION TOKEN: the last reply."""
        app = self.app
        replies = [r for r in app.view.replies() if r.finished and r.index is not None]
        if app.chat is None or not replies or replies[-1].index != len(app.chat.session.messages) - 1:
            app.notify("no reply to fork yet", severity="error")
            return
        await self.fork_reply(replies[-1], position, token)

    async def fork_reply(self, reply: AssistantMessage, position: int, token: int | str) -> None:
        """Fork `reply` at its token `position` with `token` (an id, or the text of one token). Checked first on the
        idle chat, so a bad fork, or one while a reply streams, is one line and changes nothing."""
        app, ctl = self.app, self.app.controller
        if ctl.streaming("fork") or not ctl.can_run("fork"):
            return
        if reply.index is None or not reply.is_attached:
            app.notify("this reply cannot be forked here", severity="error")
            return
        try:
            tok_id = ctl.chat.check_fork(position, token, reply.index)
        except ChatError as e:
            app.notify(str(e), severity="error")
            return
        ctl.set_busy(Busy.FORK)
        index = reply.index
        app.tokens.inspected = None
        kept = {i: tr for i, tr in reply.traces.items() if i < position}     # the kept tokens' draws are the same
        marks = {i: m for i, m in reply.marks.items() if i < position}
        children = list(app.view.children)
        for w in children[children.index(reply):]:
            await w.remove()
        app.prompt.focus()
        m = await app.turns.start_turn(Busy.FORK, fork_at=(index, position, tok_id))
        m.traces.update(kept)
        m.marks.update(marks)
        m.marks[position] = "forked"
        app.notify(f"forking the reply at token {position}: «{app.piece(tok_id)}» forced, the rest sampled again")
