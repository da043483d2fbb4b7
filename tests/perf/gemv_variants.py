"""Batch-1 GEMV candidates at the full config's shapes, timed side by side (medians, GB/s of weight bytes).

    python tests/perf/gemv_variants.py [--threads 2] [--iters 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {"qkv(full)": (1792, 768), "qkv(local)": (1280, 768), "w_o": (768, 768), "up": (3328, 768),
          "down": (768, 3328), "head": (32000, 768)}


def timeit(fn, iters):
    for _ in range(10):
        fn()
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        ts.append((time.perf_counter() - t) / iters)
    return statistics.median(ts)


def variants(N, K):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g) * 0.02
    s = (w.abs().amax(1) / 127).to(torch.bfloat16)
    q = torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    xb = torch.randn(1, K, generator=g).to(torch.bfloat16)
    xf = xb.float()
    wb = w.to(torch.bfloat16)
    out = {"int8pack_mm": (lambda: torch.ops.aten._weight_int8pack_mm(xb, q, s), N * K),
           "bf16 linear": (lambda: F.linear(xb, wb), 2 * N * K),
           "fp32 linear": (lambda: F.linear(xf, w), 4 * N * K)}
    try:
        wpk = torch.ops.mkldnn._reorder_linear_weight(wb, 1)    # oneDNN-prepacked bf16 weight (batch 1)
        out["bf16 mkldnn packed"] = (lambda: torch.ops.mkldnn._linear_pointwise(xb, wpk, None, "none", [], ""),
                                     2 * N * K)
    except Exception as e:  # noqa: BLE001
        print("  (no mkldnn packed bf16:", type(e).__name__, str(e)[:80], ")")
    try:
        qt = q.t()
        xq = torch.randint(-127, 127, (1, K), dtype=torch.int8)
        torch._int_mm(xq, qt)
        out["_int_mm s8s8 (M=1)"] = (lambda: torch._int_mm(xq, qt), N * K)
    except Exception as e:  # noqa: BLE001
        print("  (no _int_mm:", type(e).__name__, str(e)[:80], ")")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"threads {torch.get_num_threads()}")
    for name, (N, K) in SHAPES.items():
        res = variants(N, K)
        line = []
        for v, (fn, nbytes) in res.items():
            t = timeit(fn, a.iters if N * K < 5e6 else a.iters // 4)
            line.append(f"{v} {t * 1e6:7.1f} us {nbytes / t / 1e9:5.1f} GB/s")
        print(f"{name:11s} {N}x{K}: " + " | ".join(line))


if __name__ == "__main__":
    main()
