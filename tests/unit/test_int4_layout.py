"""The int4 weights' grouped layout (engine/int4_layout.py, native_q4_layout.h): rows by groups of four, interleaved
in super-blocks of 512 columns, the last N % 4 rows plain. Conversions are exact, row ranges and concatenations keep
the layout, and a file an older tinychat wrote (plain int4 tensors, no layout key) loads as the same model."""
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tinychat.engine import int4_layout as L
from tinychat.engine import native
from tinychat.engine.quant_int4 import Int4Linear, _quantize_int4, quantize_int4
from tinychat.quant_files import INT4_LAYOUT_KEY, load_quantized, older_int4_layout

sys.path.insert(0, str(Path(__file__).parent))
from test_llama_import import VARIANTS, _weights, write_hf  # noqa: E402

G = torch.Generator().manual_seed(7)
SHAPES = [(1, 64), (4, 64), (7, 576), (8, 512), (9, 1100), (13, 1536), (12, 300), (6, 2048)]


def _byte_of(N, Kp, n, k):
    """(byte index, high nibble?) of weight (n, k), written from native_q4_layout.h's description (apart from the
    PyTorch conversion it checks)."""
    nsb, r = Kp // 512, n % 4
    if n >= N // 4 * 4:
        return n * Kp // 2 + k // 64 * 32 + k % 32, k % 64 >= 32
    base = (n - r) * Kp // 2
    if k < 512 * nsb:
        lane, s = k % 512 // 32, k % 32 // 4
        return base + 1024 * (k // 512) + 128 * s + 32 * r + 4 * (lane % 8) + k % 4, lane >= 8
    c, j = divmod(k - 512 * nsb, 64)
    return base + 1024 * nsb + 128 * c + 32 * r + j % 32, j >= 32


@pytest.mark.parametrize("N,K", SHAPES)
def test_grouped_puts_each_nibble_where_the_layout_says_and_plain_undoes_it(N, K):
    p, s = native.random_int4(N, K, G)                  # any bytes: read as plain rows
    u = L.unpack_plain(p)
    q, ws = L.grouped(p, s)
    assert q.shape == p.shape and ws.shape == s.shape
    Kp = 2 * p.size(1)
    for n in range(N):
        for k in range(0, Kp, 7):
            i, high = _byte_of(N, Kp, n, k)
            assert (int(q.view(-1)[i]) >> 4 if high else int(q.view(-1)[i]) & 15) == int(u[n, k]), (n, k)
    back = L.plain(q, ws)
    assert torch.equal(back[0], p) and torch.equal(back[1], s)


@pytest.mark.parametrize("N,K", SHAPES)
def test_row_ranges_and_concatenations_of_grouped_matrices_are_the_plain_ones_grouped(N, K):
    p, s = native.random_int4(N, K, G)
    q, ws = L.grouped(p, s)
    for a, b in [(0, N), (0, N // 4 * 4), (4 * (N > 4), N), (1, N), (N // 2, N), (0, max(1, N - 1))]:
        if a >= b:
            continue
        got = L.rows(q, ws, a, b)
        want = L.grouped(p[a:b], s[a:b])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (a, b)
        assert L.aligned(a, b, N) == (got[0].data_ptr() == q[a:b].data_ptr())     # whole groups: views
    cut = N // 2
    got = L.cat([L.rows(q, ws, 0, cut), L.rows(q, ws, cut, N)] if cut else [(q, ws)])
    assert torch.equal(got[0], q) and torch.equal(got[1], ws)


def test_quantize_int4_is_the_plain_rounding_grouped_and_reads_back_by_unpack4():
    w = torch.randn(10, 700, generator=G)
    p, s = _quantize_int4(w)
    q, ws = quantize_int4(w)
    gq, gws = L.grouped(p, s)
    assert torch.equal(q, gq) and torch.equal(ws, gws)
    assert torch.equal(native.unpack4(q, 700), (L.unpack_plain(p)[:, :700].to(torch.int16) - 8).to(torch.int8))
    lin = torch.nn.Linear(700, 10, bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    assert torch.allclose(Int4Linear(lin).weight, native.dequant4_ref(q, ws, 700).float())


def test_fusing_rows_that_split_a_row_group_copies_them_into_the_layout():
    lins = [torch.nn.Linear(576, n, bias=False) for n in (10, 14)]
    q = [Int4Linear(lin, prefill_bf16=False) for lin in lins]
    fused = Int4Linear.from_rows([(q[0], 0, 10), (q[1], 3, 14)])      # 10 rows then 11: groups cut at 10
    assert not fused.views_ok(0, 10)
    w = torch.cat([q[0].weight, q[1].weight[3:]])
    assert torch.equal(fused.weight, w)
    x = torch.randn(3, 576, generator=G)
    ref = native.gemm4_ref(x, fused.qweight, fused.scale)
    assert torch.allclose(ref, x.double() @ w.double().T, rtol=0.05, atol=0.05 * float(ref.abs().max()))


@pytest.mark.parametrize("variant,mode", [("llama-tied", "int4"), ("qwen2-bias-untied", "int4"), ("llama-tied", "int8")])
def test_an_int4_file_of_an_older_tinychat_plain_layout_loads_as_the_same_model(tmp_path, variant, mode):
    """int8 files too: their head's two-level int4 copy."""
    from tinychat.importer.run import import_model
    cfg = VARIANTS[variant]
    src = write_hf(tmp_path / "hf", cfg, _weights(cfg, qk_std=0.15))
    folder = import_model(src, name="packed", quant=mode)
    path = folder / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
    assert meta[INT4_LAYOUT_KEY] == "grouped" and not older_int4_layout(folder)
    new = load_quantized(folder).state_dict()
    new = {k: v.clone() for k, v in new.items()}
    sd = {k: v.clone() for k, v in load_file(str(path)).items()}
    n4 = 0
    for k in [k for k, v in sd.items() if v.dtype == torch.uint8]:
        sk = k.removesuffix("q4weight") + "q4scale" if k.endswith("q4weight") else k.removesuffix("qweight") + "scale"
        sd[k], sd[sk] = L.plain(sd[k], sd[sk])
        n4 += 1
    assert n4 > 2 if mode == "int4" else n4 == 1
    del meta[INT4_LAYOUT_KEY]
    path.unlink()
    save_file(sd, str(path), metadata=meta)               # what a tinychat before the grouped layout wrote
    assert older_int4_layout(folder)                      # `tinychat models` says so (import it again)
    old = load_quantized(folder).state_dict()
    assert sorted(old) == sorted(new)
    for k, v in new.items():
        assert torch.equal(old[k], v), k


def test_a_stored_int4_models_identity_is_the_one_an_older_tinychat_gave_it(tmp_path, monkeypatch):
    """Sessions tie themselves to the identity: hashing the int4 tensors in the plain layout keeps those recorded
    before the grouped layout on their model."""
    from tinychat import identity
    from tinychat.importer.run import import_model
    cfg = VARIANTS["llama-tied"]
    folder = import_model(write_hf(tmp_path / "hf", cfg, _weights(cfg, qk_std=0.15)), name="p", quant="int4")
    m = load_quantized(folder)
    now = identity.model_identity(m)
    n4 = 0
    for mod in m.modules():                         # the tensors as a tinychat before the grouped layout held them
        if type(mod) is Int4Linear:
            q, s = L.plain(mod.qweight, mod.scale)
            mod.register_buffer("qweight", q)
            mod.register_buffer("scale", s)
            n4 += 1
    assert n4 > 2
    monkeypatch.setattr(identity, "_plain_int4", lambda sd: {})         # ... and hashed them as they lay
    assert identity.model_identity(m) == now
