"""The CLI as a daily driver (issue 28): line breaks of every entry point, --continue, --no-save, the session id in
--json, --quant auto, progress of the long commands, and the sessions list naming each session's model."""
import io
import json

import pytest
from typer.testing import CliRunner

from tinychat import session as S
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
