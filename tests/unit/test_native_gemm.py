"""Prefill's int8 GEMM (engine/native_gemm.h, tc_gemm): every token's activations rounded to int8 in blocks of 32 with
one fp32 scale each, exactly as the GEMV rounds one vector. What it promises: the GEMM equals float64 math on the
rounded activations (native.gemm_ref) up to fp32 summation order (1e-5 of the largest output) on any shape
(remainder tokens, rows and columns), with or without a bias, on 1 or 2 threads; and a token's row equals the GEMV
of that token (what the native decode step computes for it) to the same tolerance."""
import pytest
import torch

from tinychat.engine import native

SHAPES = [(1, 1, 1), (5, 7, 19), (67, 37, 80), (130, 64, 768), (9, 13, 100), (3, 5, 3328), (200, 12, 33),
          (64, 4, 64), (11, 7, 576), (6, 9, 300), (13, 5, 1100), (7, 10, 1536)]    # K: whole and partial super-blocks


@pytest.fixture(scope="module")
def lib():
    lib = native.load()
    if lib is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    return lib


def _case(M, N, K, seed=0):
    g = torch.Generator().manual_seed(seed + M * 131 + N * 7 + K)
    q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    s = torch.rand(N, generator=g) + 0.5
    x = torch.randn(M, K, generator=g) * torch.where(torch.rand(M, K, generator=g) < 0.02, 40.0, 1.0)
    return q, s, x, torch.randn(N, generator=g)


def _err(y, ref):
    return ((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("nt", [1, 2])
def test_native_gemm_equals_float64_math_on_the_rounded_activations(lib, M, N, K, nt):
    q, s, x, b = _case(M, N, K)
    for bias in (None, b):
        ref = native.gemm_ref(x, q, s, bias)
        assert _err(native.gemm(lib, x, q, s, bias, nt), ref) <= 1e-5
        y = torch.empty(M, N)                               # the naive C reference, one token at a time
        scratch = torch.empty(int(lib.tc_act_bytes(max(K, 64))), dtype=torch.uint8)
        lib.tc_gemm_ref(x.data_ptr(), scratch.data_ptr(), q.data_ptr(), s.data_ptr(),
                        None if bias is None else bias.data_ptr(), y.data_ptr(), M, N, K)
        assert _err(y, ref) <= 1e-5


@pytest.mark.parametrize("M", [130, 200, 257])
def test_the_output_is_the_same_bits_whatever_the_chunking(lib, M):
    # chunks are sized by the thread count (200 tokens: 64 each on 1 thread, 50 on 2, 34 on 3): no token's
    # output may depend on which tokens share its chunk or register tile
    for K in (96, 1100):                  # the GEMV's layout only; super-blocks, a half one and the rest
        q, s, x, b = _case(M, 24, K)
        one = native.gemm(lib, x, q, s, b, 1)
        for nt in (2, 3):
            assert torch.equal(native.gemm(lib, x, q, s, b, nt), one)


def test_a_prefilled_token_gets_what_the_gemv_gives_it(lib):
    q, s, x, _ = _case(33, 50, 768)
    y = native.gemm(lib, x, q, s, None, 2)
    xq = native.act_scratch(lib, 768)
    for m in (0, 17, 32):
        v = torch.empty(50)
        lib.tc_gemv(x[m].contiguous().data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), v.data_ptr(), 50, 768,
                    0, 1)
        assert _err(y[m], v.double()) <= 1e-5


def test_the_gemm_rounds_the_activations_unlike_fp32_math(lib):
    q, s, x, _ = _case(40, 24, 256)
    fp = (x.double() @ q.double().t()) * s.double()
    rel = _err(native.gemm(lib, x, q, s, None, 1), fp)
    assert 1e-5 < rel < 0.02                                 # really rounded, by about the int8 step


def test_zero_and_nonfinite_tokens_stay_their_own(lib):
    q, s, x, b = _case(6, 9, 70)
    x[1] = 0.0
    x[4, 40] = float("nan")
    y = native.gemm(lib, x, q, s, b, 2)
    assert torch.equal(y[1], b)                              # an all-zero token: only the bias
    assert torch.isnan(y[4]).all() and torch.isfinite(y[[0, 2, 3, 5]]).all()


def test_bad_operands_are_refused_before_the_kernel_runs(lib):
    q, s, x, b = _case(4, 8, 32)
    with pytest.raises(ValueError):
        native.gemm(lib, x.double(), q, s, b, 1)
    with pytest.raises(ValueError):
        native.gemm(lib, x, q[:, :16].contiguous(), s, b, 1)
    with pytest.raises(ValueError):
        native.gemm(lib, x, q, s, b[:3], 1)
