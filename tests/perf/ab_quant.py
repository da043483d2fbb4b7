"""Quant modes A/B in one process (int8 vs int4 by default): one copy of the model per mode, each with its own cache
and Decoder; rounds interleaved (mode by mode, in turn), each round timing --steps decode steps after a --ctx-token
prefill and one prefill of --prefill tokens; medians over rounds and each mode's ratio to the first. Interleaving in
one process keeps a shared host's load changes out of the ratios better than fresh processes do.

    python tests/perf/ab_quant.py [--model DIR | --config full] [--modes int8 int4] [--threads 1] [--rounds 9]

Not a test."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))    # this checkout's tinychat


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--config", default="full")
    ap.add_argument("--modes", nargs="+", default=["int8", "int4"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    a = ap.parse_args()
    import torch

    from tinychat.engine import Decoder, EngineOptions, KVCache, append, quantize_cpu
    from tinychat.model import TinyAgentLM, config_for
    torch.set_num_threads(a.threads)
    opts = EngineOptions(tune_threads=False)
    runs = {}
    for mode in a.modes:
        torch.manual_seed(0)
        m = TinyAgentLM.from_pretrained(a.model) if a.model else TinyAgentLM(config_for(a.config)).eval()
        quantize_cpu(m, mode, options=opts)
        cache = KVCache(m, 1, a.ctx + a.steps + a.prefill + 8, "cpu", dtype=torch.float32)
        dec = Decoder(m, cache, graph=False, options=opts)
        runs[mode] = (m, cache, dec, cache.mark())          # the empty cache's mark
    V = runs[a.modes[0]][0].cfg.vocab_size
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, V, (1, a.ctx), generator=g)
    long = torch.randint(0, V, (1, a.prefill), generator=g)
    steps = torch.randint(0, V, (a.steps,), generator=g).tolist()
    dec_t = {k: [] for k in a.modes}
    pre_t = {k: [] for k in a.modes}
    with torch.no_grad():
        for r in range(a.rounds + 1):                       # round 0: warm-up
            for mode in a.modes:
                m, cache, dec, empty = runs[mode]
                cache.truncate(empty)
                t0 = time.perf_counter()
                append(m, cache, long, [a.prefill])
                t1 = time.perf_counter()
                cache.truncate(empty)
                append(m, cache, prompt, [a.ctx])
                t2 = time.perf_counter()
                for t in steps:
                    dec.step(t)
                t3 = time.perf_counter()
                if r:
                    pre_t[mode].append(a.prefill / (t1 - t0))
                    dec_t[mode].append(a.steps / (t3 - t2))
    base = a.modes[0]
    print(f"{a.model or a.config}, {a.threads} thread(s), {a.rounds} rounds, medians (min-max)")
    for mode in a.modes:
        d, p = statistics.median(dec_t[mode]), statistics.median(pre_t[mode])
        rd = d / statistics.median(dec_t[base])
        rp = p / statistics.median(pre_t[base])
        print(f"  {mode:5s} decode {d:7.1f} tok/s ({min(dec_t[mode]):.1f}-{max(dec_t[mode]):.1f}) x{rd:.2f}   "
              f"prefill {a.prefill} {p:7.1f} tok/s ({min(pre_t[mode]):.1f}-{max(pre_t[mode]):.1f}) x{rp:.2f}")


if __name__ == "__main__":
    main()
