"""The settings screen (F2, /settings) in the app: the chat's settings with the ones waiting to apply, each one's
source, the app's preferences; what it changes goes to the controller (from the next turn) and prefs.json. A part of
TinyChatApp (`app.settings`), on the UI thread."""
from __future__ import annotations

import dataclasses



class SettingsFlow:
    def __init__(self, app):
        self.app = app

    def open(self) -> None:
        app, ctl = self.app, self.app.controller
        if ctl.chat is None:
            app.notify(ctl.load_error or "the model is still loading", severity="warning")
            return
        pending = app.state.pending_settings
        st = ctl.chat.settings
        for k, v in pending.items():
            st = st.with_value(k, v)
        values = dataclasses.asdict(st)
        note = "A new system prompt applies at once while the chat has no turns, else from the next new chat."
        from ..prefs import load_prefs
        prefs = dataclasses.asdict(load_prefs()[0])
        sources = {**getattr(ctl.chat, "sources", {}), **{k: "/set" for k in pending}}
        from .screens.settings import SettingsScreen    # imported when first opened
        app.push_screen(SettingsScreen(values, ctl.check_settings, note, prefs=prefs, sources=sources), self.done)

    def done(self, changes: dict | None) -> None:
        from .screens.settings import PREF
        prefs = {k[len(PREF):]: v == "on" for k, v in (changes or {}).items() if k.startswith(PREF)}
        if prefs:
            self.save_prefs(prefs)
        changes = {k: v for k, v in (changes or {}).items() if not k.startswith(PREF)}
        if changes:
            self.app.controller.apply_settings(changes)

    def save_prefs(self, changes: dict[str, bool]) -> None:
        """Write the app's preferences (prefs.json) at once; a failure is one line, the chat goes on."""
        from ..prefs import load_prefs, save_prefs
        try:
            path = save_prefs(dataclasses.replace(load_prefs()[0], **changes))
        except OSError as e:
            self.app.notify(f"preferences not saved: {e}", severity="error")
            return
        names = ", ".join(f"{k.replace('_', '-')} = {'on' if v else 'off'}" for k, v in changes.items())
        self.app.notify(f"{names} (saved in {path})")
