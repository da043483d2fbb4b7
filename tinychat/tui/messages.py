"""Messages from the app's workers to its widgets (dataclasses; posted from worker threads with `post_message`).

Worker threads never touch widgets: everything they learn reaches the UI as one of these, handled on the
event loop. Token updates are batched (see `runtime.TokenBatcher`), so the UI gets tens of them per second, not
one per token. Fields hold plain Python objects: traces are `tinychat.sampler.TokenTrace` instances, but the UI
only reads their attributes and never imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:                       # types only: the UI never imports the chat runtime (torch) at run time
    from ..chat.ab import ABResult
    from ..chat.runtime import Chat, TurnResult
    from ..chat.replay import TurnReplay
    from ..sampler import TokenTrace
    from .state import Busy


@dataclass
class TokenItem:
    """One sampled token as the UI sees it."""
    index: int                  # position in the reply (-1: trailing text flushed after the last token)
    token: int                  # token id (-1 for flushed text)
    text: str                   # the text this token completed (may be "" mid-character)
    trace: TokenTrace | None = None
    ms: float = 0.0             # time since the previous token


@dataclass
class RuntimeReady(Message):
    """The model is loaded and a chat is open."""
    chat: Chat
    token_strings: list[str]    # display text of every token id
    note: str = ""              # e.g. "continuing session X (3 turns)"
    status: dict = field(default_factory=dict)


@dataclass
class ChatOpened(Message):
    """A different chat (a saved session, or a new one) replaces the current one."""
    chat: Chat
    note: str = ""
    status: dict = field(default_factory=dict)
    token_strings: list[str] | None = None      # the new model's, when the chat came with a switch of models


@dataclass
class TokensReady(Message):
    """A batch of newly sampled tokens of the running reply."""
    turn_id: int
    items: list[TokenItem]
    cache: dict | None = None   # the cache's fill as the batch left: {"cache_tokens": n, "cache_bytes": b}


@dataclass
class TurnFinished(Message):
    """The running reply is complete (stopped, cancelled or cut off at max-new)."""
    turn_id: int
    result: TurnResult
    status: dict = field(default_factory=dict)   # chat.status() read on the worker right after the turn
    warning: str | None = None                   # the autosave after the turn failed: one line (the turn is kept)
    notice: str | None = None                    # one line worth telling (the turn ran on another int8 step)


@dataclass
class ReplayTurnStarted(Message):
    turn: int                   # 1-based
    user_text: str
    recorded: list[int]         # the recorded reply's content token ids


@dataclass
class ReplayTurnFinished(Message):
    turn: int
    replay: TurnReplay


@dataclass
class ReplayFinished(Message):
    turns: int
    divergences: list[str]
    stopped: bool = False
    status: dict = field(default_factory=dict)


@dataclass
class JobDone(Message):
    """A chat operation other than a turn finished on the worker: undo (value: the user text taken back), new chat,
    settings (value: {field: the value applied}), save (value: the path, or None when there was nothing to save),
    a switch of alternatives or an edited reply (value: (place, of n))."""
    kind: Busy
    value: Any = None
    status: dict = field(default_factory=dict)
    warning: str | None = None      # the autosave after it failed: one line (the change is kept)


@dataclass
class AbReady(Message):
    """The sampler A/B's two decodes are done (tinychat/chat/ab.py); side A is the active reply."""
    result: ABResult
    status: dict = field(default_factory=dict)
    warning: str | None = None      # the autosave after it failed: one line
