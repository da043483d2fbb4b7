"""Text helpers shared by the widgets: visible control characters, token labels, sizes."""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def visible(text: str) -> str:
    """Text safe for the terminal: C0 controls (but newline and tab) and DEL shown as control pictures."""
    return _CONTROL.sub(lambda m: chr(0x2400 + ord(m.group())) if m.group() != "\x7f" else "\u2421", text)


def token_label(s: str, width: int = 12) -> str:
    """A token's text for the inspector and the token view: whitespace made visible, clipped to `width`."""
    s = visible(s).replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
    if not s:
        s = "∅"
    return s if len(s) <= width else s[:width - 1] + "…"


def size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
