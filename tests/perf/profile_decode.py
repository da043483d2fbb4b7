"""Where a batch-1 decode step of the lean CPU path (engine/cpu_step.py) spends its time: ops per token, ms per token,
and the split between the int8/bf16 GEMVs, attention and everything else (dispatch-bound small ops).

    python tests/perf/profile_decode.py [--config full] [--quant int8] [--ctx 100] [--steps 64]
"""
from __future__ import annotations

import argparse
import collections
import time

import torch

from tinychat.engine import Decoder, EngineOptions, KVCache, append, quantize_cpu
from tinychat.model import TinyAgentLM, config_for

GEMV = {"aten::_weight_int8pack_mm", "native", "aten::linear", "aten::mm", "aten::addmm", "aten::matmul"}
ATTN = {"aten::bmm", "aten::baddbmm", "aten::_softmax", "aten::softmax"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="full")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rows", type=int, default=25, help="top ops to list")
    ap.add_argument("--no-native", action="store_true", help="the PyTorch-ops step (EngineOptions(native=False))")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    m = TinyAgentLM(config_for(a.config)).eval()
    quantize_cpu(m, a.quant)
    cache = KVCache(m, 1, a.ctx + 3 * a.steps + 8, "cpu", dtype=torch.float32)
    dec = Decoder(m, cache, graph=False, options=EngineOptions(native=not a.no_native))
    nat = dec.cpu_step.nat if dec.cpu_step is not None else None
    if nat is not None:                      # time the native calls as one profiler row
        lib = nat.lib

        class Timed:
            def __init__(self, f):
                self.f = f

            def __call__(self, *args):
                with torch.profiler.record_function("native"):
                    return self.f(*args)
        class TimedLib:
            def __getattr__(self, name):
                return Timed(getattr(lib, name))
        nat.lib = TimedLib()
    with torch.no_grad():
        append(m, cache, torch.randint(0, m.cfg.vocab_size, (1, a.ctx)), [a.ctx])
        for t in range(a.steps):                                 # warm-up
            dec.step(t)
        t0 = time.perf_counter()
        for t in range(a.steps):
            dec.step(t)
        plain = (time.perf_counter() - t0) / a.steps
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for t in range(a.steps):
                dec.step(t)
    ev = prof.key_averages()
    top = [e for e in ev if e.key not in ("ProfilerStep*",)]
    n_ops = 0
    by = collections.Counter()
    total_self = 0.0
    for e in top:
        total_self += e.self_cpu_time_total
        n_ops += e.count
        k = "gemv" if e.key in GEMV else "attention" if e.key in ATTN else "other"
        by[k] += e.self_cpu_time_total
    print(f"{a.config} {a.quant} ctx {a.ctx}, threads {torch.get_num_threads()}, mode {dec.mode}")
    print(f"step: {plain * 1e3:.2f} ms ({1 / plain:.1f} tok/s) unprofiled; ops/token (all, nested incl.): "
          f"{n_ops / a.steps:.0f}")
    prof_ms = total_self / 1e3 / a.steps
    for k in ("gemv", "attention", "other"):
        print(f"  {k:10s} {by[k] / 1e3 / a.steps:7.2f} ms/token  ({by[k] / total_self:5.1%} of profiled self time)")
    print(f"  profiled total {prof_ms:.2f} ms/token (profiler overhead inflates small ops)")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
