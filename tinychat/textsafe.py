"""Text from files and users, made safe to print on a terminal.

A title, a message or a file name can hold control characters: ESC starts the CSI / OSC sequences that clear the
screen, set the window title or write the clipboard (OSC 52), and the C1 range (U+0080..U+009F) holds one-character
forms of the same introducers. Everything tinychat prints from a file or a user goes through `safe_line` (one line:
titles, errors, list rows) or `safe_text` (keeps newlines and tabs: message text), and what the app draws through
`visible` (control pictures). Control characters become visible escapes (`\\x1b`), so nothing is lost from view and
nothing reaches the terminal raw. A pipe gets the same escaped text as a terminal (it often ends at one: `| less
-R`, `| tee`); the exact text is in --json output and in `sessions export` (to a file, or --format json). Also
`plural`, for counts in what is printed. Torch-free, no imports."""
from __future__ import annotations

import re

# C0 controls, DEL and C1 controls; `safe_text` keeps \t and \n. Bidi overrides (U+202A..U+202E, U+2066..U+2069)
# can make a line read differently from what it holds, so they are escaped too.
_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def plural(n: int, noun: str, nouns: str = "") -> str:
    """n with its noun: "1 turn", "2 turns", "1,500 tokens" (nouns: the plural when it is not noun + "s")."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def safe_line(text: object) -> str:
    """One printable line: every control character (newlines too) as a visible escape."""
    return _LINE.sub(_escape, str(text))


def safe_text(text: object) -> str:
    """Printable text that keeps its lines: control characters but \\n and \\t as visible escapes; \\r\\n -> \\n."""
    return _TEXT.sub(_escape, str(text).replace("\r\n", "\n"))


_PICTURE = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_WIDE = re.compile("[\x80-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: object) -> str:
    """The same escaping for a full-screen app (the Textual UI): C0 controls but newline and tab, and DEL, as their
    Unicode pictures (ESC as ␛, BEL as ␇: one cell each, so a line keeps its layout), the C1 controls and bidi
    overrides as visible escapes (\\x9b, \\u202e)."""
    text = _PICTURE.sub(lambda m: chr(0x2400 + ord(m.group())) if m.group() != "\x7f" else "\u2421", str(text))
    return _WIDE.sub(_escape, text)


def strip_controls(text: str) -> str:
    """Text with every control character removed (what a title may hold), whitespace runs kept as they were."""
    return _LINE.sub("", text)


def has_controls(text: str) -> bool:
    return _LINE.search(text) is not None
