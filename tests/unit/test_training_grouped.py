"""Best-of-N teacher generation (tinychat.training.grouped) and the v2 conversation driver (dialogue.py).

A tiny random llama stands in for the teacher: every candidate reply's log-probabilities are checked against a
full recompute of its own history, which fails if a forked row's cache is not the history it should hold.
"""
from __future__ import annotations

import pytest
import torch

from tinychat.training import fastattn
from tinychat.training.batched import Sampling
from tinychat.training.dialogue import Dialogue, contains_answer, reply_score
from tinychat.training.grouped import Candidate, GroupedGenerator
from tinychat.training.questions import Plan, Turn
from tinychat.training.teacher import Llama, TeacherConfig, random_weights

TINY = TeacherConfig(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48,
                     rope_theta=10000.0, norm_eps=1e-5, context_length=1024)
TOP_K = 12


def make_model(kv: str) -> Llama:
    """kv "plain" / "int8", or "batched": the plain cache read by the GPU's attention (decoding rows in one call)."""
    if kv == "batched":
        return Llama(TINY, random_weights(TINY, seed=5), dtype=torch.float32, max_len=256, kv="plain",
                     attend="batched")
    return Llama(TINY, random_weights(TINY, seed=5), dtype=torch.float32, max_len=256, kv=kv)


class Recording:
    """Picks a candidate by a fixed rule and records every candidate's full token history."""

    def __init__(self, prefix, prompts, pick):
        self.seq, self.prompts, self.pick, self.checked = list(prefix) + list(prompts[0]), prompts, pick, []

    def first_prompt(self):
        return self.prompts[0]

    def on_replies(self, cands, room):
        self.checked.append([(list(self.seq), c) for c in cands])
        w = self.pick(cands)
        # the generator's rule: a reply's last sampled token (the stop token, or the max_new-th) is never fed
        self.seq += cands[w].ids if cands[w].stopped else cands[w].ids[:-1]
        nxt = len(self.checked)
        if nxt >= len(self.prompts):
            return w, None
        self.seq += self.prompts[nxt]
        return w, self.prompts[nxt]


def reference_logprobs(model: Llama, history: list[int], cand: Candidate) -> list[float]:
    """Top-k-renormalised log-probabilities of the candidate's tokens (stop included), recomputed from scratch:
    by the cache-free forward for a plain cache; for the int8 cache by one prefill of the whole sequence into a
    fresh row (the cache's own rounding, no copied rows)."""
    toks = cand.ids + ([STOP] if cand.stopped else [])
    seq = history + toks
    if model.kv == "plain":
        logits = model.forward_full(torch.tensor([seq]))[0].float()         # [T, V]
    else:
        model.allocate(1)
        T = len(seq)
        h = model.step(torch.tensor(seq), torch.arange(T), torch.zeros(T, dtype=torch.long),
                       torch.tensor([[0, 0, 0, T]]))
        logits = model.logits(h).float()
    out = []
    for i, t in enumerate(toks):
        row = logits[len(history) - 1 + i]
        top = row.topk(TOP_K).values
        out.append(float(row[t] - top.logsumexp(-1)))
    return out


STOP = 3


@pytest.mark.parametrize("kv", ["plain", "int8", "batched"])
def test_every_forked_candidate_continues_its_own_history(kv):
    if kv == "int8" and not fastattn.available():
        pytest.skip("the int8 cache needs the fastattn kernel (a C compiler)")
    model = make_model(kv)
    prefix = [7, 8, 9]
    convs = [Recording(prefix, [[10 + i, 11, 12], [13, 14 + i], [15, 16, 17, 18]],
                       pick=(lambda c: len(c) - 1) if i % 2 else (lambda c: 0)) for i in range(5)]
    gen = GroupedGenerator(model, groups=2, n=3, sampling=Sampling(1.0, 1.0, TOP_K, 9), stop_id=STOP,
                           prefix=prefix, seed=4)
    done = list(gen.run(iter(convs)))
    assert len(done) == 5 and all(len(d.checked) == 3 for d in done)
    tol = 2e-3 if kv == "int8" else 1e-4
    worst = 0.0
    for d in done:
        for turn in d.checked:
            for history, cand in turn:
                ref = reference_logprobs(model, history, cand)
                assert len(ref) == len(cand.logprobs)
                worst = max(worst, max(abs(a - b) for a, b in zip(ref, cand.logprobs)))
    assert worst < tol


def test_candidates_of_a_turn_are_sampled_independently():
    model = make_model("plain")
    conv = Recording([1, 2], [[4, 5, 6]], pick=lambda c: 0)
    gen = GroupedGenerator(model, groups=1, n=4, sampling=Sampling(1.0, 1.0, TOP_K, 12), stop_id=STOP,
                           prefix=[1, 2], seed=0)
    (done,) = list(gen.run(iter([conv])))
    replies = [tuple(c.ids) for _, c in done.checked[0]]
    assert len(set(replies)) > 1


def test_contains_answer_matches_whole_words_only():
    assert contains_answer("The capital of Japan is Tokyo.", ["Tokyo"])
    assert contains_answer("It is 12!", [12, "twelve"])
    assert not contains_answer("It is 125.", [12])
    assert not contains_answer("Parisian food is great", ["Paris"])
    assert contains_answer("a Baby CAT is called a kitten", ["kitten", "kittens"])


def test_reply_score_penalises_rambling_answers_to_short_questions():
    lp = [-0.5] * 10
    short = reply_score("Tokyo is the capital.", lp, "What is the capital of Japan?")
    ramble = reply_score("A. B. C. D. E. F.", lp, "What is the capital of Japan?")
    story = reply_score("A. B. C. D. E. F.", lp, "Tell me a story about a fox.")
    assert ramble < short and story == short


class FakeTok:
    """Token ids are character codes; enough for the driver's bookkeeping."""

    def encode(self, text):
        class E:
            ids = [ord(c) % 256 for c in text]
        return E()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def cand(text: str, lp: float = -1.0, stopped: bool = True) -> Candidate:
    ids = [ord(c) for c in text]
    return Candidate(ids, stopped, [lp] * (len(ids) + 1))


def test_a_wrong_answer_is_never_kept_and_the_best_valid_one_is():
    plan = Plan("fact-country", (Turn("What is the capital of Japan?", ("Tokyo",)), Turn("Why?")), "template")
    d = Dialogue(plan, FakeTok(), 40, frozenset(), seed=0)
    d.first_prompt()
    w, cont = d.on_replies([cand("The capital of Japan is Paris, a city in France.", -0.1),
                            cand("It is Tokyo, the largest city in Japan.", -0.9),
                            cand("Tokyo is the capital of Japan.", -0.4)], room=500)
    assert w == 2 and cont is not None
    assert d.messages[1]["content"] == "Tokyo is the capital of Japan."
    assert d.reasons == ["wrong", None, None]


def test_no_valid_reply_ends_the_conversation_with_the_reason():
    plan = Plan("fact-country", (Turn("What is the capital of Japan?", ("Tokyo",)),), "template")
    d = Dialogue(plan, FakeTok(), 40, frozenset(), seed=0)
    w, cont = d.on_replies([cand("Paris is the capital of France."), cand("Paris, of course.")], room=500)
    assert cont is None and d.ended == "wrong" and d.record("x", {}) is None


def test_a_detail_follow_up_names_a_word_of_the_kept_reply():
    plan = Plan("explain", (Turn("How do plants grow?"), Turn("", dynamic="detail")), "template")
    d = Dialogue(plan, FakeTok(), 40, frozenset(), seed=3)
    reply = "Plants use photosynthesis to turn sunlight into sugar."
    w, cont = d.on_replies([cand(reply)], room=500)
    assert cont is not None
    words = {"photosynthesis", "sunlight", "sugar"}
    assert any(x in d.user for x in words), d.user


def test_a_reply_that_parrots_is_not_kept():
    plan = Plan("define", (Turn('Can you use the word "occupational" in a sentence?'), Turn("Why?")), "template")
    d = Dialogue(plan, FakeTok(), 40, frozenset(), seed=0)
    w, cont = d.on_replies([cand('Can you use the word "occupational" in a sentence? Yes.', -0.01),
                            cand("Her occupational therapist helped her walk again.", -1.2)], room=500)
    assert w == 1 and d.reasons == ["echo", None]
    w, cont = d.on_replies([cand("Her occupational therapist helped her walk again.", -0.01),
                            cand("Because it names work.", -1.5)], room=500)
    assert w == 1 and d.reasons[-2:] == ["echo", None]
