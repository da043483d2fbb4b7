"""Batch-1 decode of two git revisions of tinychat, side by side: each round runs one fresh process per revision
(a `git worktree` of each, so the Python code, the native kernels and their build are each revision's own),
alternating, and which goes first alternates too, so machine noise hits both alike. Reports the median over rounds
of each process's mean step rate (the mean, not the median step: stalls count) at two context lengths.

    python tests/perf/ab_revs.py BEFORE [AFTER] [--config demo] [--quant int8] [--threads 1] [--rounds 5]

AFTER defaults to the working tree. Random weights (speed does not depend on them); every step feeds a fixed token
sequence, so both sides do the same work. Uses this checkout's interpreter (torch must be importable).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, {src!r})
import tinychat
assert tinychat.__file__.startswith({src!r}), tinychat.__file__
torch.set_num_threads({threads})
from tinychat.model import TinyAgentLM, config_for
from tinychat.engine import Decoder, KVCache, append, quantize_cpu
torch.manual_seed(0)
m = TinyAgentLM(config_for({config!r})).eval()
quantize_cpu(m, {quant!r})
V = m.cfg.vocab_size
out = {{}}
with torch.no_grad():
    for ctx in {ctxs!r}:
        cache = KVCache(m, 1, min(m.cfg.max_seq_len, ctx + {steps} + 8), "cpu", dtype=torch.float32)
        dec = Decoder(m, cache)
        append(m, cache, torch.arange(ctx).remainder(V)[None], torch.tensor([ctx]))
        for i in range(8):
            dec.step((i * 31) % V)
        t = time.perf_counter()
        for i in range({steps}):
            dec.step((i * 97 + 5) % V)
        out[str(ctx)] = {steps} / (time.perf_counter() - t)
print(json.dumps(out))
"""


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev], check=True,
                   capture_output=True)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default=None, help="a revision (default: the working tree)")
    ap.add_argument("--config", default="demo")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--ctx", type=int, nargs="+", default=[100, 1000])
    a = ap.parse_args()
    if a.after == a.before:
        sys.exit("before and after name the same revision")
    tmp = Path(tempfile.mkdtemp(prefix="tinychat-ab-"))
    trees = {}
    try:
        trees[a.before] = worktree(a.before, tmp / "before")
        trees[a.after or "working tree"] = worktree(a.after, tmp / "after") if a.after else ROOT
        res: dict = {k: {str(c): [] for c in a.ctx} for k in trees}
        for r in range(a.rounds):
            order = list(trees.items())                  # the first process of a round ran up to ~20 % faster at 2
            for name, src in order if r % 2 == 0 else order[::-1]:   # threads on a shared host: alternate it
                code = CHILD.format(src=str(src), threads=a.threads, config=a.config, quant=a.quant, ctxs=a.ctx,
                                    steps=a.steps)
                env = dict(os.environ, TINYCHAT_HOME=str(tmp / f"home-{abs(hash(name))}"))  # own kernel builds
                p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                   cwd=str(tmp))
                if p.returncode != 0:
                    sys.exit(f"{name}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
                for c, v in json.loads(p.stdout).items():
                    res[name][c].append(v)
            print(f"round {r + 1}/{a.rounds}", file=sys.stderr)
        names = list(trees)
        summary = {"config": a.config, "quant": a.quant, "threads": a.threads, "rounds": a.rounds,
                   "steps": a.steps, "tok_s": {n: {c: round(statistics.median(v), 1) for c, v in res[n].items()}
                                               for n in names}}
        summary["ratio"] = {c: round(summary["tok_s"][names[1]][c] / summary["tok_s"][names[0]][c], 3)
                            for c in map(str, a.ctx)}
        print(json.dumps(summary))
    finally:
        for name, src in trees.items():
            if src != ROOT:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)],
                               capture_output=True)


if __name__ == "__main__":
    main()
