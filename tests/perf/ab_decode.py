"""Decode A/B on one quantized model and cache: the lean step with the native kernels (EngineOptions(native=True)) vs the
PyTorch ops only (False), and optionally _decode_one; rounds interleaved, medians of tok/s over rounds.

    python tests/perf/ab_decode.py [--config full] [--quant int8] [--ctx 100] [--steps 32] [--rounds 7] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from tinychat.engine import Decoder, EngineOptions, KVCache, append, quantize_cpu
from tinychat.model import TinyAgentLM, config_for


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="full")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--eager", action="store_true", help="also time _decode_one (Decoder.fast = False)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = quantize_cpu(TinyAgentLM(config_for(a.config)).eval(), a.quant)
    cache = KVCache(m, 1, a.ctx + a.steps + 8, "cpu", dtype=torch.float32)
    decs = {nat: Decoder(m, cache, graph=False, options=EngineOptions(native=nat)) for nat in (False, True)}
    have_native = decs[True].cpu_step.nat is not None
    print(f"native kernels: {'on' if have_native else 'off'}")
    append(m, cache, torch.randint(0, m.cfg.vocab_size, (1, a.ctx)), [a.ctx])
    mark = cache.mark()
    variants = {"torch ops": (False, True)}
    if have_native:
        variants["native"] = (True, True)
    if a.eager:
        variants["_decode_one"] = (False, False)
    res = {k: [] for k in variants}
    logits = {}
    toks = torch.randint(0, m.cfg.vocab_size, (a.steps,)).tolist()
    for r in range(a.rounds + 1):
        for k, (nat, fast) in variants.items():
            dec = decs[nat]
            dec.fast = fast
            cache.truncate(mark)
            t = time.perf_counter()
            for tok in toks:
                out = dec.step(tok)
            dt = time.perf_counter() - t
            logits[k] = out
            if r:
                res[k].append(a.steps / dt)
    base = statistics.median(res["torch ops"])
    ref = logits["torch ops"]
    for k, v in res.items():
        med = statistics.median(v)
        rel = ((logits[k] - ref).abs().max() / ref.abs().max()).item()
        print(f"{a.config} {a.quant} ctx {a.ctx} threads {torch.get_num_threads()}: {k:12s} {med:7.1f} tok/s "
              f"({1e3 / med:6.2f} ms/token) x{med / base:.2f}  logits vs torch ops {rel:.4f}")


if __name__ == "__main__":
    main()
