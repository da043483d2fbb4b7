"""The int8 GEMV kernels (engine/native_q8.h): int8 activations in blocks of 32 with one fp32 scale each, exact int32
block dots. What they promise: the GEMV equals float64 math on the rounded activations (native.quant8_ref) up to
fp32 summation order (1e-5 of the largest output), and the rounding itself is within half a step of each block's
scale (max|block| / 127)."""
import pytest
import torch

from tinychat.engine import native


@pytest.fixture(scope="module")
def lib():
    lib = native.load()
    if lib is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    return lib


def test_int8_activation_rounding_is_within_half_a_step_of_each_block_scale():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3328, generator=g) * torch.where(torch.rand(3328, generator=g) < 0.02, 50.0, 1.0)
    x[64:96] = 0.0                                           # an all-zero block stays zero
    deq = native.quant8_ref(x)
    step = x.view(-1, 32).abs().amax(1).double() / 127.0
    err = (deq - x.double()).abs().view(-1, 32)
    assert (err <= step[:, None] * 0.5 + 1e-9).all()
    assert (deq[64:96] == 0).all()
    assert err.max() > 0                                     # really rounded
    assert torch.isnan(native.quant8_ref(torch.tensor([1.0, float("inf"), 2.0]))).all()


@pytest.mark.parametrize("N,K", [(37, 80), (64, 768), (5, 19), (12, 3328), (9, 100), (1, 1)])
@pytest.mark.parametrize("nt", [1, 2])
def test_native_gemv_equals_float64_math_on_the_rounded_activations(lib, N, K, nt):
    g = torch.Generator().manual_seed(N * K)
    q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    s = torch.rand(N, generator=g) + 0.5
    x = torch.randn(K, generator=g)
    ref = (q.double() @ native.quant8_ref(x)) * s.double()
    xq = native.act_scratch(lib, K)
    y = torch.full((N,), 2.0)
    lib.tc_gemv(x.data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), N, K, 1, nt)
    assert ((y.double() - 2.0 - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-6).item()
    yr = torch.empty(N)
    lib.tc_gemv_ref(x.data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), yr.data_ptr(), N, K, 0)  # the naive C
    assert ((yr.double() - ref).abs().max() <= 1e-5 * ref.abs().max() + 1e-6).item()


def test_native_gemv_differs_from_bf16_activations_by_less_than_one_percent(lib):
    """The fast step's int8 activations against the PyTorch lean step's bf16 ones (aten._weight_int8pack_mm) on the
    same int8 weights: both round the activations, differently."""
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (256, 768), dtype=torch.int8, generator=g)
    s = (torch.rand(256, generator=g) * 0.01).to(torch.bfloat16)
    x = torch.randn(768, generator=g)
    y, sf, xq = torch.empty(256), s.float(), native.act_scratch(lib, 768)     # (held: raw pointers below)
    lib.tc_gemv(x.data_ptr(), xq.data_ptr(), q.data_ptr(), sf.data_ptr(), y.data_ptr(), 256, 768, 0, 1)
    aten = torch.ops.aten._weight_int8pack_mm(x[None].to(torch.bfloat16), q, s).float()[0]
    rel = ((y - aten).abs().max() / aten.abs().max()).item()
    assert 0 < rel < 0.01


def test_the_kernel_path_is_named(lib):
    assert native.kernel_path() in native.KERNEL_PATHS
