"""The int4 weights of `--quant int4` (native_q4.h, quant_int4.py's Int4Linear): the rounding of quantize_int4, the packed
layout, and the GEMV / GEMM kernels against a float64 reference of the same rounding on odd shapes and 1 / 2 threads.
The other kernel paths (AVX2 +- VNNI, AVX-512 without VNNI, scalar, NEON under qemu) run the same checks through
tests/native/q8_harness.c (test_native_q8_targets.py)."""
import pytest
import torch

from tinychat.engine import native
from tinychat.engine import prefill_policy, quant_int4
from tinychat.engine.quant import Int4Linear, quantize_int4

lib = native.load()
needs_kernels = pytest.mark.skipif(lib is None, reason=f"native kernels off: {native.why_not}")
G = torch.Generator().manual_seed(11)


def _rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def test_int4_rounding_is_within_half_a_step_of_each_weight_and_reads_back_as_packed():
    w = torch.randn(37, 100, generator=G) * torch.rand(37, 1, generator=G) * 3
    w[3, 32:64] = 0.0                                   # an all-zero group: scale 0, weights 0
    packed, scales = quantize_int4(w)
    assert packed.shape == (37, 64) and packed.dtype == torch.uint8      # 100 columns padded to 128
    assert scales.shape == (37, 4) and scales.dtype == torch.float16
    deq = native.dequant4_ref(packed, scales, 100)
    step = scales.double().abs().repeat_interleave(32, dim=1)[:, :100]
    q = native.unpack4(packed, 100)
    clamped = (q == -8) | (q == 7)
    assert ((deq - w.double()).abs() <= step * 0.5 + 1e-6)[~clamped].all()
    # a clamped value: within 1.5 steps (the -8.5 candidate maps the largest magnitude to -8.5, so a value of the
    # other sign as large reaches 8.5 and is clamped to 7)
    assert ((deq - w.double()).abs() <= step * 1.5 + 1e-6).all()
    assert deq[3, 32:64].eq(0).all() and scales[3, 1] == 0
    assert native.unpack4(packed, 128)[:, 100:].eq(0).all()              # the padding is q = 0
    p2, s2 = quantize_int4(w.clone())
    assert torch.equal(p2, packed) and torch.equal(s2, scales)            # deterministic


def test_int4_quantization_error_is_below_q4_0s_plain_rounding():
    """The scale search keeps Q4_0's own candidate (-8) when nothing beats it, so the error can only go down."""
    w = torch.randn(64, 256, generator=G)
    packed, scales = quantize_int4(w)
    err = (native.dequant4_ref(packed, scales, 256) - w.double()).square().sum()
    g = w.view(64, 8, 32)
    m = g.gather(-1, g.abs().argmax(-1, keepdim=True))
    d = (m / -8).half().float()
    plain = ((g / d).round().clamp(-8, 7) * d - g).double().square().sum()
    assert err < plain * 0.97


@needs_kernels
@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("M,N,K", [(1, 5, 19), (67, 37, 80), (9, 8, 576), (130, 12, 1536), (3, 7, 300)])
def test_int4_gemm_and_gemv_equal_the_float64_reference_of_their_rounding(M, N, K, nt):
    packed, scales = native.random_int4(N, K, G)
    x = torch.randn(M, K, generator=G)
    x[0, :7] *= 50                                      # a spiky block
    b = torch.randn(N, generator=G)
    ref = native.gemm4_ref(x, packed, scales, b)
    y = native.gemm4(lib, x, packed, scales, b, nt)
    assert _rel(y, ref) < 1e-5
    for m in (0, M - 1):                                 # each token's row is what decoding it gives
        v = native.gemv4(lib, x[m].contiguous(), packed, scales, nt) + b
        assert _rel(v, ref[m]) < 1e-5 and _rel(v, y[m]) < 1e-5


@needs_kernels
@pytest.mark.parametrize("M,N,K", [(200, 37, 896), (130, 24, 384), (67, 8, 1100), (200, 29, 576), (70, 19, 33)])
def test_the_int4_gemm_gives_the_same_bits_on_any_number_of_threads(M, N, K):
    # the threads split the row tiles (each unpacked by one thread), a run's ends falling inside a tile's chunks
    # on some counts; K = 384, 896, 1,100 are zero-padded past their super-blocks on the VNNI paths; K = 576, 33: a
    # rest of <= 64 columns, a super-block of its own on AVX-512 (row tiles' rests with rows past N repeated)
    packed, scales = native.random_int4(N, K, G)
    x = torch.randn(M, K, generator=G)
    b = torch.randn(N, generator=G)
    one = native.gemm4(lib, x, packed, scales, b, 1)
    assert _rel(one, native.gemm4_ref(x, packed, scales, b)) < 1e-5
    for nt in (2, 3, 5):
        assert torch.equal(native.gemm4(lib, x, packed, scales, b, nt), one)


@needs_kernels
def test_an_int4_linear_runs_its_rows_on_the_kernels_and_fuses_rows_exactly():
    lins = [torch.nn.Linear(96, n, bias=True) for n in (40, 24)]
    q = [Int4Linear(lin, prefill_bf16=False) for lin in lins]
    assert q[0].prefill_kernel(64) == "native-gemm"
    x = torch.randn(2, 5, 96, generator=G)
    y = q[0](x)
    assert y.shape == (2, 5, 40)
    ref = native.gemm4_ref(x.view(-1, 96), q[0].qweight, q[0].scale, q[0].bias.float())
    assert _rel(y.view(-1, 40), ref) < 1e-5
    fused = Int4Linear.from_rows([(q[0], 0, 40), (q[1], 8, 24)])
    assert torch.equal(fused.qweight, torch.cat([q[0].qweight, q[1].qweight[8:]]))
    assert torch.equal(fused.scale, torch.cat([q[0].scale, q[1].scale[8:]]))
    w = q[0].weight                                      # the dequantized rows: within a step of the fp32 ones
    assert (w - lins[0].weight).abs().max() <= 1.5 * q[0].scale.float().abs().max()     # 1.5: see above
    q[0].native = False                                  # the fallback: fp32 GEMM on the dequantized weights
    assert q[0].prefill_kernel(64) == "fp32-gemm"
    assert _rel(q[0](x).view(-1, 40), ref) < 0.02


@needs_kernels
@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("N,K", [(5, 19), (37, 80), (9, 576), (3, 300), (130, 64)])
def test_int4_rows_dequantize_to_bf16_bit_for_bit_as_torch_rounds_them(N, K, nt):
    packed, scales = native.random_int4(N, K, G)
    scales[0, 0], scales[-1, -1] = 0.0, -0.0            # zero scales of both signs keep their zeros' signs
    want = native.dequant4_ref(packed, scales, K).float().to(torch.bfloat16)
    got = native.dequant4_bf16(lib, packed, scales, K, nt)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@needs_kernels
def test_an_int4_linear_prefills_on_bf16_gemms_where_asked_and_by_default_on_amx(monkeypatch):
    lin = torch.nn.Linear(200, 70, bias=True)
    m = Int4Linear(lin, prefill_bf16=True)
    assert m.prefill_kernel(64) == "bf16-gemm"
    assert m.prefill_kernel(prefill_policy.INT8_GEMV_ROWS_BF16) == "native-gemm"     # a few rows: the int4 GEMM
    x = torch.randn(40, 200, generator=G)
    want = x.double() @ native.dequant4_ref(m.qweight, m.scale, 200).t() + m.bias.double()
    y = m(x)
    assert _rel(y, want) < 2e-2
    monkeypatch.setattr(quant_int4, "BF16_BLOCK", 2 * 200 * 16)             # blocks of 16 rows: 16, 16, ..., 6
    assert _rel(m(x), y) < 1e-2
    m.prefill_bf16 = None                                # the default: bf16 GEMMs on AMX machines only
    for amx, kernel in ((True, "bf16-gemm"), (False, "native-gemm")):
        monkeypatch.setattr(prefill_policy, "cpu_has_bf16_dot", lambda: True)
        monkeypatch.setattr(prefill_policy, "cpu_has_amx", lambda amx=amx: amx)
        assert m.prefill_kernel(64) == kernel
    m.prefill_bf16 = False
    assert m.prefill_kernel(64) == "native-gemm"
