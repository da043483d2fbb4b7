"""The one base of tinychat's expected failures.

A `TinychatError` is the user's to act on (a bad flag, file, model or session; a full disk named by its file): its
message is one line fit to print, and the CLI prints it as `tinychat: error: ...` and exits 2. Anything else that
reaches the CLI is a bug: it says "internal error", asks for --debug, and exits 70 (EX_SOFTWARE), so a bug never
looks like a user mistake. The classes keep their older bases too (ValueError, RuntimeError, OSError), so code that
caught those still does."""
from __future__ import annotations


class TinychatError(Exception):
    """An expected failure with a one-line message for the user (exit 2 at the CLI)."""


EXIT_USER = 2        # a TinychatError, a bad flag (click), an OS error naming its file
EXIT_INTERNAL = 70   # anything else: a bug (sysexits.h EX_SOFTWARE)
