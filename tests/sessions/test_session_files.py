"""Session file layer: paths, atomic saves, strict loading, listing, export, identity hashes, KV snapshots."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import pytest
from session_support import assert_one_line_naming, make_session

from tinychat import paths
from tinychat.sessions import session as S
from tinychat.sessions import snapshot as SS
from tinychat.sessions import export as SE
from tinychat.sessions.session import Message, Session, SessionError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


# -- paths ---------------------------------------------------------------------------------------------------------


def test_paths_follow_tinychat_home_and_create_nothing(home):
    assert paths.home() == home
    assert paths.sessions_dir() == home / "sessions"
    assert not home.exists()  # computing paths never creates folders


def test_paths_default_to_platform_dirs_without_tinychat_home(monkeypatch):
    monkeypatch.delenv("TINYCHAT_HOME")
    assert paths.home() == platformdirs.user_data_path("tinychat")
    assert paths.sessions_dir() == platformdirs.user_data_path("tinychat") / "sessions"


def test_session_modules_import_without_torch_or_side_effects(tmp_path):
    code = (
        "import sys, pkgutil, importlib, tinychat.paths, tinychat.tokenizer, tinychat.sessions, tinychat.chat; "
        "[importlib.import_module('tinychat.sessions.' + m.name) for m in pkgutil.iter_modules(tinychat.sessions.__path__)]; "
        "assert len(sys.modules) and 'tinychat.sessions.session' in sys.modules; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    env = {**os.environ, "TINYCHAT_HOME": str(tmp_path / "h"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "h").exists()


# -- ids and titles ------------------------------------------------------------------------------------------------


def test_new_ids_are_unique_file_safe_and_sort_by_time():
    ids = [S.new_id(now=1_700_000_000 + k * 0.37) for k in range(300)]
    assert sorted(ids) == ids
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"\d{8}-\d{6}-\d{3}-[0-9a-f]{6}", i) for i in ids)
    assert len({S.new_id() for _ in range(500)}) == 500
    same_ms = [S.new_id(now=1_700_000_000.0001) for _ in range(2000)]      # one millisecond: never a collision
    assert len(set(same_ms)) == 2000


def test_default_title_uses_first_line_and_cuts_at_a_word_boundary():
    assert S.default_title("\n  hello   there \nsecond line") == "hello there"
    assert S.default_title("word " * 30, limit=24) == "word word word word…"
    assert S.default_title("x" * 100, limit=10) == "x" * 9 + "…"
    assert S.default_title("   ") == ""


# -- save / load ---------------------------------------------------------------------------------------------------


def test_save_load_round_trip_preserves_every_field(home):
    s = make_session(3)
    path = S.save(s, touch=False)
    assert path == home / "sessions" / f"{s.id}.json"
    loaded = S.load(s.id)
    assert loaded == s
    assert S.load(path) == s
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # a BOM from a Windows editor is tolerated
    assert S.load(path) == s
    raw = json.loads(path.read_text(encoding="utf-8-sig"))
    assert (raw["schema"], raw["version"]) == ("tinychat.session", 2)
    assert loaded.messages[2].seed == 2**63 - 1  # 63-bit seeds survive JSON exactly
    assert loaded.context_ids() == [t for m in s.messages for t in m.token_ids]
    assert loaded.system_prompt == "Be brief." and loaded.n_turns == 3


def test_save_keeps_token_id_lists_on_one_line_for_readable_files():
    s = make_session(1)
    text = S.save(s).read_text(encoding="utf-8")
    assert '"token_ids": [1, 14, 20, 21, 2, 5]' in text
    assert '"temperature": 0.7' in text
    assert text.startswith('{\n  "schema": "tinychat.session",\n')        # the session's fields indented for people,
    assert all(line.startswith('    {"role": ') for line in text.splitlines() if '"role"' in line)   # a message a line


def test_save_touches_updated_and_fills_an_empty_title_from_the_first_user_message():
    s = make_session(1)
    s.title = ""
    before = time.time()
    S.save(s)
    assert s.updated >= before
    assert s.title == "question 0: naïve 😀"
    assert S.load(s.id).title == s.title
    s.title = "Mine"
    S.save(s)
    assert S.load(s.id).title == "Mine"


def test_save_refuses_a_session_that_load_would_reject(home):
    bad = [
        ("token id", lambda s: s.messages[1].token_ids.append(-1), "messages[1].token_ids[5]"),
        ("role", lambda s: setattr(s.messages[0], "role", "robot"), "messages[0].role"),
        ("finish", lambda s: setattr(s.messages[2], "finish", "done"), "messages[2].finish"),
        ("settings", lambda s: s.settings.update(bad=float("nan")), "cannot serialize"),
        ("settings type", lambda s: s.settings.update(bad=object()), "cannot serialize"),
    ]
    for name, spoil, where in bad:
        s = make_session(1)
        spoil(s)
        with pytest.raises(SessionError, match=re.escape(where)):
            S.save(s)
        assert not (home / "sessions" / f"{s.id}.json").exists(), name
    with pytest.raises(SessionError, match="invalid session id"):
        S.save(make_session(1, sid="../escape"))


def _half_write_then_fail(path, parts):
    data = b"".join(parts)
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("stage", ["serialize", "write", "fsync", "replace"])
def test_failed_save_leaves_the_previous_file_intact_and_no_temp_files(monkeypatch, home, stage):
    s = make_session(2)
    path = S.save(s)
    before_bytes, before_updated = path.read_bytes(), s.updated
    s.messages += [Message("user", "a new turn", [1, 2]), Message("assistant", "ok", [3], settings={}, seed=1)]

    def boom(*a, **k):
        raise OSError(5, f"injected {stage} failure")

    with monkeypatch.context() as mp:
        if stage == "serialize":
            mp.setattr(S, "_dumps", lambda *a, **k: (_ for _ in ()).throw(TypeError("injected")))
        elif stage == "write":
            mp.setattr(S, "_write_parts", _half_write_then_fail)
        else:
            mp.setattr(S.os, stage, boom)
        with pytest.raises((OSError, SessionError), match="injected|No space"):
            S.save(s)
    assert path.read_bytes() == before_bytes
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
    assert s.updated == before_updated  # the object is only touched once the write succeeded
    assert S.load(s.id).n_turns == 2


def test_load_of_a_missing_session_names_the_file(home):
    with pytest.raises(SessionError, match="no such session file") as err:
        S.load("20240101-000000-000-abcdef")
    assert_one_line_naming(err.value, home / "sessions" / "20240101-000000-000-abcdef.json")


def test_load_by_id_rejects_a_file_holding_another_id_but_load_by_path_accepts_it(home):
    s = make_session(1)
    src = S.save(s)
    copy_path = src.with_name("other-id.json")
    copy_path.write_bytes(src.read_bytes())
    with pytest.raises(SessionError, match="file name") as err:
        S.load("other-id")
    assert_one_line_naming(err.value, copy_path)
    assert S.load(copy_path) == s


def test_unsafe_ids_are_refused():
    for bad in ["a.b", "", "-x", "a b", "x" * 200]:
        with pytest.raises(SessionError, match="invalid session id"):
            S.session_path(bad)
    with pytest.raises(SessionError, match="invalid session id"):
        S.delete("..")


# -- listing and management ----------------------------------------------------------------------------------------


def test_list_sessions_lists_newest_first_and_skips_bad_files_reporting_them(home):
    for k in range(3):
        s = make_session(k + 1, sid=f"good-{k}")
        s.updated = 1_700_000_000 + [50, 300, 10][k]
        S.save(s, touch=False)
    folder = home / "sessions"
    (folder / "broken.json").write_text('{"schema": "tinychat.session", "vers')
    (folder / "foreign.json").write_text('{"some": "other app"}')
    (folder / "misnamed.json").write_bytes((folder / "good-0.json").read_bytes())
    (folder / ".good-0.json.abc.tmp").write_text("half a write")  # leftover temp file: ignored silently
    (folder / "notes.txt").write_text("not a session")

    errors: list[SessionError] = []
    infos = S.list_sessions(errors=errors)
    assert [i.id for i in infos] == ["good-1", "good-0", "good-2"]
    assert [i.n_turns for i in infos] == [2, 1, 3]
    assert infos[0].path == folder / "good-1.json" and infos[0].updated == 1_700_000_300
    assert infos[0].title == "question 0: naïve 😀"
    reported = sorted(Path(str(e).split(": ", 1)[0]).name for e in errors)
    assert reported == ["broken.json", "foreign.json", "misnamed.json"]
    assert all("\n" not in str(e) for e in errors)
    assert S.list_sessions() == infos  # without an error list it still never raises


def test_list_sessions_of_a_missing_folder_is_empty_and_untitled_sessions_get_a_placeholder(home):
    assert S.list_sessions() == []
    assert not home.exists()
    S.save(Session(id="empty-one"))
    assert [(i.title, i.n_turns) for i in S.list_sessions()] == [(S.UNTITLED, 0)]


def test_delete_removes_the_session_and_its_snapshot(home):
    torch = pytest.importorskip("torch")
    s = make_session(1)
    S.save(s)
    SS.save_snapshot(s.id, {"k": torch.zeros(2)}, {})
    assert S.delete(s.id) is True
    assert list((home / "sessions").iterdir()) == []
    assert S.delete(s.id) is False


def test_rename_sets_the_title_without_reordering():
    s = make_session(1)
    S.save(s, touch=False)
    renamed = S.rename(s.id, "  Cats   and dogs ")
    loaded = S.load(s.id)
    assert loaded.title == renamed.title == "Cats and dogs"
    assert loaded.updated == s.updated
    with pytest.raises(SessionError, match="cannot be empty"):
        S.rename(s.id, "   ")


# -- export --------------------------------------------------------------------------------------------------------


def test_export_json_loads_back_identically(tmp_path):
    s = make_session(2)
    out = tmp_path / "my chat export.json"
    out.write_text(SE.export_json(s), encoding="utf-8")
    assert S.load(out) == s


def test_export_markdown_lists_title_model_and_every_message_in_order():
    s = make_session(2)
    s.title = "Cats"
    md = SE.export_markdown(s)
    assert md.startswith("# Cats\n")
    assert "demo (abababababab)" in md and "int8" in md
    order = [md.index(f"## {role}\n\n{text}") for role, text in [
        ("System", "Be brief."), ("User", "question 0"), ("Assistant", "answer 0"),
        ("User", "question 1"), ("Assistant", "answer 1"),
    ]]
    assert order == sorted(order)
    assert md.count("*(reply cut off: length)*") == 1  # turn 1 finished by length


def test_export_markdown_marks_edited_and_forked_replies():
    s = make_session(2)
    replies = [m for m in s.messages if m.role == "assistant"]
    replies[0].finish = "edited"
    replies[1].fork = {"position": 2, "token": 7}
    md = SE.export_markdown(s)
    assert md.count("*(reply edited by hand)*") == 1
    assert md.index("answer 0") < md.index("*(reply edited by hand)*") < md.index("question 1")
    assert "*(forked: reply token 3 chosen by hand, id 7)*" in md
    assert "reply cut off" not in md.split("answer 0")[1].split("question 1")[0]


# -- identity hashes -----------------------------------------------------------------------------------------------


@dataclass
class _Cfg:
    d_model: int = 64
    engram_orders: tuple = (2, 3)


def test_file_hash_streams_and_matches_sha256(tmp_path):
    data = os.urandom(300_000)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert SS.file_hash(f) == SS.file_hash(f, chunk_size=4096) == SS.hash_bytes(data) == expected


def test_identity_hash_depends_on_config_and_weights_only(tmp_path):
    w1, w2 = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    w1.write_bytes(b"weights-1")
    w2.write_bytes(b"weights-2")
    base = SS.identity_hash({"d_model": 64, "engram_orders": (2, 3)}, w1)
    assert base == SS.identity_hash({"engram_orders": [2, 3], "d_model": 64}, w1)  # key order, tuple vs list
    assert base == SS.identity_hash(_Cfg(), w1)  # dataclass configs too
    assert base != SS.identity_hash({"d_model": 65, "engram_orders": (2, 3)}, w1)
    assert base != SS.identity_hash({"d_model": 64, "engram_orders": (2, 3)}, w2)
    assert re.fullmatch(r"[0-9a-f]{64}", base)


# -- KV snapshots --------------------------------------------------------------------------------------------------


def test_kv_snapshot_round_trips_tensors_and_metadata(home):
    torch = pytest.importorskip("torch")
    tensors = {
        "k.0": torch.randn(2, 4, 8, dtype=torch.float32),
        "v.0": torch.randn(2, 4, 8).to(torch.bfloat16),
        "lengths": torch.tensor([5, 3], dtype=torch.int64),
    }
    meta = {"identity": "ab" * 32, "n_tokens": "42"}
    assert SS.load_snapshot("snap-1") is None
    path = SS.save_snapshot("snap-1", tensors, meta)
    assert path == home / "sessions" / "snap-1.kv.safetensors"
    got, got_meta = SS.load_snapshot("snap-1")
    assert got_meta == meta
    assert got.keys() == tensors.keys()
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    assert sorted(p.name for p in path.parent.iterdir()) == ["snap-1.kv.safetensors"]
    with pytest.raises(TypeError):
        SS.save_snapshot("snap-2", {"x": torch.zeros(1)}, {"n": 3})
    with pytest.raises(ValueError, match="reserved"):
        SS.save_snapshot("snap-2", {"x": torch.zeros(1)}, {"tinychat.session_id": "other"})


def test_corrupt_or_foreign_kv_snapshot_raises_session_error(home):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    good = SS.save_snapshot("snap-3", {"k": torch.arange(1000, dtype=torch.float32)}, {"n": "1"})
    raw = good.read_bytes()
    folder = good.parent
    cases = {
        "truncated": raw[: len(raw) // 2],
        "header only": raw[:8],
        "garbage": os.urandom(64),
        "empty": b"",
    }
    for label, content in cases.items():
        good.write_bytes(content)
        with pytest.raises(SessionError, match="corrupt KV snapshot") as err:
            SS.load_snapshot("snap-3")
        assert_one_line_naming(err.value, good)
    save_file({"k": torch.zeros(2)}, str(good))  # plain safetensors file, no tinychat metadata
    with pytest.raises(SessionError, match="not a tinychat KV snapshot"):
        SS.load_snapshot("snap-3")
    SS.save_snapshot("snap-4", {"k": torch.zeros(2)}, {})
    os.replace(folder / "snap-4.kv.safetensors", good)  # another session's snapshot under this name
    with pytest.raises(SessionError, match="belongs to session 'snap-4'"):
        SS.load_snapshot("snap-3")


# -- crash safety --------------------------------------------------------------------------------------------------

WRITER = r"""
import sys
from tinychat.sessions import session as S
folder = sys.argv[1]
s = S.Session(id="killtest", model={"name": "m", "hash": "h"})
n = 0
while True:
    n += 1
    size = 20_000 + (n % 7) * 6_000       # the file's size changes every save: a torn write shows
    s.settings = {"n": n}
    s.messages = [S.Message("user", f"turn {n}", list(range(size))), S.Message("assistant", "", [1], settings={}, seed=1)]
    S.save(s, folder)
    if n == 1:
        print("ready", flush=True)
"""


def test_save_survives_sigkill_at_random_moments(tmp_path):
    folder = tmp_path / "kill"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(3)
    for _ in range(15):                 # a fixed number of kills: how many fit in some seconds would depend on the host
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], env=env, stdout=subprocess.PIPE)
        try:
            assert proc.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0, 0.08))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL  # it was still writing when killed
        s = S.load("killtest", folder)
        n = s.settings["n"]
        assert s.messages[0].content == f"turn {n}"
        assert len(s.messages[0].token_ids) == 20_000 + (n % 7) * 6_000
        assert [i.id for i in S.list_sessions(folder)] == ["killtest"]  # stray temp files are never listed
