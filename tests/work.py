"""Work bounds without clocks: the lines of tinychat's own Python a call executes, counted by a trace function.

Unit tests do not assert times (a shared, loaded machine makes them flaky, and a slow run is not a wrong one), but a
quadratic walk, or a loop over a size a file only claims, must still fail a test. The number of lines tinychat's code
executes is such a measure: it is the same on every machine and every run, it grows with the work a Python loop
does, and a budget stops the call as soon as it is spent, so a regression fails at once instead of hanging.

What it does not see: work inside C (json parsing, list.index, torch kernels) and in other packages' Python. Bounds
on allocation are separate (e.g. the size of every model built, test_model_fuzz.Built)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

PACKAGE = str(Path(__file__).resolve().parents[1] / "tinychat")


class _Spent(BaseException):
    """Raised inside the traced call when its budget is spent: a BaseException, so no `except Exception` in tinychat
    turns it into an ordinary error and goes on untraced."""


def lines_run(fn: Callable[[], Any], budget: int | None = None) -> tuple[Any, int]:
    """(fn(), how many lines of tinychat's Python it executed, in this thread). With a budget, an AssertionError as
    soon as it executes more: the call is cut short, not waited for."""
    count = 0

    def local(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
            if budget is not None and count > budget:
                raise _Spent
        return local

    def on_call(frame, event, arg):
        return local if frame.f_code.co_filename.startswith(PACKAGE) else None

    old = sys.gettrace()
    sys.settrace(on_call)
    try:
        result = fn()
    except _Spent:
        raise AssertionError(f"more than {budget:,} lines of tinychat executed") from None
    finally:
        sys.settrace(old)
    if budget is not None and count > budget:          # the trace was dropped (an error in it): still over
        raise AssertionError(f"more than {budget:,} lines of tinychat executed ({count:,})")
    return result, count


class Lines:
    """The lines of tinychat's Python this thread executes inside a `with` block: for code that awaits (a Textual
    pilot), which lines_run's function call cannot hold. Coroutines the block resumes in this thread are counted
    too (the app's handlers under run_test); other threads are not. `.count` after the block. No budget: cutting a
    call short inside an event loop would be caught by whatever runs the callback, not fail the test."""

    def __init__(self):
        self.count = 0

    def _local(self, frame, event, arg):
        if event == "line":
            self.count += 1
        return self._local

    def _on_call(self, frame, event, arg):
        return self._local if frame.f_code.co_filename.startswith(PACKAGE) else None

    def __enter__(self) -> Lines:
        self._old = sys.gettrace()
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc) -> None:
        sys.settrace(self._old)
