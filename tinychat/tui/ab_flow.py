"""The TinyChatApp part that runs the sampler A/B (`/ab KEY=VALUE ...`, tinychat/chat/ab.py): the A/B screen at once, the
two decodes on the chat worker (one @work method; it posts AbReady and never touches a widget), the result into the
screen, then the side the user keeps (a switch of alternatives, on the same worker as /alt)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work

from ..sessions import tree as T
from ..textsafe import plural
from ..commands import CommandError, parse_ab
from .messages import AbReady
from .screens.ab import ABScreen
from .state import Busy
from .widgets.inspector import Counters

if TYPE_CHECKING:
    from ..chat.runtime import Chat


class ABMixin:
    """/ab in the app."""

    def start_ab(self, args: list[str]) -> None:
        try:
            changes = parse_ab(args)
        except CommandError as e:
            self.notify(str(e), severity="error")
            return
        if self.chat is not None and self.busy is not None and self.busy.decoding:
            self.notify("wait for the reply to finish (Esc stops it), then /ab", severity="error")
            return
        if not self._can_run("/ab"):
            return
        if not self.chat.session.n_turns:
            self.notify("no reply to compare yet: send a message first", severity="error")
            return
        err = self._check_settings(changes)          # key and value, as /set (the worker checks the rest)
        if err:
            self.notify(err, severity="error")
            return
        self._set_busy(Busy.AB)
        self.status_bar.update_status(activity="A/B: decoding twice…")
        label = " ".join(f"{k}={v}" for k, v in changes.items())
        self.push_screen(ABScreen(label), self._ab_done)
        self._job_ab(self.chat, changes)

    @work(thread=True, exclusive=True, group="chat", exit_on_error=False, name="chat")
    def _job_ab(self, chat: Chat, changes: dict[str, str]) -> None:
        from ..chat.ab import run_ab
        r = run_ab(chat, changes)
        self.post_message(AbReady(r, chat.status()))

    async def on_ab_ready(self, msg: AbReady) -> None:
        with self._idle_after():
            await self._show_ab(msg)

    async def _show_ab(self, msg: AbReady) -> None:
        self._ab_result = msg.result
        for side in (msg.result.a, msg.result.b):       # both replies keep their traces for the rebuilt view
            stats = Counters.from_traces(side.traces)
            meta = f"{plural(len(side.tokens), 'token')} · A/B side {side.name}" + \
                (f" · {side.finish}" if side.finish and side.finish != "stop" else "")
            self.state.remember(self.chat.session.id, side.message_id, side.tokens,
                                {t.index: t for t in side.traces}, stats, meta)
        self._update_status(msg.status, tok_s=None, ttft_ms=None, activity="")
        screen = self.screen
        if isinstance(screen, ABScreen):
            screen.show_result(msg.result)            # the conversation is shown again when it closes
        else:                                         # the screen was closed while the decodes ran
            await self._show_history()
            self.notify(f"A/B done: {msg.result.cause}; A is the active reply")
        if getattr(self.chat, "save_warning", None):
            self.notify(self.chat.save_warning, severity="warning", timeout=10)

    async def ab_failed(self) -> None:
        """The A/B's worker failed (its error is notified): close the screen, show what the session holds."""
        if isinstance(self.screen, ABScreen):
            await self.screen.dismiss(None)
        await self._show_history()

    async def _ab_done(self, choice: str | None) -> None:
        if choice is None:
            if self.busy is Busy.AB and self.chat is not None:
                self.chat.cancel()                    # closed while decoding: stop what runs
            return
        screen_result = getattr(self, "_ab_result", None)
        if choice == "A" or screen_result is None:
            await self._show_history()                # side A, the active reply
            self.notify("kept A (B stays an alternative of the reply)")
            self.prompt.focus()
            return
        sibs, _ = T.siblings(self.chat.session, len(self.chat.session.messages) - 1)
        place = next((i + 1 for i, m in enumerate(sibs) if m.id == screen_result.b.message_id), None)
        if place is None or not self._can_run("keeping B"):
            return
        self._set_busy(Busy.ALT)
        self._job_alt(self.chat, str(place), None)
        if choice == "B+settings":
            await self.apply_settings({k: str(v) for k, v in screen_result.changes.items()})
