"""append / append_chunked / _decode_one against the plain full forward (the exact reference)."""
import importlib
import sys

import pytest
import torch

from support import make_model
from tinychat.engine import CHUNK, KVCache, append, append_chunked
from tinychat.engine.append import _decode_one

TOL = 1e-3   # max |Δlogit| in fp32 (seen: ~2e-7)


def _feed(model, fn, schedule, B, max_len=512, **kw):
    """Feed a schedule of (n_new per row, rows) steps with random tokens; after each step compare every fed row's
    logits to forward() over that row's whole sequence. Returns the largest error."""
    g = torch.Generator().manual_seed(1)
    cache = KVCache(model, B, max_len, "cpu", dtype=torch.float32)
    seqs = [[] for _ in range(B)]
    worst = 0.0
    for n_new, rows in schedule:
        C = max(n_new)
        idx = torch.randint(0, model.cfg.vocab_size, (len(n_new), C), generator=g)
        out = fn(model, cache, idx, n_new, rows=rows, **kw)
        targets = rows if rows is not None else list(range(B))
        for j, r in enumerate(targets):
            if n_new[j] == 0:
                continue
            seqs[r] += idx[j, :n_new[j]].tolist()
            ref = model(torch.tensor([seqs[r]]))[0, -1]
            worst = max(worst, (out[j] - ref).abs().max().item())
    assert cache.lens_cpu.tolist() == [len(s) for s in seqs]
    assert cache.lens.tolist() == [len(s) for s in seqs]
    return worst


SCHEDULE = [
    ([37, 5, 0], None),            # ragged rows, one row untouched
    ([1, 70, 3], None),            # a chunk longer than CHUNK (64) and than the ring (8)
    ([20, 9], [2, 0]),             # a sub-batch via rows, out of order
    ([0, 1, 1], None),
    ([130], [1]),                  # a long chunk for one row: many window wrap-arounds
]


@pytest.mark.parametrize("engram", [True, False], ids=["engram", "no-engram"])
@pytest.mark.parametrize("fn", [append, append_chunked], ids=["append", "append_chunked"])
def test_append_matches_full_forward(fn, engram):
    model = make_model(engram=engram)
    assert model.engram_modules() or not engram
    assert _feed(model, fn, SCHEDULE, B=3) < TOL


def test_append_with_small_query_blocks_matches_full_forward():
    # block=16 splits the 70- and 130-token chunks into many query blocks, each with its own key band
    assert _feed(make_model(), append, SCHEDULE, B=3, block=16) < TOL


def test_append_padded_shapes_match_full_forward(monkeypatch):
    # the GPU padding (power-of-two chunk, rounded key ranges) exercised on the CPU
    A = importlib.import_module("tinychat.engine.append")   # the package attribute is the function
    monkeypatch.setattr(A, "KEY_ROUND", 16)
    assert _feed(make_model(), append, SCHEDULE, B=3, pad_shapes=True) < TOL


def test_long_prefill_beyond_one_query_block_matches_forward():
    model = make_model()
    assert _feed(model, append, [([300], None), ([1], None)], B=1) < TOL
    assert CHUNK < 300


def test_append_returns_none_and_leaves_cache_for_zero_tokens():
    model = make_model()
    cache = KVCache(model, 2, 64, "cpu", dtype=torch.float32)
    assert append(model, cache, torch.zeros(2, 4, dtype=torch.long), [0, 0]) is None
    assert cache.lens_cpu.tolist() == [0, 0]


def _cache_state(c: KVCache):
    return [t.clone() for t in (c.gk, c.gv, c.lk, c.lv, c.lpos, c.lens, c.lens_cpu, c.tokens)]


def test_decode_one_is_bit_identical_to_append_chunked():
    model = make_model()
    prompt = torch.randint(0, 512, (1, 29), generator=torch.Generator().manual_seed(3))
    a = KVCache(model, 1, 128, "cpu", dtype=torch.float32)
    b = KVCache(model, 1, 128, "cpu", dtype=torch.float32)
    append_chunked(model, a, prompt, [29])
    append_chunked(model, b, prompt, [29])
    for t in [5, 17, 99, 3, 250, 7, 7, 7, 400, 1, 2]:     # past the 8-slot ring: wrap-around
        tok = torch.tensor([[t]])
        la = _decode_one(model, a, tok, int(a.lens_cpu[0]))
        lb = append_chunked(model, b, tok, [1])
        assert torch.equal(la, lb)
    for x, y in zip(_cache_state(a), _cache_state(b)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("fn", [append, append_chunked])
def test_cache_full_raises_and_leaves_cache_unchanged(fn):
    model = make_model()
    cache = KVCache(model, 2, 40, "cpu", dtype=torch.float32)
    fn(model, cache, torch.ones(2, 30, dtype=torch.long), [30, 10])
    before = _cache_state(cache)
    with pytest.raises(RuntimeError, match="KV cache full"):
        fn(model, cache, torch.ones(2, 11, dtype=torch.long), [11, 1])
    for x, y in zip(before, _cache_state(cache)):
        assert torch.equal(x, y)


def _rss_anon_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_long_cache_holds_memory_for_the_positions_used_and_decodes_exactly():
    # the global K/V of a cache sized for 32k positions is an anonymous mapping (engine/cache.py lazy_zeros): zeros,
    # written like any tensor, and only the pages written become resident
    model = make_model(max_seq_len=32768)
    before = _rss_anon_kb()
    wide = KVCache(model, 8, 32768, "cpu", dtype=torch.float32)
    size = 2 * wide.gk.numel() * 4
    assert size > 64 << 20 and (_rss_anon_kb() - before) * 1024 < size // 8
    assert not wide.gk.any() and not wide.gv.any()
    del wide
    cache = KVCache(model, 1, 32768, "cpu", dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, model.cfg.vocab_size, (1, 40), generator=g)
    out = append(model, cache, idx, [40])
    ref = model(idx)[0, -1]
    assert (out[0] - ref).abs().max().item() < TOL
    small = KVCache(model, 1, 64, "cpu", dtype=torch.float32)
    append(model, small, idx, [40])
    assert torch.equal(cache.gk[:, :, :, :40], small.gk[:, :, :, :40])
