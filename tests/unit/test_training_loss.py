"""The trainer's fast paths against the plain ones: query-blocked attention against the dense (T, 2T) mask, and the
fused head + cross-entropy against the model's forward and F.cross_entropy (loss and every gradient)."""
import pytest
import torch

from support import make_llama_model, make_model
from tinychat.model import grouped_attention
from tinychat.training.loss import BLOCK_ROWS, masked_loss, masked_loss_reference


def _qkv(B=2, H=4, Hk=2, T=50, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda h: torch.randn(B, h, T, D, generator=g, dtype=torch.float64)   # noqa: E731
    return r(H), r(Hk), r(Hk), r(Hk), r(Hk)


@pytest.mark.parametrize("T,window,chunk", [(50, 8, 16), (50, 8, 7), (33, 20, 16), (64, 8, 64), (9, 4, 16)])
def test_query_blocks_attend_exactly_like_the_dense_mask(T, window, chunk):
    q, kg, vg, kl, vl = _qkv(T=T)
    dense = grouped_attention(q, kg, vg, kl, vl, window, chunk=0)
    blocked = grouped_attention(q, kg, vg, kl, vl, window, chunk=chunk)
    assert torch.allclose(blocked, dense, atol=1e-12, rtol=0)
    # and the dense form is the naive one: repeated K/V heads, the (T, 2T) mask written out
    i = torch.arange(T)
    g = i[None, :] <= i[:, None]
    m = torch.cat([g, g & (i[:, None] - i[None, :] < window)], 1)
    K, V = torch.cat([kg, kl], 2).repeat_interleave(2, 1), torch.cat([vg, vl], 2).repeat_interleave(2, 1)
    s = (q @ K.transpose(-1, -2)) / q.size(-1) ** 0.5
    naive = s.masked_fill(~m, float("-inf")).softmax(-1) @ V
    assert torch.allclose(dense, naive, atol=1e-12, rtol=0)


def test_query_blocks_without_local_keys_are_plain_causal_attention():
    q, kg, vg, _, _ = _qkv(T=40)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kg.repeat_interleave(2, 1), vg.repeat_interleave(2, 1),
                                                           is_causal=True)
    assert torch.allclose(grouped_attention(q, kg, vg, None, None, 0, chunk=16), ref, atol=1e-12, rtol=0)


def test_a_blocked_forward_gives_the_same_logits():
    m = make_model(seed=3)
    idx = torch.randint(0, m.cfg.vocab_size, (2, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(m(idx, attn_chunk=16), m(idx), atol=1e-4, rtol=0)


def _batch(model, B=3, T=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, model.cfg.vocab_size, (B, T), generator=g)
    tgt = torch.randint(0, model.cfg.vocab_size, (B, T), generator=g)
    msk = torch.rand(B, T, generator=g) < 0.6
    msk[0, :5] = True
    return idx, tgt, msk


def _loss_and_grads(fn, model, batch, **kw):
    model.zero_grad(set_to_none=True)
    loss, n = fn(model, *batch, **kw)
    loss.backward()
    return float(loss.detach()), n, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("make", [make_model, make_llama_model], ids=["tinyagent", "llama"])
def test_the_fused_head_loss_equals_the_plain_one_with_every_gradient(make):
    model = make(seed=1).train()
    batch = _batch(model)
    assert int(batch[2].sum()) > BLOCK_ROWS                        # several row blocks
    fast = _loss_and_grads(masked_loss, model, batch, bf16=False, attn_chunk=64)
    ref = _loss_and_grads(masked_loss_reference, model, batch, bf16=False)
    assert fast[1] == ref[1] == int(batch[2].sum())
    assert fast[0] == pytest.approx(ref[0], rel=1e-5)
    assert fast[2].keys() == ref[2].keys() and "head.weight" in fast[2]
    for k in ref[2]:
        scale = ref[2][k].abs().max().item() or 1.0
        assert (fast[2][k] - ref[2][k]).abs().max().item() <= 1e-4 * scale, k


def test_the_fused_head_loss_in_bf16_stays_close_to_the_plain_bf16_loss():
    model = make_model(seed=2).train()
    batch = _batch(model, seed=5)
    fast = _loss_and_grads(masked_loss, model, batch, bf16=True)
    ref = _loss_and_grads(masked_loss_reference, model, batch, bf16=True)
    assert fast[0] == pytest.approx(ref[0], rel=2e-2)
    for k in ref[2]:
        cos = torch.nn.functional.cosine_similarity(fast[2][k].flatten(), ref[2][k].flatten(), dim=0)
        assert cos > 0.99, (k, float(cos))


def test_the_fused_head_loss_without_gradients_keeps_no_gradient_buffer():
    model = make_model(seed=4)
    batch = _batch(model, T=120)
    with torch.no_grad():
        fast, n = masked_loss(model, *batch, bf16=False)
        ref, m = masked_loss_reference(model, *batch, bf16=False)
    assert n == m and float(fast) == pytest.approx(float(ref), rel=1e-5)
