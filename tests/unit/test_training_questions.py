"""v2 conversation plans (tinychat.training.questions)."""
from __future__ import annotations

import random
import re

from tinychat.training.questions import (KIND_WEIGHTS, MIXES, arithmetic_item, countries, first_names, held_out,
                                         make_plan, plan_stream, plural)
from tinychat.training.stats import diversity


def plans(n, seed=6):
    it = plan_stream(seed, use_chitchat=False)
    return [next(it) for _ in range(n)]


def test_the_plan_stream_is_deterministic():
    assert plans(300) == plans(300)
    assert plans(50, seed=7) != plans(50)


def test_openings_are_diverse_and_no_message_dominates():
    ps = plans(4000)
    d = diversity([{"role": "user", "content": t.text} for t in p.turns if t.text] for p in ps)
    assert d.distinct_openings >= 0.6 * len(ps)
    assert d.top_share < 0.02


def test_fact_questions_carry_their_answer():
    rng = random.Random(0)
    facts = [p for p in (make_plan(rng) for _ in range(2000)) if p.kind.startswith("fact-")]
    assert facts and all(p.turns[0].check for p in facts)
    cap = [p for p in facts if "capital" in p.turns[0].text and "Japan" in p.turns[0].text]
    for p in cap:
        assert "Tokyo" in p.turns[0].check


def test_memory_plans_end_with_a_checked_question_about_the_opening():
    rng = random.Random(1)
    mem = [p for p in (make_plan(rng) for _ in range(3000)) if p.kind == "memory"]
    assert mem
    for p in mem:
        last = p.turns[-1]
        assert last.check and any(a in p.turns[0].text for a in last.check)


def test_probe_names_and_sums_are_never_used_in_training_plans():
    rng = random.Random(2)
    held = {n for n in first_names() if held_out(n, "name")}
    assert held
    for p in (make_plan(rng) for _ in range(3000)):
        if p.kind == "memory":
            assert not any(f" {n}." in p.turns[0].text or f" {n} " in p.turns[0].text for n in held)
    for _ in range(2000):
        op, ans, text = arithmetic_item(rng)
        a, b = [int(w) for w in re.findall(r"\d+", text)][:2]
        if op == "-" and text.startswith("Subtract"):      # "Subtract b from a"
            a, b = b, a
        assert not held_out(f"{a}{op}{b}", "sum"), text


def test_every_kind_can_be_drawn():
    rng = random.Random(3)
    seen = {make_plan(rng, openings=("Hi there!",), pool=("What is a kite made of?",)).source for _ in range(3000)}
    assert seen == {"template", "chitchat-dataset", "self-instruct"}
    assert abs(sum(KIND_WEIGHTS.values()) - 1) < 1e-9


def test_plural():
    assert [plural(w) for w in ("cat", "mouse", "fly", "fox", "guinea pig", "goldfish")] == \
        ["cats", "mice", "flies", "foxes", "guinea pigs", "goldfish"]


def test_self_instruct_keeps_one_clean_question_about_the_topic():
    from tinychat.training.selfinstruct import keep_question
    assert keep_question("What makes a good chessboard?", "chessboard") == "What makes a good chessboard?"
    assert keep_question('A curious person might ask, "What\'s it like to be a podiatrist?', "podiatrist") == \
        "What's it like to be a podiatrist?"
    assert keep_question("What is a good question someone could ask about sushi?", "sushi") is None
    assert keep_question("Why do people carry the harp?\nAnother one?", "harp") is None
    assert keep_question("How much do you know about Estonia?", "Kenya") is None
    assert keep_question("Sure! What is a bagpipe?", "bagpipes") is None


def _country_counts(mix, n=6000):
    from collections import Counter
    names = [c["name"] for c in countries()]
    it = plan_stream(6, use_chitchat=False, mix=mix)
    got = Counter()
    for _ in range(n):
        p = next(it)
        if p.kind == "fact-country":
            got.update(name for name in names if re.search(rf"\b{re.escape(name)}\b", p.turns[0].text))
    return got


def test_the_v3_mix_asks_twice_the_facts_and_about_well_known_countries_more():
    for weights, *_ in MIXES.values():
        assert abs(sum(weights.values()) - 1) < 1e-9
    v2, v3 = _country_counts("v2"), _country_counts("v3")
    assert sum(v3.values()) > 1.6 * sum(v2.values())

    def top(c):
        return sum(c[n] for n in ("Japan", "France", "Germany", "China", "India")) / sum(c.values())
    assert top(v3) > 2.5 * top(v2)                     # by how common a name is, not uniform over 219 countries


def _checked_later_turns(mix, n=3000):
    """(later turns, those asking a checked fact) in plans whose own kind asks none: a fact there is a change of
    subject."""
    it = plan_stream(6, use_chitchat=False, mix=mix)
    later = checked = 0
    for _ in range(n):
        p = next(it)
        if p.kind.startswith("fact-") or p.kind == "memory":
            continue
        later += len(p.turns) - 1
        checked += sum(bool(t.check) for t in p.turns[1:])
    return later, checked


def test_only_the_v4_mix_changes_the_subject_and_keeps_the_first_kind():
    for mix in ("v2", "v3"):                           # the streams the committed shards resume: no switches
        later, checked = _checked_later_turns(mix)
        assert later > 1000 and checked == 0
    later, checked = _checked_later_turns("v4")
    assert 0.04 * later < checked < 0.2 * later        # a fifth of later turns switch; ~a third of kinds are facts
    v3, v4 = plan_stream(6, use_chitchat=False, mix="v3"), plan_stream(6, use_chitchat=False, mix="v4")
    first3, first4 = [next(v3) for _ in range(2000)], [next(v4) for _ in range(2000)]
    assert {p.kind for p in first4} == {p.kind for p in first3}     # a plan is labelled by its opening's kind
    assert all(p.turns[0].check for p in first4 if p.kind.startswith("fact-"))


def _creator_questions(mix, n=3000):
    from tinychat.training import creators
    works = {w: (verb, m) for verb, table in creators.MADE_BY.items() for w, m in table.items()}
    it = plan_stream(6, use_chitchat=False, mix=mix)
    asked = []                        # (work, turn) for every checked turn that names a work (the object kind's
                                      # unchecked "Who invented the radio?" is no creator question)
    kinds = set()
    for _ in range(n):
        p = next(it)
        kinds.add(p.kind)
        for t in p.turns:
            asked += [(w, t) for w in works if t.check and re.search(rf"\b{re.escape(w)}\?", t.text)]
    return works, asked, kinds


def test_the_v5_mix_asks_who_made_famous_works_and_checks_the_makers_name():
    from tinychat.training import creators
    from tinychat.training.dialogue import contains_answer
    works, asked, kinds = _creator_questions("v5")
    assert "fact-creator" in kinds and len({w for w, _ in asked}) > 40
    for w, t in asked:
        verb, maker = works[w]
        assert set(t.check) == set(creators.checks(maker)), t
        assert contains_answer(f"{w} is by {maker}.", t.check)       # the full name passes its own check
        assert not held_out(w, "creator"), w                         # a probe's works never occur in plans
    assert contains_answer("It was painted by Leonardo da Vinci.", creators.checks("Leonardo da Vinci"))
    assert not contains_answer("It was painted by Picasso.", creators.checks("Leonardo da Vinci"))
    probe_side = creators.items(held_out, probe_side=True)
    assert 0 < len(probe_side) < 0.3 * len(works)


def test_the_mixes_before_v5_never_ask_who_made_something():
    for mix in ("v2", "v3", "v4"):                     # the streams committed shards resume stay as they were
        _, asked, kinds = _creator_questions(mix, n=1500)
        assert not asked and "fact-creator" not in kinds


def test_a_follow_up_about_two_makers_never_treats_them_as_one_person():
    from tinychat.training import creators
    rng = random.Random(4)
    for _ in range(200):
        q = creators.more(rng, "invented", "the airplane", "the Wright brothers")
        assert "Wright" not in q and q[0].isupper()
