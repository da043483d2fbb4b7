"""Prefill A/B: quant Linears through fp32 GEMMs (EngineOptions.prefill_bf16 False) vs bf16 GEMMs (True), interleaved repeat by
repeat on one model and cache; medians of tok/s.

    python tests/perf/ab_prefill.py [--config full] [--quant int8] [--lens 200 1000] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from tinychat.engine import KVCache, append, quantize_cpu
from tinychat.model import TinyAgentLM, config_for


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="full")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--lens", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = quantize_cpu(TinyAgentLM(config_for(a.config)).eval(), a.quant)
    cache = KVCache(m, 1, max(a.lens) + 1, "cpu", dtype=torch.float32)
    for n in a.lens:
        idx = torch.randint(0, m.cfg.vocab_size, (1, n))
        res = {False: [], True: []}
        outs = {}
        for r in range(a.repeats + 1):
            for flag in (False, True):
                for mod in m.modules():           # the quant Linears' EngineOptions.prefill_bf16, per layer
                    if hasattr(mod, "prefill_bf16"):
                        mod.prefill_bf16 = flag
                cache.reset([0])
                t = time.perf_counter()
                outs[flag] = append(m, cache, idx, [n])
                if r:
                    res[flag].append(n / (time.perf_counter() - t))
        f, b = statistics.median(res[False]), statistics.median(res[True])
        rel = ((outs[True] - outs[False]).abs().max() / outs[False].abs().max()).item()
        print(f"{a.config} {a.quant} prefill {n}: fp32 GEMMs {f:7.1f} tok/s | bf16 GEMMs {b:7.1f} tok/s | "
              f"x{b / f:.2f} | logits rel diff {rel:.4f}  (threads {torch.get_num_threads()})")


if __name__ == "__main__":
    main()
