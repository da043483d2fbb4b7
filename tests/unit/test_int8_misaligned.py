"""Int8Linear on a weight whose first byte is not 64-byte aligned (a stored file's mapped tensor can lie at any
offset): torch's int8 kernel faulted on such a (2048, 2048) weight for a prefill of <= INT8_GEMM_ROWS tokens and in
the lean step's mm, killing the process."""
import torch

from tinychat.engine.quant import Int8Linear


def _misaligned(lin: Int8Linear, off: int = 8) -> Int8Linear:
    q = lin.qweight
    buf = torch.empty(q.numel() + 64, dtype=torch.int8)
    view = buf[off:off + q.numel()].view_as(q).copy_(q)
    assert view.data_ptr() % 64 == off
    return Int8Linear.from_packed(view, lin.scale, None if lin.bias is None else lin.bias.detach(), lin.in_features)


def test_a_misaligned_int8_weight_gives_the_aligned_results_for_few_rows_and_mm():
    torch.manual_seed(0)
    lin = Int8Linear(torch.nn.Linear(2048, 2048, bias=False))
    odd = _misaligned(lin)
    x = torch.randn(1, 4, 2048)
    ref = x @ lin.weight.T
    for native in (True, False):                   # the native GEMM (int8 activations) or torch's kernel on a copy
        lin.native = odd.native = native
        assert (odd(x) - ref).abs().max() < 0.05 * ref.abs().max()
    xb = torch.randn(3, 2048).to(torch.bfloat16)
    assert torch.equal(odd.mm(xb), lin.mm(xb))
    assert odd.qweight.data_ptr() % 64 == 8        # the module's own tensor is kept (mapped pages stay mapped)
