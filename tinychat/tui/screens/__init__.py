"""The app's screens: help, settings, sessions, and small dialogs. Imported when first opened (PEP 562: a name here
imports its module on first use), so the app's window does not wait for them (the help screen's Markdown, the
sessions list): `from tinychat.tui.screens.help import HelpScreen` imports only that one."""
from __future__ import annotations

import importlib

_WHERE = {"ConfirmDialog": "dialogs", "TextDialog": "dialogs", "HelpScreen": "help", "SessionsScreen": "sessions",
          "SettingsScreen": "settings"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
