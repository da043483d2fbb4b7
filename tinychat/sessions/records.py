"""A session's records: Session and Message (what a session file holds, in memory), SessionInfo (a listing's row),
the errors every part of the file layer raises, and the constants of the file format that both the reader
(sessions/read.py) and the writer (sessions/session.py) follow.

No I/O here and nothing from session.py or read.py (both import this), so no import cycle. Callers import these
names from sessions/session.py, the file layer's public face."""

from __future__ import annotations

import dataclasses
import operator
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinychat.sessions import tree as session_tree
from ..errors import TinychatError

SCHEMA = "tinychat.session"
VERSION = 2  # the tree (sessions/tree.py); version 1 files (one path, no ids) still load
ROLES = ("system", "user", "assistant")
FINISH_REASONS = ("stop", "length", "cancelled", "edited")   # edited: written by the user (chat.edit_reply)

# Ids name files: letters, digits, '-' and '_' only (no dots, no separators), so an id can never escape the
# sessions folder or collide with a snapshot's or temp file's name.
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_ROLE = operator.attrgetter("role")


class SessionError(TinychatError, ValueError):
    """A session file that cannot be used. `str(e)` is one line: '<file>: <what is wrong>'."""


class SessionConflict(SessionError):
    """The file on disk changed since this copy was read (another copy was saved over it): not overwritten."""


class SessionLocked(SessionError):
    """Another process has the session open (holds its lock)."""

    def __init__(self, message: str, session_id: str = "", pid: int | None = None):
        super().__init__(message)
        self.session_id, self.pid = session_id, pid


class SnapshotError(SessionError):
    """The session was saved but its KV snapshot was not (a full disk, a folder in its place)."""


@dataclass
class Message:
    role: str  # one of ROLES
    content: str
    token_ids: list[int] = field(default_factory=list)  # the message's whole ChatML frame, as in the context
    created: float = field(default_factory=time.time)  # unix seconds
    # Assistant turns only (None elsewhere):
    settings: dict[str, Any] | None = None  # sampler settings this turn was generated with
    seed: int | None = None  # the turn's random seed
    finish: str | None = None  # one of FINISH_REASONS
    timing_ms: list[float] | None = None  # per sampled token, milliseconds (optional)
    # The tree (version 2; sessions/tree.py): 0 = not yet given an id (link() gives one before a save)
    id: int = 0
    parent: int | None = None  # the message before this one on its path (None: a root)
    fork: dict[str, Any] | None = None  # a reply forced at a token: {"position": int, "token": int} (branches.Fork)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Session:
    id: str
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model: dict[str, Any] = field(default_factory=lambda: {"name": "", "hash": ""})  # name, hash (+ free extras)
    tokenizer_hash: str = ""
    quant: str = "none"  # weight mode the turns ran under, e.g. "none", "int8", "bf16"
    device: str = "cpu"  # device kind, e.g. "cpu", "cuda"
    settings: dict[str, Any] = field(default_factory=dict)  # session-wide sampler defaults
    messages: list[Message] = field(default_factory=list)  # the active path
    branches: list[Message] = field(default_factory=list)  # every message off the active path (sessions/tree.py)
    revision: int = 0  # +1 per save: what the overwrite check compares
    kv_sha256: str = ""  # tensors_sha256 of the KV snapshot saved with this revision ("" = none)

    @classmethod
    def new(cls, **kwargs: Any) -> Session:
        """A fresh session with a new id and the current time."""
        return cls(id=new_id(), **kwargs)

    @property
    def system_prompt(self) -> str:
        """The leading system message's text ('' when there is none); it lives in `messages` like any other."""
        return self.messages[0].content if self.messages and self.messages[0].role == "system" else ""

    @property
    def n_turns(self) -> int:
        return operator.countOf(map(_ROLE, self.messages), "user")

    def context_ids(self) -> list[int]:
        """All messages' ids in order: the context to re-prefill (add the generation prompt to continue)."""
        return [t for m in self.messages for t in m.token_ids]

    def to_dict(self) -> dict[str, Any]:
        session_tree.link(self)
        d = {"schema": SCHEMA, "version": VERSION}
        d.update(dataclasses.asdict(self))
        return d


@dataclass(frozen=True)
class SessionInfo:
    """One row of `list_sessions`."""

    id: str
    path: Path
    title: str
    updated: float
    n_turns: int
    model: str = ""  # the name of the model it was recorded with ("default": the shipped one)


# -- ids ------------------------------------------------------------------------------------------------------


_LAST_ID = [(-1, 0)]            # (millisecond, suffix) of the last id this process made
_ID_LOCK = threading.Lock()


def new_id(now: float | None = None) -> str:
    """'YYYYMMDD-HHMMSS-mmm-xxxxxx' (UTC time, then 24 bits): sorts by creation time. The bits are random for the first
    id of a millisecond and count up from there for the next ones this process makes in it, so ids made together
    never collide (random bits alone did: 500 in one millisecond share one about once in 130 runs) and sort in the
    order they were made; two processes collide only on the same random bits in the same millisecond."""
    t = time.time() if now is None else now
    ms = int(t * 1000)
    with _ID_LOCK:
        last_ms, last = _LAST_ID[0]
        suffix = (last + 1) % (1 << 24) if ms == last_ms else secrets.randbelow(1 << 24)
        _LAST_ID[0] = (ms, suffix)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(t))
    return f"{stamp}-{ms % 1000:03d}-{suffix:06x}"
