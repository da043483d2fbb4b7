"""``python -m tinychat.training stats``: how diverse the user side of the training data is.

A student learns templates when the same few user messages come back thousands of times. This step counts, for
each shard folder given and for all of them together:

- conversations and user turns;
- distinct user messages and distinct openings (first user messages), compared after normalisation (lower case,
  runs of white space collapsed, trailing punctuation and space stripped), so "Why?" and "why ?" count once;
- the share of user turns taken by the most common message, and the top messages with their counts.

    python -m tinychat.training stats --shards data/shards data/shards-1 data/shards-6 [--top 10] [--json]

Goals for new data (issue #32): >= 100,000 distinct user messages, >= 50,000 distinct openings, and no single user
message above 0.5 % of user turns.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from .data import read_conversations

_SPACE = re.compile(r"\s+")
_TRAIL = re.compile(r"[\s.!?,;:]+$")

GOALS = {"distinct_user": 100_000, "distinct_openings": 50_000, "top_share_max": 0.005}


def normalise(text: str) -> str:
    """The form two user messages are compared in: lower case, one space, no trailing punctuation."""
    t = _SPACE.sub(" ", text.strip().lower())
    return _TRAIL.sub("", t) or t


@dataclass
class Diversity:
    conversations: int = 0
    user_turns: int = 0
    distinct_user: int = 0
    distinct_openings: int = 0
    top_share: float = 0.0                      # most common user message / user turns
    top: list[tuple[str, int]] = field(default_factory=list)

    def meets_goals(self) -> dict[str, bool]:
        return {"distinct_user": self.distinct_user >= GOALS["distinct_user"],
                "distinct_openings": self.distinct_openings >= GOALS["distinct_openings"],
                "top_share": self.top_share <= GOALS["top_share_max"]}


def diversity(conversations: Iterable[Sequence[dict]], top: int = 10) -> Diversity:
    """Counts over conversations given as message lists ([{"role", "content"}, ...])."""
    users: Counter[str] = Counter()
    openings: set[str] = set()
    n = 0
    for msgs in conversations:
        n += 1
        first = True
        for m in msgs:
            if m["role"] != "user":
                continue
            key = normalise(m["content"])
            users[key] += 1
            if first:
                openings.add(key)
                first = False
    turns = sum(users.values())
    common = users.most_common(top)
    return Diversity(conversations=n, user_turns=turns, distinct_user=len(users), distinct_openings=len(openings),
                     top_share=(common[0][1] / turns) if common else 0.0, top=common)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", nargs="+", required=True, metavar="DIR", help="shard folders or files")
    p.add_argument("--top", type=int, default=10, help="most common user messages to list")
    p.add_argument("--json", action="store_true", help="one JSON object: per folder and in all")


def _line(name: str, d: Diversity) -> str:
    return (f"{name}: {d.conversations:,} conversations, {d.user_turns:,} user turns, "
            f"{d.distinct_user:,} distinct user messages, {d.distinct_openings:,} distinct openings, "
            f"top message {d.top_share:.2%} of user turns")


def run(args) -> int:
    per = {s: diversity(read_conversations(s), args.top) for s in args.shards}
    total = diversity((m for s in args.shards for m in read_conversations(s)), args.top) \
        if len(args.shards) > 1 else next(iter(per.values()))
    if args.json:
        print(json.dumps({"folders": {k: asdict(v) for k, v in per.items()}, "all": asdict(total),
                          "goals": GOALS, "meets_goals": total.meets_goals()}, indent=1))
        return 0
    for name, d in per.items():
        print(_line(name, d))
    if len(per) > 1:
        print(_line("all", total))
    print("most common user messages (all):")
    for text, count in total.top:
        print(f"  {count:7,}  {count / max(total.user_turns, 1):6.2%}  {text[:90]}")
    goals = total.meets_goals()
    print("goals: " + ", ".join(f"{k} {'met' if ok else 'not met'}" for k, ok in goals.items()))
    return 0
