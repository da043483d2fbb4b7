"""Decode speed with an fp32 vs an fp16 KV cache (EngineOptions.kv_cache) after a long prompt: bench's run_bench (as
`tinychat bench --kv-cache MODE`) in a fresh process per measurement, the two modes alternated (which goes first alternates too),
medians over rounds. Decode tok/s is the gen-len tokens decoded right after the prompt-len prefill.

    python tests/perf/kv_cache.py --model s-int8 --prompt-len 4000 --gen-len 64 --rounds 3 --threads 1
    python tests/perf/kv_cache.py --model DIR --rounds 1 --start 1      # one more round, the other order
    python tests/perf/kv_cache.py --model s-int8 --interleaved --rounds 16 --block 16   # one process, A/B blocks

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


def interleaved(a) -> None:
    """Both caches in one process, prefilled with the same prompt, then blocks of --block decode steps alternated
    between them (each block from the same cache state: truncate to the mark): a load that comes and goes hits
    both alike. Medians of the blocks' tok/s."""
    import time

    import torch

    from tinychat.bench import _load
    from tinychat.engine import Decoder, KVCache, append
    from tinychat.options import EngineOptions
    from tinychat.plan import decide
    torch.set_num_threads(a.threads)
    model, _ = _load(a.model, None, 0, a.quant)
    opts = EngineOptions.from_env(tune_threads=False)
    plan = decide(model, a.quant, "cpu", opts)
    V = model.cfg.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, V - 1, (1, a.prompt_len), generator=g)
    toks = torch.randint(0, V - 1, (a.block,), generator=g).tolist()
    runs = {}
    for mode, dt in (("fp32", torch.float32), ("fp16", torch.float16)):
        cache = KVCache(model, 1, a.prompt_len + a.block + 2, "cpu", dtype=dt)
        dec = Decoder(model, cache, graph=False, plan=plan)
        append(model, cache, prompt, [a.prompt_len])
        runs[mode] = (dec, cache, cache.mark())
        print(f"{mode}: step {dec.variant.name}, {cache.used_bytes() / 1e6:.0f} MB of K/V", flush=True)
    res: dict[str, list[float]] = {"fp32": [], "fp16": []}
    for r in range(a.rounds):
        for mode in (["fp32", "fp16"] if r % 2 == 0 else ["fp16", "fp32"]):
            dec, cache, mark = runs[mode]
            cache.truncate(mark)
            t0 = time.perf_counter()
            for tok in toks:
                dec.step(tok)
            res[mode].append(a.block / (time.perf_counter() - t0))
    for mode, v in res.items():
        print(f"{mode}: " + " ".join(f"{x:.1f}" for x in v))
    m32, m16 = statistics.median(res["fp32"]), statistics.median(res["fp16"])
    print(f"interleaved median decode tok/s at {a.prompt_len} tokens: fp32 {m32:.2f}, fp16 {m16:.2f} "
          f"({m16 / m32:.2f}x)")


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
    ap.add_argument("--interleaved", action="store_true", help="one process, decode blocks alternated (see below)")
    ap.add_argument("--block", type=int, default=16, help="--interleaved: decode steps per block")
    a = ap.parse_args()
    if a.interleaved:
        sys.path.insert(0, str(ROOT))
        from tinychat.loading import model_path
        a.model = str(model_path(Path(a.model)))
        interleaved(a)
        return 0
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
