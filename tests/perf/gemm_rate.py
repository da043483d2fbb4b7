"""The native int8 prefill GEMM alone (tc_gemm, engine/native_gemm.h) at the full config's four Linear shapes:
GMAC/s per shape and over all four, medians of --repeats, for the build this checkout loads (TINYCHAT_NATIVE_ARCH
builds another level). Compare revisions by running it in each one's worktree, alternating, several rounds:

    python tests/perf/gemm_rate.py [--tokens 200] [--threads 1] [--repeats 7] [--json]

Random int8 weights and fp32 activations (the rate does not depend on them); each shape's weights stay in cache
between repeats, so this is the kernel's compute rate, not the model's streaming.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tinychat.engine import native

SHAPES = [(768, 768), (1280, 768), (3328, 768), (768, 3328)]     # (N out, K in): w_o, fused QKV, up, down


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    lib = native.load()
    if lib is None:
        raise SystemExit(f"no native kernels: {native.why_not}")
    g = torch.Generator().manual_seed(0)
    rows, total_t, total_mac = {}, 0.0, 0
    for n, k in SHAPES:
        q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        s = torch.rand(n, generator=g) + 0.5
        x = torch.randn(a.tokens, k, generator=g)
        try:
            need = lib.tc_gemm_act_bytes(a.tokens, k, a.threads)
        except TypeError:                                   # revisions before ABI 12: (M, K)
            need = lib.tc_gemm_act_bytes(a.tokens, k)
        scratch = torch.empty(int(need), dtype=torch.uint8)
        y = torch.empty(a.tokens, n)
        native.gemm(lib, x, q, s, None, a.threads, scratch, out=y)          # warm: caches, pages
        ts = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            native.gemm(lib, x, q, s, None, a.threads, scratch, out=y)
            ts.append(time.perf_counter() - t)
        t = statistics.median(ts)
        rows[f"{n}x{k}"] = round(a.tokens * n * k / t / 1e9, 1)
        total_t += t
        total_mac += a.tokens * n * k
    out = {"kernel_path": native.kernel_path(), "tokens": a.tokens, "threads": a.threads, "gmac_s": rows,
           "all_gmac_s": round(total_mac / total_t / 1e9, 1)}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{out['kernel_path']}, {a.tokens} tokens, {a.threads} thread(s): "
              + ", ".join(f"{k} {v}" for k, v in rows.items()) + f" | all {out['all_gmac_s']} GMAC/s")


if __name__ == "__main__":
    main()
