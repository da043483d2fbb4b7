"""The sampler A/B in the app (`/ab KEY=VALUE ...`, tinychat/chat/ab.py): the A/B screen at once, the two decodes on
the chat thread (jobs.RunAB, which posts AbReady), the result into the screen, then the side the user keeps (a
switch of alternatives, as /alt). A part of TinyChatApp (`app.ab`), on the UI thread."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..commands import parse_ab
from ..sessions import tree as session_tree
from ..textsafe import plural
from .messages import AbReady
from .state import Busy
from .widgets.inspector import Counters

if TYPE_CHECKING:
    from ..chat.ab import ABResult


class ABFlow:
    def __init__(self, app):
        self.app = app
        self.result: ABResult | None = None        # the last A/B's, for the side kept

    def start(self, args: list[str]) -> None:
        """/ab's arguments (CommandError when they are not KEY=VALUE ...)."""
        app = self.app
        changes = parse_ab(args)
        if not app.controller.ab(changes):
            return
        app.status_bar.update_status(activity="A/B: decoding twice…")
        label = " ".join(f"{k}={v}" for k, v in changes.items())
        from .screens.ab import ABScreen        # imported when first opened: the window does not wait for it
        app.push_screen(ABScreen(label), self.done)

    async def ready(self, msg: AbReady) -> None:
        with self.app.controller.idle_after():
            await self._show(msg)

    async def _show(self, msg: AbReady) -> None:
        app = self.app
        self.result = msg.result
        for side in (msg.result.a, msg.result.b):       # both replies keep their traces for the rebuilt view
            stats = Counters.from_traces(side.traces)
            meta = f"{plural(len(side.tokens), 'token')} · A/B side {side.name}" + \
                (f" · {side.finish}" if side.finish and side.finish != "stop" else "")
            app.state.remember(app.chat.session.id, side.message_id, side.tokens,
                               {t.index: t for t in side.traces}, stats, meta)
        app.update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        screen = app.screen
        from .screens.ab import ABScreen
        if isinstance(screen, ABScreen):
            screen.show_result(msg.result)            # the conversation is shown again when it closes
        else:                                         # the screen was closed while the decodes ran
            await app.show_history()
            app.notify(f"A/B done: {msg.result.cause}; A is the active reply")
        if msg.warning:
            app.notify(msg.warning, severity="warning", timeout=10)

    async def failed(self) -> None:
        """The A/B's job failed (its error is notified): close the screen, show what the session holds."""
        app = self.app
        from .screens.ab import ABScreen
        if isinstance(app.screen, ABScreen):
            await app.screen.dismiss(None)
        await app.show_history()

    async def done(self, choice: str | None) -> None:
        app, ctl = self.app, self.app.controller
        if choice is None:
            if app.busy is Busy.AB and app.chat is not None:
                app.chat.cancel()                     # closed while decoding: stop what runs
            return
        result = self.result
        if choice == "A" or result is None:
            await app.show_history()                  # side A, the active reply
            app.notify("kept A (B stays an alternative of the reply)")
            app.prompt.focus()
            return
        sibs, _ = session_tree.siblings(app.chat.session, len(app.chat.session.messages) - 1)
        place = next((i + 1 for i, m in enumerate(sibs) if m.id == result.b.message_id), None)
        if place is None or not ctl.can_run("keeping B"):
            return
        ctl.keep_alt(str(place))
        if choice == "B+settings":
            ctl.apply_settings({k: str(v) for k, v in result.changes.items()})
