"""The native kernels of a git revision against the working tree's, in one process: both builds loaded side by side
(ctypes), their calls interleaved round by round, so a loaded host slows both alike; outputs compared bit for bit.
Only the C sources differ between the sides (the Python code is this checkout's), so this measures kernel changes.

    python tests/perf/ab_kernels.py gemm    [--rev HEAD] [--threads 1] [--tokens 200] [--ks 576 768 1536 3328]
    python tests/perf/ab_kernels.py attn    [--rev HEAD] [--threads 1] [--tokens 200] [--ctx 0 1000] [--window 128]
    python tests/perf/ab_kernels.py decode  [--rev HEAD] [--threads 1] [--ctx 100 1500] [--window 256]
    python tests/perf/ab_kernels.py prefill [--rev HEAD] [--threads 1] [--tokens 200] [--config full]

gemm: `tc_gemm`, 768 rows x K, per K. attn: `tc_prefill_attn` (12 / 4 heads, D 64) after ctx earlier tokens.
decode: `tc_attn`, one token at position ctx (the same heads; a local and a full layer), 10x the rounds.
prefill: a whole int8 prefill of a random-weight config, the module's loaded library swapped between rounds.
Each line: medians (ms), new / old time (median of per-round ratios) and whether the outputs are `torch.equal`.
TINYCHAT_NATIVE_ARCH builds both sides for another level (e.g. the evex256 stand-in, see README.md here).
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))                    # this checkout's tinychat, not an installed one

from tinychat.engine import native  # noqa: E402


def builds(rev: str):
    """(old, new): the kernels built from rev's C sources and from the working tree's, both loaded."""
    new = native.load()
    if new is None:
        sys.exit(f"no native kernels here: {native.why_not}")
    src, headers = native.SOURCE, dict(native.SOURCES)
    try:
        for name in headers:             # a file the revision lacks: empty (its sources do not include it)
            got = subprocess.run(["git", "show", f"{rev}:tinychat/engine/{name}"], cwd=ROOT, capture_output=True,
                                 text=True)
            if got.returncode and name == "native.c":
                sys.exit(f"{rev}: no tinychat/engine/native.c ({got.stderr.strip()})")
            native.SOURCES[name] = got.stdout if got.returncode == 0 else ""
        native.SOURCE = native.SOURCES["native.c"]
        old = ctypes.CDLL(str(native._build(native._compiler())))
    finally:
        native.SOURCE = src
        native.SOURCES.clear()
        native.SOURCES.update(headers)
    for name in dir(new):                        # the same signatures (declared on the loaded side)
        if name.startswith("tc_") and hasattr(old, name):
            f, g = getattr(old, name), getattr(new, name)
            f.argtypes, f.restype = g.argtypes, g.restype
    return old, new


def interleave(rounds: int, sides: dict, warm: int = 3):
    """Run each side's callable once a round; returns {side: [seconds]}, {side: last output}."""
    ts, out = {k: [] for k in sides}, {}
    for r in range(warm + rounds):
        for k, f in sides.items():
            t = time.perf_counter()
            out[k] = f()
            if r >= warm:
                ts[k].append(time.perf_counter() - t)
    return ts, out


def report(label: str, ts, out):
    ratio = statistics.median(b / a for a, b in zip(ts["old"], ts["new"]))
    same = torch.equal(out["old"], out["new"])
    print(f"{label}: old {statistics.median(ts['old']) * 1e3:.3f} ms, new {statistics.median(ts['new']) * 1e3:.3f} "
          f"ms, new/old {ratio:.3f}, outputs equal: {same}")


def gemm(a, libs):
    M, N, nt = a.tokens, 768, a.threads
    for K in a.ks:
        g = torch.Generator().manual_seed(K)
        q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        s, x = torch.rand(N, generator=g) + 0.5, torch.randn(M, K, generator=g)
        sc = torch.empty(int(libs["new"].tc_gemm_act_bytes(M, K, nt)), dtype=torch.uint8)
        sides = {k: (lambda lib=lib: native.gemm(lib, x, q, s, None, nt, sc)) for k, lib in libs.items()}
        report(f"gemm {M} x {N} x K={K}, {nt} thread(s)", *interleave(a.rounds, sides))


def attn(a, libs):
    C, W, H, Hk, D = a.tokens, a.window, 12, 4, 64
    for L0 in a.ctx:
        g = torch.Generator().manual_seed(C + L0)
        q = torch.randn(H, C, D, generator=g) * 0.3
        kg, vg = torch.randn(Hk, L0 + C + 1, D, generator=g), torch.randn(Hk, L0 + C + 1, D, generator=g)
        seq = None
        if W:
            sp = torch.arange(L0 - W, L0 + C, dtype=torch.int64).clamp_min(-1)
            seq = (torch.randn(Hk, W + C, D, generator=g), torch.randn(Hk, W + C, D, generator=g), sp)
        sides = {k: (lambda lib=lib: native.prefill_attn(lib, q, kg, vg, seq, L0, W)) for k, lib in libs.items()}
        report(f"prefill attention, {C} queries after {L0}, band {W}, {a.threads} thread(s)",
               *interleave(a.rounds, sides))


def decode(a, libs):
    H, Hk, D, W = 12, 4, 64, a.window
    for L in a.ctx:
        for full in (0, 1):
            g = torch.Generator().manual_seed(L + full)
            heads = torch.randn((H + 4 * Hk) * D, generator=g)
            ang = torch.rand(D // 2, generator=g) * 6
            cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
            lk, lv = torch.randn(Hk, W + 1, D, generator=g), torch.randn(Hk, W + 1, D, generator=g)
            gk, gv = torch.randn(Hk, L + 2, D, generator=g), torch.randn(Hk, L + 2, D, generator=g)
            lpos = torch.full((W + 1,), -1, dtype=torch.long)
            for p in range(max(0, L - W + 1), L + 1):      # the ring holds the last W positions
                lpos[p % W] = p
            sc = torch.empty(a.threads * (H // Hk) * (L + 2 + W))

            def run(lib):
                y, h = torch.empty(H * D), heads.clone()
                lib.tc_attn(h.data_ptr(), H, Hk, D, full, cos.data_ptr(), sin.data_ptr(), lk.data_ptr(),
                            lv.data_ptr(), W, gk.data_ptr(), gv.data_ptr(), L + 2, lpos.data_ptr(), L, y.data_ptr(),
                            sc.data_ptr(), a.threads)
                return y
            sides = {k: (lambda lib=lib: run(lib)) for k, lib in libs.items()}
            report(f"decode attention at {L} ({'full' if full else 'local'} layer), band {W}, {a.threads} "
                   f"thread(s)", *interleave(a.rounds * 10, sides, 30))


def prefill(a, libs):
    from tinychat.engine import KVCache, append, quantize_cpu
    from tinychat.model import TinyAgentLM, config_for
    torch.manual_seed(0)
    m = quantize_cpu(TinyAgentLM(config_for(a.config)).eval(), "int8")
    n = a.tokens
    cache = KVCache(m, 1, n + 1, "cpu", dtype=torch.float32)
    idx = torch.randint(0, m.cfg.vocab_size, (1, n))

    def run(lib):
        native._lib = lib                        # every kernel call of the prefill goes to this build
        cache.reset([0])
        return append(m, cache, idx, [n])
    try:
        sides = {k: (lambda lib=lib: run(lib)) for k, lib in libs.items()}
        report(f"{a.config} int8 prefill of {n} tokens, {a.threads} thread(s)", *interleave(a.rounds, sides, 1))
    finally:
        native._lib = libs["new"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["gemm", "attn", "decode", "prefill"])
    ap.add_argument("--rev", default="HEAD", help="the revision whose C sources are the old side")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=0, help="default: 35 (gemm, attn), 12 (prefill)")
    ap.add_argument("--ks", type=int, nargs="+", default=[576, 768, 1536, 3328])
    ap.add_argument("--ctx", type=int, nargs="+", default=[0, 1000])
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--config", default="full")
    a = ap.parse_args()
    a.rounds = a.rounds or (12 if a.what == "prefill" else 35)
    torch.set_num_threads(a.threads)
    old, new = builds(a.rev)
    print(f"kernel path {new.tc_kernel_path().decode()}; old = {a.rev}'s C sources, new = the working tree's")
    {"gemm": gemm, "attn": attn, "decode": decode, "prefill": prefill}[a.what](a, {"old": old, "new": new})


if __name__ == "__main__":
    main()
