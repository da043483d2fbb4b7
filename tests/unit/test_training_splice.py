"""Splicing: conversations that change the subject, made from the shards' own opening exchanges (issue #32)."""
from __future__ import annotations

import gzip
import json

import pytest

from tinychat.training import data as D
from tinychat.training.splice import PREFIX_CHARS, openings, splice_conversations
from training_support import fake_conversations, tok

KINDS = ["fact-country", "fact-colour", "memory", "explain", "chitchat"]


def kinded(n: int, seed: int = 0) -> list[tuple[str, list[dict]]]:
    return [(KINDS[i % len(KINDS)], m) for i, m in enumerate(fake_conversations(n, seed))]


def test_a_spliced_conversation_is_its_own_messages_after_openings_of_other_kinds():
    convs = kinded(600, seed=3)
    first = {(m[0]["content"], m[1]["content"]): k for k, m in convs}    # every opening exchange and its kind
    out = splice_conversations(convs, 0.3, seed=1)
    assert len(out) == len(convs)                                        # in place: no conversation added or lost
    spliced = 0
    for (kind, msgs), (k2, new) in zip(convs, out):
        assert k2 == kind
        extra = len(new) - len(msgs)
        assert extra in (0, 2, 4) and new[extra:] == msgs                # the conversation itself, whole, at the end
        if extra:
            spliced += 1
            pieces = [(new[i]["content"], new[i + 1]["content"]) for i in range(0, extra, 2)]
            assert all(new[i]["role"] == "user" and new[i + 1]["role"] == "assistant" for i in range(0, extra, 2))
            prefix_kinds = [first[p] for p in pieces]                    # each piece is some conversation's opening
            assert kind not in prefix_kinds and len(set(prefix_kinds)) == len(prefix_kinds)
    assert 0.22 * len(convs) < spliced < 0.38 * len(convs)


def test_splicing_is_deterministic_by_seed_and_off_at_zero():
    convs = kinded(200)
    assert splice_conversations(convs, 0.5, seed=4) == splice_conversations(convs, 0.5, seed=4)
    assert splice_conversations(convs, 0.5, seed=4) != splice_conversations(convs, 0.5, seed=5)
    assert splice_conversations(convs, 0.0) == convs
    untyped = [("", m) for _, m in convs]                                # old shards name no kind: left alone
    assert splice_conversations(untyped, 1.0) == untyped
    one_kind = [("memory", m) for _, m in convs]                         # nothing unrelated to put in front
    assert splice_conversations(one_kind, 1.0) == one_kind
    with pytest.raises(ValueError, match="splice fraction"):
        splice_conversations(convs, 1.5)


def test_long_openings_are_never_prefixes():
    long = ("explain", [{"role": "user", "content": "x" * PREFIX_CHARS}, {"role": "assistant", "content": "y"}])
    short = ("memory", [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}])
    assert openings([long, short]) == [short]
    out = splice_conversations([long, short] * 50, 1.0, seed=0)
    assert all("x" * PREFIX_CHARS not in m[0]["content"] or m[0:2] == long[1] for _, m in out)


def test_the_training_split_splices_only_training_conversations_and_the_cache_keys_on_it(tmp_path):
    convs = fake_conversations(400, seed=12)
    folder = tmp_path / "shards"
    folder.mkdir()
    with gzip.open(folder / "shard-00000.jsonl.gz", "wt", encoding="utf-8") as f:
        for i, msgs in enumerate(convs):
            f.write(json.dumps({"id": str(i), "kind": KINDS[i % len(KINDS)], "messages": msgs}) + "\n")
    plain_tr, plain_va = D.load_split(folder, 0.1)
    tr, va = D.load_split(folder, 0.1, splice=0.5, seed=2)
    assert va == plain_va                                                # validation is never spliced
    assert len(tr) == len(plain_tr)
    changed = sum(a != b for a, b in zip(tr, plain_tr))
    assert all(a[len(a) - len(b):] == b for a, b in zip(tr, plain_tr)) and 0.35 * len(tr) < changed < 0.65 * len(tr)
    # weighted copies are drawn on their own: some copy of a conversation differs from its original
    wtr, _ = D.load_split(folder, 0.1, {"memory": 3}, splice=0.5, seed=2)
    assert len(wtr) == len(plain_tr) + 2 * sum(KINDS[convs.index(c) % len(KINDS)] == "memory" for c in plain_tr)
    cache = tmp_path / "data.safetensors"
    a, _ = D.load_tokenized(folder, tok(), 0.1, cache=cache)
    b, _ = D.load_tokenized(folder, tok(), 0.1, cache=cache, splice=0.5, seed=2)
    assert len(a) == len(b) and b.n_tokens > a.n_tokens                  # re-read with the prefixes, not a stale hit


def test_the_train_command_takes_a_splice_share_and_refuses_a_bad_one():
    from tinychat.training.train_cli import _fraction
    assert _fraction("0.25") == 0.25
    for bad in ("1.5", "-0.1", "x"):
        with pytest.raises(Exception, match="between 0 and 1|not a number"):
            _fraction(bad)
