"""Numbers typed by a user (slash commands, `/set`, flags), read one way everywhere: ASCII digits only.

Python's own readers accept more than a user means: "²".isdigit() is true but int("²") raises; int("١٢") is 12
(Arabic-Indic digits), int("1_000") is 1000, float("nan") and float("1e999") are numbers. Here a number is
`[+-]?[0-9]+` (an integer) or a decimal with an optional exponent, finite, at most MAX_DIGITS characters; anything
else is a ValueError (or the caller's error class) with one line naming what was expected. No imports beyond re.
"""
from __future__ import annotations

import math
import re

MAX_DIGITS = 40     # longer than any setting needs; int() of 5,000 digits is slow and refused by Python anyway

_COUNT = re.compile(r"[0-9]+")
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def is_count(text: object) -> bool:
    """A non-negative integer written with ASCII digits only ("12"; not "²", "١٢", "+1", " 1", "1_0")."""
    return isinstance(text, str) and len(text) <= MAX_DIGITS and _COUNT.fullmatch(text) is not None


def is_integer(text: object) -> bool:
    """An integer with an optional sign, ASCII digits only."""
    return isinstance(text, str) and len(text) <= MAX_DIGITS and _INT.fullmatch(text) is not None


def parse_int(text: str, name: str = "a number", lo: int | None = None, hi: int | None = None,
              error: type[Exception] = ValueError) -> int:
    """text (surrounding spaces allowed) as an integer within [lo, hi]; else `error` naming `name`."""
    t = text.strip() if isinstance(text, str) else text
    if not is_integer(t):
        raise error(f"{name} must be a whole number written with the digits 0-9 (got {_show(text)})")
    return _in_range(int(t), name, lo, hi, error)


def parse_float(text: str, name: str = "a number", lo: float | None = None, hi: float | None = None,
                error: type[Exception] = ValueError) -> float:
    """text (surrounding spaces allowed) as a finite decimal number within [lo, hi]; else `error` naming `name`."""
    t = text.strip() if isinstance(text, str) else text
    if not (isinstance(t, str) and len(t) <= MAX_DIGITS and _FLOAT.fullmatch(t)):
        raise error(f"{name} must be a number written with the digits 0-9 (e.g. 0.8; got {_show(text)})")
    v = float(t)
    if not math.isfinite(v):
        raise error(f"{name} must be a finite number (got {_show(text)})")
    return _in_range(v, name, lo, hi, error)


def _in_range(v, name, lo, hi, error):
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        lo_s = "" if lo is None else f"{lo:g}"
        hi_s = "" if hi is None else f"{hi:g}"
        where = f"between {lo_s} and {hi_s}" if lo is not None and hi is not None else \
            f"at least {lo_s}" if lo is not None else f"at most {hi_s}"
        raise error(f"{name} must be {where} (got {v:g})")
    return v


def _show(text: object) -> str:
    r = repr(text)
    return r if len(r) <= 40 else r[:37] + "..."
