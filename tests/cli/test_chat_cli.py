"""The `tinychat` CLI: plain mode in a pipe, sessions, replay --check, and one-line errors for bad input."""
import json
import os
import random
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from support import tokenizer
from tinychat.cli import app, main


def _run(args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def _sessions():
    r = _run(["sessions", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_plain_json_one_object_per_turn_and_autosaved(model_dir):
    r = _run(["--model", model_dir, "--plain", "--json", "--max-new", "12", "--seed", "3"],
             input="hello there\nwhy the cat?\n")
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(lines) == 2
    for obj in lines:
        assert {"text", "n_tokens", "finish", "ttft_ms", "decode_tok_s"} <= set(obj)
        assert obj["finish"] in ("stop", "length") and 0 < obj["n_tokens"] <= 12
    (info,) = _sessions()
    assert info["n_turns"] == 2 and info["title"] == "hello there"


def test_slash_commands_in_plain_mode(model_dir):
    script = "hello\n/set temperature 0\n/set max-new 5\nwhy?\n/undo\n/regen\n/trace on\nagain\n/info\n/quit\nnever sent\n"
    r = _run(["--model", model_dir, "--plain", "--json", "--max-new", "8"], input=script)
    assert r.exit_code == 0, r.output
    turns = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(turns) == 4                                   # hello, why? (then undone), hello regenerated, again
    assert all(t["n_tokens"] <= 5 for t in turns[1:])
    (info,) = _sessions()
    assert info["n_turns"] == 2


def test_bad_slash_command_in_a_pipe_is_an_error_exit(model_dir):
    r = _run(["--model", model_dir, "--plain", "--max-new", "4"], input="/frobnicate\n")
    assert r.exit_code == 2 and "unknown command" in r.stderr


def test_sessions_show_export_rename_rm(model_dir, tmp_path):
    _run(["--model", model_dir, "--plain", "--max-new", "6"], input="tell me about the moon\n")
    (info,) = _sessions()
    sid = info["id"]
    assert "  1 turn   tell me about the moon" in _run(["sessions"]).stdout      # a count with its noun
    assert "tell me about the moon" in _run(["sessions", "show", sid]).stdout
    out = tmp_path / "s.json"
    assert _run(["sessions", "export", sid, "--format", "json", "--out", out]).exit_code == 0
    assert json.loads(out.read_text())["id"] == sid
    assert _run(["sessions", "rename", sid, "Moon talk"]).exit_code == 0
    assert _sessions()[0]["title"] == "Moon talk"
    assert _run(["sessions", "rm", sid]).exit_code == 0
    assert _sessions() == []
    assert _run(["sessions", "rm", sid]).exit_code != 0


def test_replay_check_exit_codes(model_dir, capsys):
    # a fixed seed: the tampered position below must be one of the reply's content tokens, not its end frame
    _run(["--model", model_dir, "--plain", "--max-new", "10", "--seed", "3"], input="hello there\nwhy the cat?\n")
    (info,) = _sessions()
    r = _run(["replay", info["id"], "--check", "--model", model_dir])
    assert r.exit_code == 0 and "replay: 2 turns, " in r.stdout and "token-exact" in r.stdout
    data = json.loads(open(info["path"]).read())
    reply = data["messages"][-1]["token_ids"]
    head = len(tokenizer().generation_prompt_ids())
    assert len(reply) - head - len(tokenizer().end_ids()) > 2
    reply[head + 2] = (reply[head + 2] + 7) % tokenizer().vocab_size
    open(info["path"], "w").write(json.dumps(data))
    r = _run(["replay", info["path"], "--check", "--model", model_dir])
    assert r.exit_code == 1 and "divergence: turn 2, token 2" in r.stdout
    code, err = _cli_main(["replay", info["id"], "--check", "--model", model_dir / "nope"], capsys)
    assert code == 2 and "no such model folder" in err



def test_a_folder_check_replays_each_session_on_the_model_it_names(model_dir):
    # two imported models (folders under the models folder, by name) with different weights, a session on each: the
    # folder check without --model replays each on its own model, not both on the shipped one
    import shutil

    from support import make_chat_model
    from tinychat import paths
    a, b = paths.models_dir() / "alpha", paths.models_dir() / "beta"
    shutil.copytree(model_dir, a)
    make_chat_model(seed=7).save_pretrained(b)
    shutil.copy(model_dir / "tokenizer.json", b / "tokenizer.json")
    for name in ("alpha", "beta"):
        assert _run(["--model", name, "-p", "hello there", "--max-new", "6", "--seed", "2"]).exit_code == 0
    r = _run(["replay", paths.sessions_dir(), "--check"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count("token-exact") == 2
    r = _run(["replay", paths.sessions_dir(), "--check", "--model", "alpha"])   # --model: every session on it
    assert r.exit_code == 2 and "another model (beta)" in r.stdout and r.stdout.count("token-exact") == 1

def _cli_main(args, capsys):
    old = sys.argv
    sys.argv = ["tinychat", *map(str, args)]
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return e.value.code, out.err


def test_corrupt_session_files_each_give_exit_2_and_a_short_error(model_dir, tmp_path, capsys):
    _run(["--model", model_dir, "--plain", "--max-new", "6"], input="hello there\n")
    (info,) = _sessions()
    good = open(info["path"], "rb").read()
    rng = random.Random(0)
    trials = 0
    for i in range(300):            # until 100 corruptions that break the file (how many do depends on its bytes)
        if trials == 100:
            break
        data = bytearray(good)
        kind = i % 4
        if kind == 0:
            data = data[:rng.randrange(len(data))]
        elif kind == 1:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 2:
            obj = json.loads(good)
            key = rng.choice(list(obj))
            obj[key] = rng.choice([None, 7, "x", [], {}]) if rng.random() < 0.7 else obj.pop(key)
            data = json.dumps(obj).encode()
        else:
            obj = json.loads(good)
            msg = rng.choice(obj["messages"])
            msg[rng.choice(list(msg))] = rng.choice([-1, "oops", [1.5], None, {"a": 1}])
            data = json.dumps(obj).encode()
        bad = tmp_path / f"bad{i}.json"
        bad.write_bytes(bytes(data))
        code, err = _cli_main(["sessions", "show", bad], capsys)
        if code == 0:
            continue                                        # a flip that left valid JSON with valid values
        trials += 1
        assert code == 2, err
        assert err.count("\n") == 1 and err.startswith("tinychat: error:") and "Traceback" not in err
    assert trials == 100


def test_plain_mode_through_a_real_pipe(model_dir):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "tinychat", "--model", str(model_dir), "--max-new", "8", "--seed", "1"],
                       input="hello there\nwhy the cat?\n", capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) >= 2                  # stdout carries only the replies
    assert "Traceback" not in p.stderr


def test_bad_flags_are_one_line_errors(model_dir, capsys):
    for args, msg in [(["--quant", "int3", "--model", model_dir], "--quant must be one of"),
                      (["--temperature", "-1", "--model", model_dir, "--plain"], "temperature must be between"),
                      (["--model", model_dir / "missing", "--plain"], "no such model folder"),
                      (["--model", "no-such-name", "--plain"], "no model folder or imported model named "
                                                                "'no-such-name' (`tinychat models` lists"),
                      (["--session", "nope", "--model", model_dir, "--plain"], "no such session")]:
        code, err = _cli_main(args, capsys)
        assert code == 2 and msg in err and err.count("\n") == 1, (args, err)



def test_a_mistyped_model_name_suggests_the_imported_ones_it_may_mean(tmp_path, capsys):
    """An import keeps its file's suffix (SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct.Q4_1): the bare
    name, another case or a typo gets the imported names it may have meant, still in one line."""
    import os
    from pathlib import Path
    models = Path(os.environ["TINYCHAT_HOME"]) / "models"
    for n in ("SmolLM2-135M-Instruct.Q4_1", "Qwen2.5-0.5B-Instruct", "other"):
        (models / n).mkdir(parents=True)
        (models / n / "config.json").write_text("{}")
    (models / ".half.importing").mkdir()                   # an import under way: never suggested
    for typed, want in (("SmolLM2-135M-Instruct", "did you mean 'SmolLM2-135M-Instruct.Q4_1'?"),
                        ("smollm2", "did you mean 'SmolLM2-135M-Instruct.Q4_1'?"),
                        ("Qwen2.5-05B-Instrcut", "did you mean 'Qwen2.5-0.5B-Instruct'?"),
                        ("nothing-like-it", "(`tinychat models` lists")):
        code, err = _cli_main(["--model", typed, "--plain"], capsys)
        assert code == 2 and want in err and err.count("\n") == 1, (typed, err)
        assert ".half" not in err


def test_a_hugging_face_repo_id_opens_the_model_pulled_from_it_or_says_how_to_pull_it(tmp_path, capsys):
    """`--model ORG/NAME[:QUANT]` as ollama / llama.cpp users type it: the imported model whose import.json says it
    was pulled from that repo (case-insensitive; :QUANT picks among a GGUF repo's quants); several: one line naming
    them; none: one line with the pull command."""
    import json
    import os
    from pathlib import Path

    from tinychat.loading import model_path
    models = Path(os.environ["TINYCHAT_HOME"]) / "models"
    for n, repo, quant in (("tiny", "org/tiny", None), ("tiny-Q8_0", "org/tiny-GGUF", "Q8_0"),
                           ("tiny-Q4_K_M", "org/tiny-GGUF", "Q4_K_M"), ("local", None, None)):
        (models / n).mkdir(parents=True)
        (models / n / "config.json").write_text("{}")
        meta = {"source": "x"} if repo is None else {"source": "x", "hub": {"repo": repo, "quant": quant}}
        (models / n / "import.json").write_text(json.dumps(meta))
    assert model_path("org/tiny") == models / "tiny" and model_path("ORG/Tiny") == models / "tiny"
    assert model_path("org/tiny-GGUF:q4_k_m") == models / "tiny-Q4_K_M"
    for typed, want in (("org/tiny-GGUF", "org/tiny-GGUF: pulled as tiny-Q4_K_M, tiny-Q8_0; give one"),
                        ("org/other", "org/other: no such model folder, nor a model pulled from that Hugging Face "
                                      "repo (`tinychat pull org/other` downloads and imports it)"),
                        ("nothing-like-it", "`tinychat pull ORG/NAME` or `tinychat import SRC` brings one")):
        code, err = _cli_main(["--model", typed, "--plain"], capsys)
        assert code == 2 and want in err and err.count("\n") == 1, (typed, err)


def test_a_missing_argument_is_named_as_help_shows_it(capsys):
    for args, msg in [(["sessions", "show"], "tinychat sessions show needs ID|PATH"),
                      (["sessions", "rename", "abc"], "tinychat sessions rename needs TITLE (see"),
                      (["replay"], "tinychat replay needs ID|PATH|DIR"),
                      (["import"], "tinychat import needs SRC (see tinychat import --help)")]:
        code, err = _cli_main(args, capsys)
        assert code == 2 and msg in err and err.count("\n") == 1 and "ref" not in err, (args, err)
        assert ("lists the saved chats" in err) == ("needs ID" in err), err

def test_session_given_as_a_bare_json_file_name_continues_that_file(model_dir, tmp_path, monkeypatch):
    # "mychat.json" has no "/": it is still a path (session.load's rule), not an id to look up in the sessions folder
    _run(["--model", model_dir, "--plain", "--max-new", "6", "--seed", "1"], input="hello there\n")
    (info,) = _sessions()
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "mychat.json").write_bytes(open(info["path"], "rb").read())
    assert _run(["sessions", "rm", info["id"]]).exit_code == 0       # only the file named on the command line
    monkeypatch.chdir(work)
    r = _run(["--model", model_dir, "--plain", "--json", "--max-new", "4", "--session", "mychat.json"],
             input="and then?\n")
    assert r.exit_code == 0, r.output
    assert len(r.stdout.splitlines()) == 1
    (after,) = _sessions()
    assert after["id"] == info["id"] and after["n_turns"] == 2


def test_a_library_load_error_is_a_one_line_exit_2(model_dir, tmp_path, capsys):
    from tinychat.loading import LoadError, load_runtime
    bare = tmp_path / "no-tokenizer"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((model_dir / f).read_bytes())
    with pytest.raises(LoadError, match="no tokenizer.json"):
        load_runtime(bare)
    code, err = _cli_main(["--model", bare, "--plain"], capsys)
    assert code == 2 and "no tokenizer.json" in err and err.count("\n") == 1, err


def test_int4_asked_of_a_small_model_says_once_what_it_costs(model_dir):
    # a one-shot's reply stays alone on stdout; the note (a model under 300M parameters loses much at 4 bits) on
    # stderr, for int4 asked by hand only
    note = "4-bit weights cost a model this small"
    for quant, noted in (("int4", True), ("int8", False)):
        r = _run(["--model", model_dir, "-p", "hello there", "--max-new", "4", "--quant", quant, "--no-save"])
        assert r.exit_code == 0, r.output
        assert (note in r.stderr) is noted and note not in r.stdout
        assert r.stderr.count(note) == (1 if noted else 0)


def test_the_int4_note_is_for_small_models_and_modes_asked_by_hand(monkeypatch):
    from support import make_chat_model
    from tinychat import loading
    m = make_chat_model()
    assert loading.small_int4_note(m, "int4", None)
    assert loading.small_int4_note(m, "int4", "the model is stored int4") is None     # --quant auto took it
    assert loading.small_int4_note(m, "int8", None) is None
    monkeypatch.setattr(loading, "SMALL_INT4", 1000)                                    # a model above the line
    assert loading.small_int4_note(m, "int4", None) is None
