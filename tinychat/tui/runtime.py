"""The worker side of the app: how it gets a chat (load the model once, open new or saved sessions on it), and
the token batcher that turns per-token callbacks on the decode thread into a few UI messages per second.

Everything here runs on worker threads; it imports the chat runtime (and so torch) lazily, inside functions, so
the window appears before torch and the model load."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .messages import TokenItem

_FIXED = os.environ.get("TINYCHAT_UI_BATCH_MS")       # a fixed batch interval (experiments), else adaptive


class Pace:
    """How often the decode thread posts token batches. The UI thread and the decode thread share the GIL: every
    bit of UI work (markdown, inspector, a frame) stalls decoding, more so on a busy machine. So the interval adapts
    to what one update costs the UI thread (its CPU time from one batch to the next, smoothed): the UI spends at
    most `duty` of the time on the stream, within [lo, hi] seconds between updates (30-60 ms on a quiet laptop,
    up to 250 ms on an overloaded machine). `fixed` (TINYCHAT_UI_BATCH_MS, or set by tests) pins it."""

    def __init__(self, duty: float = 0.05, lo: float = 0.03, hi: float = 0.25):
        self.duty, self.lo, self.hi = duty, lo, hi
        self.fixed: float | None = float(_FIXED) / 1000 if _FIXED else None
        self.estimate = lo

    @property
    def interval(self) -> float:
        return self.fixed if self.fixed is not None else self.estimate

    def observe(self, ui_cpu_s: float) -> None:
        """The UI thread's CPU time over the last batch cycle."""
        target = min(self.hi, max(self.lo, ui_cpu_s / self.duty))
        self.estimate = 0.6 * self.estimate + 0.4 * target


class TokenBatcher:
    """Collects (index, token, text, trace, ms) from `on_token` and calls `post(items)` once `pace.interval`
    seconds have passed since the last post; `flush()` posts the rest. Runs on the decode thread."""

    def __init__(self, post: Callable[[list[TokenItem]], None], pace: Pace | None = None):
        self.post = post
        self.pace = pace or Pace()
        self.items: list[TokenItem] = []
        self.last = time.perf_counter()

    def __call__(self, index, token, text, trace, ms) -> None:
        self.items.append(TokenItem(index, token, text, trace, ms))
        now = time.perf_counter()
        if now - self.last >= self.pace.interval:
            self.last = now
            self.flush()

    def flush(self) -> None:
        if self.items:
            items, self.items = self.items, []
            self.post(items)


@dataclass
class Runtime:
    """A loaded model: what `tinychat.cli.load_runtime` returns."""
    model: Any
    tokenizer: Any
    name: str
    identity: str


class Backend:
    """How the app gets chats. `load()` (on a worker) loads the model and opens the first chat: a new one, or
    `session` when given; `open(ref)` opens another session (or a new chat when ref is None) on the same model.
    Chats are built with `tinychat.cli._open_chat`, the same construction as the plain mode."""

    def __init__(self, model: Path | None = None, quant: str = "none", device: str = "cpu", settings=None,
                 overrides: dict | None = None, session: str | None = None):
        self.model_path, self.quant, self.device = model, quant, device
        self.settings, self.overrides, self.session = settings, dict(overrides or {}), session
        self.rt: Runtime | None = None

    def load_runtime(self) -> Runtime:
        from ..cli import load_runtime
        return Runtime(*load_runtime(self.model_path))

    def load(self):
        """The first chat (loads the model)."""
        if self.rt is None:
            self.rt = self.load_runtime()
        return self.open(self.session, first=True)

    def open(self, session_ref: str | None = None, first: bool = False):
        from ..cli import _open_chat
        rt = self.rt
        settings = self.settings if first or session_ref is None else None
        overrides = self.overrides if first else {}
        return _open_chat(rt.model, rt.tokenizer, rt.name, rt.identity, self.quant, self.device, settings,
                          overrides, session_ref)

    def token_strings(self) -> list[str]:
        return self.rt.tokenizer.token_strings()


class ReplayBackend(Backend):
    """Loads the model for replaying a recorded session: a fresh chat, autosave off (as `tinychat replay`)."""

    def __init__(self, sess, model: Path | None = None, device: str = "cpu"):
        super().__init__(model=model, quant=sess.quant, device=device)
        self.sess = sess

    def open(self, session_ref=None, first: bool = False):
        from ..chat import Chat, ChatSettings
        rt, sess = self.rt, self.sess
        return Chat(rt.model, rt.tokenizer, ChatSettings(system_prompt=sess.system_prompt), quant=sess.quant,
                    device=self.device, model_name=rt.name, model_hash=rt.identity, autosave=False,
                    max_len=sess.model.get("max_len"))


class FactoryBackend(Backend):
    """For tests and embedding: chats from a callable `factory(session_ref | None) -> Chat` (the tokenizer is
    taken from the chat)."""

    def __init__(self, factory: Callable[[str | None], Any], session: str | None = None, replay=None):
        super().__init__(session=session)
        self.factory = factory
        self.sess = replay
        self._tok = None

    def load(self):
        chat = self.factory(self.session)
        self._tok = chat.tok
        return chat

    def open(self, session_ref=None, first: bool = False):
        return self.factory(session_ref)

    def token_strings(self) -> list[str]:
        return self._tok.token_strings()
