"""Issue #33 item 4: a big session is a log a save appends to (sessions/log.py), not a file rewritten whole after
every turn. What it must keep: a reload gives exactly the session saved (every kind of tree change), an older file
converts on its first save, a save that did not finish (a torn append, a SIGKILL) is dropped with a notice and
never loses the session, a listing reads only the log's ends, a log stays bounded, and bad logs are one line."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import make_chat, tokenizer

from tinychat.sessions import export as SE
from tinychat.sessions import log as session_log
from tinychat.sessions import read as session_read
from tinychat.sessions import session as S
from tinychat.sessions import write as session_write

REPO = Path(__file__).resolve().parents[2]
SID = "20261202-000000-000-abcdef"
SETTINGS = {"temperature": 0.8, "top_p": 0.9, "penalty": 1.2, "penalty_window": 64, "ban": True, "seed": 1}


@pytest.fixture
def small_log(monkeypatch):
    """Sessions of 4 messages or more are logs (the real threshold is LOG_MIN_MESSAGES)."""
    monkeypatch.setattr(S, "LOG_MIN_MESSAGES", 4)


def _msg(mid, parent, role, rng):
    m = {"role": role, "content": f"m{mid}", "token_ids": [rng.randrange(3, 390) for _ in range(5)], "created": 1.0,
         "settings": None, "seed": None, "finish": None, "timing_ms": None, "id": mid, "parent": parent,
         "fork": None}
    if role == "assistant":
        m.update(settings=dict(SETTINGS), seed=rng.randrange(2 ** 62), finish="stop", timing_ms=[1.5] * 5)
    return m


def document(n_branch: int = 40, n_turns: int = 2) -> dict:
    """One JSON document (as an older tinychat wrote it): a system message, `n_turns` turns, a chain off the
    first reply."""
    rng = random.Random(0)
    msgs = [_msg(1, None, "system", rng)]
    for i in range(2 * n_turns):
        msgs.append(_msg(i + 2, i + 1, "user" if i % 2 == 0 else "assistant", rng))
    branches, parent, nxt = [], 3, len(msgs) + 1
    for i in range(n_branch):
        branches.append(_msg(nxt, parent, "user" if i % 2 == 0 else "assistant", rng))
        parent, nxt = nxt, nxt + 1
    return {"schema": "tinychat.session", "version": 2, "id": SID, "title": "t", "created": 1.0, "updated": 1.0,
            "model": {"name": "tiny-test", "hash": ""}, "tokenizer_hash": "", "quant": "none", "device": "cpu",
            "settings": dict(SETTINGS), "messages": msgs, "branches": branches, "revision": 1, "kv_sha256": ""}


def _turn(s, i):
    s.messages += [S.Message("user", f"more {i}", [1, 4, 2]),
                   S.Message("assistant", f"ok {i}", [1, 5, 2], settings=dict(SETTINGS), seed=i)]


def _same(a, b):
    assert [m.to_dict() for m in a.messages] == [m.to_dict() for m in b.messages]
    assert [m.to_dict() for m in a.branches] == [m.to_dict() for m in b.branches]
    assert (a.title, a.updated, a.revision, a.settings, a.kv_sha256) == (b.title, b.updated, b.revision, b.settings,
                                                                         b.kv_sha256)


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_older_file_loads_and_becomes_a_log_on_its_first_save_then_turns_are_appended(tmp_path, small_log):
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps(document(), indent=1))
    s = S.load(path)
    S.save(s, tmp_path)
    assert _records(path)[0] == {"schema": "tinychat.session", "version": 3, "id": SID}
    _same(S.load(path), s)
    for i in range(3):
        before = path.read_bytes()
        _turn(s, i)
        S.save(s, tmp_path)
        after = path.read_bytes()
        assert after.startswith(before)                     # appended, never rewritten
        added = [json.loads(line) for line in after[len(before):].decode().splitlines()]
        assert [next(iter(r)) for r in added] == ["path", "path", "commit"]
        _same(S.load(path), s)
    assert S.load(path).n_turns == 5


def test_a_chat_s_log_reloads_exactly_after_every_kind_of_tree_change(tmp_path, small_log):
    chat = make_chat(max_new=3, seed=3, sessions_dir=tmp_path)
    ops = [lambda: chat.send("hello there"), lambda: chat.send("why the cat?"), chat.regenerate,
           lambda: chat.switch_alternative("prev"), lambda: chat.send("and the dog"), chat.undo,
           lambda: chat.send("and the moon"), lambda: chat.switch_alternative("next", 4),
           lambda: chat.edit_reply(None, "written by hand"), lambda: chat.send("more"), chat.regenerate,
           lambda: chat.fork(0, tokenizer().im_end), lambda: chat.switch_alternative("prev", 2)]
    appended = 0
    for i, op in enumerate(ops):
        op()
        target = S.session_path(chat.session.id, tmp_path)
        before = target.read_bytes() if target.exists() else None
        path = chat.save()
        appended += before is not None and path.read_bytes().startswith(before)
        back = S.load(path)
        _same(back, chat.session)
        assert SE.export_json(back) == SE.export_json(chat.session), f"after op {i}"
        assert back.notice is None
    assert _records(path)[0]["version"] == 3 and appended >= 5


def test_saves_after_tree_changes_append_a_cut_and_only_what_changed(tmp_path, small_log):
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps(document()))
    s = S.load(path)
    S.save(s, tmp_path)
    size = path.stat().st_size
    s.branches.append(s.messages.pop())                    # a new alternative of the last reply
    s.messages.append(S.Message("assistant", "other", [1, 6, 2], settings=dict(SETTINGS), seed=3))
    S.save(s, tmp_path)
    added = [json.loads(line) for line in path.read_bytes()[size:].decode().splitlines()]
    assert [next(iter(r)) for r in added] == ["cut", "path", "branch", "commit"]
    assert added[0]["cut"] == [len(s.messages) - 1, len(s.branches) - 1]
    _same(S.load(path), s)


def _log_with_appends(tmp_path, turns=2):
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps(document()))
    s = S.load(path)
    S.save(s, tmp_path)
    sizes = [path.stat().st_size]
    copies = [S.load(path)]
    for i in range(turns):
        _turn(s, i)
        S.save(s, tmp_path)
        sizes.append(path.stat().st_size)
        copies.append(S.load(path))
    return path, s, sizes, copies


def test_a_torn_append_at_any_byte_loads_the_last_complete_save_with_a_notice(tmp_path, small_log):
    path, s, sizes, copies = _log_with_appends(tmp_path)
    whole = path.read_bytes()
    for cut in range(sizes[-2] + 1, sizes[-1]):
        path.write_bytes(whole[:cut])
        back = S.load(path)
        if cut == sizes[-1] - 1:                            # only the last newline lost: the save is whole
            _same(back, copies[-1])
            assert back.notice is None
        else:
            _same(back, copies[-2])
            assert "did not finish" in back.notice and str(path) in back.notice and "\n" not in back.notice
        [info] = S.list_sessions(tmp_path)
        assert info.updated == back.updated and info.n_turns == back.n_turns
    path.write_bytes(whole[:sizes[-2] + 30])
    back = S.load(path)
    _turn(back, 9)
    S.save(back, tmp_path)                                  # the next save rewrites it whole: the torn end is gone
    again = S.load(path)
    assert again.notice is None
    _same(again, back)
    assert b"more 9" in path.read_bytes() and path.read_bytes().count(b'"commit"') == 1


def test_sessions_show_and_export_of_a_torn_log_say_so_on_stderr(tmp_path, small_log, capsys):
    from support import run_main
    path, s, sizes, copies = _log_with_appends(tmp_path)
    path.write_bytes(path.read_bytes()[:sizes[-1] - 20])        # the last save did not finish
    for args in (["sessions", "show", path], ["sessions", "export", path, "--format", "json"]):
        code, out, err = run_main(args, capsys)
        assert code in (0, None) and "more 0" in out and "more 1" not in out     # as of the last complete save
        assert err.startswith("note: ") and "did not finish" in err and err.count("\n") == 1
    path.write_bytes(path.read_bytes()[:sizes[-2]])             # whole again: no note
    code, out, err = run_main(["sessions", "show", path], capsys)
    assert code in (0, None) and err == ""


def test_a_torn_log_restores_in_a_chat_with_the_notice(tmp_path, small_log):
    chat = make_chat(max_new=3, seed=3, sessions_dir=tmp_path)
    chat.send("hello")
    chat.send("again")
    path = chat.save()
    chat.close()
    with open(path, "ab") as f:
        f.write(b'{"path": {"role": "us')
    from tinychat.chat.runtime import Chat
    again = Chat.restore(chat.session.id, chat.model, chat.tok, sessions_dir=tmp_path)
    assert again.notice and "did not finish" in again.notice
    assert again.session.n_turns == 2
    again.send("a third")
    again.save()
    assert S.load(path).n_turns == 3 and S.load(path).notice is None


def test_a_failed_append_leaves_the_file_as_it_was_and_the_next_save_writes_the_turn(tmp_path, small_log,
                                                                                      monkeypatch):
    path, s, sizes, _ = _log_with_appends(tmp_path, turns=1)
    before = path.read_bytes()
    _turn(s, 5)
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        S.save(s, tmp_path)
    monkeypatch.setattr(os, "fsync", real)
    assert path.read_bytes() == before
    S.save(s, tmp_path)
    _same(S.load(path), s)


def test_an_older_copy_cannot_append_over_a_newer_save(tmp_path, small_log):
    path, s, _, _ = _log_with_appends(tmp_path, turns=1)
    old = S.load(path)
    _turn(s, 7)
    S.save(s, tmp_path)
    _turn(old, 8)
    with pytest.raises(S.SessionConflict):
        S.save(old, tmp_path)
    S._seen.clear()                     # as another process finds it: the revision read from the log's last commit
    with pytest.raises(S.SessionConflict, match="revision 4 on disk, 3 here"):
        S.save(old, tmp_path)
    _same(S.load(path), s)


def test_a_listing_reads_a_log_s_header_and_last_commit_only(tmp_path, small_log, monkeypatch):
    from tinychat.sessions import index as session_index
    path, s, _, _ = _log_with_appends(tmp_path)
    session_index.index_path(tmp_path).unlink(missing_ok=True)
    parsed = []
    monkeypatch.setattr(session_log, "parse", lambda *a: parsed.append(a) or pytest.fail("parsed"))
    monkeypatch.setattr(session_read, "_read_json", lambda p: parsed.append(p) or pytest.fail("parsed"))
    monkeypatch.setattr(session_log, "TAIL_BLOCK", 64)     # the last commit is found across blocks
    [info] = S.list_sessions(tmp_path)
    assert parsed == [] and (info.n_turns, info.updated, info.title) == (s.n_turns, s.updated, s.title)
    lines = path.read_text().splitlines()
    lines[-1] = lines[-1].replace('"title": "t"', '"title": 5')
    path.write_text("\n".join(lines) + "\n")
    errors: list = []
    assert S.list_sessions(tmp_path, errors) == [] and "title" in str(errors[0]) and str(path) in str(errors[0])


BAD_LOGS = {
    "a line before the last commit is not JSON": (lambda ls: ls[:2] + ["{oops"] + ls[2:], "line 3: invalid JSON"),
    "a cut out of range": (lambda ls: ls[:-1] + ['{"cut": [99, 0]}', ls[-1]], "cut must be"),
    "a message line lost": (lambda ls: ls[:2] + ls[3:], "a line is missing"),
    "an unknown record": (lambda ls: ls[:2] + ['{"note": 1}'] + ls[2:], "not a session record"),
    "no commit": (lambda ls: ls[:-1], "no complete save"),
    "the header only": (lambda ls: ls[:1], "no complete save"),
    "another id in the commit": (lambda ls: ls[:-1] + [ls[-1].replace(SID, SID[:-1] + "0")], "id"),
    "a bad message": (lambda ls: ls[:2] + [ls[2].replace('"role": "user"', '"role": "usr"')] + ls[3:], "role"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_a_damaged_log_is_refused_in_one_line_naming_the_file(tmp_path, small_log, case):
    path, *_ = _log_with_appends(tmp_path, turns=0)
    damage, expect = BAD_LOGS[case]
    path.write_text("\n".join(damage(path.read_text().splitlines())) + "\n")
    with pytest.raises(S.SessionError) as err:
        S.load(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and expect in message, message


def test_one_document_claiming_version_3_is_refused(tmp_path):
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps({**document(), "version": 3}, indent=2))
    with pytest.raises(S.SessionError, match="version-3 session file is JSON lines"):
        S.load(path)


def test_a_log_is_rewritten_whole_before_dead_lines_outgrow_it(tmp_path, small_log, monkeypatch):
    monkeypatch.setattr(session_write, "COMPACT_SLACK", 8)
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps(document(n_branch=40)))
    s = S.load(path)
    S.save(s, tmp_path)
    for i in range(60):                                     # regenerate the last reply again and again
        s.branches.append(s.messages.pop())
        s.messages.append(S.Message("assistant", f"take {i}", [1, 6, 2], settings=dict(SETTINGS), seed=i))
        S.save(s, tmp_path)
        recs = _records(path)
        live = len(s.messages) + len(s.branches)
        assert len(recs) - 2 - live <= live // 4 + 8 + 4     # dead lines stay bounded
    assert len(s.branches) == 100
    _same(S.load(path), s)


def test_a_change_to_most_of_the_tree_rewrites_the_file(tmp_path, small_log, monkeypatch):
    monkeypatch.setattr(session_write, "COMPACT_SLACK", 8)
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps(document(n_branch=40)))
    s = S.load(path)
    S.save(s, tmp_path)
    inode = path.stat().st_ino
    s.branches = s.branches[::-1]                           # every branch message moved
    S.save(s, tmp_path)
    assert path.stat().st_ino != inode                      # a new file renamed into place
    _same(S.load(path), s)


WRITER = r"""
import sys
from tinychat.sessions import session as S
S.LOG_MIN_MESSAGES = 4
folder = sys.argv[1]
s = S.Session(id="killlog", model={"name": "m", "hash": "h"})
n = 0
while True:
    n += 1
    size = 2_000 + (n % 7) * 3_000       # appends of different sizes: a torn one shows
    s.settings = {"n": n}
    s.messages += [S.Message("user", f"turn {n}", list(range(size))), S.Message("assistant", "", [1], settings={}, seed=1)]
    S.save(s, folder)
    if n % 5 == 0:                      # now and then a new alternative of the last reply: a cut
        s.branches.append(s.messages.pop())
        s.messages.append(S.Message("assistant", f"alt {n}", [2], settings={}, seed=2))
        S.save(s, folder)
    if n == 3:
        print("ready", flush=True)
"""


def test_a_log_survives_sigkill_at_random_moments_while_appending(tmp_path):
    folder = tmp_path / "kill"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(4)
    torn = 0
    for _ in range(10):             # a fixed number of kills: how many fit in some seconds would depend on the host
        for p in folder.glob("killlog*"):
            p.unlink()
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], env=env, stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0, 0.1))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL
        s = S.load("killlog", folder)
        torn += s.notice is not None
        n = s.settings["n"]
        assert n >= 3 and len(s.messages) == 2 * n and s.messages[-2].content == f"turn {n}"
        assert len(s.messages[-2].token_ids) == 2_000 + (n % 7) * 3_000
        assert [i.id for i in S.list_sessions(folder)] == ["killlog"]
        _turn(s, n)                                         # it saves again after the crash
        S.save(s, folder)
        assert S.load("killlog", folder).n_turns == n + 1


def test_a_log_is_ascii_on_disk_and_gives_back_every_character(tmp_path, small_log):
    path = tmp_path / f"{SID}.json"
    path.write_text(json.dumps(document()))
    s = S.load(path)
    text = "é 猫 🐈 \x7f \x85 \x9b[31m \u2028 end"
    s.messages += [S.Message("user", text, [1, 4, 2]),
                   S.Message("assistant", text[::-1], [1, 5, 2], settings=dict(SETTINGS), seed=1)]
    S.save(s, tmp_path)
    _turn(s, 1)
    S.save(s, tmp_path)
    assert path.read_bytes().isascii()
    back = S.load(path)
    _same(back, s)
    assert back.messages[-4].content == text
