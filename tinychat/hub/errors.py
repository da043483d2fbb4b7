"""The hub commands' one error: a pull, listing or cache lookup that cannot go on, with a one-line reason that says
what to do (the CLI prints it and exits 2)."""

from ..errors import TinychatError


class PullError(TinychatError, ValueError):
    """`tinychat pull` (or a cached repo lookup) cannot go on; the message is one line, fit for the user."""
