"""Issue #16 through the real command: two processes on one session, an older copy, a failed save in a pipe,
escape codes, invalid UTF-8 on stdin, /dev/zero, int8 steps in replay, a truncated cached kernel."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import tokenizer

from tinychat.sessions import session as S

REPO = Path(__file__).resolve().parents[2]


def _env(**extra):
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def tc(*args, input=None, timeout=120, **env):
    """`python -m tinychat ARGS` in a real process (stdin a pipe): (returncode, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "tinychat", *map(str, args)], input=input, capture_output=True,
                       env=_env(**env), timeout=timeout, cwd=REPO)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def _sessions_dir() -> Path:
    return Path(os.environ["TINYCHAT_HOME"]) / "sessions"


def _only_session() -> dict:
    (path,) = _sessions_dir().glob("*.json")
    return json.loads(path.read_text())


def _new_session(model_dir, lines="hello there\nwhy the cat?\n") -> str:
    rc, out, err = tc("--model", model_dir, "--plain", "--max-new", "8", "--seed", "7", input=lines.encode())
    assert rc == 0, err
    return _only_session()["id"]


# -- 1. two processes continuing the same session -------------------------------------------------------------

def test_a_second_process_continuing_an_open_session_exits_2_and_no_turn_is_lost(model_dir):
    sid = _new_session(model_dir)
    first = subprocess.Popen([sys.executable, "-m", "tinychat", "--model", str(model_dir), "--plain", "--json",
                              "--session", sid, "--max-new", "6", "--seed", "11"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=REPO)
    try:
        first.stdin.write(b"A\n")
        first.stdin.flush()
        assert json.loads(first.stdout.readline())["n_tokens"] >= 0     # A has the session open and wrote a turn
        # A second process that waited for the lock would wait for A, which waits for its stdin: it would never
        # end, and tc's timeout (there only to stop such a hang) fails the test. A is still running at the refusal.
        rc, out, err = tc("--model", model_dir, "--plain", "--session", sid, "--max-new", "6", "--seed", "12",
                          input=b"B\n")
        assert rc == 2 and out == "" and first.poll() is None
        assert err.count("\n") == 1 and f"session {sid} is open in another tinychat (pid {first.pid})" in err
        assert f"tinychat sessions copy {sid}" in err
        rc, out, err = tc("sessions", "copy", sid)                       # the offered way on: a copy, continued
        assert rc == 0, err
        copy_id = out.strip()
        rc, _, err = tc("--model", model_dir, "--plain", "--session", copy_id, "--max-new", "6", input=b"B\n")
        assert rc == 0, err
        first.stdin.write(b"A again\n")
        first.stdin.close()
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGKILL)
            first.wait()
    users = [m.content for m in S.load(sid).messages if m.role == "user"]
    assert users == ["hello there", "why the cat?", "A", "A again"]
    copied = S.load(copy_id)
    assert [m.content for m in copied.messages if m.role == "user"] == ["hello there", "why the cat?", "A", "B"]
    assert copied.title.endswith("(copy)")
    rc, _, err = tc("--model", model_dir, "--plain", "--session", sid, "--max-new", "6", input=b"B\n")
    assert rc == 0, err                                                   # free again once A has exited
    assert [m.content for m in S.load(sid).messages if m.role == "user"][-1] == "B"


# -- 2. an older copy by path ---------------------------------------------------------------------------------------

def test_continuing_or_renaming_an_older_exported_copy_is_refused_and_the_newer_session_kept(model_dir, tmp_path):
    sid = _new_session(model_dir, "hello there\n")
    old = tmp_path / "old.json"
    assert tc("sessions", "export", sid, "--format", "json", "-o", old)[0] == 0
    assert tc("--model", model_dir, "--plain", "--session", sid, "--max-new", "6", input=b"more\n")[0] == 0
    for args in (["--model", model_dir, "--plain", "--session", old, "--max-new", "6"], ["sessions", "rename", old, "T"]):
        rc, out, err = tc(*args, input=b"X\n")
        assert rc == 2 and "changed after this copy of it was read" in err and err.count("\n") == 1, err
    users = [m["content"] for m in _only_session()["messages"] if m["role"] == "user"]
    assert users == ["hello there", "more"]


# -- 3. a failed save in --plain ------------------------------------------------------------------------------------

def test_plain_mode_shows_every_reply_and_warns_once_per_turn_when_saves_fail(model_dir, tmp_path):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)                                       # (it may hold the shared kernel builds)
    (tmp_path / "a-file").write_text("not a folder")
    (home / "sessions").symlink_to(tmp_path / "a-file")
    rc, out, err = tc("--model", model_dir, "--plain", "--json", "--max-new", "6", "--seed", "3",
                      input=b"hello there\nwhy the cat?\nand the dog?\n", TINYCHAT_HOME=str(home))
    replies = [json.loads(line) for line in out.splitlines()]
    assert len(replies) == 3                                        # every reply shown, every line read
    warnings = [line for line in err.splitlines() if line.startswith("warning: not saved:")]
    assert len(warnings) == 3 and "Traceback" not in err
    assert rc == 2                                                  # the run still says it did not save


# -- 7. escape codes ------------------------------------------------------------------------------------------------

def test_sessions_list_show_and_errors_never_print_escape_codes(model_dir, tmp_path):
    sid = _new_session(model_dir, "\x1b]52;c;aGVsbG8=\x07hello\n")
    assert tc("sessions", "rename", sid, "x\x1b]0;PWNED\x07\x1b[2J")[0] == 0
    path = _sessions_dir() / f"{sid}.json"
    data = json.loads(path.read_text())
    data["messages"][1]["content"] = "hi \x1b[2J\x9b31m there"
    data["title"] = "t\x1b]0;PWNED\x07"                               # hand-edited
    path.write_text(json.dumps(data))
    bad = tmp_path / "bad\x1b[2J.json"
    bad.write_text("{")
    for args in (["sessions"], ["sessions", "show", sid], ["sessions", "export", sid], ["sessions", "show", bad]):
        rc, out, err = tc(*args)
        for text in (out, err):
            assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, (args, text)
    assert "\\x1b" in tc("sessions", "show", sid)[1]


# -- 10. invalid UTF-8 on stdin -----------------------------------------------------------------------------------

def test_invalid_utf8_on_stdin_is_replaced_and_the_run_goes_on(model_dir):
    rc, out, err = tc("--model", model_dir, "--plain", "--json", "--max-new", "5", "--seed", "2",
                      input=b"hello\n\xff\xfe bad \xc3 bytes\nthird line\n")
    assert rc == 0, err
    assert len(out.splitlines()) == 3
    users = [m["content"] for m in _only_session()["messages"] if m["role"] == "user"]
    assert users[1] == "\ufffd\ufffd bad \ufffd bytes" and users[2] == "third line"


def test_invalid_utf8_under_a_c_locale_is_replaced_too(model_dir):
    rc, out, err = tc("--model", model_dir, "--plain", "--json", "--max-new", "5", "--seed", "2",
                      input=b"hello\n\xff bad\nthird\n", LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONIOENCODING="")
    assert rc == 0, err
    assert len(out.splitlines()) == 3


# -- 11. /dev/zero -----------------------------------------------------------------------------------------------------

def test_sessions_show_of_dev_zero_is_refused_at_once():
    rc, out, err = tc("sessions", "show", "/dev/zero", timeout=30)
    assert rc == 2 and "not a regular file" in err and err.count("\n") == 1


# -- 6. the int8 step a session was recorded with -------------------------------------------------------------------

def _int8_session(model_dir, native: str) -> dict:
    rc, out, err = tc("--model", model_dir, "--plain", "--quant", "int8", "--max-new", "12", "--seed", "4",
                      input=b"hello there\n", TINYCHAT_NATIVE=native)
    assert rc == 0, err
    return _only_session()


def test_replay_names_the_int8_step_a_session_was_recorded_with_instead_of_a_divergence(model_dir):
    data = _int8_session(model_dir, "0")
    reply = data["messages"][-1]
    from tinychat.engine.quant import cpu_has_bf16_dot
    assert reply["settings"]["step"] == "torch-int8" + ("+bf16-prefill" if cpu_has_bf16_dot() else "")
    path = _sessions_dir() / f"{data['id']}.json"
    rc, out, _ = tc("replay", data["id"], "--check", "--model", model_dir, TINYCHAT_NATIVE="0")
    assert rc == 0 and "token-exact" in out
    # the same file, as if recorded by the native step (its tokens round differently: here one is changed)
    head = len(tokenizer().generation_prompt_ids())
    reply["settings"]["step"] = "native-int8-v1"
    reply["token_ids"][head] = (reply["token_ids"][head] + 1) % tokenizer().vocab_size
    path.write_text(json.dumps(data))
    rc, out, _ = tc("replay", data["id"], "--check", "--model", model_dir, TINYCHAT_NATIVE="0")
    assert rc == 1 and "divergence:" not in out
    assert "recorded with the native int8 step v1, which this machine does not have (it runs the PyTorch int8 " \
           "step" in out
    del reply["settings"]["step"]                                  # a file from before steps were recorded
    path.write_text(json.dumps(data))
    rc, out, _ = tc("replay", data["id"], "--check", "--model", model_dir, TINYCHAT_NATIVE="0")
    assert rc == 1 and "divergence: turn 1, token 0" in out and "(unknown)" in out


# -- 9. a truncated cached kernel ------------------------------------------------------------------------------------

LOAD_KERNELS = "from tinychat.engine import native; lib = native.load(); print('ok' if lib else native.why_not)"


def test_a_truncated_cached_kernel_is_rebuilt_instead_of_crashing(tmp_path):
    from tinychat.engine import native
    if native._compiler() is None:
        pytest.skip("no C compiler here")
    env = _env(TINYCHAT_HOME=str(tmp_path / "home"))
    first = subprocess.run([sys.executable, "-c", LOAD_KERNELS], capture_output=True, text=True, env=env, timeout=300)
    assert first.stdout.strip() == "ok", first.stderr
    (so,) = (tmp_path / "home" / "cache" / "kernels").glob("tc_native_*.so")
    os.truncate(so, 1000)
    again = subprocess.run([sys.executable, "-c", LOAD_KERNELS], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and again.stdout.strip() == "ok", (again.returncode, again.stderr[-500:])
    assert so.stat().st_size > 1000


def test_a_copy_keeps_every_branch_leaves_the_original_untouched_and_replays_exactly(model_dir):
    rc, _, err = tc("--model", model_dir, "--plain", "--max-new", "8", "--seed", "3",
                    input=b"hello there\n/set seed 4\n/regen\nwhy the cat?\n")
    assert rc == 0, err
    sid = _only_session()["id"]
    before = S.session_path(sid).read_bytes()
    rc, out, err = tc("sessions", "copy", sid, "--title", "my fork", "--json")
    assert rc == 0, err
    info = json.loads(out)
    orig, dup = S.load(sid), S.load(info["id"])
    assert S.session_path(sid).read_bytes() == before and info["id"] != sid and dup.title == "my fork"
    assert [m.token_ids for m in dup.messages] == [m.token_ids for m in orig.messages]
    assert [m.token_ids for m in dup.branches] == [m.token_ids for m in orig.branches] and dup.branches
    rc, _, err = tc("replay", info["id"], "--check", "--model", model_dir)
    assert rc == 0, err
    rc, out, err = tc("sessions", "copy", "20990101-000000-000-abcdef")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err


# -- the quick exit: torch's module teardown skipped, nothing else ------------------------------------------------

_EXIT_PROBE = """
import atexit, sys, threading, torch
from tinychat.cli import _quick_exit
class Torn:
    def __del__(self):
        print("torn down", file=sys.stderr)
keep = Torn()                                   # a module global: its __del__ runs in the interpreter's teardown
atexit.register(lambda: print("atexit ran", file=sys.stderr))
if "thread" in sys.argv:
    threading.Thread(target=lambda: __import__("time").sleep(0.3)).start()
print("unflushed", end="")                      # no newline: still in stdout's buffer
_quick_exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


@pytest.mark.parametrize("how, rc, err", [("0", 0, ""), ("3", 3, ""), ("a message", 1, "a message\n")])
def test_the_quick_exit_flushes_runs_atexit_and_keeps_the_code_but_skips_the_teardown(how, rc, err):
    p = subprocess.run([sys.executable, "-c", _EXIT_PROBE, how], capture_output=True, text=True, env=_env(), cwd=REPO)
    assert (p.returncode, p.stdout) == (rc, "unflushed")
    assert p.stderr == err + "atexit ran\n"                              # no "torn down": the teardown was skipped
    # another thread still running: the normal exit (which waits for it), teardown included
    p = subprocess.run([sys.executable, "-c", _EXIT_PROBE, how, "thread"], capture_output=True, text=True, env=_env(),
                       cwd=REPO)
    assert (p.returncode, p.stdout) == (rc, "unflushed") and "atexit ran\ntorn down\n" in p.stderr


def test_a_one_shot_ends_quickly_with_the_same_reply_and_session_as_the_slow_exit(model_dir):
    outs = []
    for slow in ("", "1"):
        rc, out, err = tc("--model", model_dir, "-p", "hello there", "--json", "--max-new", "8", "--seed", "5",
                          TINYCHAT_SLOW_EXIT=slow)
        assert rc == 0, err
        saved = _only_session()                                   # written whole before the process ended
        turns = [(m["role"], m["content"], m["token_ids"]) for m in saved["messages"]]
        outs.append((json.loads(out)["text"], turns, saved["kv_sha256"]))
        for f in _sessions_dir().glob("*.json"):
            f.unlink()
    assert outs[0] == outs[1] and outs[0][0]
