"""Text entering tinychat (a paste, `-p`, `-f`, a line of `--plain`'s stdin): line breaks made one kind.

Terminals send a pasted line break as a carriage return (CR) more often than not, and files from Windows end lines
with CRLF. The model was trained on LF only, the markdown export and the session file keep what was sent, and
CR shows as `␍` in the view: so every entry point turns CRLF and a lone CR into LF before the text goes anywhere.
Torch-free, no imports."""
from __future__ import annotations


def lf(text: str) -> str:
    """`text` with CRLF and lone CR line breaks as LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def count_lines(text: str) -> int:
    """Lines of `text` as an editor shows them (after lf): one more than its line breaks."""
    return lf(text).count("\n") + 1
