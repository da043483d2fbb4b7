"""The sampler A/B (issue #14, tinychat/chat/ab.py): one seed for both sides, the first differing token and its cause read
off the traces, both replies kept as alternatives, either one active, every branch still replaying exactly."""
import pytest
from support import make_chat

from tinychat.sessions import session as S
from tinychat.chat.ab import keep_side, run_ab
from tinychat.chat.runtime import ChatError
from tinychat.chat.replay import replay_tree
from tinychat.textsafe import safe_line

Q = "hello tell me about the cat"


def _two_turns(**kw):
    """A chat whose second reply meets 3-grams of the first (the tiny model at temperature 0 repeats itself)."""
    chat = make_chat(**{"max_new": 16, "temperature": 0.0, "penalty": 1.0, "seed": 1, **kw})
    chat.send(Q)
    chat.send(Q)
    return chat


def _replays_exactly(chat):
    results = replay_tree(make_chat(autosave=False), S.load(chat.session.id))
    assert results and all(b.report.ok for b in results), [b.report.divergences for b in results]
    return results


def test_both_sides_use_one_drawn_seed_and_record_it_with_their_own_settings():
    chat = make_chat(max_new=10, temperature=0.9)          # no fixed seed: the A/B draws one for the pair
    chat.send(Q)
    r = run_ab(chat, {"top-p": "0.5"})
    assert r.a.settings.seed == r.b.settings.seed == r.seed
    by_id = {m.id: m for m in chat.session.messages + chat.session.branches}
    ra, rb = by_id[r.a.message_id], by_id[r.b.message_id]
    assert ra.seed == rb.seed == r.seed
    assert (ra.settings["top_p"], rb.settings["top_p"]) == (0.9, 0.5)
    assert chat.settings.top_p == 0.9 and chat.session.settings["top_p"] == 0.9   # the chat's settings stay


def test_a_fixed_seed_is_the_one_both_sides_use():
    chat = _two_turns(seed=77)
    assert run_ab(chat, {"ban": "off"}).seed == 77


def test_identical_settings_give_identical_replies_and_no_difference():
    chat = make_chat(max_new=12, temperature=0.9)
    chat.send(Q)
    r = run_ab(chat, {"temperature": "0.9"})
    assert r.a.tokens == r.b.tokens and r.diff is None
    assert r.cause.startswith("no difference")


def test_turning_the_ban_off_finds_the_token_the_ban_removed_and_its_3_gram():
    chat = _two_turns()
    r = run_ab(chat, {"ban": "off"})
    j = r.diff
    assert j is not None and r.a.tokens[:j] == r.b.tokens[:j]
    tb = r.b.tokens[j]
    tr_a = next(t for t in r.a.traces if t.index == j)
    assert tb in tr_a.banned                                # B's token was banned on side A ...
    gram = chat.tok.decode(r.a.tokens[j - 2:j] + [tb])
    assert f"is banned on side A by the 3-gram «{safe_line(gram)}»" in r.cause
    assert r.cause.startswith("B's «")


def test_a_stronger_penalty_is_named_with_its_factor():
    chat = _two_turns()
    r = run_ab(chat, {"penalty": "3"})
    j = r.diff
    assert j is not None
    ta = r.a.tokens[j]
    cand = next(c for c in next(t for t in r.b.traces if t.index == j).candidates if c.token == ta)
    assert cand.penalised                                   # A's token is under the penalty on side B
    assert r.cause.startswith("A's «") and "is penalised (x3; not on A) on side B" in r.cause


def test_a_narrow_top_p_is_named_as_the_cut():
    chat = _two_turns(temperature=1.0, top_p=1.0, seed=5)
    r = run_ab(chat, {"top-p": "0.01"})                     # B keeps only its most likely token
    j = r.diff
    assert j is not None
    assert "top-p cut (top-p 0.01) on side B" in r.cause and r.cause.startswith("A's «")


def test_a_temperature_change_alone_is_a_different_draw():
    chat = _two_turns(temperature=0.8, top_p=1.0, seed=3)
    r = run_ab(chat, {"temperature": "1.6"})
    assert r.diff is not None and r.cause.startswith("a different draw: the same seeded draw landed")


def test_a_shorter_max_new_ends_side_b_there():
    chat = _two_turns()
    r = run_ab(chat, {"max-new": "3"})
    assert r.diff == 3 and r.cause == "side B ended at token 3 (max-new 3)" and len(r.b.tokens) == 3


@pytest.mark.parametrize("changes, message", [
    ({}, "usage: /ab KEY=VALUE"),
    ({"colour": "red"}, "unknown setting 'colour'"),
    ({"top-p": "lots"}, "top-p: cannot read 'lots' as float"),
    ({"temperature": "9"}, "temperature must be between 0 and 5"),
    ({"seed": "4"}, "/ab cannot vary seed"),
    ({"system": "be brief"}, "/ab cannot vary system"),
])
def test_bad_changes_are_refused_with_one_line_and_change_nothing(changes, message):
    chat = _two_turns()
    before = [m.id for m in chat.session.messages], len(chat.session.branches), chat.settings
    with pytest.raises(ChatError, match=message) as e:
        run_ab(chat, changes)
    assert "\n" not in str(e.value)
    assert ([m.id for m in chat.session.messages], len(chat.session.branches), chat.settings) == before


def test_no_reply_yet_is_refused():
    with pytest.raises(ChatError, match="no reply to compare yet"):
        run_ab(make_chat(), {"top-p": "0.5"})


def test_after_the_ab_side_a_is_active_and_everything_replays_exactly():
    chat = _two_turns()
    old = chat.session.messages[-1]
    r = run_ab(chat, {"ban": "off"})
    assert chat.session.messages[-1].id == r.a.message_id and r.kept == "A"
    sibs = [old.id, r.a.message_id, r.b.message_id]
    assert chat.alternatives() == (2, 3)
    assert {m.id for m in chat.session.branches} >= {old.id, r.b.message_id}
    assert sorted(sibs) == sibs                               # the old reply, then A, then B
    assert chat.session.messages[-1].token_ids == chat.tok.generation_prompt_ids() + r.a.tokens + chat.tok.end_ids()
    results = _replays_exactly(chat)
    assert len(results) == 3


def test_keeping_b_makes_it_active_with_a_as_its_sibling_and_adopting_applies_its_settings():
    chat = _two_turns()
    r = run_ab(chat, {"ban": "off"})
    assert keep_side(chat, r, "B") == (3, 3) and r.kept == "B"
    assert chat.session.messages[-1].id == r.b.message_id
    assert any(m.id == r.a.message_id for m in chat.session.branches)
    assert chat.settings.ban is True                          # kept, not adopted
    assert S.load(chat.session.id).messages[-1].id == r.b.message_id    # saved so
    keep_side(chat, r, "B", adopt=True)
    assert chat.settings.ban is False                         # from the next turn, as /set
    _replays_exactly(chat)
    res = chat.send("and then?")                              # the next turn continues from B's reply
    assert res.token_ids and chat.session.messages[-3].id == r.b.message_id
    _replays_exactly(chat)
