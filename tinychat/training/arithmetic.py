"""Small sums, differences and products written by a program: exact answers, no teacher.

The teacher gets small arithmetic wrong often enough that its sums reach the shards thin and noisy: the generator
keeps a reply only when it contains the right number, but "To add 15 + 2 ... which gives us 17. Then ... 30" passes,
and about half of its tries are dropped. The student learned the noise: "What is 3 + 4?" got "3 + 4 = 5". These
conversations ask the v2 prompts' arithmetic questions (:func:`tinychat.training.questions.arithmetic_problem`: the
same frames, and never the probe's operand pairs) and answer them the way the teacher does on its good days: one
short sentence with the equation, a word problem answered in its own words, steps when asked how.

    python -m tinychat.training arithmetic --out data/arith-1 --seed 1 --count 4000

Records are shard records (kind ``fact-arithmetic``, source ``program``) with a ``program`` block instead of a
``teacher`` one: the seed and the command that wrote them. Shards are written whole and atomically, so the same
command writes the same bytes, and an interrupted run is finished by running it again.
"""
from __future__ import annotations

import argparse
import random
from pathlib import Path

from . import topic_lists
from .questions import arithmetic_problem

KIND, SOURCE = "fact-arithmetic", "program"
ANSWERS = {
    "+": ("{a} + {b} = {s}.|{a} plus {b} is {s}.|{a} plus {b} equals {s}.|The answer is {s}: {a} + {b} = {s}.|"
          "{a} + {b} is {s}."),
    "-": ("{a} - {b} = {s}.|{a} minus {b} is {s}.|{a} minus {b} equals {s}.|The answer is {s}: {a} - {b} = {s}.|"
          "{a} - {b} is {s}."),
    "*": ("{a} x {b} = {s}.|{a} times {b} is {s}.|{a} multiplied by {b} equals {s}.|The answer is {s}: {a} x {b} = {s}.|"
          "{a} times {b} equals {s}."),
}
AGAIN = ("And ", "Now: ", "Next one: ", "")
HOW = ("How did you get that?", "Can you show the steps?")


def _pick(rng: random.Random, frames: str) -> str:
    return rng.choice(topic_lists.split(frames))


def _noun(n: int, noun: str) -> str:
    return f"{n} {noun if n == 1 else noun + 's'}"


def answer(rng: random.Random, op: str, a: int, b: int, s: int, text: str) -> str:
    """One reply to the question ``text`` (a op b = s), in the words of the question when it is a word problem."""
    if "apples" in text:
        return _pick(rng, "If you have {x} and get {b} more, you have {a} + {b} = {y}.|You have {y}: {a} + {b} = {s}."
                     ).format(x=_noun(a, "apple"), y=_noun(s, "apple"), a=a, b=b, s=s)
    if "cookies" in text:
        return _pick(rng, "If you have {x} and eat {b}, you have {a} - {b} = {y} left.|"
                          "{y} left: {a} - {b} = {s}.").format(x=_noun(a, "cookie"), y=_noun(s, "cookie"), a=a, b=b, s=s)
    if "together" in text:
        return f"{a} and {b} together make {s}: {a} + {b} = {s}."
    return _pick(rng, ANSWERS[op]).format(a=a, b=b, s=s)


def steps(op: str, a: int, b: int, s: int) -> str:
    """How the answer comes about, checkable in the reply itself."""
    if op == "+":
        if b == 0:
            return f"Adding zero changes nothing, so {a} + 0 = {a}."
        return f"Start at {a} and count on {b} more: {a} + {b} = {s}. To check it, {s} - {b} = {a}."
    if op == "-":
        if b == 0:
            return f"Taking away zero changes nothing, so {a} - 0 = {a}."
        return f"Take {b} away from {a}, and {s} is left. To check it, {s} + {b} = {a}."
    if b == 1:
        return f"Multiplying by 1 changes nothing, so {a} x 1 = {a}."
    if b <= 5:
        return f"{a} x {b} means {b} groups of {a}: {' + '.join([str(a)] * b)} = {s}."
    return f"{a} x {b} means {b} groups of {a}: {a} x {b - 1} = {a * (b - 1)}, and {a} more makes {s}."


def conversation(rng: random.Random) -> list[dict]:
    """One to three exchanges: a problem, then another problem or how the last one was solved."""
    op, a, b, s, text = arithmetic_problem(rng)
    msgs = [{"role": "user", "content": text}, {"role": "assistant", "content": answer(rng, op, a, b, s, text)}]
    explained = False                                   # steps are asked for once per problem
    for _ in range(rng.choices((0, 1, 2), weights=(0.4, 0.4, 0.2))[0]):
        if not explained and rng.random() < 0.4:
            msgs += [{"role": "user", "content": rng.choice(HOW)}, {"role": "assistant", "content": steps(op, a, b, s)}]
            explained = True
        else:
            op, a, b, s, text = arithmetic_problem(rng)
            prefix = rng.choice(AGAIN)
            ask = prefix + (text[0].lower() + text[1:] if prefix else text)
            msgs += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer(rng, op, a, b, s, text)}]
            explained = False
    return msgs


def records(seed: int, count: int, command: str = "") -> list[dict]:
    """``count`` shard records, the same for the same seed."""
    rng = random.Random(seed)
    program = {"name": __name__, "seed": seed, "command": command}
    return [{"id": f"a{seed}-{i:06d}", "kind": KIND, "source": SOURCE, "messages": conversation(rng),
             "ended": "planned", "program": program} for i in range(count)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="shard folder to write (shard-00000.jsonl.gz, ...)")
    p.add_argument("--seed", type=int, default=1, help="the stream of problems (default 1)")
    p.add_argument("--count", type=int, default=4000, help="conversations (default 4000)")
    p.add_argument("--per-shard", type=int, default=1000, help="conversations per shard file (default 1000)")


def run(args) -> int:
    from .generate import GenerateError, shard_path, write_shard
    if args.count < 1 or args.per_shard < 1:
        raise GenerateError("--count and --per-shard must be at least 1")
    recs = records(args.seed, args.count, getattr(args, "command_line", ""))
    n = 0
    for i in range(0, len(recs), args.per_shard):
        write_shard(shard_path(args.out, i // args.per_shard), recs[i:i + args.per_shard])
        n += 1
    turns = sum(len(r["messages"]) // 2 for r in recs)
    print(f"wrote {args.out}: {n} shards, {len(recs):,} conversations, {turns:,} exchanges (seed {args.seed})",
          flush=True)
    return 0
