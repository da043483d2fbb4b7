"""The native attention kernel (tc_attn: q/k norms, RoPE, cache writes, one softmax over [global | ring] keys)
against the same math in float64 PyTorch, for head sizes on its 16-lane path (16, 64) and off it (24)."""
import pytest
import torch

from tinychat.engine import native


def _reference(heads, H, Hk, D, full, cos, sin, lk, lv, W, gk, gv, lpos, L):
    """(y (H*D), lk, lv, gk, gv) after the kernel's writes; float64 math."""
    nk = 2 if full else 1
    nqk = H + Hk * nk
    hv = heads.double().view(-1, D).clone()
    qk = hv[:nqk]
    r = 1.0 / qk.norm(dim=-1, keepdim=True)
    r[H:] *= D ** 0.5
    qk = qk * r
    a, b = qk[:, :D // 2], qk[:, D // 2:]
    c, s = cos.double(), sin.double()
    qk = torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    q, kl, kg = qk[:H], qk[H:H + Hk], qk[H + Hk:nqk]
    vl, vg = hv[nqk:nqk + Hk], hv[nqk + Hk:nqk + Hk * nk]
    lk, lv, gk, gv = (t.double().clone() for t in (lk, lv, gk, gv))
    slot = L % W
    lk[:, slot], lv[:, slot] = kl, vl
    if full:
        gk[:, L], gv[:, L] = kg, vg
    ok = (lpos[:W] >= 0) & (L - lpos[:W] < W)
    rep = H // Hk
    y = torch.empty(H, D, dtype=torch.float64)
    for h in range(H):
        g = h // rep
        keys = torch.cat([gk[g, :L + 1], lk[g, :W]])
        vals = torch.cat([gv[g, :L + 1], lv[g, :W]])
        sc = keys @ q[h]
        sc[L + 1:][~ok] = float("-inf")
        y[h] = torch.softmax(sc, 0) @ vals
    return y.flatten(), lk, lv, gk, gv


@pytest.mark.parametrize("D", [16, 64, 24])
@pytest.mark.parametrize("full", [0, 1])
@pytest.mark.parametrize("L", [3, 40, 300])
@pytest.mark.parametrize("H,Hk", [(6, 2), (8, 2), (8, 4), (9, 3), (10, 2), (12, 2)],
                         ids=["rep3", "rep4", "rep2", "rep3-odd", "rep5", "rep6"])
def test_native_attention_matches_float64_reference(D, full, L, H, Hk):
    # AVX-512 runs the q heads of a K/V group that fall in one thread's range in one pass (D = 64, up to 4 at a
    # time); 9 heads in 3 groups over 2 or 3 threads split groups between threads. Every head's arithmetic is the
    # same whatever the split: the threads never change the bits.
    lib = native.load()
    if lib is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    W, M = 32, 512
    g = torch.Generator().manual_seed(D * 1000 + L * 2 + full)
    heads = torch.randn((H + 4 * Hk) * D, generator=g) * 3
    ang = torch.rand(D // 2, generator=g) * 6
    cos, sin = ang.cos().contiguous(), ang.sin().contiguous()
    lk, lv = torch.randn(Hk, W + 1, D, generator=g), torch.randn(Hk, W + 1, D, generator=g)
    gk, gv = torch.randn(Hk, M + 1, D, generator=g), torch.randn(Hk, M + 1, D, generator=g)
    lpos = torch.full((W + 1,), -1, dtype=torch.long)
    for p in range(max(0, L - W + 1), L + 1):          # the ring holds the last W positions (fewer early on)
        lpos[p % W] = p
    if L > W:
        lpos[(L + 3) % W] = L - W - 5                      # a stale slot: must be masked
    want = _reference(heads, H, Hk, D, full, cos, sin, lk, lv, W, gk, gv, lpos, L)
    y, sc = torch.empty(H * D), torch.empty(3 * (H // Hk) * (M + 1 + W))     # per thread: a group's scores
    first = None
    for nt in (1, 2, 3):
        h, k1, v1, k2, v2 = heads.clone(), lk.clone(), lv.clone(), gk.clone(), gv.clone()
        lib.tc_attn(h.data_ptr(), H, Hk, D, full, cos.data_ptr(), sin.data_ptr(), k1.data_ptr(), v1.data_ptr(), W,
                    k2.data_ptr(), v2.data_ptr(), M + 1, lpos.data_ptr(), L, y.data_ptr(), sc.data_ptr(), nt)
        for got, ref in zip((y, k1, v1, k2, v2), want):
            torch.testing.assert_close(got.double(), ref, rtol=2e-5, atol=2e-5)
        if first is None:
            first = y.clone()
        assert torch.equal(y, first), f"{nt} threads changed the bits"


def test_native_softcap_matches_torch_tanh():
    lib = native.load()
    if lib is None:
        pytest.skip(f"no native kernels here: {native.why_not}")
    x = torch.cat([torch.randn(5000) * s for s in (0.001, 0.5, 5.0, 40.0, 300.0)]
                  + [torch.tensor([0.0, -0.0, 1e-30, -1e-30, 1e4, -1e4, float("inf"), float("-inf")])])
    for cap in (30.0, 15.0):
        want = cap * torch.tanh(x.double() / cap)
        y = x.clone()
        lib.tc_softcap(y.data_ptr(), y.numel(), cap)
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=2e-6 * cap)
    y = torch.tensor([float("nan")] * 17)
    lib.tc_softcap(y.data_ptr(), 17, 30.0)
    assert torch.isnan(y).all()
