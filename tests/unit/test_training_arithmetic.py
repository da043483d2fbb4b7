"""Program-written arithmetic conversations (tinychat.training.arithmetic): right answers, the probe kept out,
the same bytes for the same command, and a card that says where they came from."""
from __future__ import annotations

import re

import pytest

from tinychat.training import arithmetic as A
from tinychat.training import data as D
from tinychat.training.questions import held_out

EQUATION = re.compile(r"(\d+(?: [+\-x] \d+)+) (?:=|is|equals) (\d+)")
WORDS = re.compile(r"(\d+) (plus|minus|times|multiplied by) (\d+) (?:is|equals) (\d+)")
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b,
       "multiplied by": lambda a, b: a * b}


def _value(expr: str) -> int:
    tokens = expr.split()
    total = int(tokens[0])
    for op, n in zip(tokens[1::2], tokens[2::2]):
        total = total + int(n) if op == "+" else total - int(n) if op == "-" else total * int(n)
    return total


def _claims(reply: str) -> list[tuple[int, int]]:
    """(what the reply's arithmetic says, what it is) for every equation or worded sum in it."""
    out = [(int(rhs), _value(lhs)) for lhs, rhs in EQUATION.findall(reply)]
    out += [(int(s), OPS[op](int(a), int(b))) for a, op, b, s in WORDS.findall(reply)]
    return out


def test_every_reply_states_only_right_arithmetic():
    recs = A.records(3, 800)
    replies = [m["content"] for r in recs for m in r["messages"] if m["role"] == "assistant"]
    assert len(replies) > 1200
    for reply in replies:
        claims = _claims(reply)
        assert claims, reply                                    # every reply shows its working
        assert all(said == right for said, right in claims), reply
    assert _claims("3 + 4 = 5.") == [(5, 7)]                   # the checker itself catches a wrong sum


def test_the_first_answer_is_the_questions_answer_in_its_own_words():
    recs = A.records(4, 400)
    for r in recs:
        q, a = r["messages"][0]["content"], r["messages"][1]["content"]
        nums = [int(n) for n in re.findall(r"\d+", q)]
        if "apples" in q:
            assert re.search(rf"\b{nums[0] + nums[1]} apples?\b", a), (q, a)
        elif "cookies" in q:
            assert re.search(rf"\b{nums[0] - nums[1]} cookies?\b", a), (q, a)


def test_the_probes_operand_pairs_and_frames_never_occur():
    for r in A.records(5, 1500):
        for m in r["messages"]:
            if m["role"] != "user":
                continue
            assert not m["content"].startswith(("Please compute", "Tell me what")), m["content"]
    # the problems come from the v2 prompts' generator, which skips held-out pairs; spot-check it here
    for r in A.records(6, 300):
        q = r["messages"][0]["content"]
        a, b = [int(n) for n in re.findall(r"\d+", q)][:2]
        op = "+" if ("plus" in q or "+" in q or "apples" in q or "together" in q or q.startswith("Add")) else \
            "-" if ("minus" in q or " - " in q or "cookies" in q) else "*" if not q.startswith("Subtract") else None
        if op is None:                                          # "Subtract b from a"
            a, b, op = b, a, "-"
        assert not held_out(f"{a}{op}{b}", "sum"), q


def test_the_same_command_writes_the_same_bytes_and_bad_counts_are_one_line_errors(tmp_path, capsys):
    from tinychat.training.__main__ import main
    written = []
    for _ in range(2):                                  # the command is recorded, so the same --out both times
        assert main(["arithmetic", "--out", str(tmp_path / "a"), "--seed", "2", "--count", "250",
                     "--per-shard", "100"]) == 0
        written.append({p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()})
    assert sorted(written[0]) == ["shard-00000.jsonl.gz", "shard-00001.jsonl.gz", "shard-00002.jsonl.gz"]
    assert written[0] == written[1]
    convs = list(D.read_conversations(tmp_path / "a", kinds=True))
    assert len(convs) == 250 and {k for k, _ in convs} == {"fact-arithmetic"}
    assert "250 conversations" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["arithmetic", "--out", str(tmp_path / "c"), "--count", "0"])
    assert e.value.code == 1 and "--count" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_the_card_names_the_program_and_its_command_not_a_teacher(tmp_path):
    from tinychat.training.__main__ import main
    from training_support import exported_card, fake_conversations, write_shards
    teacher = write_shards(tmp_path / "shards", fake_conversations(30, seed=8))
    assert main(["arithmetic", "--out", str(tmp_path / "arith"), "--count", "40"]) == 0
    facts, card = exported_card(tmp_path, [str(teacher), str(tmp_path / "arith")])
    arith = facts["shards"]["dirs"][1]
    assert arith["program"]["name"] == "tinychat.training.arithmetic" and arith["teacher"] == {}
    assert f"python -m tinychat.training arithmetic --out {tmp_path / 'arith'} --count 40" in card
    assert f"generate --out {tmp_path / 'arith'}" not in card and f"generate --out {teacher}" in card
    assert "40 conversations (program: 40), written by a program, no teacher" in card
