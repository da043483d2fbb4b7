"""Text metrics of replies, no model: words, distinct-n, dictionary words, loops."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from ..errors import TinychatError

DEFAULT_WORDS = "/usr/share/dict/words"
_WORD_RE = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


class EvalError(TinychatError, ValueError):
    """Something the evaluation needs is missing; one line, fit for the user."""


# -- metrics on text (no model) -----------------------------------------------------------------------------------

def words(text: str) -> list[str]:
    """Lowercased words: runs of letters, with inner apostrophes (curly ones count as straight)."""
    return [w.lower() for w in _WORD_RE.findall(text.replace("\u2019", "'").replace("\u2018", "'"))]


def distinct_n(replies: Iterable[str], n: int = 2) -> float:
    """Distinct word n-grams / all word n-grams, pooled over the replies (n-grams never span two replies)."""
    grams = [tuple(w[i:i + n]) for w in map(words, replies) for i in range(len(w) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def load_wordlist(path: str | Path = DEFAULT_WORDS) -> frozenset[str]:
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"word list {p} not found: install one (Debian: apt-get install -y wamerican) "
                        "or pass --words FILE (one word per line)")
    ws = frozenset(w.strip().lower().replace("\u2019", "'") for w in p.read_text(encoding="utf-8", errors="replace")
                   .splitlines() if w.strip())
    if not ws:
        raise EvalError(f"word list {p} is empty")
    return ws


def is_word(w: str, wordset: frozenset[str]) -> bool:
    if w in wordset:
        return True
    return w.endswith("'s") and w[:-2] in wordset


def dictionary_fraction(replies: Iterable[str], wordset: frozenset[str]) -> float:
    ws = [w for r in replies for w in words(r)]
    return sum(is_word(w, wordset) for w in ws) / len(ws) if ws else 0.0


def has_loop(text: str, n: int = 4, times: int = 3) -> bool:
    """One word n-gram occurs ``times`` or more times in the text (the degenerate repetition a user sees)."""
    w = words(text)
    grams = Counter(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return bool(grams) and grams.most_common(1)[0][1] >= times


def loop_rate(replies: Iterable[str]) -> float:
    """The fraction of replies with a loop (:func:`has_loop`)."""
    rs = list(replies)
    return sum(map(has_loop, rs)) / len(rs) if rs else 0.0


def assistant_bytes(conversations) -> int:
    """Bytes of assistant text, + 1 per assistant message for its end of turn: the per-byte denominator shared
    by every model (whatever its tokenizer)."""
    return sum(len(m["content"].encode("utf-8")) + 1 for c in conversations for m in c if m["role"] == "assistant")
