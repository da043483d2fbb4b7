"""The importer's one error: a source it cannot turn into a tinychat model, with a one-line reason for the user."""

from ..errors import TinychatError


class ImportRefused(TinychatError, ValueError):
    """A checkpoint tinychat cannot import (unsupported architecture, missing file, ...): the message is one line
    that says what is missing."""
