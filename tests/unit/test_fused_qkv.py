"""A quantized model owns its fused q/k/v projections (engine/fused.py's fuse_qkv, run by quantize_cpu): the decode
step and the native prefill run them, and the separate Linears keep their rows as views of them wherever they can,
so the weights are held once; the fused prefill gives the bits of the separate projections."""
import copy
import importlib

import pytest
import torch

from support import make_llama_model, make_model
from tinychat.engine import KVCache, quantize_cpu
from tinychat.engine import native
from tinychat.engine.fused import qkv_rows, split_qkv
from tinychat.options import EngineOptions

Am = importlib.import_module("tinychat.engine.append")


def _storage(t):
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("mode", ["int8", "bf16"])
def test_a_quantized_model_holds_each_projection_row_once_where_the_rows_allow(mode):
    m = quantize_cpu(make_model(), mode)
    c = m.cfg
    name = "qweight" if mode == "int8" else "weight"
    shared = kept = 0
    for blk, f in zip(m.blocks, m.fused_qkv, strict=True):
        a = blk.attn
        rows = torch.cat([getattr(lin, name)[s:e] for lin, s, e in qkv_rows(a, c.n_kv_heads, c.head_dim)])
        assert torch.equal(getattr(f, name), rows)                     # the fused rows are the pieces' rows
        assert _storage(getattr(a.w_q, name)) == _storage(getattr(f, name))
        for lin in (a.w_kv_local, a.w_kv_global):
            if lin is None:
                continue
            both = a.w_kv_local is not None and a.w_kv_global is not None
            # a layer with both a local and a global K/V Linear interleaves their K and V rows: copies stay
            same = _storage(getattr(lin, name)) == _storage(getattr(f, name))
            assert same != both
            shared, kept = shared + same, kept + (not same)
    assert shared and kept                                  # the tiny config has both kinds of layer


def test_a_deep_copy_of_a_quantized_model_shares_rows_with_its_own_fused_projections():
    m = quantize_cpu(make_model(), "int8")
    d = copy.deepcopy(m)
    assert _storage(d.blocks[0].attn.w_q.qweight) == _storage(d.fused_qkv[0].qweight)
    assert _storage(d.fused_qkv[0].qweight) != _storage(m.fused_qkv[0].qweight)


def test_split_qkv_cuts_the_fused_output_as_the_separate_projections_give_it():
    m = quantize_cpu(make_model(), "int8")
    c = m.cfg
    h = torch.randn(1, 9, c.d_model, generator=torch.Generator().manual_seed(1))
    for blk, f in zip(m.blocks, m.fused_qkv, strict=True):
        a = blk.attn
        q, kv = split_qkv(f.forward(h), a, c.n_heads, c.n_kv_heads, c.head_dim)
        assert torch.equal(q, a.w_q(h).view(1, 9, c.n_heads, c.head_dim))
        for name, (k, v) in kv.items():
            want = getattr(a, name)(h).view(1, 9, 2, c.n_kv_heads, c.head_dim)
            assert torch.equal(k, want[:, :, 0]) and torch.equal(v, want[:, :, 1])


@pytest.mark.skipif(native.gemm_lib() is None, reason=f"no native int8 GEMM here: {native.why_not}")
@pytest.mark.parametrize("make", [make_model, make_llama_model], ids=["tinyagent", "llama"])
def test_the_fused_prefill_gives_the_bits_of_the_separate_projections(make, monkeypatch):
    # the native int8 GEMM pinned: on AMX hosts prefill would take bf16 GEMMs by default (no native calls to count)
    m = quantize_cpu(make(), "int8", options=EngineOptions(prefill_bf16=False))
    fused = m.fused_qkv
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randint(0, 400, (1, n), generator=g) for n in (150, 90, 7)]
    calls = []
    real = native.gemm
    monkeypatch.setattr(native, "gemm", lambda *a, **k: calls.append(a[2].size(0)) or real(*a, **k))
    runs = []
    for use in (True, False):
        m.fused_qkv = fused if use else None
        calls.clear()
        cache = KVCache(m, 1, 512, "cpu", dtype=torch.float32)
        logits = [Am.append(m, cache, ch, [ch.size(1)]) for ch in chunks]
        runs.append((logits, cache.state_dict(), sorted(calls)))
    (lf, cf, gf), (ls, cs, gs) = runs
    assert all(torch.equal(a, b) for a, b in zip(lf, ls, strict=True))
    assert cf.keys() == cs.keys() and all(torch.equal(cf[k], cs[k]) for k in cf)
    # one GEMM a layer for q, K and V where 2 or 3 ran, in every chunk
    extra = sum((a.w_kv_local is not None) + (a.w_kv_global is not None) for a in (b.attn for b in m.blocks))
    assert len(gs) - len(gf) == len(chunks) * extra > 0
    assert gf.count(fused[0].out_features) >= len(chunks)
