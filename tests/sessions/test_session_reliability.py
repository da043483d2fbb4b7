"""Sessions never lose a turn, never change a conversation silently, never put escape codes on the terminal
(issue #16): locks, the revision check, a failed save, verified snapshots, the one validator, stale temp files."""
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
from support import make_chat, make_chat_model, tokenizer

from tinychat.sessions import read as session_read
from tinychat.sessions import session as S
from tinychat.sessions import snapshot as SS
from tinychat.sessions import export as SE
from tinychat.sessions import lock as session_lock
from tinychat.chat.runtime import Chat, ChatError
from tinychat.textsafe import has_controls, safe_line, safe_text

REPO = Path(__file__).resolve().parents[2]


def _two_turn_chat(**kw):
    chat = make_chat(max_new=10, seed=5, **kw)
    chat.send("hello there")
    chat.send("why the cat?")
    return chat


def _cache(chat):
    return {k: v.clone() for k, v in chat.cache.state_dict().items()}


def _same_cache(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _file(chat) -> Path:
    return S.session_path(chat.session.id, chat.sessions_dir)


def _rewrite(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# -- 1. one writer per session ---------------------------------------------------------------------------------

HOLDER = """
import sys, time
from tinychat.sessions import session as S
lock = S.lock(sys.argv[1], sys.argv[2])
print("held", flush=True)
sys.stdin.readline()
"""


def _hold_in_another_process(sid: str, folder: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, sid, str(folder)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.stdout.readline() == b"held\n"
    return p


def test_a_session_held_by_another_process_is_refused_with_a_clear_message_and_freed_when_it_exits():
    chat = _two_turn_chat()
    sid, folder = chat.session.id, _file(chat).parent
    chat.close()
    holder = _hold_in_another_process(sid, folder)
    try:
        with pytest.raises(S.SessionLocked, match=rf"session {sid} is open in another tinychat \(pid {holder.pid}\)"):
            Chat.restore(sid, make_chat_model(), tokenizer(), max_len=512)
        with pytest.raises(S.SessionLocked):
            S.rename(sid, "a new title")
        with pytest.raises(S.SessionLocked):
            S.delete(sid)
        assert S.load(sid).n_turns == 2                         # reading stays possible
    finally:
        holder.stdin.close()
        holder.wait(timeout=20)
    again = Chat.restore(sid, make_chat_model(), tokenizer(), max_len=512)   # the kernel dropped the lock
    again.send("and now?")
    assert S.load(sid).n_turns == 3


def test_a_chat_holds_its_session_until_closed_and_a_new_chat_lets_go():
    chat = _two_turn_chat()
    sid, folder = chat.session.id, _file(chat).parent
    probe = [sys.executable, "-c", f"from tinychat.sessions import lock as L; import sys; "
             f"sys.exit(3 if L.is_locked_elsewhere({str(folder)!r}, {sid!r}) else 0)"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert subprocess.run(probe, env=env, timeout=60).returncode == 3
    chat.new_session()
    assert subprocess.run(probe, env=env, timeout=60).returncode == 0


# -- 2. an older copy never overwrites a newer session ---------------------------------------------------------

def test_continuing_an_older_copy_by_path_never_overwrites_the_newer_session(tmp_path):
    chat = make_chat(max_new=10, seed=5)
    chat.send("hello there")
    old = tmp_path / "old.json"
    old.write_text(SE.export_json(chat.session))
    chat.send("why the cat?")
    with pytest.raises(S.SessionError, match="changed after this copy of it was read") as err:
        Chat.restore(old, make_chat_model(), tokenizer(), max_len=512)
    assert "\n" not in str(err.value)
    with pytest.raises(S.SessionError, match="changed after this copy"):
        S.rename(str(old), "renamed from the old copy")
    assert S.load(chat.session.id).n_turns == 2 and S.load(chat.session.id).title == "hello there"


def test_an_older_copy_in_memory_cannot_overwrite_a_newer_save():
    S.save(_two_turn_chat().session)
    sid = S.list_sessions()[0].id
    a, b = S.load(sid), S.load(sid)
    a.title = "first writer"
    S.save(a)
    b.title = "second writer"
    with pytest.raises(S.SessionError, match="changed after this copy"):
        S.save(b)
    assert S.load(sid).title == "first writer" and S.load(sid).revision == a.revision
    a.title = "first writer again"                     # the copy that wrote last goes on saving
    S.save(a)
    assert S.load(sid).title == "first writer again"


def test_a_file_written_before_revisions_still_loads_and_saves():
    chat = _two_turn_chat()
    _rewrite(_file(chat), lambda d: (d.pop("revision"), d.pop("kv_sha256")))
    s = S.load(chat.session.id)
    assert (s.revision, s.kv_sha256) == (0, "")
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512)
    assert not again.used_snapshot                      # no checksum recorded: the snapshot is not trusted
    again.send("more")
    assert S.load(chat.session.id).revision == 1


# -- 3. a failed save shows the reply, warns in one line, keeps the chat consistent -----------------------------

def test_a_failed_save_keeps_the_reply_warns_in_one_line_and_saves_the_turn_later(tmp_path, monkeypatch):
    folder = tmp_path / "sessions"
    folder.write_text("a file where the sessions folder should be")
    chat = make_chat(max_new=10, seed=5, sessions_dir=folder)
    r = chat.send("hello there")
    assert r.n_tokens > 0 and r.text == chat.session.messages[-1].content
    assert r.save_warning and r.save_warning.startswith("not saved:") and "\n" not in r.save_warning
    assert str(folder) in r.save_warning
    assert chat.session.n_turns == 1                      # the turn stays in the chat ...
    folder.unlink()
    r2 = chat.send("why the cat?")
    assert r2.save_warning is None
    assert S.load(chat.session.id, folder).n_turns == 2   # ... and the next save writes it


def test_a_snapshot_that_cannot_be_written_still_saves_the_session_and_never_loads_a_stale_one():
    chat = make_chat(max_new=10, seed=5)
    chat.send("hello there")
    snap = S.snapshot_path(chat.session.id)
    snap.unlink()
    snap.mkdir()                                          # a folder in the snapshot's place
    r = chat.send("why the cat?")
    assert r.save_warning and "KV snapshot" in r.save_warning and "\n" not in r.save_warning
    assert S.load(chat.session.id).n_turns == 2
    snap.rmdir()
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512)
    assert not again.used_snapshot and _same_cache(_cache(again), _cache(chat))


def test_a_full_disk_while_writing_the_snapshot_gives_the_reply_and_a_warning(monkeypatch):
    import safetensors.torch

    def full(*a, **k):
        raise RuntimeError("Error while serializing: I/O error")

    chat = make_chat(max_new=10, seed=5)
    chat.send("hello there")
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    r = chat.send("why the cat?")
    assert r.text == chat.session.messages[-1].content and r.save_warning
    assert "I/O error" in r.save_warning and "\n" not in r.save_warning
    assert not S.snapshot_path(chat.session.id).exists()          # the stale one is gone, never loaded
    assert S.load(chat.session.id).n_turns == 2


# -- 4. a damaged snapshot never changes the conversation -------------------------------------------------------

def _flip_tensor_bytes(path: Path, n: int = 8) -> None:
    raw = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    step = (len(raw) - header) // (n + 1)
    for k in range(1, n + 1):
        raw[header + k * step] ^= 0x5A
    path.write_bytes(bytes(raw))


def test_a_snapshot_with_flipped_bytes_is_rebuilt_from_the_token_ids_with_a_notice():
    live = _two_turn_chat()
    live.set("seed", "99")
    expected = live.send("and the dog?").token_ids

    saved = _two_turn_chat()
    _flip_tensor_bytes(S.snapshot_path(saved.session.id))
    assert SS.load_snapshot(saved.session.id) is not None  # the header is intact: it still reads
    again = Chat.restore(saved.session.id, make_chat_model(), tokenizer(), max_len=512)
    assert not again.used_snapshot
    assert again.notice and "checksum" in again.notice and "\n" not in again.notice
    assert _same_cache(_cache(again), _cache(saved))
    again.set("seed", "99")
    assert again.send("and the dog?").token_ids == expected


def test_an_intact_snapshot_is_still_used():
    saved = _two_turn_chat()
    again = Chat.restore(saved.session.id, make_chat_model(), tokenizer(), max_len=512)
    assert again.used_snapshot and again.notice is None and _same_cache(_cache(again), _cache(saved))


# -- 5, 12 and the unclear cases: one validator, settings by type ------------------------------------------------

BAD_SETTINGS = [
    ("settings", "ban", "no", "settings.ban must be true or false"),
    ("settings", "no_parrot", 1, "settings.no_parrot must be true or false"),
    ("settings", "max_new", 10.5, "settings.max_new must be an integer"),
    ("settings", "penalty_window", 64.5, "settings.penalty_window must be an integer"),
    ("settings", "temperature", "abc", "settings.temperature must be a number"),
    ("settings", "temperature", 9.0, "settings.temperature must be between 0 and 5"),
    ("settings", "seed", 2**63, "settings.seed must be an integer in 0..2^63-1"),
    ("turn", "ban", "no", "messages[2].settings.ban must be true or false"),
    ("turn", "max_new", 10.5, "messages[2].settings.max_new must be an integer"),
    ("turn", "top_p", True, "messages[2].settings.top_p must be a number"),
    ("turn", "context_start", 7, "messages[2].settings.context_start must be the index of a user message"),
    ("seed", None, 2**63, "messages[2].seed must be an integer in 0..2^63-1"),
]


@pytest.mark.parametrize("where,key,value,msg", BAD_SETTINGS, ids=[f"{w}.{k}={v!r}" for w, k, v, _ in BAD_SETTINGS])
def test_settings_read_from_a_file_are_validated_by_type_like_the_flags(where, key, value, msg):
    chat = _two_turn_chat()
    path = _file(chat)

    def spoil(d):
        if where == "settings":
            d["settings"][key] = value
        elif where == "turn":
            d["messages"][2]["settings"][key] = value
        else:
            d["messages"][2]["seed"] = value

    _rewrite(path, spoil)
    for action in (lambda: S.load(chat.session.id), lambda: S.load(path),
                   lambda: Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512)):
        with pytest.raises(S.SessionError, match=msg.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")
                           .replace("^", r"\^")) as err:
            action()
        assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_system_message_in_the_middle_is_refused_by_load_continue_show_and_replay_alike():
    from tinychat.chat.replay import replay
    chat = _two_turn_chat()
    path = _file(chat)
    _rewrite(path, lambda d: d["messages"].insert(3, dict(d["messages"][0])))
    messages = set()
    for action in (lambda: S.load(chat.session.id),
                   lambda: Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512),
                   lambda: replay(make_chat(autosave=False), S.load(path))):
        with pytest.raises(S.SessionError, match=r"messages\[3\] is a system message") as err:
            action()
        messages.add(str(err.value))
    assert len(messages) == 1


def test_a_long_system_prompt_is_named_as_what_does_not_fit():
    chat = make_chat(max_new=20, max_len=128, system_prompt="the cat sees the dog " * 40)
    with pytest.raises(ChatError, match="system prompt too long"):
        chat.send("hello")


# -- 8. token ids outside the vocabulary ------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["vocab", 100000])
def test_token_ids_outside_the_vocabulary_are_refused_naming_file_message_and_position(bad):
    from tinychat.chat.replay import replay
    chat = _two_turn_chat()
    path = _file(chat)
    vocab = make_chat_model().cfg.vocab_size
    bad_id = vocab if bad == "vocab" else bad

    def spoil(d):
        d["messages"][3]["token_ids"][4] = bad_id

    _rewrite(path, spoil)
    expected = rf"{path}: messages\[3\]\.token_ids\[4\] = {bad_id} is outside the model's vocabulary"
    with pytest.raises(S.SessionError, match=expected):
        Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512)
    with pytest.raises(S.SessionError, match=expected):
        replay(make_chat(autosave=False), S.load(path))


def test_the_chat_never_feeds_an_id_the_model_has_no_row_for():
    chat = make_chat(max_new=5)
    with pytest.raises(ChatError, match="outside the model's vocabulary"):
        chat.timeline.feed([1, 2, chat.model.cfg.vocab_size + 3])


# -- 7. no escape codes -------------------------------------------------------------------------------------------

EVIL = "x\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202e"


def test_titles_lose_control_characters_and_printed_text_escapes_them():
    chat = make_chat(max_new=5)
    chat.send("\x1b]52;c;aGVsbG8=\x07hello")
    assert not has_controls(S.load(chat.session.id).title)
    renamed = S.rename(chat.session.id, EVIL)
    assert renamed.title == "x]0;PWNED[2J31m" and not has_controls(S.list_sessions()[0].title)
    assert not has_controls(safe_line(EVIL)) and "\\x1b" in safe_line(EVIL)
    assert safe_text("a\nb\x1b") == "a\nb\\x1b"


def test_a_hand_edited_title_with_escape_codes_is_listed_escaped_and_the_file_keeps_c1_as_escapes():
    chat = _two_turn_chat()
    _rewrite(_file(chat), lambda d: d.update(title=EVIL))
    (info,) = S.list_sessions()
    assert not has_controls(info.title) and "PWNED" in info.title
    s = S.load(chat.session.id)
    S.save(s, touch=False)
    raw = _file(chat).read_text(encoding="utf-8")
    assert "\x9b" not in raw and "\\u009b" in raw and S.load(chat.session.id).title == EVIL


# -- 11. only regular files, of a bounded size ---------------------------------------------------------------------

def _load_traced(path: Path, fifo: Path) -> tuple[BaseException | None, int]:
    """(what S.load(path) raised, the peak bytes Python allocated meanwhile). The load runs on a thread: one still
    blocked after a minute (opening a FIFO waits for a writer) is let go and fails the test; the minute only stops
    a hang, it bounds no speed."""
    out: dict = {}

    def load():
        try:
            S.load(path)
        except BaseException as e:          # noqa: BLE001 - handed to the test
            out["error"] = e

    tracemalloc.start()
    try:
        t = threading.Thread(target=load, daemon=True)
        t.start()
        t.join(60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))    # a writer comes and goes: the blocked open returns
        t.join(60)
        pytest.fail(f"loading {path} blocked (opened without O_NONBLOCK?)")
    return out.get("error"), peak


def test_non_regular_and_oversized_files_are_refused_without_reading_them(tmp_path, monkeypatch):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for path, msg in [("/dev/zero", "not a regular file"), (fifo, "not a regular file"), (tmp_path, "a folder")]:
        error, peak = _load_traced(Path(path), fifo)
        assert isinstance(error, S.SessionError) and msg in str(error), (path, error)
        assert peak < 1 << 20, (path, peak)              # nothing read: /dev/zero would be 256 MiB before the limit
    chat = _two_turn_chat()
    monkeypatch.setattr(session_read, "MAX_FILE_BYTES", 100)
    with pytest.raises(S.SessionError, match="too large for a session file"):
        S.load(_file(chat))


# -- minor: stale temp files ------------------------------------------------------------------------------------

def test_stale_temp_files_are_swept_once_unless_fresh_or_locked_by_another_process(tmp_path, monkeypatch):
    folder = tmp_path / "sessions"
    folder.mkdir()
    held = "20260101-000000-000-aaaaaa"
    old = time.time() - 600
    names = {"stale": ".20260101-000000-000-bbbbbb.json.x1y2.tmp",
             "stale_kv": f".20260101-000000-000-bbbbbb{S.SNAPSHOT_SUFFIX}.q9.tmp",
             "fresh": ".20260101-000000-000-cccccc.json.zz.tmp",
             "held": f".{held}.json.ab.tmp"}
    for key, name in names.items():
        (folder / name).write_bytes(b"half a file")
        if key != "fresh":
            os.utime(folder / name, (old, old))
    holder = _hold_in_another_process(held, folder)
    try:
        monkeypatch.setattr(session_lock, "_cleaned", set())
        chat = make_chat(max_new=5, sessions_dir=folder)
        chat.send("hello")
    finally:
        holder.stdin.close()
        holder.wait(timeout=20)
    left = {p.name for p in folder.iterdir()}
    assert names["fresh"] in left and names["held"] in left
    assert names["stale"] not in left and names["stale_kv"] not in left


def test_a_turn_is_shown_before_it_is_saved():
    chat = make_chat(max_new=10, seed=5)
    seen = []
    r = chat.send("hello there", on_reply=lambda res: seen.append((res.text, S.session_path(chat.session.id).exists())))
    assert seen == [(r.text, False)] and S.load(chat.session.id).n_turns == 1


def test_plain_load_of_a_session_open_elsewhere_is_one_error_line_and_the_chat_goes_on():
    import io

    from tinychat.plain import PlainREPL
    chat = _two_turn_chat()
    sid, folder = chat.session.id, _file(chat).parent
    chat.close()
    holder = _hold_in_another_process(sid, folder)
    try:
        out, err = io.StringIO(), io.StringIO()
        repl = PlainREPL(make_chat(max_new=5, seed=1), stdin=io.StringIO(f"/load {sid}\nhello\n"), stdout=out,
                         stderr=err, restore=lambda ref: Chat.restore(ref, make_chat_model(), tokenizer(), max_len=512))
        assert repl.run() == 2
    finally:
        holder.stdin.close()
        holder.wait(timeout=20)
    assert err.getvalue().count("\n") == 1 and f"error: session {sid} is open in another tinychat" in err.getvalue()
    assert out.getvalue().strip() and repl.chat.session.id != sid and repl.chat.session.n_turns == 1


def test_a_session_in_a_folder_that_cannot_hold_a_lock_still_opens_and_each_save_warns(monkeypatch):
    chat = _two_turn_chat()
    chat.close()

    def no_room(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(session_lock, "_lock_file", no_room)
    again = Chat.restore(chat.session.id, make_chat_model(), tokenizer(), max_len=512)
    r = again.send("and now?")
    assert r.n_tokens > 0 and r.save_warning and "No space left on device" in r.save_warning
    assert S.load(chat.session.id).n_turns == 2 and again.session.n_turns == 3
