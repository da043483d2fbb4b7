"""The app's chat state, in one place: which chat is open, which operation runs (Busy), what waits for the operation
to end, the replies this app decoded. The controller (controller.py) owns the one ChatState and reads and writes it on
the UI thread only: a job on the chat thread gets what it needs in its arguments (jobs.py) and never reads this. No
torch, no widgets."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..chat.runtime import Chat


class Busy(str, Enum):
    """The operation running on the chat thread (None when idle). A str, so it reads as its name in messages."""
    LOAD = "load"
    SEND = "send"
    REGEN = "regen"
    UNDO = "undo"
    NEW = "new"
    SET = "set"
    OPEN = "open"
    SAVE = "save"
    ALT = "alt"
    EDIT = "edit"
    AB = "ab"
    FORK = "fork"
    REPLAY = "replay"

    @property
    def decoding(self) -> bool:
        """A reply is being generated (Esc stops it; the cursor does not blink meanwhile)."""
        return self in (Busy.SEND, Busy.REGEN, Busy.EDIT, Busy.FORK, Busy.REPLAY)


@dataclass
class LiveFigures:
    """The running reply's speed, from the tokens' step times: the first token's (TTFT) and the rest's."""
    n: int = 0                      # tokens so far
    ms: float = 0.0                 # step time of every token after the first
    ttft: float | None = None       # the first token's time, ms

    def add(self, ms: float) -> None:
        self.n += 1
        if self.ttft is None:
            self.ttft = ms
        else:
            self.ms += ms

    @property
    def tok_s(self) -> float | None:
        return (self.n - 1) / (self.ms / 1000) if self.n > 1 and self.ms > 0 else None


KNOWN_REPLIES = 64     # decoded replies whose traces the app keeps for views rebuilt from the session


@dataclass
class ChatState:
    chat: Chat | None = None                        # the open chat (None until the model is loaded)
    busy: Busy | None = Busy.LOAD                   # the running operation, None when idle
    turn_id: int = 0                                # the reply being written (replay: minus its turn number)
    job_text: str = ""                              # the message being sent (back to the input if the turn fails)
    pending_settings: dict[str, str] = field(default_factory=dict)   # applied when the running operation ends
    edit_index: int | None = None                   # /edit: the user message the next send replaces (a new branch)
    queued: str | None = None                       # a message sent while the model loads: sent once it is ready
    # replies decoded in this app: (session id, message id) -> (content token ids, traces by token index, counters,
    # meta line), so a view rebuilt from the session (switching alternatives, keeping an A/B side) still shows how
    # their tokens were chosen. Message ids count from 1 in every session, so the session id is part of the key, and
    # the tokens must match too: a record belongs to one reply, never to a position.
    known: dict[tuple[str, int], tuple[tuple[int, ...], dict, Any, str]] = field(default_factory=dict)

    def remember(self, session_id: str, message_id: int, tokens, traces: dict, stats: Any, meta: str) -> None:
        """Keep a decoded reply's figures and traces (the last KNOWN_REPLIES of them)."""
        if not message_id:
            return
        key = (session_id, message_id)
        self.known.pop(key, None)
        self.known[key] = (tuple(tokens), dict(traces), stats, meta)
        while len(self.known) > KNOWN_REPLIES:
            self.known.pop(next(iter(self.known)))

    def recall(self, session_id: str, message_id: int, tokens) -> tuple[dict, Any, str] | None:
        """(traces, counters, meta) of the reply this app decoded as message_id of session_id with exactly these
        content tokens; None for any other (a restored reply, a message of another session with the same id)."""
        rec = self.known.get((session_id, message_id))
        if rec is None or rec[0] != tuple(tokens):
            return None
        return rec[1], rec[2], rec[3]
