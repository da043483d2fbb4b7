"""``python -m tinychat.training onpolicy``: the student's own replies, the best of K as the teacher reads them.

Every stage so far trained the student on the teacher's replies. The judge (``eval --judge``) scores something
else: how likely the teacher finds the replies the *student* samples, in conversations the student steers itself.
Stages 15-17 moved the teacher-text loss and not the judge. This step makes targets the student can reach: it
samples its own replies and keeps the ones the teacher likes best (rejection sampling: reward-ranked fine-tuning
with the teacher's log-probability as the reward; sequence-level on-policy distillation, as the two tokenizers
differ).

For each training conversation (the train side of the split train and eval use, so no held-out conversation is
ever read), the student chats through its user messages (at most ``--turns``) with the app's sampler
(``ChatSettings`` defaults, the reply cap of ``eval``) on the decode path ``--quant`` (int8 by default: about 9x the
fp32 eager path on 2 threads, the same weights to within int8 rounding). Each turn it samples K replies from the
same context (``Chat.regenerate``: siblings), the teacher reads each in context (its tokenizer, ChatML template and
the system prompt the source shards were generated with, as the judge does), and among the valid ones (stopped,
not degenerate, not an echo: :mod:`~tinychat.training.dialogue`) the best :func:`~tinychat.training.dialogue
.reply_score` is kept and the chat goes on from it (``Chat.switch_alternative``). When no candidate is valid the
conversation ends before that turn; one with no kept turn is not written.

Records are shard records: the source conversation's ``kind``, ``source`` ``"onpolicy"``, the kept ``messages``,
``selection`` per turn (``n``, ``valid``, the kept ``score`` and the ``mean`` of the valid ones), a ``program``
block (this command, the student's model identity and its sampler) that the card prints, and the source shards'
``teacher`` block (the judge reads the system prompt from it).

Shards: conversation i of the shuffled training split (``--seed``) goes to shard ``i // --per-shard``. A shard is
written whole and atomically once its conversations are done; Ctrl-C or SIGTERM stops at the next conversation
and loses only the shard in flight. Running the same command again skips the shards on disk and goes on; each
sample's seed is a function of (--seed, conversation, turn, candidate).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import time
from pathlib import Path

from ..errors import TinychatError

SOURCE = "onpolicy"


class OnPolicyError(TinychatError, ValueError):
    """Arguments or inputs this step cannot use; one line, fit for the user."""


# -- the teacher's reading of candidate replies ----------------------------------------------------------------------

def reply_logprobs(model, htok, system: str, history: list[dict], user: str, replies: list[str]) -> list[list[float]]:
    """The teacher's log-probability of each reply's tokens (its content and the closing ``<|im_end|>``, as the judge
    scores them) after ``system``, ``history`` (ChatML messages) and ``user``: one list per reply.

    The replies share the prefix, so they go through the teacher packed in one row: the prefix once, then each
    reply at the positions it would have after the prefix, attending to the prefix and to itself only; the head
    runs on the positions that predict a reply token only. (K x (prefix + reply) tokens become prefix + K x reply,
    and the head's [V, dim] product shrinks to the scored tokens: the step's cost is mostly this.)"""
    import torch

    from .teacher import IM_END, IM_START

    def enc(text: str) -> list[int]:
        return htok.encode(text).ids

    prefix: list[int] = enc(f"{IM_START}system\n{system}{IM_END}\n") if system else []
    for m in [*history, {"role": "user", "content": user}]:
        prefix += enc(f"{IM_START}{m['role']}\n") + enc(m["content"]) + enc(f"{IM_END}\n")
    prefix += enc(f"{IM_START}assistant\n")
    bodies = [enc(r) + enc(f"{IM_END}\n")[:1] for r in replies]
    if not bodies:
        return []
    P = len(prefix)
    tokens, positions, owner = list(prefix), list(range(P)), [-1] * P     # owner: which reply a token is of
    starts = []
    for j, b in enumerate(bodies):
        starts.append(len(tokens))
        tokens += b
        positions += range(P, P + len(b))
        owner += [j] * len(b)
    T = len(tokens)
    own = torch.tensor(owner)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    # (T, T): everything sees the prefix causally; a reply token sees its own reply's earlier tokens, no other's
    mask = causal & ((own[None, :] == -1) | (own[None, :] == own[:, None]))
    h = model.hidden_full(torch.tensor([tokens]), torch.tensor(positions), mask)[0]     # (T, dim)
    at, tgt = [], []                       # the row that predicts each reply token, and that token
    for j, b in enumerate(bodies):
        at += [P - 1] + list(range(starts[j], starts[j] + len(b) - 1))
        tgt += b
    logp = torch.log_softmax(model.logits(h[torch.tensor(at)]).float(), -1)
    picked = logp[torch.arange(len(tgt)), torch.tensor(tgt)].tolist()
    out, i = [], 0
    for b in bodies:
        out.append(picked[i:i + len(b)])
        i += len(b)
    return out


# -- one conversation ------------------------------------------------------------------------------------------------

def best_of_k_chat(chat, users: list[str], k: int, score, seed: int) -> tuple[list[dict], list[dict]]:
    """Chat through ``users`` sampling ``k`` replies a turn and going on from the best. score(history, user,
    candidates: [(text, stopped)]) -> one float per candidate, None where invalid. Returns (messages kept,
    selection per kept turn)."""
    msgs: list[dict] = []
    selection: list[dict] = []
    for ti, user in enumerate(users):
        cands = []
        for j in range(k):
            s = dataclasses.replace(chat.settings, seed=_seed(seed, ti, j))
            if j == 0:
                chat.settings = s
                r = chat.send(user)
            else:
                r = chat.regenerate(settings=s)
            cands.append((r.text, r.finish == "stop", chat.alternatives()[0]))   # place: 1-based among siblings
        scores = score(msgs, user, [(t, st) for t, st, _ in cands])
        valid = [(sc, i) for i, sc in enumerate(scores) if sc is not None]
        if not valid:
            break
        best, bi = max(valid)
        chat.switch_alternative(cands[bi][2])
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": cands[bi][0]}]
        selection.append({"n": k, "valid": len(valid), "score": round(best, 4),
                          "mean": round(sum(v for v, _ in valid) / len(valid), 4)})
    return msgs, selection


def _seed(seed: int, turn: int, cand: int) -> int:
    return (seed * 1_000_003 + turn * 101 + cand) % 2 ** 62


def teacher_scorer(model, htok, system: str):
    """score() for :func:`best_of_k_chat`: invalid when cut off, degenerate or an echo (the runtime never shows a
    control token in a reply); else
    :func:`~tinychat.training.dialogue.reply_score` of the teacher's log-probabilities."""
    from .degenerate import degenerate_reason
    from .dialogue import echo_reason, reply_score

    def score(history: list[dict], user: str, cands: list[tuple[str, bool]]) -> list[float | None]:
        previous = history[-1]["content"] if history else None
        ok = [i for i, (text, stopped) in enumerate(cands)
              if degenerate_reason(text, stopped) is None
              and echo_reason(text, user, previous) is None]
        out: list[float | None] = [None] * len(cands)
        lps = reply_logprobs(model, htok, system, history, user, [cands[i][0] for i in ok])
        for i, lp in zip(ok, lps):
            out[i] = reply_score(cands[i][0], lp, user)
        return out
    return score


# -- the step --------------------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=Path("assets"), help="the student (a model folder; default assets)")
    p.add_argument("--shards", nargs="+", required=True, metavar="DIR",
                   help="conversations whose user messages the student answers (their training split only)")
    p.add_argument("--out", type=Path, required=True, help="shard folder to write (shard-00000.jsonl.gz, ...)")
    p.add_argument("--k", type=int, default=4, help="replies sampled a turn, the best kept (default 4)")
    p.add_argument("--turns", type=int, default=4, help="user messages a conversation at most (default 4, as eval)")
    p.add_argument("--max-new", type=int, default=192, help="reply cap in tokens (default 192, as eval)")
    p.add_argument("--quant", choices=("int8", "bf16", "none"), default="int8",
                   help="the student's decode path (default int8)")
    p.add_argument("--conversations", type=int, default=0,
                   help="stop after this many conversations of the shuffled split (default 0: all)")
    p.add_argument("--per-shard", type=int, default=50, help="conversations a shard (default 50)")
    p.add_argument("--seed", type=int, default=1, help="the order of the conversations and every sample's seed")
    p.add_argument("--val-fraction", type=float, default=0.02, help="as train and eval (default 0.02)")
    p.add_argument("--threads", type=int, default=2)


def _conversations(shards, val_fraction: float, seed: int, limit: int) -> list[tuple[str, list[dict]]]:
    from .data import read_conversations, split
    train, _ = split(read_conversations(shards, kinds=True), val_fraction, messages=lambda pair: pair[1])
    train = [(kind, m) for kind, m in train if any(x["role"] == "user" for x in m)]
    random.Random(seed).shuffle(train)
    return train[:limit] if limit else train


def run(args, model=None, tok=None, teacher=None, scorer=teacher_scorer, log=print) -> int:
    """model/tok/teacher: a student (TinyAgentLM, Tokenizer) and a teacher (Llama, HF tokenizer) for tests
    (default: loaded from --model and the real teacher); scorer(teacher model, its tokenizer, system) -> score()."""
    import torch

    from tinychat.chat.runtime import Chat, model_identity
    from tinychat.settings import ChatSettings

    from .data import shards_arg, teacher_meta
    from .generate import _StopFlag, existing_shards, shard_path, write_shard

    if args.k < 1 or args.turns < 1 or args.per_shard < 1 or args.max_new < 1 or args.conversations < 0:
        raise OnPolicyError("--k, --turns, --per-shard and --max-new must be at least 1")
    torch.set_num_threads(args.threads)
    shards = shards_arg(args.shards)
    convs = _conversations(shards, args.val_fraction, args.seed, args.conversations)
    if not convs:
        raise OnPolicyError(f"{' '.join(args.shards)}: no training conversations")
    meta = teacher_meta(shards)
    system = meta.get("system", "")
    if model is None:
        from tinychat.model import TinyAgentLM
        from tinychat.tokenizer import Tokenizer
        if not (args.model / "model.safetensors").is_file():
            raise OnPolicyError(f"{args.model}: no model.safetensors")
        model = TinyAgentLM.from_pretrained(args.model)
        tok = Tokenizer.from_file(args.model / "tokenizer.json")
    if teacher is None:
        from .judge import load_judge
        teacher = load_judge()
    tmodel, htok = teacher
    ident = model_identity(model)
    settings = ChatSettings(max_new=args.max_new)
    program = {"name": __name__, "seed": args.seed, "command": getattr(args, "command_line", ""),
               "student": str(args.model), "student_identity": ident, "quant": args.quant, "k": args.k,
               "sampler": settings.sampler()}
    score = scorer(tmodel, htok, system)
    done = existing_shards(args.out)
    n_shards = (len(convs) + args.per_shard - 1) // args.per_shard
    quant = None if args.quant == "none" else args.quant
    t0, kept_turns, written = time.perf_counter(), 0, 0
    log(f"onpolicy: {len(convs):,} conversations in {n_shards} shards, {len(done)} on disk; best of {args.k}, "
        f"{args.quant} student, teacher system {system!r}")
    with _StopFlag() as stop:
        for si in range(n_shards):
            if si in done:
                continue
            recs = []
            for ci in range(si * args.per_shard, min(len(convs), (si + 1) * args.per_shard)):
                if stop:
                    log(f"stopped: shard {si} not written (run the same command again to go on)")
                    return 130
                kind, src = convs[ci]
                users = [m["content"] for m in src if m["role"] == "user"][:args.turns]
                chat = Chat(model, tok, settings, quant=quant, autosave=False, model_name="onpolicy",
                            model_hash=ident)
                msgs, sel = best_of_k_chat(chat, users, args.k, score, args.seed * 1_000_003 + ci * 1009)
                if msgs:
                    recs.append({"id": f"o{args.seed}-{ci:06d}", "kind": kind, "source": SOURCE, "messages": msgs,
                                 "ended": "planned" if len(sel) == len(users) else "invalid", "selection": sel,
                                 "program": program, "teacher": meta})
                    kept_turns += len(sel)
            write_shard(shard_path(args.out, si), recs)
            written += 1
            dt = time.perf_counter() - t0
            log(f"shard {si:05d}: {len(recs)} conversations; {written} shards, {kept_turns:,} turns kept in "
                f"{dt / 60:.1f} min")
    log(f"wrote {written} shards to {args.out}")
    return 0

