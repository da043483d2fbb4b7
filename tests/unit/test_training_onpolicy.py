"""`training onpolicy`: the student's own replies, the best of K as a (tiny, random) teacher reads them."""
from __future__ import annotations

import argparse
import gzip
import json

import pytest
import torch
from support import make_chat, make_chat_model, tokenizer
from training_support import fake_conversations, write_shards

from tinychat.training.data import read_conversations
from tinychat.training.judge import teacher_loss
from tinychat.training.onpolicy import OnPolicyError, best_of_k_chat, reply_logprobs, run, teacher_scorer
from tinychat.training.teacher import Llama, TeacherConfig, random_weights


@pytest.fixture(scope="module")
def teacher():
    tok = tokenizer()
    cfg = TeacherConfig(vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48)
    return Llama(cfg, random_weights(cfg, seed=1), dtype=torch.float32, max_len=512), tok.hf


def test_a_replys_log_probabilities_are_what_the_judge_scores(teacher):
    model, htok = teacher
    first = [{"role": "user", "content": "what is the sun?"}, {"role": "assistant", "content": "A big star."}]
    later = [{"role": "user", "content": "and the moon?"}, {"role": "assistant", "content": "The moon is near."}]
    judged = teacher_loss([first + later], system="Be brief.", model=model, htok=htok)
    lp = reply_logprobs(model, htok, "Be brief.", first, "and the moon?", ["The moon is near."])[0]
    assert -sum(lp) / len(lp) == pytest.approx(judged["later_turns_loss"], rel=1e-5)
    assert len(lp) == judged["later_turn_tokens"]
    lp0 = reply_logprobs(model, htok, "Be brief.", [], "what is the sun?", ["A big star."])[0]
    assert -sum(lp0) / len(lp0) == pytest.approx(judged["first_turn_loss"], rel=1e-5)


def test_replies_scored_as_one_padded_batch_score_as_they_do_alone(teacher):
    model, htok = teacher
    replies = ["A cat.", "The dog runs over the river and sings because it is happy.", "Fish!"]
    together = reply_logprobs(model, htok, "", [], "tell me a story", replies)
    for r, lp in zip(replies, together):
        assert lp == pytest.approx(reply_logprobs(model, htok, "", [], "tell me a story", [r])[0], abs=1e-4)
    assert reply_logprobs(model, htok, "", [], "hi", []) == []


def _prefer_longest(log):
    def score(history, user, cands):
        log.append((list(history), user, [t for t, _ in cands]))
        return [float(len(t)) for t, _ in cands]
    return score


def test_the_chat_goes_on_from_the_best_of_k_replies():
    chat = make_chat(autosave=False, max_new=12)
    seen: list = []
    msgs, sel = best_of_k_chat(chat, ["hello there?", "why the sun?"], 3, _prefer_longest(seen), seed=5)
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 2
    for (history, user, cands), reply in zip(seen, msgs[1::2]):
        assert len(cands) == 3
        assert reply["content"] == max(cands, key=len)           # the best-scoring candidate was kept ...
    assert seen[1][0] == msgs[:2]                                # ... and the second turn was scored after it
    active = [m.content for m in chat.session.messages]
    assert active[-4:] == [m["content"] for m in msgs]          # the chat's active path is the kept one
    assert [s["n"] for s in sel] == [3, 3] and all(s["score"] >= s["mean"] for s in sel)


def test_a_turn_with_no_valid_reply_ends_the_conversation_before_it():
    chat = make_chat(autosave=False, max_new=8)
    calls = iter([[1.0, None], [None, None]])
    msgs, sel = best_of_k_chat(chat, ["one?", "two?", "three?"], 2, lambda h, u, c: next(calls), seed=1)
    assert len(msgs) == 2 and len(sel) == 1 and sel[0]["valid"] == 1


def _args(tmp_path, src, **kw):
    base = dict(model=tmp_path / "unused", shards=[str(src)], out=tmp_path / "out", k=2, turns=2, max_new=10,
                quant="none", conversations=6, per_shard=4, seed=3, val_fraction=0.1, threads=1,
                command_line="python -m tinychat.training onpolicy ...")
    return argparse.Namespace(**{**base, **kw})


def _mean_logprob(model, htok, system):
    """The teacher's mean log-probability, every reply valid (a random student never stops: the real scorer's
    validity rules would drop every reply)."""
    def score(history, user, cands):
        return [sum(lp) / len(lp) for lp in reply_logprobs(model, htok, system, history, user, [t for t, _ in cands])]
    return score


def test_the_real_scorer_drops_replies_that_were_cut_off_or_loop(teacher):
    score = teacher_scorer(*teacher, "Be brief.")
    out = score([], "why is the sun hot?", [("The sun is a star.", True), ("The sun is a star", False),
                                            ("the sun the sun the sun the sun the sun the sun", True)])
    assert out[0] is not None and out[1:] == [None, None]


def test_the_step_writes_shards_training_reads_and_resumes_on_them(tmp_path, teacher):
    src = write_shards(tmp_path / "src", fake_conversations(30, seed=2))
    model, tok = make_chat_model(), tokenizer()
    args = _args(tmp_path, src)
    quiet = dict(teacher=teacher, scorer=_mean_logprob, log=lambda *_: None)
    assert run(args, model=model, tok=tok, **quiet) == 0
    files = sorted((tmp_path / "out").glob("shard-*.jsonl.gz"))
    assert [f.name for f in files] == ["shard-00000.jsonl.gz", "shard-00001.jsonl.gz"]
    recs = [json.loads(line) for f in files for line in gzip.open(f, "rt")]
    assert recs and all(r["source"] == "onpolicy" and r["teacher"]["system"] == "teacher system" for r in recs)
    assert all(r["program"]["command"] == args.command_line and r["program"]["k"] == 2 for r in recs)
    assert all(len(r["selection"]) == len(r["messages"]) // 2 for r in recs)
    assert len(list(read_conversations(tmp_path / "out"))) == len(recs)
    # the user messages come from the source's training side, in order within each conversation
    source_users = {tuple(m["content"] for m in c if m["role"] == "user") for c in read_conversations(src)}
    for r in recs:
        users = tuple(m["content"] for m in r["messages"] if m["role"] == "user")
        assert any(s[:len(users)] == users for s in source_users)
    # resumed: shards on disk are skipped, a missing one is written again, the same
    before = files[1].read_bytes()
    files[1].unlink()
    assert run(args, model=model, tok=tok, **quiet) == 0
    assert files[1].read_bytes() == before


def test_bad_arguments_are_one_line_errors(tmp_path, teacher):
    src = write_shards(tmp_path / "src", fake_conversations(10, seed=2))
    with pytest.raises(OnPolicyError, match="at least 1"):
        run(_args(tmp_path, src, k=0), model=make_chat_model(), tok=tokenizer(), teacher=teacher)
    with pytest.raises(OnPolicyError, match="no model.safetensors"):
        run(_args(tmp_path, src), teacher=teacher)


def test_the_card_says_the_replies_are_the_students_chosen_by_the_teacher(tmp_path, teacher):
    from training_support import exported_card
    src = write_shards(tmp_path / "src", fake_conversations(30, seed=2))
    args = _args(tmp_path, src, command_line="python -m tinychat.training onpolicy --out OUT --k 2")
    assert run(args, model=make_chat_model(), tok=tokenizer(), teacher=teacher, scorer=_mean_logprob,
               log=lambda *_: None) == 0
    _, card = exported_card(tmp_path, [str(src), str(tmp_path / "out")])
    line = next(x for x in card.splitlines() if x.startswith(f"- `{tmp_path / 'out'}`"))
    assert "the student's own replies" in line and "the best of 2 a turn" in line and "onpolicy: " in line
    assert "no teacher" not in line
    assert "python -m tinychat.training onpolicy --out OUT --k 2" in card
