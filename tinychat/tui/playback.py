"""The view of a replay's playback (`tinychat replay ID --play`): each recorded turn regenerated on the chat thread
(jobs.Replay) streams into a new reply at its recorded pace (or a chosen speed), the inspector live, and every turn
that departs from the record is highlighted from its first differing token. A part of TinyChatApp
(`app.playback`), on the UI thread."""
from __future__ import annotations


from ..textsafe import plural
from .messages import ReplayFinished, ReplayTurnFinished, ReplayTurnStarted
from .widgets import AssistantMessage, NoticeMessage, UserMessage
from .widgets.format import token_label
from .widgets.inspector import Counters


class Playback:
    def __init__(self, app):
        self.app = app
        self.summary: ReplayFinished | None = None     # how the replay ended (tests, logs)

    def start(self) -> None:
        app = self.app
        speed = app.controller.replay_speed
        app.status_bar.update_status(activity=f"replay ×{speed:g}" if speed else "replay (full speed)")
        app.controller.replay()

    async def turn_started(self, msg: ReplayTurnStarted) -> None:
        app = self.app
        await app.view.mount(UserMessage(msg.user_text, classes="message user"))
        app.state.turn_id = -msg.turn
        m = AssistantMessage(streaming=True, title=f"replay · turn {msg.turn}", classes="message assistant")
        m.recorded = list(msg.recorded)
        app.stream.open(m)
        await app.view.mount(m)
        app.view.anchor()

    async def turn_finished(self, msg: ReplayTurnFinished) -> None:
        app = self.app
        m = app.stream.current
        if m is None or app.state.turn_id != -msg.turn:
            return
        tr = msg.replay
        app.stream.close()
        m.divergence = tr.divergence
        m.stats = Counters.from_traces(tr.traces)
        if tr.divergence is None:
            meta = f"✓ token-exact: {len(tr.tokens)} tokens as recorded"
        else:
            d = tr.divergence
            m.first_divergence = d.position
            m.add_class("diverged")

            def tk(t, p):
                return "(end)" if t is None else f"«{token_label(app.piece(t), 16)}»" + \
                    (f" p={p:.3f}" if p is not None else "")
            meta = (f"✗ diverges at token {d.position}: recorded {tk(d.recorded, d.p_recorded)}, "
                    f"replayed {tk(d.replayed, d.p_replayed)}")
        await m.finish(meta)
        live = app.stream.live
        app.status_bar.update_status(tok_s=live.tok_s, ttft_ms=live.ttft)

    async def finished(self, msg: ReplayFinished) -> None:
        app = self.app
        self.summary = msg
        with app.controller.idle_after():
            reply = app.stream.close()
            if reply is not None:
                await reply.finish("stopped")
        if msg.stopped:
            text = f"replay stopped at turn {msg.turns}"
        elif msg.divergences:
            text = f"replay: {plural(msg.turns, 'turn')}, {len(msg.divergences)} diverge:\n" + "\n".join(msg.divergences)
        else:
            text = f"replay: {plural(msg.turns, 'turn')}, token-exact"
        await app.view.mount(NoticeMessage(text, error=bool(msg.divergences), classes="notice"))
        app.update_status(msg.status, activity="replay stopped" if msg.stopped else "replay done")
        app.view.scroll_end(animate=False)

    async def failed(self, text: str) -> None:
        app = self.app
        app.notify(f"replay failed: {text}", severity="error", timeout=8)
        with app.controller.idle_after():
            app.status_bar.update_status(activity="replay failed")
            reply = app.stream.close()
            if reply is not None:
                await reply.finish(f"✗ {text}")
