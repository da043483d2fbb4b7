"""The full config's Linear weights streamed like one decode step (every layer distinct, nothing stays in L2),
GEMV variants interleaved round by round so machine noise hits them alike. Medians of ms per token-equivalent.

The yardstick is a plain read of the same int8 bytes in the same order (native tc_read_bytes: a byte sum, one
instruction per 64 bytes): what one core's memory system gives; `tc_gemv / read` is the share of it the int8 GEMV
kernel reaches (the kernel path built here is printed: TINYCHAT_NATIVE_ARCH selects another, e.g.
"-march=x86-64-v3 -mavxvnni").

    python tests/perf/gemv_stream.py [--threads 1] [--rounds 15] [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # this checkout's tinychat, not an installed one
LAYER = [(1792, 768), (768, 768), (3328, 768), (768, 3328)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="only the native kernel and the plain read")
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
        if not a.quick:
            wb.append(w.to(torch.bfloat16))
            wpk.append(torch.ops.mkldnn._reorder_linear_weight(wb[-1], 1))
    if a.quick:
        ws = None
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
    variants = {} if a.quick else {"int8pack_mm": (int8, 1), "bf16 linear": (bf16, 2),
                                   "bf16 mkldnn packed": (bf16pk, 2), "fp32 linear": (fp32, 4)}
    if lib is not None:
        xq = native.act_scratch(lib, 3328)
        args = [(xf[q.size(1)].data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), q.size(0),
                 q.size(1), 0, nt) for q, s, y in zip(qs, sf, ys)]
        reads = [(q.data_ptr(), q.numel()) for q in qs]

        def nat():
            f = lib.tc_gemv
            for x in args:
                f(*x)

        def read():
            f = lib.tc_read_bytes
            for x in reads:
                f(*x)

        variants["plain read (1 thread)"] = (read, 1)
        variants["native tc_gemv"] = (nat, 1)
        nat()
        ref = (qs[0].double() @ native.quant8_ref(xf[768][0])) * sf[0].double()
        print(f"kernel path {native.kernel_path()}; tc_gemv vs its float64 reference: rel diff "
              f"{((ys[0] - ref).abs().max() / ref.abs().max()).item():.2e}")
        aten = torch.ops.aten._weight_int8pack_mm(xs[768], qs[0], ss[0]).float()[0]
        print(f"tc_gemv (int8 activations) vs aten (bf16 activations): rel diff "
              f"{((ys[0] - aten).abs().max() / aten.abs().max()).item():.2e}")
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
    print(f"threads {torch.get_num_threads()}, {nbytes / 1e6:.0f} M weights, medians (best) of {a.rounds} rounds")
    for k, (_, b) in variants.items():
        m, lo = statistics.median(res[k]), min(res[k])
        print(f"  {k:22s} {m * 1e3:7.2f} ms/token  {b * nbytes / m / 1e9:5.1f} GB/s ({b * nbytes / lo / 1e9:5.1f})  "
              f"({1 / m:6.1f} tok/s GEMV-only)")
    if lib is not None:
        # per round (adjacent in time), then the median; and best against best (the least disturbed of each)
        rd, gm = res["plain read (1 thread)"], res["native tc_gemv"]
        share = statistics.median(r / g for r, g in zip(rd, gm))
        print(f"  tc_gemv / plain read: {share:.0%} (median of per-round ratios), {min(rd) / min(gm):.0%} (best vs best)")


if __name__ == "__main__":
    main()
