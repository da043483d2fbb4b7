"""The CLI as a daily driver (issue 28): line breaks of every entry point, --continue, --no-save, the session id in
--json, --quant auto, progress of the long commands, and the sessions list naming each session's model."""
import io
import json

import pytest
from typer.testing import CliRunner

from tinychat.sessions import session as S
from tinychat.cli import app


def _run(args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def _user_messages():
    out = []
    for info in S.list_sessions():
        out += [m.content for m in S.load(info.id).messages if m.role == "user"]
    return out


# -- 2: CR and CRLF become LF wherever text comes in ----------------------------------------------------------------
def test_prompt_flag_line_breaks_become_lf(model_dir):
    r = _run(["--model", model_dir, "-p", "one\r\ntwo\rthree", "--max-new", "3"])
    assert r.exit_code == 0, r.output
    assert _user_messages() == ["one\ntwo\nthree"]


def test_file_flag_crlf_becomes_lf(model_dir, tmp_path):
    f = tmp_path / "msg.txt"
    f.write_bytes(b"first line\r\nsecond line\r\n")
    r = _run(["--model", model_dir, "-f", f, "--max-new", "3"])
    assert r.exit_code == 0, r.output
    assert _user_messages() == ["first line\nsecond line\n"]


def test_plain_stdin_ends_a_line_at_cr_crlf_and_lf():
    """The stream as a pipe gives it (lines end at LF only, nothing translated: as sys.stdin reads a pipe)."""
    from support import make_chat
    from tinychat.plain import PlainREPL
    chat = make_chat(max_new=3, autosave=False)
    out, err = io.StringIO(), io.StringIO()
    repl = PlainREPL(chat, json_out=True, stdin=io.StringIO("hello\rwhy the cat?\r\nthe sun\n\r\n", newline="\n"),
                     stdout=out, stderr=err)
    assert repl.run() == 0, err.getvalue()
    assert len(out.getvalue().splitlines()) == 3
    assert [m.content for m in chat.session.messages if m.role == "user"] == ["hello", "why the cat?", "the sun"]


# -- 4: the sessions list names each session's model --------------------------------------------------------------
def test_sessions_list_names_the_model_of_each_session(model_dir):
    r = _run(["--model", model_dir, "-p", "hello", "--max-new", "3"])
    assert r.exit_code == 0, r.output
    listed = _run(["sessions"]).stdout
    assert f"hello  ({model_dir.name})" in listed
    (info,) = json.loads(_run(["sessions", "--json"]).stdout)
    assert info["model"] == model_dir.name


# -- --quant auto, the default ----------------------------------------------------------------------------------
@pytest.fixture
def native_off(monkeypatch):
    """The native kernels off for the test (TINYCHAT_NATIVE=0), loadable again after it."""
    from tinychat.engine import native
    monkeypatch.setenv("TINYCHAT_NATIVE", "0")
    native.reset()
    yield
    monkeypatch.delenv("TINYCHAT_NATIVE")
    native.reset()


def _kernels_here() -> bool:
    from tinychat.engine import native
    return native.load() is not None


def test_auto_picks_int8_where_the_kernels_build_and_the_graph_on_a_gpu():
    from tinychat.loading import resolve_quant
    if not _kernels_here():
        pytest.skip("no native kernels on this machine")
    mode, why = resolve_quant("auto", "cpu")
    assert mode == "int8" and "native int8 kernels" in why
    assert resolve_quant("auto", "cuda")[0] == "none"                  # full precision, the captured graph
    assert resolve_quant("int8", "cpu") == ("int8", None)              # by hand: as given, nothing to say
    assert resolve_quant("none", "cpu") == ("none", None)


def test_auto_is_fp32_without_the_kernels(native_off):
    from tinychat.loading import resolve_quant
    mode, why = resolve_quant("auto", "cpu")
    assert mode == "none" and "no native int8 kernels" in why and "TINYCHAT_NATIVE=0" in why


def test_auto_continuing_a_session_keeps_its_mode():
    from tinychat.loading import resolve_quant
    sess = S.Session.new(quant="none")
    assert resolve_quant("auto", "cpu", sess) == ("none", "the mode the session was recorded with")
    sess.quant = "int8"
    assert resolve_quant("auto", "cpu", sess)[0] == "int8"
    assert resolve_quant("auto", "cuda", sess)[0] == "none"            # int8 is a CPU mode


def test_the_default_chat_runs_what_auto_chose_records_it_and_replays_exactly(model_dir):
    want = "int8" if _kernels_here() else "none"
    r = _run(["--model", model_dir, "-p", "hello there", "--max-new", "8", "--json", "--seed", "5"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["mode"] == ("fast-int8" if want == "int8" else "eager")
    (info,) = S.list_sessions()
    sess = S.load(info.id)
    assert sess.quant == want                                         # the resolved mode, never "auto"
    check = _run(["replay", info.id, "--check", "--model", model_dir])
    assert check.exit_code == 0 and "token-exact" in check.stdout, check.output
    # continued under auto: the session's mode, whatever auto would pick for a new chat
    cont = _run(["--model", model_dir, "-s", info.id, "-p", "and more", "--max-new", "4", "--json"])
    assert cont.exit_code == 0, cont.output
    assert S.load(info.id).quant == want and S.load(info.id).n_turns == 2
    ref = _run(["--model", model_dir, "--quant", "none", "-p", "hi", "--max-new", "3", "--json"])
    assert json.loads(ref.stdout)["mode"] == "eager"                 # --quant none: still the reference path


def test_auto_continues_an_fp32_session_in_fp32(model_dir):
    r = _run(["--model", model_dir, "--quant", "none", "-p", "hello", "--max-new", "4"])
    assert r.exit_code == 0, r.output
    (info,) = S.list_sessions()
    cont = _run(["--model", model_dir, "-s", info.id, "-p", "again", "--max-new", "4", "--json"])
    assert cont.exit_code == 0, cont.output
    assert json.loads(cont.stdout)["mode"] == "eager" and S.load(info.id).quant == "none"


def test_info_says_what_auto_runs_here(model_dir):
    r = _run(["info", "--model", model_dir, "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.stdout)
    assert facts["quant_auto"] in ("int8", "none") and facts["quant_auto_why"]
    text = _run(["info", "--model", model_dir]).stdout
    assert "--quant auto (the default)" in text


# -- -c / --continue ------------------------------------------------------------------------------------------
def test_continue_opens_the_most_recent_session(model_dir):
    import time
    assert _run(["--model", model_dir, "-p", "first chat", "--max-new", "3"]).exit_code == 0
    time.sleep(0.02)
    assert _run(["--model", model_dir, "-p", "second chat", "--max-new", "3"]).exit_code == 0
    newest = S.list_sessions()[0]
    r = _run(["--model", model_dir, "-c", "-p", "a follow-up", "--max-new", "3", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["session"] == newest.id
    assert [m.content for m in S.load(newest.id).messages if m.role == "user"] == ["second chat", "a follow-up"]
    r = _run(["--model", model_dir, "--plain", "--continue", "--max-new", "3"], input="and one more\n")
    assert r.exit_code == 0, r.output
    assert S.load(newest.id).n_turns == 3 and len(S.list_sessions()) == 2


def test_continue_without_a_session_or_with_one_named_is_a_one_line_error(model_dir, capsys):
    """(main() turns the UsageError into one line on stderr and exit 2, as for every flag.)"""
    from tinychat.cli import UsageError
    r = _run(["--model", model_dir, "-c", "-p", "hello"])
    assert isinstance(r.exception, UsageError) and "no saved session to continue" in str(r.exception)
    _run(["--model", model_dir, "-p", "hello", "--max-new", "3"])
    r = _run(["--model", model_dir, "-c", "-s", S.list_sessions()[0].id, "-p", "hello"])
    assert isinstance(r.exception, UsageError) and "not both" in str(r.exception)


# -- --no-save, and the session id in --json ------------------------------------------------------------------
def test_json_carries_the_session_id_it_is_saved_in(model_dir):
    r = _run(["--model", model_dir, "--plain", "--json", "--max-new", "3"], input="hello\nagain\n")
    assert r.exit_code == 0, r.output
    ids = {json.loads(line)["session"] for line in r.stdout.splitlines()}
    (info,) = S.list_sessions()
    assert ids == {info.id}


def test_no_save_writes_nothing_for_p_f_and_plain(model_dir, tmp_path):
    f = tmp_path / "msg.txt"
    f.write_text("hello from a file")
    for args, stdin in [(["-p", "hello"], None), (["-f", f], None), (["--plain"], "hello\nagain\n")]:
        r = _run(["--model", model_dir, *args, "--no-save", "--json", "--max-new", "3"], input=stdin)
        assert r.exit_code == 0, r.output
        assert all(json.loads(line)["session"] is None for line in r.stdout.splitlines())
    assert S.list_sessions() == []


def test_the_save_one_shots_preference_and_the_flags_over_it(model_dir):
    from tinychat.prefs import Prefs, save_prefs
    save_prefs(Prefs(save_one_shots=False))
    assert _run(["--model", model_dir, "-p", "not kept", "--max-new", "3"]).exit_code == 0
    assert S.list_sessions() == []
    assert _run(["--model", model_dir, "-p", "kept", "--save", "--max-new", "3"]).exit_code == 0
    r = _run(["--model", model_dir, "--plain", "--max-new", "3"], input="a plain chat is saved\n")
    assert r.exit_code == 0
    assert sorted(i.title for i in S.list_sessions()) == ["a plain chat is saved", "kept"]


def test_an_unreadable_prefs_file_is_one_note_and_the_defaults(model_dir):
    from tinychat.prefs import load_prefs, prefs_path
    prefs_path().parent.mkdir(parents=True, exist_ok=True)
    prefs_path().write_text('{"save_one_shots": "no"}')
    prefs, why = load_prefs()
    assert prefs.save_one_shots is True and "save_one_shots must be true or false" in why
    r = _run(["--model", model_dir, "-p", "hello", "--max-new", "3"])
    assert r.exit_code == 0 and "note:" in r.stderr and len(S.list_sessions()) == 1
    prefs_path().write_text("{not json")
    assert "not read" in load_prefs()[1]


def test_the_prefs_note_prints_a_home_path_with_escape_codes_escaped(tmp_path, monkeypatch):
    from tinychat.prefs import prefs_path
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "evil\x1b]0;PWNED\x07home"))
    prefs_path().parent.mkdir(parents=True, exist_ok=True)
    prefs_path().write_text("{not json")
    r = _run(["-c", "-p", "hi"])                           # the note, then a usage error: no session to continue
    assert r.exit_code != 0 and "note:" in r.stderr and "not read" in r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "evil\\x1b]0;PWNED\\x07home" in r.stderr


def test_the_reopen_last_preference_opens_the_latest_session_in_the_app_only(model_dir):
    from tinychat.cli import _session_and_saving
    from tinychat.prefs import Prefs, save_prefs
    _run(["--model", model_dir, "-p", "hello", "--max-new", "3"])
    (info,) = S.list_sessions()
    assert _session_and_saving(None, False, None, one_shot=False, app=True) == (None, True)
    save_prefs(Prefs(reopen_last=True))
    assert _session_and_saving(None, False, None, one_shot=False, app=True) == (info.id, True)
    assert _session_and_saving(None, False, None, one_shot=True, app=False) == (None, True)     # not -p
    assert _session_and_saving(None, False, False, one_shot=False, app=True) == (info.id, False)


# -- progress of the long commands --------------------------------------------------------------------------------
def test_replay_tree_reports_progress_per_turn_of_every_branch():
    from support import make_chat
    from tinychat.chat.replay import replay_tree
    chat = make_chat(max_new=5, seed=2)
    chat.send("hello there")
    chat.send("why the cat?")
    chat.regenerate()                                   # two paths: 2 turns each
    calls = []
    replay_tree(make_chat(autosave=False), S.load(chat.session.id), progress=lambda *a: calls.append(a))
    assert [c[:2] for c in calls] == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert calls[1][2] == "branch 1/2, turn 1" and calls[-1][2] == "branch 2/2, turn 2"


def test_check_folder_reports_progress_per_session(tmp_path):
    from support import make_chat
    from tinychat.chat.replay_check import check_folder
    for q in ("hello", "the cat"):
        make_chat(max_new=4, seed=3).send(q)
    calls, lines = [], []
    code = check_folder(S.list_sessions()[0].path.parent, lambda sess: make_chat(autosave=False), lines.append,
                        progress=lambda *a: calls.append(a))
    assert code == 0 and len(lines) == 2
    assert calls[0][:2] == (0, 2) and calls[-1] == (2, 2, "done")
    assert any("session 2/2" in c[2] and "(1/1 turns)" in c[2] for c in calls)


def test_import_reports_its_stages(tmp_path):
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "unit"))
    from test_llama_import import VARIANTS, _weights, write_hf
    from tinychat.importer import import_model
    cfg = VARIANTS["llama-tied"]
    src = write_hf(tmp_path / "Staged", cfg, _weights(cfg))
    calls = []
    import_model(src, progress=lambda *a: calls.append(a))
    assert [c[0] for c in calls] == [0, 1, 2, 3] and all(c[1] == 3 for c in calls)
    assert calls[0][2] == "reading the weights" and calls[-1][2] == "done"


def test_the_cli_shows_progress_on_a_terminal_for_replay_check_and_import(model_dir, tmp_path, monkeypatch):
    import contextlib

    import tinychat.cli as cli
    seen = []

    @contextlib.contextmanager
    def recording(title):
        yield (lambda done, total, what: seen.append((title, done, total, what))), cli.typer.echo
    monkeypatch.setattr(cli, "_progress", recording)
    _run(["--model", model_dir, "--plain", "--max-new", "4"], input="hello\nthe cat\n")
    (info,) = S.list_sessions()
    r = _run(["replay", info.id, "--check", "--model", model_dir])
    assert r.exit_code == 0, r.output
    assert [s[1:3] for s in seen] == [(0, 0), (0, 2), (1, 2), (2, 2)] and seen[0][0] == "replay --check"
    assert seen[0][3] == "loading the model"
    seen.clear()
    r = _run(["replay", str(info.path.parent), "--check", "--model", model_dir])
    assert r.exit_code == 0 and seen[-1][1:] == (1, 1, "done")
    assert not cli._stderr_is_terminal()                # under test: no bar, nothing but the results on stderr
