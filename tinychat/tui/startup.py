"""The app's start: the model loaded (the first view, then a replay's playback or the message queued while it
loaded), or its load failed (shown in the view; the app stays up to say so); and what exists once it is loaded kept
out of the cyclic GC's sight. A part of TinyChatApp (`app.startup`), on the UI thread."""
from __future__ import annotations

import gc

from .messages import RuntimeReady
from .widgets import NoticeMessage


class Startup:
    def __init__(self, app):
        self.app = app
        self._frozen = False                        # gc.freeze() done (see freeze)

    async def ready(self, msg: RuntimeReady) -> None:
        app, ctl = self.app, self.app.controller
        ctl.loaded(msg.chat)
        app.strings = msg.token_strings
        app.view.loading = False
        with ctl.idle_after():
            await app.show_history(msg.note)
        app.update_status(msg.status, activity="")
        self.freeze()
        if ctl.replay_sess is not None:
            app.playback.start()
        elif app.state.queued is not None:                 # Enter while the model loaded
            app.input_box.clear_note()
            await app.turns.send(ctl.take_queued())

    async def failed(self, err: BaseException, text: str) -> None:
        from ..sessions.session import SessionError
        app, ctl = self.app, self.app.controller
        what = "open the session" if isinstance(err, SessionError) else "load the model"
        ctl.load_error = f"could not {what}: {text}"
        app.view.loading = False
        await app.view.mount(NoticeMessage(f"✗ {ctl.load_error}\n\nCheck --model (a folder with config.json, "
                                           f"model.safetensors and tokenizer.json). Ctrl+Q quits.",
                                           error=True, classes="notice", id="load-error"))
        app.status_bar.update_status(model="no model", activity="load failed")
        app.notify(ctl.load_error, severity="error", timeout=10)
        ctl.set_busy(None)
        queued = ctl.take_queued()
        if queued is not None:                      # a message queued for the model: back to the input
            app.prompt.restore(queued)
            app.input_box.clear_note()

    def freeze(self) -> None:
        """What exists once the model is loaded (torch, the model, Textual: ~300k objects) lives as long as the app:
        out of the cyclic GC's sight (gc.freeze), a full collection scans only what the turns add instead of holding
        the UI (and a key typed meanwhile) for a scan of all of them every few turns. unfreeze gives them back (on
        unmount)."""
        if not self._frozen:
            gc.collect()
            gc.freeze()
            self._frozen = True

    def unfreeze(self) -> None:
        if self._frozen:
            gc.unfreeze()
            self._frozen = False
