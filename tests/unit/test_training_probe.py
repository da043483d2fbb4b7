"""The probe set (tinychat.training.probe): held out from the v2 training plans by construction."""
from __future__ import annotations

import random
import re

import torch

from tinychat.training.probe import accuracy, candidates, teacher_check
from tinychat.training.questions import make_plan
from tinychat.training.teacher import Llama, TeacherConfig, random_weights


def frame(text: str) -> str:
    """A message with its entities and numbers blanked: what a question frame looks like."""
    t = re.sub(r"\d+", "N", text)
    head, _, rest = t.partition(" ")              # the first word is the frame's, capitalised or not
    return head + " " + re.sub(r"\b[A-Z][a-z]+\b", "X", rest)


def test_probe_questions_never_occur_in_training_plans():
    probes = candidates()
    probe_msgs = {u for p in probes for u in p["turns"]}
    rng = random.Random(0)
    train_msgs = {t.text for _ in range(20000) for t in make_plan(rng).turns if t.text}
    assert not probe_msgs & train_msgs
    # not even their frames: the last user message of a probe, entities blanked, is never a training message's
    train_frames = {frame(m) for m in train_msgs}
    asked = {frame(p["turns"][-1]) for p in probes}
    assert not asked & train_frames, sorted(asked & train_frames)[:5]


def test_candidates_are_deterministic_and_carry_answers():
    a, b = candidates(), candidates()
    assert a == b and len(a) >= 200
    assert all(p["answers"] and p["turns"] for p in a)
    assert len({p["id"] for p in a}) == len(a)


def test_accuracy_by_category():
    res = [{"category": "sum", "right": True}, {"category": "sum", "right": False},
           {"category": "name", "right": True}]
    acc = accuracy(res)
    assert acc["probes"] == 3 and abs(acc["accuracy"] - 2 / 3) < 1e-9
    assert acc["by_category"] == {"name": 1.0, "sum": 0.5}


def test_switched_probes_ask_the_question_after_another_categorys():
    from tinychat.training.probe import candidates, switched
    probes = candidates()
    sw = switched(probes)
    single = [p for p in probes if len(p["turns"]) == 1]
    by_q = {p["turns"][0]: p["category"] for p in single}
    assert len(sw) == len(single) and len(single) < len(probes)          # multi-turn probes are left out
    for p, s in zip(single, sw):
        assert s["turns"][1] == p["turns"][0] and s["answers"] == p["answers"] and s["category"] == p["category"]
        assert by_q[s["turns"][0]] != p["category"] and s["id"] == p["id"] + "+switch"
    assert len({s["turns"][0] for s in sw}) > 0.8 * len(sw)             # openers vary, not one per category


class CharTok:
    """A byte tokenizer for the tiny teacher (ids < 96 after folding), with the stop token as id 3."""

    def encode(self, text):
        class E:
            ids = [3 if text[i:].startswith("<|im_end|>") else 4 + ord(c) % 90 for i, c in enumerate(text)]
        return E()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i % 26) for i in ids)

    def token_to_id(self, s):
        return 3


def test_teacher_check_keeps_only_right_answers():
    cfg = TeacherConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48)
    model = Llama(cfg, random_weights(cfg, seed=1), dtype=torch.float32, max_len=512)
    tok = CharTok()
    probes = [{"id": "x", "category": "c", "turns": ["hi"], "answers": ["zzzzzzzz"]}]
    assert teacher_check(probes, model, tok, max_new=8) == []
    # whatever the random teacher says greedily is, by definition, its right answer here
    greedy = teacher_check([{**probes[0], "answers": [""]}], model, tok, max_new=8)
    assert greedy == []            # an empty answer never matches
