"""Reading a session file: its bytes (regular files only, at most MAX_FILE_BYTES), as text (UTF-8), as JSON (one
document, or a log's records: sessions/log.py), and validated field by field into a Session (README.md, "What
sessions promise"). Anything wrong raises SessionError with a one-line message naming the file and the field.

sessions/session.py (load, list_sessions, the overwrite check of a save) reads through these and is the public face;
this module imports nothing from it (the records are in sessions/records.py), so no import cycle. No torch here."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from tinychat.jsonfields import Fields, is_int, is_obj, is_str, is_time, jtype, one_line, show
from tinychat.sessions import log as session_log
from tinychat.sessions.check import fork_ok, fork_problem, order_problem, sampler_problem, seed_ok, tree_problem
from tinychat.sessions.records import FINISH_REASONS, ID_RE, ROLES, SCHEMA, VERSION, Message, Session, SessionError

READ_VERSIONS = (1, 2, 3)  # 3: a log of JSON lines (sessions/log.py), what a big session is written as
_MAX_TOKEN_ID = 2**31 - 1  # ids must fit the int32/int64 tensors the runtime builds from them
MAX_CONTEXT = 1 << 17  # model.max_len's ceiling (weights_check.MAX_POSITIONS)
MAX_FILE_BYTES = 256 << 20  # a session file larger than this is refused unread (a 50,000-turn chat is ~30 MB)
# Fields added after version 1 shipped: optional on read (a file written before them still loads), always written.
OPTIONAL_FIELDS = {"revision": 0, "kv_sha256": ""}


# -- bytes, text, JSON ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _gc_paused():
    """Python's cycle collector off while a big file becomes objects: it would walk the growing heap again and again
    (a third of a 100,000-message load), and nothing built here is cyclic."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_bytes(path: Path, head: int | None = None) -> bytes:
    """The file's bytes: regular files only (not /dev/zero, a FIFO or a folder), at most MAX_FILE_BYTES. head: only
    its first so many bytes."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise SessionError(f"{path}: {kind}, not a session file")
        if st.st_size > MAX_FILE_BYTES:
            raise SessionError(f"{path}: too large for a session file ({st.st_size >> 20} MiB; "
                               f"the limit is {MAX_FILE_BYTES >> 20} MiB)")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1 if head is None else head)
        if len(raw) > MAX_FILE_BYTES:
            raise SessionError(f"{path}: too large for a session file (the limit is {MAX_FILE_BYTES >> 20} MiB)")
        return raw
    finally:
        os.close(fd)


def _read_bytes_or_fail(path: Path, head: int | None = None) -> bytes:
    try:
        raw = _read_bytes(path, head)
    except FileNotFoundError:
        raise SessionError(f"{path}: no such session file") from None
    except OSError as e:
        raise SessionError(f"{path}: cannot read session file ({e.strerror or one_line(e)})") from None
    if not raw.strip():
        raise SessionError(f"{path}: empty session file")
    return raw


def _decode(path: Path, raw: bytes, strict: bool = True) -> str:
    try:
        return raw.decode("utf-8-sig", errors="strict" if strict else "ignore")  # tolerate a Windows BOM
    except UnicodeDecodeError as e:
        raise SessionError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None


def _read_text(path: Path, head: int | None = None) -> str:
    return _decode(path, _read_bytes_or_fail(path, head), strict=head is None)


def _read_doc(path: Path) -> tuple[Any, dict | None]:
    """(the file's content as one JSON document holds it, None) or, for a log (sessions/log.py), (the document its
    records make, what the writer needs to know of the file)."""
    raw = _read_bytes_or_fail(path)
    text = _decode(path, raw)
    if session_log.is_log(text[:4096]):
        try:
            doc, info = session_log.parse(text, len(raw))
        except session_log.LogError as e:
            raise SessionError(f"{path}: {e}") from None
        return doc, info
    return _parse_json(path, text), None


def _disk_fields(path: Path) -> Any:
    """The session's own fields as the file on disk holds them (revision, updated ...), a log's read from its end."""
    if session_log.is_log(_read_text(path, 4096)):
        try:
            found = session_log.summary(path, MAX_FILE_BYTES)
        except (OSError, session_log.LogError) as e:
            raise SessionError(f"{path}: {one_line(e)}") from None
        return found[1]["commit"] if found else None
    return _read_json(path)


def _read_json(path: Path) -> Any:
    return _parse_json(path, _read_text(path))


def _parse_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        hint = "truncated or invalid" if e.pos >= len(text.rstrip()) else "invalid"
        raise SessionError(f"{path}: {hint} JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # NaN/Infinity, absurdly long integers, absurd nesting
        raise SessionError(f"{path}: invalid JSON ({one_line(e)[:120]})") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


# -- validation -----------------------------------------------------------------------------------------------
# Every field of a version-1 file is required (the writer always writes them all); unknown extra keys are
# ignored. Each check names the field by its JSON path, e.g. messages[3].token_ids[17] (jsonfields.Fields).


def _from_dict(d: Any, where: str, log: bool = False) -> Session:
    if not isinstance(d, dict):
        raise SessionError(f"{where}: not a session file (top level is {jtype(d)}, expected an object)")
    if d.get("schema") != SCHEMA:
        schema = show(d.get("schema"))
        raise SessionError(f"{where}: not a tinychat session file (schema {schema}, expected {SCHEMA!r})")
    version = d.get("version")
    if not is_int(version):
        raise SessionError(f"{where}: field version must be an integer, got {show(version)}")
    if version not in READ_VERSIONS:
        raise SessionError(f"{where}: unsupported session version {version} (this tinychat reads versions "
                           f"{', '.join(map(str, READ_VERSIONS))})")
    if (version == session_log.VERSION) != log:
        raise SessionError(f"{where}: a version-{version} session file is " +
                           ("JSON lines, its first the header (not one JSON document)" if version == 3 else
                            "one JSON document"))

    f = Fields(d, where, error=SessionError, defaults=OPTIONAL_FIELDS)
    sid = f.get("id", is_str, "a string")
    if not ID_RE.fullmatch(sid):
        raise f.fail("id", f"is not a valid session id: {show(sid)}")
    model = f.get("model", is_obj, "an object")
    mf = f.at(model, "model.")
    mf.get("name", is_str, "a string")
    mf.get("hash", is_str, "a string")
    if "max_len" in model:              # the context the chat ran with (Chat reads it back): a position count
        mf.get("max_len", lambda v: is_int(v) and 1 <= v <= MAX_CONTEXT, f"an integer in 1..{MAX_CONTEXT}",
               nullable=True)
    session = Session(
        id=sid,
        title=f.get("title", is_str, "a string"),
        created=f.get("created", is_time, "a non-negative number (unix time)"),
        updated=f.get("updated", is_time, "a non-negative number (unix time)"),
        model=model,
        tokenizer_hash=f.get("tokenizer_hash", is_str, "a string"),
        quant=f.get("quant", is_str, "a string"),
        device=f.get("device", is_str, "a string"),
        settings=f.get("settings", is_obj, "an object"),
        revision=f.optional("revision", lambda v: is_int(v) and v >= 0, "a non-negative integer"),
        kv_sha256=f.optional("kv_sha256", is_str, "a string"),
    )
    if problem := sampler_problem(session.settings, "settings."):
        raise SessionError(f"{where}: {problem}")
    messages = f.get("messages", lambda v: isinstance(v, list), "an array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise f.fail(f"messages[{i}]", f"must be an object, got {show(m)}")
        session.messages.append(_message_fast(m, version) or _message_from_dict(f.at(m, f"messages[{i}]."), version))
    if problem := order_problem(session.messages):
        raise SessionError(f"{where}: {problem}")
    if version >= 2:
        branches = f.get("branches", lambda v: isinstance(v, list), "an array")
        for i, m in enumerate(branches):
            if not isinstance(m, dict):
                raise f.fail(f"branches[{i}]", f"must be an object, got {show(m)}")
            session.branches.append(_message_fast(m, version) or
                                    _message_from_dict(f.at(m, f"branches[{i}]."), version))
        if problem := tree_problem(session.messages, session.branches):
            raise SessionError(f"{where}: {problem}")
    return session


_TIME_TYPES = {int, float}


def _message_fast(d: dict, version: int) -> Message | None:
    """A message exactly as a chat writes it, checked in a few operations over whole lists (a 100,000-message tree
    loads in about a second); None for anything else, which _message_from_dict then checks field by field and names.
    Accepts only what _message_from_dict accepts."""
    try:
        role, content, ids, created = d["role"], d["content"], d["token_ids"], d["created"]
        settings, seed, finish, timing = d["settings"], d["seed"], d["finish"], d["timing_ms"]
        mid, parent, fork = (d["id"], d["parent"], d["fork"]) if version >= 2 else (0, None, None)
    except (KeyError, TypeError):
        return None
    if role not in ROLES or type(content) is not str or type(ids) is not list or fork is not None:
        return None
    if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > _MAX_TOKEN_ID):
        return None
    if type(created) not in _TIME_TYPES or not 0 <= created < math.inf:
        return None
    if not (settings is None or type(settings) is dict) or not (seed is None or (type(seed) is int and seed_ok(seed))):
        return None
    if not (finish is None or finish in FINISH_REASONS):
        return None
    if timing is not None and (type(timing) is not list or timing and (
            not set(map(type, timing)) <= _TIME_TYPES or not all(map(math.isfinite, timing)) or min(timing) < 0)):
        return None
    if version >= 2 and (type(mid) is not int or not 1 <= mid <= _MAX_TOKEN_ID or
                         not (parent is None or type(parent) is int)):
        return None
    return Message(role=role, content=content, token_ids=ids, created=created, settings=settings, seed=seed,
                   finish=finish, timing_ms=timing, id=mid, parent=parent, fork=None)


def _message_from_dict(f: Fields, version: int = VERSION) -> Message:
    role = f.get("role", lambda v: v in ROLES, "one of " + "/".join(ROLES))
    tree: dict[str, Any] = {}
    if version >= 2:
        tree = {"id": f.get("id", lambda v: is_int(v) and 1 <= v <= _MAX_TOKEN_ID, "an integer in 1..2^31-1"),
                "parent": f.get("parent", is_int, "an integer", nullable=True),
                "fork": f.get("fork", fork_ok, "an object {position, token} of non-negative integers",
                              nullable=True)}
    msg = Message(
        **tree,
        role=role,
        content=f.get("content", is_str, "a string"),
        token_ids=f.int_list("token_ids", lambda v: is_int(v) and 0 <= v <= _MAX_TOKEN_ID, "a token id (0..2^31-1)"),
        created=f.get("created", is_time, "a non-negative number (unix time)"),
        settings=f.get("settings", is_obj, "an object", nullable=True),
        seed=f.get("seed", seed_ok, "an integer in 0..2^63-1", nullable=True),
        finish=f.get("finish", lambda v: v in FINISH_REASONS, "one of " + "/".join(FINISH_REASONS), nullable=True),
        timing_ms=f.int_list("timing_ms", is_time, "a non-negative number", nullable=True),
    )
    if problem := fork_problem(msg):
        raise f.fail("fork", problem)
    return msg
