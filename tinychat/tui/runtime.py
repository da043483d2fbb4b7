"""The worker side of the app: how it gets a chat (load the model once, open new or saved sessions on it), and
the token batcher that turns per-token callbacks on the decode thread into a few UI messages per second.

Everything here runs on worker threads; it imports the chat runtime (and so torch) lazily, inside functions, so
the window appears before torch and the model load."""
from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from ..loading import Runtime
from .messages import TokenItem

_FIXED = os.environ.get("TINYCHAT_UI_BATCH_MS")       # a fixed batch interval (experiments), else adaptive


class Pace:
    """How often the decode thread posts token batches.

    The UI thread and the decode thread share the GIL: while the UI renders an update (markdown, inspector, a
    frame: 10-40 ms of Python on a busy machine) the decode thread mostly waits. How much that costs depends on the
    decode: a step that spends its time in large matmuls (GIL released) hardly notices; a fast int8 step made of many
    small ops (each taking the GIL back) stalls for the whole update. So the interval follows three rules and takes
    the largest, within [lo, hi_fast] seconds:
    - stalls, seen by the decode thread itself: the time its steps take beyond twice the recent median step. Above
      `stall` of the decode time the interval grows by half; well below it, it shrinks back (to `lo` when the UI
      costs the decode nothing);
    - the UI thread's own CPU time per batch, so the UI stays under `ui_duty` of one core (within [lo, ui_hi]): on a
      machine with no idle core, UI time is taken from the decode whatever the GIL does (and on two vCPUs that
      share a core, even the C parts of the step slow down while the UI and the terminal draw). A batch costs the
      UI tens of ms (the reply's layout, the inspector, a second frame for the grown paragraph), so a decode gets a
      few updates a second at most.
    - a fast decode (median step under FAST_STEP_MS: 400+ tok/s) gets one update every `hi_fast` seconds: at that
      rate an update carries more text than anyone reads along, a 600-token reply is done in about a second, and
      every update stalls the decode for the frame it causes (figures: docs/benchmarks.md, "The app").
    `fixed` (TINYCHAT_UI_BATCH_MS, or set by tests) pins the interval."""

    WINDOW_MS = 500.0           # stalls are judged over this much decode time
    FAST_STEP_MS = 2.5

    def __init__(self, stall: float = 0.05, ui_duty: float = 0.05, lo: float = 0.03, hi: float = 0.5,
                 ui_hi: float = 0.5, hi_fast: float = 1.0):
        self.stall, self.ui_duty, self.lo, self.hi, self.ui_hi = stall, ui_duty, lo, hi, ui_hi
        self.hi_fast = hi_fast
        self.fixed: float | None = float(_FIXED) / 1000 if _FIXED else None
        self.fast = False               # the decode's median step is under FAST_STEP_MS
        self.ui_interval = lo
        self.stall_interval = lo
        self._steps: deque[float] = deque(maxlen=31)
        self._excess = 0.0
        self._total = 0.0

    @property
    def interval(self) -> float:
        if self.fixed is not None:
            return self.fixed
        v = max(self.ui_interval, self.stall_interval)
        return max(v, self.hi_fast) if self.fast else v

    def observe(self, ui_cpu_s: float) -> None:
        """The UI thread's CPU time over the last batch cycle (called on the UI thread)."""
        target = min(self.ui_hi, max(self.lo, ui_cpu_s / self.ui_duty))
        self.ui_interval = 0.6 * self.ui_interval + 0.4 * target

    def step(self, ms: float) -> None:
        """One decode step's time (called on the decode thread, for every token but a turn's first)."""
        steps = self._steps
        steps.append(ms)
        if len(steps) < 8:
            return
        base = sorted(steps)[len(steps) // 2]
        self.fast = base < self.FAST_STEP_MS
        self._excess += max(0.0, ms - 2 * base)
        self._total += ms
        if self._total >= self.WINDOW_MS:
            share = self._excess / self._total
            if share > self.stall:
                self.stall_interval = min(self.hi, self.stall_interval * 1.5)
            elif share < self.stall / 3:
                self.stall_interval = max(self.lo, self.stall_interval / 1.25)
            self._excess = self._total = 0.0


class TokenBatcher:
    """Collects (index, token, text, trace, ms) from `on_token` and calls `post(items)` once `pace.interval`
    seconds have passed since the last post (the turn's first post: `pace.lo` after the batcher was made, so the
    first words show at once whatever the pace); `flush()` posts the rest. Runs on the decode thread."""

    def __init__(self, post: Callable[[list[TokenItem]], None], pace: Pace | None = None):
        self.post = post
        self.pace = pace or Pace()
        self.items: list[TokenItem] = []
        self.last = time.perf_counter()
        self.posted = False

    def __call__(self, index, token, text, trace, ms) -> None:
        self.items.append(TokenItem(index, token, text, trace, ms))
        if index > 0 and token >= 0:
            self.pace.step(ms)
        now = time.perf_counter()
        pace = self.pace
        if now - self.last >= (pace.interval if self.posted or pace.fixed is not None else pace.lo):
            self.last = now
            self.posted = True
            self.flush()

    def flush(self) -> None:
        if self.items:
            items, self.items = self.items, []
            self.post(items)


def cache_figures(chat) -> dict:
    """The chat's cache fill for the status bar while a reply streams (read on the decode thread, between steps: a
    CPU-side length and a product of sizes, no device work)."""
    cache = chat.cache
    return {"cache_tokens": int(cache.lens_cpu[0]), "cache_bytes": cache.used_bytes()}


class Backend:
    """How the app gets chats. `load()` (on a worker) resolves the device and opens the first chat: a new one, or
    `session` when given; `open(ref)` opens another session (or a new chat when ref is None) on the same model,
    loaded again only when `--quant auto` picks another mode for it (a session keeps the mode it was recorded with);
    `switch(where, ref)` opens a session on another model. Chats are built with `tinychat.loading.open_chat`, the
    same construction as the plain mode."""

    sess = None             # the recorded session a replay backend plays back (None: a chat)

    def __init__(self, model: Path | None = None, quant: str = "auto", device: str = "cpu", settings=None,
                 overrides: dict | None = None, session: str | None = None, options=None, autosave: bool = True):
        self.model_path, self.quant, self.device, self.options = model, quant, device, options
        self.autosave = autosave                # False: --no-save
        self.settings, self.overrides, self.session = settings, dict(overrides or {}), session
        self.rt: Runtime | None = None
        self.rt_mode: str | None = None         # the mode rt's model was loaded for (quantized in place by a chat)

    def load(self):
        """The first chat (loads the model)."""
        from ..loading import resolve_device
        self.device = resolve_device(self.device)      # "auto" -> cpu or cuda (imports torch: on the worker)
        chat = self.open(self.session, first=True)
        chat.settle_threads()                           # the step's thread count measured before the first reply
        return chat

    def mode_for(self, session_ref: str | None) -> tuple[str, str | None]:
        """(mode, why auto chose it) for a chat on session_ref (None: a new chat); see loading.resolve_quant."""
        from ..loading import resolve_quant
        sess = None
        if self.quant == "auto" and session_ref is not None:
            from ..sessions import session as session_files
            try:
                sess = session_files.load(session_ref)
            except session_files.SessionError:
                pass                                    # open_chat's own load reports it
        return resolve_quant(self.quant, self.device, sess)

    def runtime(self, path: Path | None, mode: str) -> Runtime:
        """The model at path loaded for mode: the one held when it matches, else loaded anew."""
        from ..loading import load_runtime
        if self.rt is not None and self.rt_mode == mode and path == self.model_path:
            return self.rt
        return load_runtime(path, mode)

    def open(self, session_ref: str | None = None, first: bool = False):
        from ..loading import open_chat
        settings = self.settings if first or session_ref is None else None
        overrides = self.overrides if first or session_ref is None else {}     # flags: every new chat, first session
        mode, why = self.mode_for(session_ref)
        rt = self.runtime(self.model_path, mode)
        chat = open_chat(rt, mode, self.device, settings, overrides, session_ref, self.options, quant_why=why,
                         autosave=self.autosave)
        self.rt, self.rt_mode = rt, mode
        return chat

    def token_strings(self) -> list[str]:
        return self.rt.tokenizer.token_strings()

    def find_model(self, name: str):
        """Where the model a session names is, when it is here and not the one loaded: the shipped model for
        "default", else an imported model of that name; None otherwise. What `switch` takes."""
        from ..loading import default_model_path, named_model
        path = default_model_path() if name == "default" else named_model(name)
        if path is None:
            return None
        loaded = self.model_path if self.model_path is not None else default_model_path()
        if loaded is not None and Path(path).resolve() == Path(loaded).resolve():
            return None
        return path

    def switch(self, where, session_ref: str):
        """Load the model at `where` (find_model's) and open session_ref on it; the loaded model is replaced only when
        both worked (a failure leaves the app on the model it had)."""
        from ..loading import open_chat
        mode, why = self.mode_for(session_ref)
        rt = self.runtime(where, mode)
        chat = open_chat(rt, mode, self.device, None, {}, session_ref, self.options, quant_why=why,
                         autosave=self.autosave)
        self.rt, self.rt_mode, self.model_path = rt, mode, where
        return chat


class ReplayBackend(Backend):
    """Loads the model for replaying a recorded session: a fresh chat, autosave off (as `tinychat replay`)."""

    def __init__(self, sess, model: Path | None = None, device: str = "cpu"):
        super().__init__(model=model, quant=sess.quant, device=device)
        self.sess = sess

    def open(self, session_ref=None, first: bool = False):
        from ..loading import open_replay_chat
        self.rt, self.rt_mode = self.runtime(self.model_path, self.sess.quant), self.sess.quant
        return open_replay_chat(self.rt, self.sess, self.device)


class FactoryBackend(Backend):
    """For tests and embedding: chats from a callable `factory(session_ref | None) -> Chat` (the tokenizer is
    taken from the chat)."""

    def __init__(self, factory: Callable[[str | None], Any], session: str | None = None, replay=None,
                 others: dict[str, Callable[[str | None], Any]] | None = None):
        super().__init__(session=session)
        self.factory = factory
        self.sess = replay
        self._tok = None
        self.others = dict(others or {})        # other models by name: factories a session may switch the app to

    def load(self):
        chat = self.factory(self.session)
        self._tok = chat.tok
        return chat

    def open(self, session_ref=None, first: bool = False):
        return self.factory(session_ref)

    def token_strings(self) -> list[str]:
        return self._tok.token_strings()

    def find_model(self, name: str):
        return name if name in self.others and self.others[name] is not self.factory else None

    def switch(self, where, session_ref: str):
        chat = self.others[where](session_ref)
        self.factory, self._tok = self.others[where], chat.tok
        return chat
