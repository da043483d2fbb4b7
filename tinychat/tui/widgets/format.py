"""Text helpers shared by the widgets: visible control characters, token labels, sizes."""
from __future__ import annotations

from ...textsafe import visible  # noqa: F401  (the one escaping of the app: textsafe.visible, control pictures)


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
