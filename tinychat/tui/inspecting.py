"""Inspecting a reply's tokens: its token view (Ctrl+T, a click on a reply), the selected token's candidates in the
inspector, moving between replies' token views and back to the input. A part of TinyChatApp (`app.tokens`), on the
UI thread; forking from the candidates is forking.py's."""
from __future__ import annotations


from .widgets import AssistantMessage, TokenView
from .widgets.format import token_label
from .widgets.inspector import Counters, Inspector


class TokenInspection:
    def __init__(self, app):
        self.app = app
        self.inspected: tuple[AssistantMessage, int] | None = None     # the reply and token the inspector shows

    def reply_of(self, view: TokenView) -> AssistantMessage | None:
        return next((r for r in self.app.view.replies() if r.token_view is view), None)

    def last_reply(self) -> None:
        """Ctrl+T: the last finished reply's token view, at its last token."""
        replies = [r for r in self.app.view.replies() if r.finished and r.tokens]
        if not replies:
            self.app.notify("no finished reply to inspect yet")
            return
        self.focus_reply(replies[-1], index=len(replies[-1].tokens) - 1)

    def focus_reply(self, reply: AssistantMessage, index: int | None = None) -> None:
        app = self.app
        for r in app.view.replies():
            if r is not reply and r.token_view.display:
                r.show_tokens(False)
        if not app.inspector.display and app.size.width >= 80:
            app.inspector.display = True
        reply.show_tokens(True, index=index)
        reply.scroll_visible()

    def selected(self, msg: TokenView.Selected) -> None:
        app = self.app
        if not msg.view.display:        # a hidden view's first cursor (every reply mounted from a session posts one)
            return
        reply = self.reply_of(msg.view)
        if reply is None or not reply.tokens:
            return
        i = msg.index
        trace = reply.traces.get(i)
        counters = reply.stats or (Counters.from_traces(reply.traces.values()) if reply.traces else None)
        n = app.view.replies().index(reply) + 1
        heading = f"reply {n} · token #{i} «{token_label(reply.pieces[i], 16)}»"
        if reply.first_divergence is not None and i >= reply.first_divergence:
            heading += " · after the divergence"
        if reply.marks.get(i) == "forked":
            heading += " · forced here (a fork)"
        self.inspected = (reply, i)
        app.inspector.show_trace(trace, app.strings, counters, heading,
                                 pickable=app.controller.replay_sess is None and reply.index is not None)

    def leave(self, msg: TokenView.Leave) -> None:
        app = self.app
        replies = [r for r in app.view.replies() if r.tokens]
        reply = next((r for r in replies if r.token_view is msg.view), None)
        if reply is None:
            return
        if msg.direction:
            j = replies.index(reply) + msg.direction
            if 0 <= j < len(replies):
                self.focus_reply(replies[j], index=0 if msg.direction > 0 else len(replies[j].tokens) - 1)
            return
        reply.show_tokens(False)
        app.prompt.focus()

    def back(self, msg: Inspector.Back) -> None:
        """Out of the inspector's candidates: back to the token view it came from (else the input)."""
        reply = self.inspected[0] if self.inspected else None
        if reply is not None and reply.is_attached and reply.token_view.display:
            reply.token_view.focus()
        else:
            self.app.prompt.focus()
