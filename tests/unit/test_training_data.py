"""Training data at tiny scale: the held-out split, ChatML encoding and its loss mask, the tokenized cache, kind
weights, several shard folders, batches. Fake shards and a tiny tokenizer."""
from __future__ import annotations

import gzip
import json
import random

import pytest

from tinychat.tokenizer import IM_END
from tinychat.training import data as D
from training_support import tok, fake_conversations, write_shards


# -- data ---------------------------------------------------------------------------------------------------------

def test_default_system_prompt_is_the_apps():
    from tinychat.chat.runtime import ChatSettings
    assert D.DEFAULT_SYSTEM == ChatSettings().system_prompt


def test_encoding_is_the_runtime_layout_and_mask_covers_exactly_assistant_text_and_im_end():
    t = tok()
    msgs = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "The cat sees a bird."},
            {"role": "user", "content": "why?"}, {"role": "assistant", "content": "Because <|im_end|> fish!"}]
    ids, mask = D.encode_conversation(t, msgs)
    assert ids == t.format_messages([{"role": "system", "content": D.DEFAULT_SYSTEM}] + msgs,
                                    add_generation_prompt=False)
    # the masked tokens form one run per assistant message, decoding to its content + <|im_end|>
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    assert not cur
    assert [t.decode(r) for r in runs] == ["The cat sees a bird." + IM_END, "Because <|im_end|> fish!" + IM_END]
    assert [r[-1] for r in runs] == [t.im_end, t.im_end]
    # every im_end closing a non-assistant message, every header and every newline after im_end is unmasked
    assert sum(mask) == sum(len(r) for r in runs)
    assert sum(1 for i, m in zip(ids, mask) if i == t.im_end and not m) == 3   # system + 2 user messages

    # batches: targets shifted by one, mask on targets; padding is mask 0; truncation at seq_len
    ts = D.encode_all(t, [msgs, msgs[:2]])
    idx, tgt, msk = ts.collate([0, 1], seq_len=512)
    assert idx.shape == tgt.shape == msk.shape == (2, len(ids) - 1)
    assert idx[0].tolist() == ids[:-1] and tgt[0].tolist() == ids[1:] and msk[0].tolist() == [bool(m) for m in mask[1:]]
    n1 = int(ts.lengths[1]) - 1
    assert not msk[1, n1:].any() and (idx[1, n1:] == D.PAD_ID).all()
    assert t.decode(tgt[0][msk[0]].tolist()) == "The cat sees a bird." + IM_END + "Because <|im_end|> fish!" + IM_END
    idx, tgt, msk = ts.collate([0], seq_len=10)
    assert idx.shape == (1, 10) and idx[0].tolist() == ids[:10] and tgt[0].tolist() == ids[1:11]


def test_batch_encoding_matches_one_by_one():
    convs = fake_conversations(12, seed=5)
    ts = D.encode_all(tok(), convs)
    for i, msgs in enumerate(convs):
        ids, mask = D.encode_conversation(tok(), msgs)
        a, b = int(ts.offsets[i]), int(ts.offsets[i + 1])
        assert ts.ids[a:b].tolist() == ids and ts.mask[a:b].tolist() == [bool(m) for m in mask]


def test_split_is_deterministic_order_free_and_about_the_fraction(tmp_path):
    convs = fake_conversations(3000, seed=2)
    tr1, va1 = D.split(convs, 0.02)
    shuffled = convs[:]
    random.Random(9).shuffle(shuffled)
    tr2, va2 = D.split(shuffled, 0.02)
    key = D.conversation_hash
    assert sorted(map(key, va1)) == sorted(map(key, va2)) and sorted(map(key, tr1)) == sorted(map(key, tr2))
    assert 25 <= len(va1) <= 100                     # ~2 % of ~3000 unique conversations
    assert all(D.is_validation(c, 0.02) for c in va1) and not any(D.is_validation(c, 0.02) for c in tr1)
    assert not {key(c) for c in va1} & {key(c) for c in tr1}
    # read back from gzipped shards: same split; extra record fields and system messages do not matter
    write_shards(tmp_path / "shards", convs, per_shard=700)
    tr3, va3 = D.load_split(tmp_path / "shards", 0.02)
    assert [key(c) for c in va3] == [key(c) for c in va1] and len(tr3) == len(tr1)
    assert D.teacher_meta(tmp_path / "shards")["system"] == "teacher system"


def test_tokenized_cache_is_reused_until_the_shards_change(tmp_path, monkeypatch):
    shards = write_shards(tmp_path / "shards", fake_conversations(30, seed=6), per_shard=10)
    cache = tmp_path / "data.safetensors"
    tr, va = D.load_tokenized(shards, tok(), 0.1, cache=cache)
    ref_tr, ref_va = (D.encode_all(tok(), c) for c in D.load_split(shards, 0.1))
    assert tr.fingerprint() == ref_tr.fingerprint() and va.fingerprint() == ref_va.fingerprint()
    with monkeypatch.context() as mp:
        mp.setattr(D, "load_split", lambda *a: pytest.fail("cache not used"))
        tr2, _ = D.load_tokenized(shards, tok(), 0.1, cache=cache)
    assert tr2.fingerprint() == tr.fingerprint()
    write_shards(tmp_path / "shards", fake_conversations(3, seed=7), per_shard=10)    # rewrites shard 0
    tr3, _ = D.load_tokenized(shards, tok(), 0.1, cache=cache)
    assert tr3.fingerprint() != tr.fingerprint()


def test_kind_weights_repeat_training_conversations_of_those_kinds_only(tmp_path):
    convs = fake_conversations(400, seed=11)
    kinds = ["fact-capital", "fact-sum", "memory", "explain"]
    folder = tmp_path / "shards"
    folder.mkdir()
    with gzip.open(folder / "shard-00000.jsonl.gz", "wt", encoding="utf-8") as f:
        for i, msgs in enumerate(convs):
            f.write(json.dumps({"id": str(i), "kind": kinds[i % 4], "messages": msgs}) + "\n")
    kind_of = {D.conversation_hash(m): kinds[i % 4] for i, m in enumerate(convs)}
    plain_tr, plain_va = D.load_split(folder, 0.1)
    tr, va = D.load_split(folder, 0.1, {"fact-*": 3, "memory": 2})
    key = D.conversation_hash
    assert [key(c) for c in va] == [key(c) for c in plain_va]         # validation is never weighted
    assert tr[:len(plain_tr)] == plain_tr                               # the originals first, in order
    count = {}
    for c in tr:
        count[key(c)] = count.get(key(c), 0) + 1
    want = {"fact-capital": 3, "fact-sum": 3, "memory": 2, "explain": 1}
    assert {h: want[kind_of[h]] for h in map(key, plain_tr)} == count
    assert D.kind_weight("fact-x", {"fact-*": 3}) == 3 and D.kind_weight("factx", {"fact-*": 3}) == 1
    # the tokenized cache keys on the weights: a changed weight is re-read, not a stale hit
    cache = tmp_path / "data.safetensors"
    a, _ = D.load_tokenized(folder, tok(), 0.1, cache=cache)
    b, _ = D.load_tokenized(folder, tok(), 0.1, cache=cache, weights={"memory": 2})
    assert len(b) == len(a) + sum(kind_of[key(c)] == "memory" for c in plain_tr)


def test_the_train_command_refuses_a_bad_weight():
    from tinychat.training.train_cli import _weight
    assert _weight("fact-*=3") == ("fact-*", 3)
    for bad in ("fact", "=3", "memory=0", "memory=x"):
        with pytest.raises(Exception, match="KIND=N"):
            _weight(bad)


def test_bad_shards_fail_clearly(tmp_path):
    with pytest.raises(D.DataError, match="no such"):
        D.shard_files(tmp_path / "missing")
    (tmp_path / "x.jsonl").write_text('{"messages": [{"role": "bot", "content": "hi"}]}\n')
    with pytest.raises(D.DataError, match="x.jsonl:1: bad message"):
        list(D.read_conversations(tmp_path))


def test_several_shard_folders_read_in_order_and_the_tokenizer_command_takes_them(tmp_path):
    from tinychat.training.__main__ import main
    a = write_shards(tmp_path / "a", fake_conversations(60, seed=1))
    b = write_shards(tmp_path / "b", fake_conversations(40, seed=2))
    files = D.shard_files([a, b])
    assert files == D.shard_files(a) + D.shard_files(b)
    assert len(list(D.read_conversations([a, b]))) == 100
    assert D.shards_arg(["x"]) == "x" and D.shards_arg(["x", "y"]) == ["x", "y"]
    out = tmp_path / "tok.json"
    assert main(["tokenizer", "--shards", str(a), str(b), "--out", str(out), "--vocab-size", "300"]) == 0
    train, val = D.load_split([a, b])
    assert len(train) + len(val) == 100 and out.is_file()
    with pytest.raises(D.DataError, match="no such"):
        D.shard_files([a, tmp_path / "missing"])


def test_batch_plan_covers_every_conversation_once_within_budget():
    ts = D.encode_all(tok(), fake_conversations(120, seed=3))
    p0 = ts.plan(batch_tokens=300, seq_len=64, seed=0, epoch=0, max_rows=6)
    assert sorted(i for b in p0 for i in b) == list(range(120))
    for b in p0:
        longest = max(min(int(ts.lengths[i]), 65) - 1 for i in b)
        assert len(b) <= 6 and (len(b) == 1 or longest * len(b) <= 300)
    assert p0 == ts.plan(300, 64, 0, 0, 6)
    assert p0 != ts.plan(300, 64, 0, 1, 6)
