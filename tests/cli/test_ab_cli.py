"""The sampler A/B in the plain mode: `/ab KEY=VALUE ...` prints both replies, the first differing token and its
cause, and how to keep B; /alt keeps it; every branch still replays exactly; bad input is one line, exit 2."""
import json

from typer.testing import CliRunner

from tinychat.cli import app

Q = "hello tell me about the cat"
ARGS = ["--plain", "--max-new", "12", "--seed", "1", "--temperature", "0", "--penalty", "1"]


def _run(args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def _only_session():
    (info,) = json.loads(_run(["sessions", "--json"]).stdout)
    return info


def test_plain_ab_shows_both_replies_the_first_difference_and_how_to_keep_b(model_dir):
    r = _run(["--model", model_dir, *ARGS], input=f"{Q}\n{Q}\n/ab ban=off\n/alt 3\n")
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    a = next(line for line in out if line.startswith("A (current settings): "))
    b = next(line for line in out if line.startswith("B (ban=off): "))
    assert "⟦" in a and "⟧" in b                    # the first differing token marked on both sides
    assert a.split("⟦")[0][len("A (current settings): "):] == b.split("⟦")[0][len("B (ban=off): "):]
    assert "A/B, seed 1: first difference at token" in r.stderr
    assert "is banned on side A by the 3-gram" in r.stderr
    assert "A is the active reply (2/3); /alt 3 keeps B (and /set ban off adopts its settings)" in r.stderr
    assert "reply 3/3" in r.stderr                  # /alt 3 kept B
    data = json.loads(open(_only_session()["path"]).read())
    assert len(data["branches"]) == 2 and data["messages"][-1]["settings"]["ban"] is False
    check = _run(["replay", _only_session()["id"], "--check", "--model", model_dir])
    assert check.exit_code == 0 and "token-exact" in check.stdout, check.output


def test_plain_ab_with_json_prints_one_object(model_dir):
    r = _run(["--model", model_dir, *ARGS, "--json"], input=f"{Q}\n/ab temperature=0\n")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout.splitlines()[-1])["ab"]
    assert obj["first_difference"] is None and obj["seed"] == 1 and obj["a"]["text"] == obj["b"]["text"]


def test_bad_ab_input_is_a_one_line_error_and_loses_nothing(model_dir):
    r = _run(["--model", model_dir, *ARGS], input=f"/ab top-p=0.5\n{Q}\n/ab top-p\n/ab warmth=2\n")
    assert r.exit_code == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert [e.split(":")[1].strip() for e in errors] == ["no reply to compare yet", "usage", "unknown setting 'warmth' (settings"]
    data = json.loads(open(_only_session()["path"]).read())
    assert len(data["messages"]) == 3 and not data.get("branches")


def test_side_by_side_wraps_both_texts_into_two_columns():
    from tinychat.plain import side_by_side
    lines = side_by_side("A: the cat sat on the mat and then it slept", "B: the dog", 43)
    assert all(" │ " in line or line.endswith(" │") for line in lines) and len(lines) > 1
    left = " ".join(line.split(" │")[0].strip() for line in lines)
    assert left == "A: the cat sat on the mat and then it slept" and lines[0].split(" │ ")[1] == "B: the dog"
    assert max(len(line.split(" │")[0]) for line in lines) == 20


def test_plain_ab_without_a_difference_says_so_once(model_dir):
    r = _run(["--model", model_dir, *ARGS], input=f"{Q}\n/ab top-p=0.5\n")      # greedy: top-p changes nothing
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stderr.splitlines() if x.startswith("A/B, seed 1"))
    assert line == "A/B, seed 1: no difference: both sides sampled the same tokens"
