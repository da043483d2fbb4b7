"""The native prefill attention (native.prefill_attn, tc_prefill_attn) against a dense float64 reference, and an
int8 model's prefill through it against the SDPA path it replaces."""
import importlib

import pytest
import torch

from support import make_llama_model, make_model
from tinychat.engine import KVCache, quantize_cpu
from tinychat.engine import native

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"native kernels off: {native.why_not}")
Am = importlib.import_module("tinychat.engine.append")


def _reference(q, kg, vg, seq, L0, W):
    """Dense float64: query i (position L0 + i) over global keys 0..L0 + i, then band entries i + 1 .. i + W whose
    position is not -1."""
    H, C, D = q.shape
    Hk = kg.size(0)
    rep = H // Hk
    y = torch.zeros(H, C, D, dtype=torch.float64)
    for h in range(H):
        g = h // rep
        for i in range(C):
            K, V = kg[g, :L0 + i + 1].double(), vg[g, :L0 + i + 1].double()
            if seq is not None:
                sk, sv, sp = seq
                band = [j for j in range(i + 1, i + W + 1) if sp[j] >= 0]
                K = torch.cat([K, sk[g, band].double()])
                V = torch.cat([V, sv[g, band].double()])
            p = torch.softmax(K @ q[h, i].double(), dim=0)
            y[h, i] = p @ V
    return y


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("D", [64, 24], ids=["D64-simd", "D24-plain"])
@pytest.mark.parametrize("W", [0, 8], ids=["global-only", "with-band"])
@pytest.mark.parametrize("H,Hk", [(6, 2), (8, 2), (8, 4), (5, 5)], ids=["rep3", "rep4", "rep2", "rep1"])
def test_prefill_attention_equals_the_dense_float64_reference(W, D, nt, H, Hk):
    # rep = H / Hk q heads per K/V group: AVX-512 runs groups of 2, 3 or 4 heads in one pass (D = 64)
    g = torch.Generator().manual_seed(W + D + H * Hk)
    C, L0, M = 13, 21, 64
    q = torch.randn(H, C, D, generator=g) * 0.5
    kg, vg = torch.randn(Hk, M + 1, D, generator=g), torch.randn(Hk, M + 1, D, generator=g)
    seq = None
    if W:
        sk, sv = torch.randn(Hk, W + C, D, generator=g), torch.randn(Hk, W + C, D, generator=g)
        sp = torch.arange(L0 - W, L0 + C, dtype=torch.int64)
        sp[2] = -1                                     # a ring slot that holds no key of the band
        seq = (sk, sv, sp)
    prev = torch.get_num_threads()
    torch.set_num_threads(nt)
    try:
        y = native.prefill_attn(native.load(), q, kg, vg, seq, L0, W)
    finally:
        torch.set_num_threads(prev)
    want = _reference(q, kg, vg, seq, L0, W)
    assert (y.double() - want).abs().max() < 1e-5


@pytest.mark.parametrize("D", [64, 24], ids=["D64-simd", "D24-plain"])
@pytest.mark.parametrize("H,Hk", [(6, 2), (8, 2), (5, 5)], ids=["rep3", "rep4", "rep1"])
def test_a_query_gets_the_same_bits_whatever_chunk_it_comes_in(D, H, Hk):
    # a cache rebuilt by one long prefill must equal the one the turns' shorter prefills made (restore, replay)
    g = torch.Generator().manual_seed(D + H)
    C, L0, M, W = 23, 9, 64, 8
    q = torch.randn(H, C, D, generator=g)
    kg, vg = torch.randn(Hk, M + 1, D, generator=g), torch.randn(Hk, M + 1, D, generator=g)
    sk, sv = torch.randn(Hk, W + C, D, generator=g), torch.randn(Hk, W + C, D, generator=g)
    sp = torch.arange(L0 - W, L0 + C, dtype=torch.int64)
    sp[sp < 0] = -1                                    # early on the ring holds fewer than W keys
    lib = native.load()
    whole = native.prefill_attn(lib, q, kg, vg, (sk, sv, sp), L0, W)
    parts, at = [], 0
    for n in (1, 5, 3, 14):                            # the same queries in four calls
        band = slice(at, at + W + n)                   # the W entries before the chunk, then its own
        parts.append(native.prefill_attn(lib, q[:, at:at + n], kg, vg, (sk[:, band], sv[:, band], sp[band]),
                                         L0 + at, W))
        at += n
    assert torch.equal(torch.cat(parts, dim=1), whole)


@pytest.mark.parametrize("make", [make_model, make_llama_model], ids=["tinyagent", "llama"])
def test_an_int8_prefill_on_the_native_attention_stays_with_the_sdpa_prefill(make, monkeypatch):
    q = quantize_cpu(make(), "int8")
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randint(0, 400, (1, n), generator=g) for n in (150, 90, 7)]
    calls = []
    real = native.prefill_attn
    monkeypatch.setattr(native, "prefill_attn", lambda *a, **k: calls.append(1) or real(*a, **k))
    outs = []
    for use in (True, False):
        if not use:
            monkeypatch.setattr(Am, "_native_attn", lambda *a, **k: None)
        cache = KVCache(q, 1, 512, "cpu", dtype=torch.float32)
        outs.append(torch.stack([Am.append(q, cache, c, [c.size(1)])[0] for c in chunks]))
    assert len(calls) == 3 * len(q.blocks)                # the first pass only, every layer of every chunk
    rel = ((outs[0] - outs[1]).abs().max() / outs[1].abs().max()).item()
    assert rel < 0.02                                     # int8 activation rounding can amplify fp32 differences
    assert (outs[0].argmax(-1) == outs[1].argmax(-1)).all()


def test_fp32_and_bf16_models_keep_the_sdpa_prefill(monkeypatch):
    calls = []
    monkeypatch.setattr(native, "prefill_attn", lambda *a, **k: calls.append(1))
    for mode in ("none", "bf16"):
        m = make_model() if mode == "none" else quantize_cpu(make_model(), "bf16")
        cache = KVCache(m, 1, 256, "cpu", dtype=torch.float32)
        Am.append(m, cache, torch.randint(0, 400, (1, 40)), [40])
    assert calls == []


def _cpu_has(flag: str) -> bool:
    try:
        return any(flag in line.split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except OSError:
        return False


LEVELS = [("-march=x86-64-v3", "avx2", ("avx2", "fma")),
          # AVX-512 without VNNI (Skylake-SP): the 16-lane attention beside the AVX2 level's 256-bit int8 dots
          ("-march=x86-64-v4", "avx512", ("avx512f", "avx512bw", "avx512vl", "avx2", "fma"))]


@pytest.mark.parametrize("arch,path,needs", LEVELS, ids=[p for _, p, _ in LEVELS])
def test_another_levels_build_runs_the_kernel_tests_under_its_own_path_name(arch, path, needs, tmp_path):
    """The kernels built for another x86 level (TINYCHAT_NATIVE_ARCH, as tests/perf measures it): the path is named
    for the kernels that really run, with its step version, and the GEMV / GEMM, decode and prefill attention tests
    pass on that build in a process of their own (an AVX2 laptop's attend_grp8 / exp8 and its 8-lane SwiGLU in the
    llama step; an AVX-512 server without VNNI's 16-lane attention and 256-bit dots)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    if not all(_cpu_has(f) for f in needs):
        pytest.skip(f"needs a CPU with {', '.join(needs)}")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TINYCHAT_NATIVE_ARCH": arch, "TINYCHAT_HOME": str(tmp_path)}
    probe = subprocess.run([sys.executable, "-c", "from tinychat.engine import native; "
                            "print(native.kernel_path(), native.step_version())"],
                           env=env, capture_output=True, text=True, cwd=root)
    assert probe.stdout.split() == [path, str(native.KERNEL_PATHS[path].step_version)], probe.stderr[-500:]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/unit/test_native_prefill_attn.py", "tests/unit/test_native_attention.py",
                        "tests/unit/test_native_q8.py", "tests/unit/test_native_llama.py", "-k",
                        "not another_levels_build"],
                       env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("D", [64, 24])
def test_rope_heads_gives_the_bits_of_the_torch_rotation_and_scaling(nt, D):
    # a projection's (C, 2, nh, D) output viewed head-major, as the prefill hands it over; out: the cache's rows
    lib = native.load()
    C, nh, L0, M = 37, 3, 5, 64
    g = torch.Generator().manual_seed(D + nt)
    proj = torch.randn(C, 2, nh, D, generator=g) * 4
    x = proj.permute(1, 2, 0, 3)[0]                                    # (nh, C, D), strided
    ang = torch.rand(C, D // 2, generator=g) * 50
    cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
    before = torch.get_num_threads()
    torch.set_num_threads(nt)
    try:
        _check_rope_heads(lib, proj, x, cos, sin, nh, C, D, L0, M)
    finally:
        torch.set_num_threads(before)


def _check_rope_heads(lib, proj, x, cos, sin, nh, C, D, L0, M):
    want = Am._rope_cs(x[None], cos[None, None], sin[None, None])[0]
    assert torch.equal(native.rope_heads(lib, x, (cos, sin)), want)
    assert torch.equal(native.rope_heads(lib, x, (cos, sin), D ** -0.5), want * D ** -0.5)
    cache = torch.zeros(nh, M, D)
    native.rope_heads(lib, x, (cos, sin), out=cache[:, L0:L0 + C])
    assert torch.equal(cache[:, L0:L0 + C], want) and not cache[:, :L0].any() and not cache[:, L0 + C:].any()
    native.rope_heads(lib, proj.permute(1, 2, 0, 3)[1], None, out=cache[:, L0:L0 + C])           # a copy
    assert torch.equal(cache[:, L0:L0 + C], proj[:, 1].transpose(0, 1))
    with pytest.raises(ValueError):
        native.rope_heads(lib, x.transpose(1, 2), (cos, sin))
