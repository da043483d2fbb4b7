"""Session files: what a chat recorded, on disk (README.md, "What sessions promise").

One session = `<sessions_dir>/<id>.json` (versioned JSON) plus, optionally, `<id>.kv.safetensors` (a KV-cache
snapshot, sessions/snapshot.py). This module is the file layer only: the chat runtime restores (re-prefill from token
ids, or load a snapshot when the model identity matches) and replays on top of it; sessions/export.py writes a
session as markdown or JSON text. It is the file layer's public face (save, load, listing, ids, management); the
records (Session, Message, the errors) are in sessions/records.py and reading and validating a file in
sessions/read.py, both re-exported here.

A session records everything needed to continue or replay a chat to the token:
- model identity (hash of weights + config), tokenizer hash, quant mode, device kind;
- every message with the exact token ids it occupies in the context: a message's ids are its whole ChatML
  frame (`<|im_start|>role\\n ... <|im_end|>\\n`), so concatenating all messages' ids gives the context the
  model saw, including an assistant turn's sampled ids exactly as sampled (never re-encoded from text);
- each assistant turn's sampler settings, random seed and how it finished;
- timestamps.

Guarantees: writes are atomic (temp file in the same folder, fsync, `os.replace`), so a crash or kill leaves
either the old or the new file, never a torn one. A session of LOG_MIN_MESSAGES messages or more is a log instead
(sessions/log.py, version 3): a save appends what changed and a commit line (fsynced), and reading stops at the last
commit, so the end of an append that did not finish is dropped (with a notice: `session.notice`), never the session;
a log is rewritten whole, atomically, when most of it changed or too much of it no longer counts. Every save holds
the session's lock (sessions/lock.py: a chat holds it while the session is open, so a second process is refused) and checks that the file on disk is still the
one this copy was read from or last wrote (`revision` + `updated`), so an older copy never overwrites a newer
session. Reading (sessions/read.py) validates every field, the settings by type and range and the order of messages
(sessions/check.py); anything wrong raises `SessionError` with a one-line message naming the file, and one bad file
never stops `list_sessions`. Only regular files are read, at most MAX_FILE_BYTES.

No torch here (sessions/snapshot.py imports safetensors/torch only inside its functions).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from tinychat import paths
from tinychat.sessions import index as session_index, lock as session_lock, log as session_log, tree as session_tree, \
    write as session_write
from tinychat.sessions import read as session_read
from tinychat.fsutil import atomic_write
from tinychat.jsonfields import Fields, one_line, show
from tinychat.sessions.check import text_problem, vocab_problem
from tinychat.sessions.read import MAX_CONTEXT, MAX_FILE_BYTES, OPTIONAL_FIELDS, READ_VERSIONS
from tinychat.sessions.records import (FINISH_REASONS, ID_RE, ROLES, SCHEMA, VERSION, Message, Session, SessionConflict,
                                       SessionError, SessionInfo, SessionLocked, SnapshotError, new_id)
from tinychat.textsafe import safe_line, strip_controls

__all__ = [  # the file layer's public face: callers import these from here (records.py and read.py hold some)
    "FINISH_REASONS", "LOG_MIN_MESSAGES", "MAX_CONTEXT", "MAX_FILE_BYTES", "OPTIONAL_FIELDS", "READ_VERSIONS",
    "ROLES", "SCHEMA", "SNAPSHOT_FORMAT", "SNAPSHOT_SUFFIX", "UNTITLED", "VERSION",
    "Message", "Session", "SessionConflict", "SessionError", "SessionInfo", "SessionLocked", "SnapshotError",
    "adopt_revision", "check_current", "check_tokens", "check_vocab", "copy", "default_title", "delete",
    "list_sessions", "load", "lock", "matches", "new_id", "rename", "resolve_id", "save", "search_text",
    "session_path", "snapshot_path",
]

LOG_MIN_MESSAGES = 1024  # a session of this many messages (path and branches) or more is written as a log
SNAPSHOT_SUFFIX = ".kv.safetensors"
SNAPSHOT_FORMAT = "1"
UNTITLED = "New chat"


def _lock(folder: Path, session_id: str) -> session_lock.SessionLock:
    try:
        return session_lock.acquire(folder, session_id)
    except session_lock.LockHeld as e:
        raise SessionLocked(str(e), e.session_id, e.pid) from None


# -- ids, titles, paths ---------------------------------------------------------------------------------------


def default_title(text: str, limit: int = 48) -> str:
    """A title from a user message: its first non-blank line, whitespace collapsed, cut at a word boundary."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(strip_controls(line).split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip() + "…"


def _dir(dir: str | Path | None) -> Path:
    return Path(dir) if dir is not None else paths.sessions_dir()


def _check_id(session_id: object) -> str:
    if not isinstance(session_id, str) or not ID_RE.fullmatch(session_id):
        raise SessionError(f"invalid session id {show(session_id)}")
    return session_id


def session_path(session_id: str, dir: str | Path | None = None) -> Path:
    return _dir(dir) / f"{_check_id(session_id)}.json"


def resolve_id(ref: str, dir: str | Path | None = None) -> str:
    """A saved session's id from `ref`: the id itself, or the start of exactly one saved session's id (ids are long:
    `20261202-023742-582-d2fc28`; `20261202-0237` is enough while no other session starts so). SessionError when
    several start so; `ref` itself when none does (reading it then says there is no such file)."""
    _check_id(ref)
    d = _dir(dir)
    if (d / f"{ref}.json").exists() or not d.is_dir():
        return ref
    hits = sorted(n[:-5] for n in os.listdir(d) if n.startswith(ref) and n.endswith(".json")
                  and ID_RE.fullmatch(n[:-5]))
    if len(hits) > 1:
        more = ", ..." if len(hits) > 3 else ""
        raise SessionError(f"session id {ref!r} is ambiguous: {len(hits)} saved sessions start so "
                           f"({', '.join(hits[:3])}{more})")
    return hits[0] if hits else ref


def snapshot_path(session_id: str, dir: str | Path | None = None) -> Path:
    return _dir(dir) / f"{_check_id(session_id)}{SNAPSHOT_SUFFIX}"


_C1 = re.compile("[\x7f-\x9f]")


def _dumps(obj: Any, depth: int = 0) -> str:
    """JSON, indented for people, but with number lists (token ids, timings) kept on one line. DEL and the C1
    controls are written as \\u escapes (json leaves them raw; a terminal showing the file could act on them)."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", _dumps_raw(obj, depth))


def _dumps_raw(obj: Any, depth: int = 0) -> str:
    flat = isinstance(obj, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj)
    if flat or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False)
    pad, end = "  " * (depth + 1), "  " * depth
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(str(k), ensure_ascii=False)}: {_dumps_raw(v, depth + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + _dumps_raw(v, depth + 1) for v in obj) + "\n" + end + "]"


def _fields(session: Session, where: str, overrides: dict) -> dict:
    """The session's own fields (all but its messages) as a save writes them, checked as load reads them."""
    session_tree.link(session)
    fields = {f.name: getattr(session, f.name) for f in dataclasses.fields(session)
              if f.name not in ("messages", "branches")}
    fields.update(overrides)
    session_read._from_dict({"schema": SCHEMA, "version": VERSION, **fields, "messages": [], "branches": []}, where)
    return fields


def _encoder(where: str) -> Any:
    def check_message(d: dict, path: str) -> None:
        session_read._message_fast(d, VERSION) or \
            session_read._message_from_dict(Fields(d, where, path, SessionError), VERSION)
    return check_message


def _serialize(session: Session, where: str, **overrides: Any) -> list[bytes]:
    """The session as one JSON document (a version-2 file: `sessions export --format json`; what a session smaller
    than LOG_MIN_MESSAGES is saved as), in pieces; never what `load` would reject."""
    header = {"schema": SCHEMA, "version": VERSION, **_fields(session, where, overrides)}
    try:
        return session_write.encode(session, header, where, _dumps, _encoder(where), SessionError)
    except (TypeError, ValueError) as e:
        if isinstance(e, SessionError):
            raise
        raise SessionError(f"{where}: cannot serialize session ({one_line(e)})") from None


def _encode_save(session: Session, where: str, fields: dict, size: int | None,
                 turns: int) -> tuple[str, list[bytes]]:
    """("append", the lines to append to the file of `size` bytes) or ("write", the whole file's bytes, in pieces to
    write one after the other) (sessions/write.py: only what changed since the last save is encoded and checked);
    never what `load` would reject. A session of LOG_MIN_MESSAGES messages or more is a log (sessions/log.py)."""
    check_message = _encoder(where)
    try:
        if len(session.messages) + len(session.branches) < LOG_MIN_MESSAGES:
            header = {"schema": SCHEMA, "version": VERSION, **fields}
            return "write", session_write.encode(session, header, where, _dumps, check_message, SessionError)
        if size is not None:
            data = session_write.append(session, fields, where, check_message, SessionError, turns, size)
            if data is not None:
                return "append", [data]
        return "write", session_write.encode_log(session, fields, where, check_message, SessionError, turns)
    except (TypeError, ValueError) as e:
        if isinstance(e, SessionError):
            raise
        raise SessionError(f"{where}: cannot serialize session ({one_line(e)})") from None


# -- save / load ----------------------------------------------------------------------------------------------


# What this process last read or wrote, per file: (inode, mtime_ns, size) -> (revision, updated), so a save that
# finds the file as it left it need not parse it again.
_seen: dict[str, tuple] = {}


def save(session: Session, dir: str | Path | None = None, *, touch: bool = True) -> Path:
    """Write `session` atomically to `<dir>/<id>.json` and return the path.

    `touch` sets `updated` to now (autosave after a turn); an empty title is filled from the first user message;
    `revision` goes up by one. The session object is only changed once the write has succeeded.
    Holds the session's lock while it checks and writes: SessionLocked when another process has the session open,
    SessionConflict when the file on disk is not the one this copy was read from or last wrote.
    """
    target = session_path(session.id, dir)
    overrides: dict[str, Any] = {"revision": session.revision + 1}
    if touch:
        overrides["updated"] = max(time.time(), session.created)
    if not session.title:
        first_user = next((m.content for m in session.messages if m.role == "user"), "")
        if default_title(first_user):
            overrides["title"] = default_title(first_user)
    fields = _fields(session, str(target), overrides)
    turns = session_tree.turns(session)
    with _lock(target.parent, session.id):
        session_lock.clean_stale_temps(target.parent)
        _check_current(session, target)
        size = _unchanged_size(target)
        how, parts = _encode_save(session, str(target), fields, size, turns)
        if how == "append":
            _append(target, parts[0], size)
        else:
            atomic_write(target, lambda tmp: _write_parts(tmp, parts))
        for key, value in overrides.items():
            setattr(session, key, value)
        if len(session.messages) + len(session.branches) < LOG_MIN_MESSAGES:
            session_write.forget(session)
        elif how == "append":
            session_write.written(session, size + len(parts[0]), session.__dict__.pop("_log_pending"))
        else:
            session_write.written(session, sum(map(len, parts)))
        _remember(session, target)
        session_index.record(target, _row(session, turns))     # `tinychat sessions` need not parse it again
    return target


def _write_parts(path: Path, parts: list[bytes]) -> None:
    with open(path, "wb") as f:
        f.writelines(parts)


def _unchanged_size(target: Path) -> int | None:
    """The file's size when it is as this process last read or wrote it (a log may then be appended to), else None."""
    try:
        st = os.stat(target)
    except OSError:
        return None
    seen = _seen.get(str(Path(target).absolute()))
    return st.st_size if seen is not None and seen[:3] == (st.st_ino, st.st_mtime_ns, st.st_size) else None


def _append(target: Path, data: bytes, size: int) -> None:
    """Append a save's lines to a log file and fsync them; on failure cut the file back to `size` (what is left of a
    save that did not finish is dropped when read anyway: sessions/log.py)."""
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def _remember(session: Session, path: Path) -> None:
    """Note the file `session` now matches (after a load or a save)."""
    session._disk = (session.revision, session.updated)  # type: ignore[attr-defined]  (not a field: not written)
    try:
        st = os.stat(path)
    except OSError:
        return
    _seen[str(Path(path).absolute())] = (st.st_ino, st.st_mtime_ns, st.st_size, session.revision, session.updated)


def _check_current(session: Session, target: Path) -> None:
    base = getattr(session, "_disk", None)
    if base is None:  # never read nor written here: a new session (ids are random, so the file is its own)
        return
    try:
        st = os.stat(target)
    except FileNotFoundError:  # deleted meanwhile (the sessions screen): saving brings it back
        return
    except OSError as e:
        raise SessionError(f"{target}: cannot check the saved session ({e.strerror or one_line(e)})") from None
    seen = _seen.get(str(Path(target).absolute()))
    if seen is not None and seen[:3] == (st.st_ino, st.st_mtime_ns, st.st_size):
        disk = seen[3:]
    else:
        try:
            d = session_read._disk_fields(target)
        except SessionError:  # a damaged file: nothing in it to lose
            return
        if not isinstance(d, dict):
            return
        disk = (d.get("revision", 0), d.get("updated"))
    if disk != base:
        raise SessionConflict(f"{target}: the saved session changed after this copy of it was read "
                              f"(revision {disk[0]} on disk, {base[0]} here); not overwriting it")


def check_current(session: Session, dir: str | Path | None = None) -> None:
    """Raise SessionConflict now if saving `session` would be refused (a chat checks this when it opens a copy)."""
    target = session_path(session.id, dir)
    with _lock(target.parent, session.id):
        _check_current(session, target)


def adopt_revision(session: Session, dir: str | Path | None = None) -> None:
    """After this process changed the file behind an open session's back (the app renaming the chat it has open):
    take the file's revision, so the chat's next save is not refused. A file that cannot be read is left alone."""
    try:
        on_disk = load(session.id, dir)
    except SessionError:
        return
    session.revision = on_disk.revision
    session._disk = on_disk._disk  # type: ignore[attr-defined]


def lock(session_id: str, dir: str | Path | None = None) -> session_lock.SessionLock:
    """Hold a session's lock (a chat, while it has the session open). SessionLocked when another process has it."""
    return _lock(session_path(session_id, dir).parent, session_id)


def _resolve(id_or_path: str | Path, dir: str | Path | None) -> tuple[Path, str | None]:
    """A path (anything with a separator or a .json suffix) or an id; the id the file must hold, if known."""
    if isinstance(id_or_path, Path) or "/" in id_or_path or os.sep in id_or_path or id_or_path.endswith(".json"):
        return Path(id_or_path), None
    sid = resolve_id(id_or_path, dir)
    return session_path(sid, dir), sid


def load(id_or_path: str | Path, dir: str | Path | None = None) -> Session:
    """Read and validate a session by id (in `dir` / the sessions folder; or the start of one: resolve_id) or by path.
    Raises SessionError."""
    path, expect_id = _resolve(id_or_path, dir)
    if expect_id is not None and not path.exists():
        raise SessionError(f"{path}: no such session file (`tinychat sessions` lists the saved ones)")
    with session_read._gc_paused():
        doc, log = session_read._read_doc(path)
        session = session_read._from_dict(doc, str(path), log=log is not None)
    if doc.get("version", 0) >= 2:                # ids and links checked (check.tree_problem): as link() leaves them
        session_tree.already_linked(session)
    session_write.known_good(session)             # its tree was just checked: a save checks only what changes
    if expect_id is not None and session.id != expect_id:
        raise SessionError(f"{path}: holds session id {session.id!r}, not the one its file name says")
    session.source = str(path)  # type: ignore[attr-defined]  (for errors that name the file; not written)
    session.notice = None  # type: ignore[attr-defined]  (one line for the user about the read; not written)
    if log is not None and log["torn"]:
        session.notice = f"{path}: dropped the end of a save that did not finish ({log['torn']} bytes: a crash " \
                         f"while saving?); this is the session as of its last complete save"
    elif log is not None and log["appendable"]:
        session_write.written(session, log["size"], log["dead"])     # a save appends to it
    _remember(session, path)
    return session


# -- listing and management -----------------------------------------------------------------------------------


def list_sessions(dir: str | Path | None = None, errors: list[SessionError] | None = None) -> list[SessionInfo]:
    """Every readable session in `dir`, newest `updated` first.

    A file that fails to load is skipped; its SessionError is appended to `errors` when a list is given
    (so the UI can show it), and never raised. Files unchanged since they were last listed or saved are not parsed
    again (sessions/index.py).
    """
    folder = _dir(dir)
    if not folder.is_dir():
        return []
    infos = []
    for path, row in session_index.listing(folder, _listing_row):
        if "error" in row:
            if errors is not None:
                errors.append(SessionError(row["error"]))
            continue
        infos.append(SessionInfo(id=row["id"], path=path, title=safe_line(row["title"]) or UNTITLED,
                                 updated=row["updated"], n_turns=row["n_turns"], model=safe_line(row["model"])))
    infos.sort(key=lambda info: (info.updated, info.id), reverse=True)
    return infos


def _listing_row(path: Path) -> dict:
    """A session file's listing row (sessions/index.py), checked whole as load checks it, or {"error": one line}."""
    try:
        if (row := _log_row(path)) is not None:
            return row
        with session_read._gc_paused():
            s = session_read._from_dict(session_read._read_json(path), str(path))
        if s.id != path.stem:
            raise SessionError(f"{path}: holds session id {s.id!r}, not the one its file name says")
    except SessionError as e:
        return {"error": str(e)}
    return _row(s)


def _log_row(path: Path) -> dict | None:
    """A log's listing row from its header and last commit alone (sessions/log.py: a listing need not read a big
    tree; `load` checks the rest); None for a file that is not a log."""
    if not session_log.is_log(session_read._read_text(path, 4096)):
        return None
    try:
        found = session_log.summary(path, session_read.MAX_FILE_BYTES)
    except (OSError, session_log.LogError) as e:
        raise SessionError(f"{path}: {one_line(e)}") from None
    if found is None:
        return None
    head, rec = found
    s = session_read._from_dict({**rec["commit"], "schema": head.get("schema"), "version": session_log.VERSION,
                                 "messages": [], "branches": []}, str(path), log=True)
    if s.id != path.stem or head.get("id") != s.id:
        raise SessionError(f"{path}: holds session id {s.id!r}, not the one its file name says")
    return {**_row(s), "n_turns": rec["turns"]}


def _row(s: Session, turns: int | None = None) -> dict:
    return {"id": s.id, "title": s.title, "updated": s.updated, "n_turns": s.n_turns if turns is None else turns,
            "model": str(s.model.get("name") or "")}


def search_text(path: str | Path) -> str:
    """The session's title and every message on any branch, casefolded, NUL between them (no match spans two;
    '' if unreadable)."""
    try:
        s = load(path)
    except SessionError:
        return ""
    return "\x00".join(x.casefold() for x in [s.title] + [m.content for m in s.messages + s.branches])


def matches(path: str | Path, text: str) -> bool:
    """Whether the session at `path` has `text` (case-insensitive) in its title or any message, on any branch.
    A file that cannot be read does not match."""
    return bool(text) and text.casefold() in search_text(path)


def delete(session_id: str, dir: str | Path | None = None) -> bool:
    """Remove a session and its KV snapshot (snapshot first: a session without one is still whole).
    True when the session file existed. SessionLocked when another process has it open. session_id: an id or the
    start of exactly one (resolve_id)."""
    session_id = resolve_id(session_id, dir)
    target = session_path(session_id, dir)
    if not target.parent.is_dir():
        return False
    with _lock(target.parent, session_id):
        snapshot_path(session_id, dir).unlink(missing_ok=True)
        try:
            target.unlink()
        except FileNotFoundError:
            return False
    return True


def rename(session_id: str, title: str, dir: str | Path | None = None) -> Session:
    """Set a session's title (does not count as an update: the list order stays). Control characters (escape
    sequences) are dropped from it."""
    title = " ".join(strip_controls(title).split())
    if not title:
        raise SessionError(f"{session_path(session_id, dir)}: a title cannot be empty")
    session = load(session_id, dir)
    session.title = title
    save(session, dir, touch=False)
    return session


def copy(session_id: str, dir: str | Path | None = None, title: str | None = None) -> Session:
    """Save a copy of a session under a new id (every branch; no KV snapshot: the copy's first restore prefills).
    Reads the file as it is on disk, so it works while another process has the session open."""
    src = load(session_id, dir)
    dup = dataclasses.replace(src, id=new_id(), revision=0, kv_sha256="",
                              title=" ".join(strip_controls(title).split()) if title else f"{src.title} (copy)".strip())
    dup.created = dup.updated = time.time()
    save(dup, dir, touch=False)
    return dup


def check_vocab(session: Session, vocab_size: int) -> None:
    """SessionError naming the file, message and position of the first token id outside `vocab_size`."""
    if problem := vocab_problem(session.messages, vocab_size) or vocab_problem(session.branches, vocab_size,
                                                                                "branches"):
        raise SessionError(f"{getattr(session, 'source', None) or f'session {session.id}'}: {problem}")


def check_tokens(session: Session, vocab_size: int, tok: Any, frames_only: bool = False) -> None:
    """check_vocab, then that every message's text is what its token ids hold (session_check.text_problem): what a
    chat continues and replay regenerates from is what the session shows. SessionError naming file and message. A
    session of another tokenizer is left to the chat's identity check (it names the tokenizer). frames_only: the chat
    frames only (replay reports each turn's text as it replays it)."""
    check_vocab(session, vocab_size)
    if session.tokenizer_hash not in ("", tok.sha256):      # another tokenizer: the chat's identity check says so
        return
    if problem := (text_problem(session.messages, tok, frames_only=frames_only) or
                   text_problem(session.branches, tok, "branches", frames_only=frames_only)):
        raise SessionError(f"{getattr(session, 'source', None) or f'session {session.id}'}: {problem}")
