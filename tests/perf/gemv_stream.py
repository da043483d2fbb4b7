"""The full config's Linear weights streamed like one decode step (every layer distinct, nothing stays in L2),
GEMV variants interleaved round by round so machine noise hits them alike. Medians of ms per token-equivalent.

    python tests/perf/gemv_stream.py [--threads 1] [--rounds 15]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

LAYER = [(1792, 768), (768, 768), (3328, 768), (768, 3328)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=16)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shapes = LAYER * a.layers + [(32000, 768)]
    ws = [torch.randn(N, K, generator=g) * 0.02 for N, K in shapes]
    qs, ss, wb, wpk = [], [], [], []
    for w in ws:
        s = (w.abs().amax(1) / 127).to(torch.bfloat16)
        qs.append(torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous())
        ss.append(s)
        wb.append(w.to(torch.bfloat16))
        wpk.append(torch.ops.mkldnn._reorder_linear_weight(wb[-1], 1))
    xs = {K: torch.randn(1, K, generator=g).to(torch.bfloat16) for K in (768, 3328)}
    nbytes = sum(N * K for N, K in shapes)

    def int8():
        for q, s in zip(qs, ss):
            torch.ops.aten._weight_int8pack_mm(xs[q.size(1)], q, s)

    def bf16():
        for w in wb:
            F.linear(xs[w.size(1)], w)

    def bf16pk():
        for w, pk in zip(wb, wpk):
            torch.ops.mkldnn._linear_pointwise(xs[w.size(1)], pk, None, "none", [], "")

    def fp32():
        for w in ws:
            F.linear(xs[w.size(1)].float(), w)

    from tinychat.engine import native
    lib = native.load()
    sf = [x.float() for x in ss]
    xf = {K: v.float() for K, v in xs.items()}
    ys = [torch.empty(q.size(0)) for q in qs]
    nt = torch.get_num_threads()
    xq = torch.empty(4096, dtype=torch.int16)
    args = [(xf[q.size(1)].data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), q.size(0), q.size(1), 0, nt)
            for q, s, y in zip(qs, sf, ys)]

    def nat():
        f = lib.tc_gemv
        for a in args:
            f(*a)

    variants = {"int8pack_mm": (int8, 1), "bf16 linear": (bf16, 2), "bf16 mkldnn packed": (bf16pk, 2),
                "fp32 linear": (fp32, 4)}
    if lib is not None:
        variants["native tc_gemv"] = (nat, 1)
        ref = torch.ops.aten._weight_int8pack_mm(xs[768], qs[0], ss[0]).float()[0]
        nat()
        print("native vs aten rel diff", ((ys[0] - ref).abs().max() / ref.abs().max()).item())
    else:
        print("native kernels off:", native.why_not)
    res = {k: [] for k in variants}
    for fn, _ in variants.values():
        fn()
    for _ in range(a.rounds):
        for k, (fn, _) in variants.items():
            t = time.perf_counter()
            fn()
            res[k].append(time.perf_counter() - t)
    print(f"threads {torch.get_num_threads()}, {nbytes / 1e6:.0f} M weights")
    for k, (_, b) in variants.items():
        m = statistics.median(res[k])
        print(f"  {k:20s} {m * 1e3:7.2f} ms/token  {b * nbytes / m / 1e9:5.1f} GB/s  ({1 / m:6.1f} tok/s GEMV-only)")


if __name__ == "__main__":
    main()
