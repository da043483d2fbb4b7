"""Decode speed with an fp32 vs an fp16 KV cache (EngineOptions.kv_cache) after a long prompt: bench's run_bench (as
`tinychat bench --kv-cache MODE`) in a fresh process per measurement, the two modes alternated (which goes first alternates too),
medians over rounds. Decode tok/s is the gen-len tokens decoded right after the prompt-len prefill.

    python tests/perf/kv_cache.py --model s-int8 --prompt-len 4000 --gen-len 64 --rounds 3 --threads 1
    python tests/perf/kv_cache.py --model DIR --rounds 1 --start 1      # one more round, the other order

Not a test: the figures go to docs/benchmarks.md ("fp16 KV cache")."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


RUN = """
import json, sys
from tinychat.bench import run_bench
from tinychat.loading import model_path
from tinychat.options import EngineOptions
model, quant, mode, P, G, T, W = sys.argv[1:]
print(json.dumps(run_bench(model_path(model), None, quant, "cpu", int(P), int(G), 1, warmup=int(W),
                           threads=int(T), options=EngineOptions.from_env(kv_cache=mode))))
"""


def run(model: str, quant: str, mode: str, prompt_len: int, gen_len: int, threads: int, warmup: int) -> dict:
    """One run_bench in a fresh process (what `tinychat bench --kv-cache MODE --repeats 1 --json` runs, with the
    warm-up repeat optional: the long prefill before the timed decode warms the step up already)."""
    cmd = [sys.executable, "-c", RUN, model, quant, mode, str(prompt_len), str(gen_len), str(threads), str(warmup)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"bench failed: {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--prompt-len", type=int, default=4000)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="0: fp32 first in round 0; 1: fp16 first")
    ap.add_argument("--warmup", type=int, default=0, help="untimed repeats before the timed one (bench's default: 1)")
    a = ap.parse_args()
    res: dict[str, list[float]] = {"fp32": [], "fp16": []}
    for r in range(a.rounds):
        order = ["fp32", "fp16"] if (r + a.start) % 2 == 0 else ["fp16", "fp32"]
        for mode in order:
            out = run(a.model, a.quant, mode, a.prompt_len, a.gen_len, a.threads, a.warmup)
            assert out["kv_dtype"] == {"fp32": "float32", "fp16": "float16"}[mode], out["kv_dtype"]
            res[mode].append(out["decode_tok_s"])
            print(f"round {r} {mode}: decode {out['decode_tok_s']:.2f} tok/s, prefill {out['prefill_tok_s']:.0f} "
                  f"tok/s, KV {out['kv_bytes_per_token']} B/token, peak RSS {out['peak_rss_mb']:.0f} MB "
                  f"({out['int8_kernels']}, {out['processor']})", flush=True)
    m32, m16 = statistics.median(res["fp32"]), statistics.median(res["fp16"])
    print(f"median decode tok/s after {a.prompt_len} tokens: fp32 {m32:.2f}, fp16 {m16:.2f} ({m16 / m32:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
