"""The app's screens: help, settings, sessions, and small dialogs."""
from .dialogs import ConfirmDialog, TextDialog
from .help import HelpScreen
from .sessions import SessionsScreen
from .settings import SettingsScreen

__all__ = ["ConfirmDialog", "HelpScreen", "SessionsScreen", "SettingsScreen", "TextDialog"]
