"""The teacher as judge (`training eval --judge`) and the loop metric, on a tiny random teacher."""
from __future__ import annotations

import random

import pytest
import torch
from support import _WORDS, make_tokenizer

from tinychat.training.judge import FixedTurns, judge, messages_of, seed_mean, teacher_loss, teacher_replies
from tinychat.training.teacher import Llama, TeacherConfig, random_weights
from tinychat.training.textmetrics import has_loop, loop_rate


@pytest.fixture(scope="module")
def teacher():
    tok = make_tokenizer()
    cfg = TeacherConfig(vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48)
    return Llama(cfg, random_weights(cfg, seed=1), dtype=torch.float32, max_len=512), tok.hf


def chats(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    say = lambda k: " ".join(rng.choice(_WORDS) for _ in range(k))  # noqa: E731
    return [{"turns": [{"user": say(5) + "?", "reply": say(9) + ".", "finish": "stop"}
                       for _ in range(rng.randint(1, 3))]} for _ in range(n)]


def test_a_reply_loops_when_one_word_4gram_comes_three_times():
    assert has_loop("A moment to remember, a moment to remember. A moment to remember!")
    assert not has_loop("A moment to remember, a moment to remember. Then the sun rose.")
    assert not has_loop("the the the")                     # too short for a 4-gram
    assert loop_rate(["one two three four " * 3, "fine text here", "", "x y z w x y z w"]) == 0.25
    assert loop_rate([]) == 0.0


def test_the_judge_scores_the_student_replies_in_context_and_samples_the_teachers_own(teacher):
    model, htok = teacher
    student = chats(4, seed=3)
    res = judge(student, system="Be brief.", temperature=0.8, top_p=0.9, max_new=12, seed=5, teacher=teacher)
    direct = teacher_loss([messages_of(c) for c in student], system="Be brief.", model=model, htok=htok)
    assert res["student_nll"] == pytest.approx(direct["loss_per_token"])
    assert res["student_tokens"] == direct["target_tokens"]
    own = res["teacher_conversations"]
    # the teacher answered the same user messages, in the same conversations, in order
    assert [[t["user"] for t in c["turns"]] for c in own] == [[t["user"] for t in c["turns"]] for c in student]
    assert all(t["tokens"] <= 12 and t["finish"] in ("stop", "length") for c in own for t in c["turns"])
    assert res["teacher_nll"] > 0 and res["ratio"] == pytest.approx(res["student_nll"] / res["teacher_nll"])
    again = judge(student, system="Be brief.", temperature=0.8, top_p=0.9, max_new=12, seed=5, teacher=teacher)
    assert again["teacher_nll"] == pytest.approx(res["teacher_nll"])     # seeded


def test_the_teachers_replies_stop_when_the_next_turn_would_not_fit(teacher):
    model, htok = teacher
    d = FixedTurns(["hello there?", "and then?"], htok, max_new=8)
    assert d.first_prompt()
    assert d.on_reply(htok.encode("fine").ids, True, room=4) is None        # no room for the next turn
    assert [t["reply"] for t in d.turns] == ["fine"]
    out = teacher_replies([["hi?"], ["what?", "why?"]], model, htok, "", 0.0, 1.0, max_new=6, batch=2)
    assert [len(c["turns"]) for c in out] == [1, 2]


def test_the_loss_splits_first_replies_from_later_ones(teacher):
    model, htok = teacher
    convs = [messages_of(c) for c in chats(6, seed=4)]
    both = teacher_loss(convs, system="Be brief.", model=model, htok=htok)
    firsts = [m[:2] for m in convs]                              # each conversation's first exchange only
    first_only = teacher_loss(firsts, system="Be brief.", model=model, htok=htok)
    assert both["first_turn_loss"] == pytest.approx(first_only["loss_per_token"], rel=1e-5)
    n_first = first_only["target_tokens"]
    assert n_first + both["later_turn_tokens"] == both["target_tokens"]
    mixed = (both["first_turn_loss"] * n_first + both["later_turns_loss"] * both["later_turn_tokens"])
    assert mixed / both["target_tokens"] == pytest.approx(both["loss_per_token"], rel=1e-5)


def test_the_seed_mean_is_the_plain_mean_of_each_seeds_figures(teacher):
    student = chats(3, seed=4)
    by_seed = {s: judge(student, system="", temperature=0.8, top_p=0.9, max_new=6, seed=s, teacher=teacher)
               for s in (2, 0)}
    m = seed_mean(by_seed)
    assert m["seeds"] == [0, 2] and list(m["by_seed"]) == ["0", "2"]
    assert m["teacher_nll"] == pytest.approx((by_seed[0]["teacher_nll"] + by_seed[2]["teacher_nll"]) / 2)
    assert by_seed[0]["teacher_nll"] != by_seed[2]["teacher_nll"]       # the teacher's own samples follow the seed
    assert m["by_seed"]["2"]["student_nll_later"] == by_seed[2]["student_nll_later"]
    with pytest.raises(ValueError, match="no seeds"):
        seed_mean({})
