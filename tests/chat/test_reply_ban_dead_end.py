"""The reply ban at a dead end (issue 28, item 5): when the ban would leave under 5 % of the probability mass, the
guard lifts only the bans of earlier turns (and of the user's message); the 3-grams the reply itself already said
stay banned, so a reply never repeats one. Tested on a model built to loop (its next token is the next one of a
3-token cycle with all but ~1e-13 of the mass), and on the hook itself. Turns recorded before this rule (no
"dead_end" in their settings) lifted every ban; replay samples them that way, so they stay token-exact."""
from collections import Counter

import pytest
import torch

from support import make_chat_model, tokenizer
from tinychat.sessions import session as S
from tinychat.chat.runtime import Chat, ChatSettings, TurnPlan
from tinychat.chat.replay import replay
from tinychat.sampler import DEAD_END_MIN_MASS, KEEP_REPLY, LIFT_ALL, TurnHook


def loop_model(cycle):
    """A tiny chat model whose blocks add next to nothing, so the logits depend on the current token alone: a cycle
    token predicts the next one of the cycle, any other token the cycle's first, each with logit ~30 (softcapped)
    against 0 for the rest of the vocabulary."""
    m = make_chat_model()
    with torch.no_grad():
        for blk in m.blocks:
            for p in blk.parameters():
                p.mul_(1e-4)          # (not zero: an all-zero row has no int8 scale)
        m.embed.weight.zero_()
        m.embed.weight[:, 0] = 1.0
        m.head.weight.zero_()
        m.head.weight[cycle[0], 0] = 10.0
        for i, t in enumerate(cycle):
            m.embed.weight[t].zero_()
            m.embed.weight[t, i + 1] = 1.0
            m.head.weight[cycle[(i + 1) % len(cycle)], i + 1] = 10.0
    return m


CYCLE = tokenizer().encode(" the cat sees")


def repeats(ids) -> int:
    """3-grams said more than once in ids (each extra time counts)."""
    return sum(c - 1 for c in Counter(tuple(ids[i:i + 3]) for i in range(len(ids) - 2)).values() if c > 1)


@pytest.fixture
def looping():
    assert len(CYCLE) == 3
    return loop_model(CYCLE)          # one per test: an int8 chat quantizes it in place


def _chat(model, quant="none", **kw):
    return Chat(model, tokenizer(), ChatSettings(penalty=1.0, max_new=40, seed=1, **kw), quant=quant,
                model_name="loop", max_len=512)


@pytest.mark.parametrize("quant", ["none", "int8"])
@pytest.mark.parametrize("temperature", [0.0, 0.2, 0.8])
def test_a_reply_never_repeats_its_own_3_gram_on_a_model_built_to_loop(looping, quant, temperature):
    chat = _chat(looping, quant, temperature=temperature)
    r = chat.send("hello")
    assert len(r.token_ids) > 6 and r.token_ids[:3] == CYCLE           # it starts into the loop ...
    assert repeats(r.token_ids) == 0                                     # ... and never goes round it twice
    assert r.stats.banned_steps >= 3 and r.stats.lifts == 0              # the dead ends kept the reply's bans
    assert chat.session.messages[-1].settings["dead_end"] == KEEP_REPLY


def test_the_old_rule_loops_on_the_same_model(looping):
    """The control: lifting every ban at a dead end (what turns recorded before the rule did) goes round the loop."""
    chat = _chat(looping, temperature=0.2)
    user = S.Message("user", "hello", chat.tok.message_ids("user", "hello"))
    r = chat.run_turn(TurnPlan(user, dead_end=LIFT_ALL))
    assert repeats(r.token_ids) > 10 and r.stats.lifts > 10


def test_a_dead_end_lifts_the_bans_of_earlier_turns_only():
    logits = torch.full((1, 10), -10.0)
    logits[0, 4] = 10.0                                  # 4: banned by an earlier turn's 3-gram (1, 2, 4)
    logits[0, 5] = 10.0                                  # 5: the reply already said (1, 2, 5)
    hook = TurnHook({(1, 2): [4]}, temperature=1.0, top_p=1.0, pen=1.0, pen_ids=[], stop=9, trace=True, reply=True)
    out = [1, 2, 5, 1, 2]
    res = hook(out, logits)
    assert res[0, 4] == 10.0 and res[0, 5] == float("-inf")         # 4 lifted, 5 still banned
    assert hook.stats.lifts == 1 and hook.stats.banned_steps == 1
    hook.finish(out + [4])
    tr = hook.traces[-1]
    assert tr.lifted and tr.banned == [5] and not tr.ended
    assert 1 - 0.5 > DEAD_END_MIN_MASS


def test_a_dead_end_with_nothing_but_the_replys_own_3_grams_ends_the_reply():
    logits = torch.full((1, 10), float("-inf"))
    logits[0, 5] = 3.0                                   # the only finite candidate repeats the reply's (1, 2, 5)
    hook = TurnHook({}, temperature=0.7, top_p=0.9, pen=1.0, pen_ids=[], stop=9, trace=True, reply=True)
    out = [1, 2, 5, 1, 2]
    res = hook(out, logits)
    assert torch.isfinite(res[0]).nonzero().flatten().tolist() == [9]  # only the stop token can be drawn
    assert hook.stats.ended == 1
    hook.finish(out + [9])
    assert hook.traces[-1].ended and hook.traces[-1].token == 9


def test_the_rule_is_recorded_and_both_rules_replay_exactly(looping):
    chat = _chat(looping, temperature=0.5)
    chat.send("hello")                                   # this version's rule
    user = S.Message("user", "again", chat.tok.message_ids("user", "again"))
    chat.settings = ChatSettings(penalty=1.0, max_new=40, seed=2, temperature=0.5)
    chat.run_turn(TurnPlan(user, dead_end=LIFT_ALL))     # as a turn recorded before the rule ran
    rec = chat.session.messages[-1]
    old = S.Message(**{**rec.__dict__, "settings": {k: v for k, v in rec.settings.items() if k != "dead_end"}})
    chat.session.messages[-1] = old                      # the file of an older version: no "dead_end"
    S.save(chat.session)
    sess = S.load(chat.session.id)
    assert [m.settings.get("dead_end") for m in sess.messages if m.role == "assistant"] == [KEEP_REPLY, None]
    assert repeats(chat.timeline.content(sess.messages[-1])) > 0
    report = replay(Chat(looping, tokenizer(), ChatSettings(), model_name="loop", max_len=512, autosave=False), sess)
    assert report.ok and len(report.turns) == 2


def test_a_session_naming_an_unknown_rule_is_refused(tmp_path):
    import json
    chat = Chat(make_chat_model(), tokenizer(), ChatSettings(max_new=3, seed=1), model_name="t", max_len=512)
    chat.send("hello")
    path = S.session_path(chat.session.id)
    data = json.loads(path.read_text())
    data["messages"][-1]["settings"]["dead_end"] = "lift-nothing"
    path.write_text(json.dumps(data))
    with pytest.raises(S.SessionError, match="dead_end must be one of keep-reply, lift-all"):
        S.load(chat.session.id)
