"""Prefill A/B of the quant Linears' prefill kernels, interleaved repeat by repeat on one model and cache; medians of
tok/s and each variant's ratio to the first.

    python tests/perf/ab_prefill.py [--config full] [--quant int8] [--lens 200 1000] [--threads 1]
                                    [--variants fp32 bf16 native]

Variants (set on every quant Linear between repeats): fp32 = dequantized weights + fp32 GEMMs (the path without
native kernels and without bf16 dot products), bf16 = bf16 GEMMs (EngineOptions.prefill_bf16), native = the native
int8 GEMM (engine/native_gemm.h; int8 models only). The logits' largest difference to the first variant, relative
to its largest logit, is printed too.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from tinychat.engine import KVCache, append, quantize_cpu
from tinychat.model import TinyAgentLM, config_for

FLAGS = {"fp32": dict(prefill_bf16=False, native=False), "bf16": dict(prefill_bf16=True, native=False),
         "native": dict(prefill_bf16=False, native=True)}


def set_variant(model, name):
    for mod in model.modules():           # the quant Linears' options, per layer
        if hasattr(mod, "prefill_bf16"):
            for k, v in FLAGS[name].items():
                setattr(mod, k, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="full")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--lens", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=["fp32", "bf16"], choices=list(FLAGS))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = quantize_cpu(TinyAgentLM(config_for(a.config)).eval(), a.quant)
    if "native" in a.variants:
        from tinychat.engine import native
        print(f"native kernel path: {native.kernel_path()}; torch CPU capability: "
              f"{torch.backends.cpu.get_cpu_capability()}")
    cache = KVCache(m, 1, max(a.lens) + 1, "cpu", dtype=torch.float32)
    for n in a.lens:
        idx = torch.randint(0, m.cfg.vocab_size, (1, n))
        res = {v: [] for v in a.variants}
        outs = {}
        for r in range(a.repeats + 1):
            for v in a.variants:
                set_variant(m, v)
                cache.reset([0])
                t = time.perf_counter()
                with torch.no_grad():
                    outs[v] = append(m, cache, idx, [n])
                if r:
                    res[v].append(n / (time.perf_counter() - t))
        base = a.variants[0]
        med = {v: statistics.median(res[v]) for v in a.variants}
        parts = []
        for v in a.variants:
            rel = ((outs[v] - outs[base]).abs().max() / outs[base].abs().max()).item()
            parts.append(f"{v} {med[v]:7.1f} tok/s (x{med[v] / med[base]:.2f}, logits {rel:.4f})")
        print(f"{a.config} {a.quant} prefill {n}, threads {torch.get_num_threads()}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
