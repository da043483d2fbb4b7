"""Which teacher replies are unusable as training targets: cut off, a control token, empty, not English, a loop.

Shared by the v1 driver (generate.py's Conversation) and the v2 one (dialogue.py).
"""
from __future__ import annotations

import re
from collections import Counter

# ----------------------------------------------------------------------------------------------

_TYPOGRAPHIC = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"',
                              "\u2014": "-", "\u2013": "-", "\u2026": "...", "\u00a0": " ",
                              "\u00e9": "e", "\u00b0": "o"})
_STOPWORDS = frozenset("""the a an and or but of to in on at for with is are was were be it this that
you your i my me we our they he she his her its as by from not can will do have has so if
what how why when there their them all some more""".split())
_WORD = re.compile(r"[a-z']+")


def degenerate_reason(text: str, stopped: bool, special: bool = False) -> str | None:
    """Why a reply is unusable, or None if it is fine.

    truncated: no <|im_end|> within max_new tokens; special: a control token inside the reply;
    empty: no letters or digits; non_english: > 2 % non-ASCII characters (after mapping curly quotes,
    dashes, ellipsis), < 50 % letters among non-space characters, or >= 8 words without a single
    common English function word; loop: a word 4-gram occurring 3+ times, a non-empty line repeated
    3+ times, or fewer than half of the word 3-grams distinct (replies of 30+ words).
    """
    if not stopped:
        return "truncated"
    if special:
        return "special"
    t = text.strip()
    if not any(ch.isalnum() for ch in t):
        return "empty"
    plain = t.translate(_TYPOGRAPHIC)
    chars = [ch for ch in plain if not ch.isspace()]
    if sum(not ch.isascii() for ch in chars) > 0.02 * len(chars):
        return "non_english"
    if sum(ch.isalpha() for ch in chars) < 0.5 * len(chars):
        return "non_english"
    words = _WORD.findall(plain.lower())
    if len(words) >= 8 and not any(w in _STOPWORDS for w in words):
        return "non_english"
    grams4 = Counter(tuple(words[i:i + 4]) for i in range(len(words) - 3))
    if grams4 and grams4.most_common(1)[0][1] >= 3:
        return "loop"
    lines = Counter(ln.strip().lower() for ln in t.splitlines() if ln.strip())
    if lines and lines.most_common(1)[0][1] >= 3:
        return "loop"
    if len(words) >= 30:
        grams3 = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
        if len(set(grams3)) < 0.5 * len(grams3):
            return "loop"
    return None
