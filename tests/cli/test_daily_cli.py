"""The CLI as a daily driver (issue 28): line breaks of every entry point, --continue, --no-save, the session id in
--json, --quant auto, progress of the long commands, and the sessions list naming each session's model."""
import io
import json

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
