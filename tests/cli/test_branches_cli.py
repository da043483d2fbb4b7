"""Branches from the command line: /regen and /alt in plain mode, `sessions show` marks alternatives, `replay --check`
walks every branch, and a folder of sessions is checked as a suite."""
import json

import pytest
from typer.testing import CliRunner

from support import tokenizer
from tinychat.cli import app


def _run(args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def _only_session():
    r = _run(["sessions", "--json"])
    (info,) = json.loads(r.stdout)
    return info


def _branched(model_dir):
    """A session with one turn, three replies (the second active), and a second turn under it."""
    r = _run(["--model", model_dir, "--plain", "--max-new", "10", "--seed", "3"],
             input="hello there\n/set seed 4\n/regen\n/set seed 5\n/regen\n/alt 2\nwhy the cat?\n")
    assert r.exit_code == 0, r.output
    return r, _only_session()


def test_plain_regen_keeps_alternatives_and_alt_switches_between_them(model_dir):
    r, info = _branched(model_dir)
    assert "reply 2/3" in r.stderr
    data = json.loads(open(info["path"]).read())
    assert data["version"] == 2 and len(data["branches"]) == 2
    show = _run(["sessions", "show", info["id"]])
    assert show.exit_code == 0 and "## Assistant (reply 2/3)" in show.stdout


@pytest.mark.parametrize("line, message", [("/alt 9", "no alternative 9: this reply has 2"),
                                           ("/alt sideways", "usage: /alt next|prev|N")])
def test_bad_alt_is_a_one_line_error_and_loses_nothing(model_dir, line, message):
    r = _run(["--model", model_dir, "--plain", "--max-new", "8", "--seed", "3"],
             input=f"hello there\n/set seed 4\n/regen\n{line}\n")
    assert r.exit_code == 2 and message in r.stderr
    data = json.loads(open(_only_session()["path"]).read())
    assert len(data["messages"]) == 3 and len(data["branches"]) == 1


def test_replay_check_walks_every_branch_and_names_the_one_that_differs(model_dir):
    _, info = _branched(model_dir)
    r = _run(["replay", info["id"], "--check", "--model", model_dir])
    assert r.exit_code == 0 and "3 branches" in r.stdout and "token-exact" in r.stdout, r.output
    data = json.loads(open(info["path"]).read())
    head = len(tokenizer().generation_prompt_ids())
    off = data["branches"][-1]               # the third reply (seed 5), off the active path
    off["token_ids"][head + 1] = (off["token_ids"][head + 1] + 7) % tokenizer().vocab_size
    open(info["path"], "w").write(json.dumps(data))
    r = _run(["replay", info["id"], "--check", "--model", model_dir])
    assert r.exit_code == 1
    assert "branch turn 1 reply 3/3: divergence: turn 1, token 1" in r.stdout


def test_replay_check_of_a_folder_reports_one_object_per_session(model_dir, tmp_path):
    _, info = _branched(model_dir)
    _run(["--model", model_dir, "--plain", "--max-new", "8", "--seed", "7"], input="a second chat\n")
    folder = info["path"].rsplit("/", 1)[0]
    r = _run(["replay", folder, "--check", "--json", "--model", model_dir])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == 2 and all(row["ok"] for row in rows)
    assert sorted(row["branches"] for row in rows) == [1, 3]
    data = json.loads(open(info["path"]).read())
    head = len(tokenizer().generation_prompt_ids())
    ids = data["messages"][2]["token_ids"]
    ids[head] = (ids[head] + 3) % tokenizer().vocab_size
    open(info["path"], "w").write(json.dumps(data))
    r = _run(["replay", folder, "--check", "--model", model_dir])
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and sum("DIFFERS branch" in x for x in lines) == 1


def test_sessions_grep_finds_text_on_any_branch_and_refuses_an_empty_pattern(model_dir):
    _run(["--model", model_dir, "--plain", "--max-new", "6", "--seed", "3"], input="all about Zebras\n")
    _run(["--model", model_dir, "--plain", "--max-new", "6", "--seed", "3"], input="hello there\n")
    r = _run(["sessions", "--grep", "zebra", "--json"])
    assert r.exit_code == 0 and [i["title"] for i in json.loads(r.stdout)] == ["all about Zebras"]
    assert json.loads(_run(["sessions", "--grep", "no such words", "--json"]).stdout) == []
    r = _run(["sessions", "--grep", " "])
    assert r.exit_code != 0
    # `sessions list` is the same listing, options and all
    assert _run(["sessions", "list", "--json"]).stdout == _run(["sessions", "--json"]).stdout
    r = _run(["sessions", "list", "--grep", "zebra"])
    assert r.exit_code == 0 and "all about Zebras" in r.stdout and "hello there" not in r.stdout


def test_one_shot_prompt_sends_one_message_and_prints_the_reply(model_dir):
    r = _run(["--model", model_dir, "-p", "hello there", "--max-new", "6", "--seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    (obj,) = [json.loads(x) for x in r.stdout.splitlines()]
    assert obj["n_tokens"] >= 1
    r = _run(["--model", model_dir, "-p", "-", "--max-new", "6", "--seed", "3"], input="line one\nline two\n")
    assert r.exit_code == 0, r.output
    sessions = json.loads(_run(["sessions", "--json"]).stdout)
    assert sorted(i["n_turns"] for i in sessions) == [1, 1]           # the two lines were one message
    assert len(json.loads(_run(["sessions", "--grep", "line one\nline two", "--json"]).stdout)) == 1
    r = _run(["--model", model_dir, "-p", "  "])
    assert r.exit_code != 0 and "empty" in str(r.exception)


def test_plain_fork_forces_a_token_keeps_the_old_reply_and_replays_exactly(model_dir):
    r = _run(["--model", model_dir, "--plain", "--max-new", "10", "--seed", "3"],
             input='hello there\n/fork 2 " cat"\n')
    assert r.exit_code == 0, r.output
    assert "reply 2/2: forked at token 2" in r.stderr
    info = _only_session()
    data = json.loads(open(info["path"]).read())
    head = len(tokenizer().generation_prompt_ids())
    (cat,) = tokenizer().encode(" cat")
    reply, (old,) = data["messages"][-1], data["branches"]
    assert reply["fork"] == {"position": 2, "token": cat} and reply["token_ids"][head + 2] == cat
    assert reply["token_ids"][:head + 2] == old["token_ids"][:head + 2] and reply["parent"] == old["parent"]
    r = _run(["replay", info["id"], "--check", "--model", model_dir])
    assert r.exit_code == 0 and "2 branches" in r.stdout and "token-exact" in r.stdout, r.output


@pytest.mark.parametrize("line, message", [("/fork 99 5", "no token 99 in this reply"),
                                           ("/fork 1 999999", "outside the model's vocabulary"),
                                           ('/fork 1 "the cat sees"', "not one"),
                                           ("/fork one 5", "usage: /fork POSITION TOKEN")])
def test_a_bad_plain_fork_is_a_one_line_error_and_loses_nothing(model_dir, line, message):
    r = _run(["--model", model_dir, "--plain", "--max-new", "8", "--seed", "3"], input=f"hello there\n{line}\n")
    assert r.exit_code == 2 and message in r.stderr
    assert len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1
    data = json.loads(open(_only_session()["path"]).read())
    assert len(data["messages"]) == 3 and data["branches"] == []


def test_one_shot_from_a_file_sends_its_whole_text_as_one_message(model_dir, tmp_path):
    msg = tmp_path / "question.txt"
    msg.write_text("first line of the file\nsecond line\n", encoding="utf-8")
    r = _run(["--model", model_dir, "-f", msg, "--max-new", "6", "--seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    (obj,) = [json.loads(x) for x in r.stdout.splitlines()]
    (info,) = json.loads(_run(["sessions", "--grep", "first line of the file\nsecond line", "--json"]).stdout)
    assert info["n_turns"] == 1 and obj["n_tokens"] >= 1


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "absent.txt", "No such file"),
    (lambda p: p, "a folder, not a file"),
    (lambda p: (p / "b.bin").write_bytes(b"\xff\xfe\x00bad") and p / "b.bin", "not UTF-8 text"),
    (lambda p: (p / "n.txt").write_bytes(b"ab\x00cd") and p / "n.txt", "binary file"),
    (lambda p: (p / "e.txt").write_text("  \n") and p / "e.txt", "empty"),
])
def test_a_bad_message_file_is_refused_in_one_line(model_dir, tmp_path, make, message):
    r = _run(["--model", model_dir, "-f", make(tmp_path)])
    assert type(r.exception).__name__ == "UsageError" and message in str(r.exception)    # main(): one line, exit 2
    assert json.loads(_run(["sessions", "--json"]).stdout) == []


def test_one_shot_takes_the_message_from_p_or_f_not_both(model_dir, tmp_path):
    (tmp_path / "m.txt").write_text("hi")
    r = _run(["--model", model_dir, "-p", "hello", "-f", tmp_path / "m.txt"])
    assert type(r.exception).__name__ == "UsageError" and "not both" in str(r.exception)
