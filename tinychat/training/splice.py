"""Topic switches without a teacher: a conversation after an unrelated opening exchange.

Every generated conversation stays on its first topic: its later turns are follow-ups, "the same about another
country" or generic prompts. A student trained only on those continues the last answer's template when the user
changes the subject ("Who wrote Hamlet?" after two capitals: "The capital of Italy is ..."). Splicing makes
conversations that change the subject: the first exchange (user message + the teacher's reply) of one or two
conversations of *other kinds*, then a whole conversation. The teacher wrote each piece in a fresh context; its reply
to a question unrelated to what came before is what it would write after it, so the spliced targets stay the
teacher's, and the student sees that the reply answers the newest message.

    spliced = splice_conversations(train, fraction=0.25, seed=0)   # [(kind, messages)] -> the same, some spliced

Deterministic for a (conversations, fraction, seed); a conversation is spliced in place (no copy added), so an
epoch grows only by the prefixes' tokens.
"""
from __future__ import annotations

import random
from typing import Sequence

PREFIX_CHARS = 600          # an opening exchange longer than this (user + reply characters) is not used as a prefix
TWO_PREFIXES = 0.3          # the share of spliced conversations that get two opening exchanges, not one


def openings(conversations: Sequence[tuple[str, list[dict]]]) -> list[tuple[str, list[dict]]]:
    """(kind, [user, assistant]) first exchanges short enough to be prefixes, in input order."""
    out = []
    for kind, msgs in conversations:
        if not kind or len(msgs) < 2 or msgs[0]["role"] != "user" or msgs[1]["role"] != "assistant":
            continue
        if len(msgs[0]["content"]) + len(msgs[1]["content"]) <= PREFIX_CHARS:
            out.append((kind, [dict(msgs[0]), dict(msgs[1])]))
    return out


def splice_conversations(conversations: Sequence[tuple[str, list[dict]]], fraction: float,
                         seed: int = 0) -> list[tuple[str, list[dict]]]:
    """The conversations with about ``fraction`` of them (those with a kind) prefixed by one or two opening
    exchanges of conversations of other kinds (the kind a record names: fact-country, memory, chitchat, ...; conversations
    without one, as in old shards, are left alone). Kinds stay the conversation's own, so --weight applies as before."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"splice fraction must be in [0, 1], got {fraction}")
    if fraction == 0.0:
        return list(conversations)
    pool = openings(conversations)
    if len({k for k, _ in pool}) < 2:           # nothing unrelated to put in front
        return list(conversations)
    rng = random.Random(f"splice:{seed}")
    out = []
    for kind, msgs in conversations:
        if not kind or rng.random() >= fraction:
            out.append((kind, msgs))
            continue
        want = 2 if rng.random() < TWO_PREFIXES else 1
        prefix: list[dict] = []
        used = {kind}              # one opening per kind, none of the conversation's own kind
        for _ in range(8 * want):          # draws until `want` openings of unused kinds are found
            if len(prefix) >= 2 * want:
                break
            k, ex = pool[rng.randrange(len(pool))]
            if k in used:
                continue
            used.add(k)
            prefix += [dict(m) for m in ex]
        out.append((kind, prefix + list(msgs)) if prefix else (kind, msgs))
    return out
