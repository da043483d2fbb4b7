"""Session files: what a chat recorded, on disk (design §5).

One session = `<sessions_dir>/<id>.json` (versioned JSON) plus, optionally, `<id>.kv.safetensors` (a KV-cache
snapshot). This module is the file layer only: the chat runtime restores (re-prefill from token ids, or load a
snapshot when the model identity matches) and replays on top of it.

A session records everything needed to continue or replay a chat to the token:
- model identity (hash of weights + config), tokenizer hash, quant mode, device kind;
- every message with the exact token ids it occupies in the context: a message's ids are its whole ChatML
  frame (`<|im_start|>role\\n ... <|im_end|>\\n`), so concatenating all messages' ids gives the context the
  model saw, including an assistant turn's sampled ids exactly as sampled (never re-encoded from text);
- each assistant turn's sampler settings, random seed and how it finished;
- timestamps.

Guarantees: writes are atomic (temp file in the same folder, fsync, `os.replace`), so a crash or kill leaves
either the old or the new file, never a torn one. Reading validates every field; anything wrong raises
`SessionError` with a one-line message naming the file, and one bad file never stops `list_sessions`.

No torch at import: safetensors/torch are imported only inside the snapshot functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tinychat import paths
from tinychat.fsutil import atomic_write

SCHEMA = "tinychat.session"
VERSION = 1
ROLES = ("system", "user", "assistant")
FINISH_REASONS = ("stop", "length", "cancelled")
SNAPSHOT_SUFFIX = ".kv.safetensors"
SNAPSHOT_FORMAT = "1"
UNTITLED = "New chat"

# Ids name files: letters, digits, '-' and '_' only (no dots, no separators), so an id can never escape the
# sessions folder or collide with a snapshot's or temp file's name.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_MAX_TOKEN_ID = 2**31 - 1  # ids must fit the int32/int64 tensors the runtime builds from them
_MAX_SEED = 2**64 - 1  # torch.manual_seed's range


class SessionError(ValueError):
    """A session file that cannot be used. `str(e)` is one line: '<file>: <what is wrong>'."""


@dataclass
class Message:
    role: str  # one of ROLES
    content: str
    token_ids: list[int] = field(default_factory=list)  # the message's whole ChatML frame, as in the context
    created: float = field(default_factory=time.time)  # unix seconds
    # Assistant turns only (None elsewhere):
    settings: dict[str, Any] | None = None  # sampler settings this turn was generated with
    seed: int | None = None  # the turn's random seed
    finish: str | None = None  # one of FINISH_REASONS
    timing_ms: list[float] | None = None  # per sampled token, milliseconds (optional)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Session:
    id: str
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model: dict[str, Any] = field(default_factory=lambda: {"name": "", "hash": ""})  # name, hash (+ free extras)
    tokenizer_hash: str = ""
    quant: str = "none"  # weight mode the turns ran under, e.g. "none", "int8", "bf16"
    device: str = "cpu"  # device kind, e.g. "cpu", "cuda"
    settings: dict[str, Any] = field(default_factory=dict)  # session-wide sampler defaults
    messages: list[Message] = field(default_factory=list)

    @classmethod
    def new(cls, **kwargs: Any) -> Session:
        """A fresh session with a new id and the current time."""
        return cls(id=new_id(), **kwargs)

    @property
    def system_prompt(self) -> str:
        """The leading system message's text ('' when there is none); it lives in `messages` like any other."""
        return self.messages[0].content if self.messages and self.messages[0].role == "system" else ""

    @property
    def n_turns(self) -> int:
        return sum(m.role == "user" for m in self.messages)

    def context_ids(self) -> list[int]:
        """All messages' ids in order: the context to re-prefill (add the generation prompt to continue)."""
        return [t for m in self.messages for t in m.token_ids]

    def to_dict(self) -> dict[str, Any]:
        d = {"schema": SCHEMA, "version": VERSION}
        d.update(dataclasses.asdict(self))
        return d


@dataclass(frozen=True)
class SessionInfo:
    """One row of `list_sessions`."""

    id: str
    path: Path
    title: str
    updated: float
    n_turns: int


# -- ids, titles, paths ---------------------------------------------------------------------------------------


def new_id(now: float | None = None) -> str:
    """'YYYYMMDD-HHMMSS-mmm-xxxxxx' (UTC time + 24 random bits): sorts by creation time, unique in practice."""
    t = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(t))
    return f"{stamp}-{int(t * 1000) % 1000:03d}-{secrets.token_hex(3)}"


def default_title(text: str, limit: int = 48) -> str:
    """A title from a user message: its first non-blank line, whitespace collapsed, cut at a word boundary."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
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
    if not isinstance(session_id, str) or not _ID_RE.fullmatch(session_id):
        raise SessionError(f"invalid session id {_show(session_id)}")
    return session_id


def session_path(session_id: str, dir: str | Path | None = None) -> Path:
    return _dir(dir) / f"{_check_id(session_id)}.json"


def snapshot_path(session_id: str, dir: str | Path | None = None) -> Path:
    return _dir(dir) / f"{_check_id(session_id)}{SNAPSHOT_SUFFIX}"


def _dumps(obj: Any, depth: int = 0) -> str:
    """JSON, indented for people, but with number lists (token ids, timings) kept on one line."""
    flat = isinstance(obj, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in obj)
    if flat or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False)
    pad, end = "  " * (depth + 1), "  " * depth
    if isinstance(obj, dict):
        items = [f"{pad}{json.dumps(str(k), ensure_ascii=False)}: {_dumps(v, depth + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    return "[\n" + ",\n".join(pad + _dumps(v, depth + 1) for v in obj) + "\n" + end + "]"


def _serialize(session: Session, where: str, **overrides: Any) -> str:
    data = session.to_dict()
    data.update(overrides)
    _from_dict(data, where)  # never write what `load` would reject
    try:
        return _dumps(data) + "\n"
    except (TypeError, ValueError) as e:
        raise SessionError(f"{where}: cannot serialize session ({_one_line(e)})") from None


# -- save / load ----------------------------------------------------------------------------------------------


def save(session: Session, dir: str | Path | None = None, *, touch: bool = True) -> Path:
    """Write `session` atomically to `<dir>/<id>.json` and return the path.

    `touch` sets `updated` to now (autosave after a turn); an empty title is filled from the first user message.
    The session object is only changed once the write has succeeded.
    """
    target = session_path(session.id, dir)
    overrides: dict[str, Any] = {}
    if touch:
        overrides["updated"] = max(time.time(), session.created)
    if not session.title:
        first_user = next((m.content for m in session.messages if m.role == "user"), "")
        if default_title(first_user):
            overrides["title"] = default_title(first_user)
    payload = _serialize(session, str(target), **overrides).encode("utf-8")
    atomic_write(target, lambda tmp: tmp.write_bytes(payload))
    for key, value in overrides.items():
        setattr(session, key, value)
    return target


def _resolve(id_or_path: str | Path, dir: str | Path | None) -> tuple[Path, str | None]:
    """A path (anything with a separator or a .json suffix) or an id; the id the file must hold, if known."""
    if isinstance(id_or_path, Path) or "/" in id_or_path or os.sep in id_or_path or id_or_path.endswith(".json"):
        return Path(id_or_path), None
    return session_path(id_or_path, dir), id_or_path


def load(id_or_path: str | Path, dir: str | Path | None = None) -> Session:
    """Read and validate a session by id (in `dir` / the sessions folder) or by path. Raises SessionError."""
    path, expect_id = _resolve(id_or_path, dir)
    session = _from_dict(_read_json(path), str(path))
    if expect_id is not None and session.id != expect_id:
        raise SessionError(f"{path}: holds session id {session.id!r}, not the one its file name says")
    return session


def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SessionError(f"{path}: no such session file") from None
    except OSError as e:
        raise SessionError(f"{path}: cannot read session file ({e.strerror or _one_line(e)})") from None
    if not raw.strip():
        raise SessionError(f"{path}: empty session file")
    try:
        text = raw.decode("utf-8-sig")  # tolerate the BOM some Windows editors add
    except UnicodeDecodeError as e:
        raise SessionError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        hint = "truncated or invalid" if e.pos >= len(text.rstrip()) else "invalid"
        raise SessionError(f"{path}: {hint} JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (ValueError, RecursionError) as e:  # NaN/Infinity, absurdly long integers, absurd nesting
        raise SessionError(f"{path}: invalid JSON ({_one_line(e)[:120]})") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


# -- validation -----------------------------------------------------------------------------------------------
# Every field of a version-1 file is required (the writer always writes them all); unknown extra keys are
# ignored. Each check names the field by its JSON path, e.g. messages[3].token_ids[17].


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _jtype(v: Any) -> str:
    names = {
        dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a number"
    }
    return "null" if v is None else names.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return _jtype(v)
    text = repr(v)  # repr escapes newlines, so messages stay on one line
    return text if len(text) <= 40 else text[:37] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_obj(v: Any) -> bool:
    return isinstance(v, dict)


class _Fields:
    """Typed access to one JSON object's fields; failures raise SessionError naming file and field."""

    def __init__(self, data: dict, where: str, prefix: str = ""):
        self.data, self.where, self.prefix = data, where, prefix

    def fail(self, key: str, what: str) -> SessionError:
        return SessionError(f"{self.where}: field {self.prefix}{key} {what}")

    def get(self, key: str, ok: Callable[[Any], bool], expected: str, *, nullable: bool = False) -> Any:
        if key not in self.data:
            raise SessionError(f"{self.where}: missing field {self.prefix}{key}")
        value = self.data[key]
        if value is None and nullable:
            return None
        if not ok(value):
            raise self.fail(key, f"must be {expected}{' or null' if nullable else ''}, got {_show(value)}")
        return value

    def int_list(self, key: str, ok: Callable[[Any], bool], expected: str, *, nullable: bool = False) -> list | None:
        values = self.get(key, lambda v: isinstance(v, list), "an array", nullable=nullable)
        if values is not None and not all(map(ok, values)):
            i = next(i for i, v in enumerate(values) if not ok(v))
            raise self.fail(f"{key}[{i}]", f"must be {expected}, got {_show(values[i])}")
        return values


def _from_dict(d: Any, where: str) -> Session:
    if not isinstance(d, dict):
        raise SessionError(f"{where}: not a session file (top level is {_jtype(d)}, expected an object)")
    if d.get("schema") != SCHEMA:
        schema = _show(d.get("schema"))
        raise SessionError(f"{where}: not a tinychat session file (schema {schema}, expected {SCHEMA!r})")
    version = d.get("version")
    if not _is_int(version):
        raise SessionError(f"{where}: field version must be an integer, got {_show(version)}")
    if version != VERSION:
        raise SessionError(f"{where}: unsupported session version {version} (this tinychat reads version {VERSION})")

    f = _Fields(d, where)
    sid = f.get("id", _is_str, "a string")
    if not _ID_RE.fullmatch(sid):
        raise f.fail("id", f"is not a valid session id: {_show(sid)}")
    model = f.get("model", _is_obj, "an object")
    mf = _Fields(model, where, "model.")
    mf.get("name", _is_str, "a string")
    mf.get("hash", _is_str, "a string")
    session = Session(
        id=sid,
        title=f.get("title", _is_str, "a string"),
        created=f.get("created", _is_time, "a non-negative number (unix time)"),
        updated=f.get("updated", _is_time, "a non-negative number (unix time)"),
        model=model,
        tokenizer_hash=f.get("tokenizer_hash", _is_str, "a string"),
        quant=f.get("quant", _is_str, "a string"),
        device=f.get("device", _is_str, "a string"),
        settings=f.get("settings", _is_obj, "an object"),
    )
    messages = f.get("messages", lambda v: isinstance(v, list), "an array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise f.fail(f"messages[{i}]", f"must be an object, got {_show(m)}")
        session.messages.append(_message_from_dict(_Fields(m, where, f"messages[{i}].")))
    return session


def _message_from_dict(f: _Fields) -> Message:
    role = f.get("role", lambda v: v in ROLES, "one of " + "/".join(ROLES))
    return Message(
        role=role,
        content=f.get("content", _is_str, "a string"),
        token_ids=f.int_list("token_ids", lambda v: _is_int(v) and 0 <= v <= _MAX_TOKEN_ID, "a token id (0..2^31-1)"),
        created=f.get("created", _is_time, "a non-negative number (unix time)"),
        settings=f.get("settings", _is_obj, "an object", nullable=True),
        seed=f.get("seed", lambda v: _is_int(v) and 0 <= v <= _MAX_SEED, "an integer in 0..2^64-1", nullable=True),
        finish=f.get("finish", lambda v: v in FINISH_REASONS, "one of " + "/".join(FINISH_REASONS), nullable=True),
        timing_ms=f.int_list("timing_ms", _is_time, "a non-negative number", nullable=True),
    )


# -- listing and management -----------------------------------------------------------------------------------


def list_sessions(dir: str | Path | None = None, errors: list[SessionError] | None = None) -> list[SessionInfo]:
    """Every readable session in `dir`, newest `updated` first.

    A file that fails to load is skipped; its SessionError is appended to `errors` when a list is given
    (so the UI can show it), and never raised.
    """
    folder = _dir(dir)
    if not folder.is_dir():
        return []
    infos = []
    for path in folder.glob("*.json"):
        if path.name.startswith("."):  # in-flight or abandoned temp files
            continue
        try:
            s = _from_dict(_read_json(path), str(path))
            if s.id != path.stem:
                raise SessionError(f"{path}: holds session id {s.id!r}, not the one its file name says")
        except SessionError as e:
            if errors is not None:
                errors.append(e)
            continue
        infos.append(SessionInfo(id=s.id, path=path, title=s.title or UNTITLED, updated=s.updated, n_turns=s.n_turns))
    infos.sort(key=lambda info: (info.updated, info.id), reverse=True)
    return infos


def delete(session_id: str, dir: str | Path | None = None) -> bool:
    """Remove a session and its KV snapshot (snapshot first: a session without one is still whole).
    True when the session file existed."""
    snapshot_path(session_id, dir).unlink(missing_ok=True)
    try:
        session_path(session_id, dir).unlink()
    except FileNotFoundError:
        return False
    return True


def rename(session_id: str, title: str, dir: str | Path | None = None) -> Session:
    """Set a session's title (does not count as an update: the list order stays)."""
    title = " ".join(title.split())
    if not title:
        raise SessionError(f"{session_path(session_id, dir)}: a title cannot be empty")
    session = load(session_id, dir)
    session.title = title
    save(session, dir, touch=False)
    return session


# -- export ---------------------------------------------------------------------------------------------------


def export_json(session: Session) -> str:
    """The session file's exact JSON text (loadable again with `load(path)`)."""
    return _serialize(session, f"<session {session.id}>")


def _when(t: float) -> str:
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def export_markdown(session: Session) -> str:
    """A readable transcript: title, model line, then one section per message."""
    model = session.model.get("name") or "unknown model"
    if session.model.get("hash"):
        model += f" ({str(session.model['hash'])[:12]})"
    lines = [
        f"# {session.title or UNTITLED}",
        "",
        f"*{model} · {session.quant} · {session.device} · started {_when(session.created)}*",
    ]
    for m in session.messages:
        lines += ["", f"## {m.role.capitalize()}", "", m.content.rstrip("\n")]
        if m.finish in ("length", "cancelled"):
            lines += ["", f"*(reply cut off: {m.finish})*"]
    return "\n".join(lines) + "\n"


# -- model identity -------------------------------------------------------------------------------------------


def hash_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_hash(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """sha256 of a file, read in chunks (weights can be hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def identity_hash(config: Mapping[str, Any] | Any, weights_path: str | Path) -> str:
    """Model identity = sha256 over the config (canonical JSON: sorted keys, tuples as lists) + the weights' hash.

    `config` is a dict or a dataclass (e.g. ModelConfig). Same weights under another config is another model.
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    canon = json.dumps(dict(config), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    h = hashlib.sha256(b"tinychat.model-identity/1\0")
    h.update(canon.encode("ascii"))
    h.update(b"\0" + file_hash(weights_path).encode("ascii"))
    return h.hexdigest()


# -- KV snapshots ---------------------------------------------------------------------------------------------
# `<id>.kv.safetensors` holds whatever tensors the runtime hands over (its cache buffers) plus string metadata.
# Two reserved metadata keys tie the file to its session; the caller's `meta` should say what the snapshot is
# valid for (model identity hash, quant, dtype, number of tokens) so the runtime can refuse a stale one.

_META_FORMAT = "tinychat.kv_format"
_META_SESSION = "tinychat.session_id"


def save_snapshot(
    session_id: str, tensors: Mapping[str, Any], meta: Mapping[str, str], dir: str | Path | None = None
) -> Path:
    """Atomically write `tensors` (name -> contiguous torch.Tensor, no shared storage) and `meta` (str -> str)."""
    from safetensors.torch import save_file

    target = snapshot_path(session_id, dir)
    bad = [k for k, v in meta.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"snapshot metadata must map str to str; bad key(s): {bad[:3]}")
    if any(k.startswith("tinychat.") for k in meta):
        raise ValueError("snapshot metadata keys starting with 'tinychat.' are reserved")
    full_meta = {**meta, _META_FORMAT: SNAPSHOT_FORMAT, _META_SESSION: session_id}
    atomic_write(target, lambda tmp: save_file(dict(tensors), str(tmp), metadata=full_meta))
    return target


def load_snapshot(
    session_id: str, dir: str | Path | None = None, device: str = "cpu"
) -> tuple[dict[str, Any], dict[str, str]] | None:
    """(tensors, meta) from `<id>.kv.safetensors`, None when there is none; SessionError when it is unusable."""
    path = snapshot_path(session_id, dir)
    if not path.exists():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as f:
            meta = dict(f.metadata() or {})
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors raises its own error types (and OSError) for damaged files
        raise SessionError(f"{path}: corrupt KV snapshot ({_one_line(e)[:160]})") from None
    if meta.get(_META_FORMAT) != SNAPSHOT_FORMAT:
        raise SessionError(f"{path}: not a tinychat KV snapshot (format {_show(meta.get(_META_FORMAT))})")
    if meta.get(_META_SESSION) != session_id:
        raise SessionError(f"{path}: KV snapshot belongs to session {_show(meta.get(_META_SESSION))}")
    return tensors, {k: v for k, v in meta.items() if not k.startswith("tinychat.")}
