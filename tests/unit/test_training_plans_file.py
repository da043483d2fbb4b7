"""Conversation plans written to a file here and read where the teacher runs (a GPU machine without the entity
packages): the same plans, the same bytes, shards that name the file, and one-line errors for what cannot work."""
from __future__ import annotations

import argparse
import gzip
import itertools

import pytest
import torch

from tinychat.training import dialogue, generate
from tinychat.training.generate import existing_shards, read_shard, shard_path
from tinychat.training.plans_file import PlansError, read_plans, write_plans
from tinychat.training.questions import Plan, Turn, plan_stream
from tinychat.training.teacher import Llama, TeacherConfig, random_weights
from training_support import CharTok

TINY = TeacherConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                     rope_theta=10000.0, norm_eps=1e-5, context_length=1024)


def test_a_plans_file_holds_the_stream_generate_would_draw_and_is_made_again_byte_for_byte(tmp_path):
    want = list(itertools.islice(plan_stream(10, use_chitchat=False, mix="v3"), 200))
    assert write_plans(tmp_path / "a.jsonl.gz", plan_stream(10, use_chitchat=False, mix="v3"), 200) == 200
    assert list(read_plans(tmp_path / "a.jsonl.gz")) == want
    assert any(t.check for p in want for t in p.turns) and any(t.dynamic for p in want for t in p.turns)
    write_plans(tmp_path / "b.jsonl.gz", plan_stream(10, use_chitchat=False, mix="v3"), 200)
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_a_broken_or_missing_plans_file_is_named_in_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    with gzip.open(bad, "wt") as f:
        f.write('{"kind": "fact", "source": "template", "turns": [{"text": "Hi?"}]}\n{"kind": 3}\n')
    with pytest.raises(PlansError, match=r"bad.jsonl.gz:2: not a conversation plan"):
        list(read_plans(bad))
    with pytest.raises(PlansError, match="no such plans file"):
        list(read_plans(tmp_path / "none.jsonl.gz"))


def _args(out, plans, **kw):
    base = dict(out=out, tokens=10**9, seed=0, per_shard=2, batch=4, max_new=4, max_len=256, temperature=0.8,
                top_p=0.95, top_k=8, system="", threads=1, no_chitchat=True, max_shards=2, bench=0, prompts="v3",
                best_of=2, questions=None, plans=plans, device="cpu", teacher=None, workers=1, write_plans=None)
    return argparse.Namespace(**{**base, **kw})


def test_a_run_from_a_plans_file_asks_its_questions_in_order_and_its_shards_name_the_file(tmp_path, monkeypatch):
    plans = [Plan("fact", (Turn(f"Question {i}?"), Turn("", dynamic="detail")), "template") for i in range(6)]
    path = tmp_path / "plans.jsonl.gz"
    write_plans(path, plans, 10)
    monkeypatch.setattr(dialogue, "degenerate_reason", lambda text, stopped, special=False: None)
    monkeypatch.setattr(dialogue, "echo_reason", lambda *a: None)
    monkeypatch.setattr(generate, "_special_ids", lambda t: frozenset({0, 1}))
    model = Llama(TINY, random_weights(TINY, seed=3), dtype=torch.float32, max_len=256)
    generate.run_worker(_args(tmp_path / "out", path), model=model, tok=CharTok(), log=lambda m: None)
    recs = [r for i in sorted(existing_shards(tmp_path / "out")) for r in read_shard(shard_path(tmp_path / "out", i))]
    assert len(recs) == 4                                    # two shards of two
    assert sorted(r["messages"][0]["content"] for r in recs) == [f"Question {i}?" for i in range(4)]
    assert all(r["teacher"]["plans"]["file"] == "plans.jsonl.gz" and len(r["teacher"]["plans"]["sha256"]) == 64
               for r in recs)
    from tinychat.training.card import generate_command
    cmd = generate_command(recs[0]["teacher"], 100, "data/shards-10")
    assert "--plans data/plans.jsonl.gz" in cmd and "--prompts v3" in cmd and "--device" not in cmd
    assert "--device cuda --workers 1" in generate_command({**recs[0]["teacher"], "device": "cuda"}, 100)
    with pytest.raises(generate.GenerateError, match="fresh --out"):       # a plans run does not resume
        generate.run_worker(_args(tmp_path / "out", path), model=model, tok=CharTok(), log=lambda m: None)


def test_flags_that_cannot_make_a_run_are_refused_before_anything_loads(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    write_plans(path, [Plan("fact", (Turn("Hi?"),), "template")], 1)
    for kw, says in ((dict(prompts="v1"), "v2, v3, v4 or v5"), (dict(workers=2), "one worker"),
                     (dict(device="tpu"), "cpu or cuda"),
                     *(((dict(device="cuda"), "no CUDA GPU"),) if not torch.cuda.is_available() else ())):
        with pytest.raises(generate.GenerateError, match=says):
            generate.run(_args(tmp_path / "o", path, **kw))
    assert not (tmp_path / "o").exists()
    with pytest.raises(generate.GenerateError, match="v2, v3, v4 or v5"):
        generate.run(_args(tmp_path / "o", None, prompts="v1", write_plans=tmp_path / "w.jsonl.gz"))
