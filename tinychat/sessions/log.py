"""Session files of version 3: a log that a save appends to (issue #33 item 4: rewriting a 100,000-message tree, some
50 MB, took 0.3 s after every turn, and listing it parsed all of it).

A big session (session.LOG_MIN_MESSAGES messages or more) is written as JSON lines, one record per line:

    {"schema": "tinychat.session", "version": 3, "id": "<session id>"}            the header, line 1
    {"path": {<message>}}        a message appended to the active path (`messages`)
    {"branch": {<message>}}      a message appended to `branches`
    {"cut": [p, b]}              the active path keeps its first p messages and `branches` its first b
    {"commit": {<the session's own fields>}, "count": [p, b], "turns": n}

A save appends what changed since the last one (sessions/write.py: a cut where a list no longer starts as it did,
the messages after it, then a commit) in one write and fsyncs it; when that would be most of the file, or the file
holds too many lines that no longer count, it rewrites the file whole instead (atomic: temp file, fsync, rename),
so the log never grows far beyond its content. A commit line holds every field of the session but its messages (the
title, `updated`, `revision` ...), the lengths the two lists have then (checked when read: a lost line is caught) and
the number of turns on the active path, so a listing reads the header and the last commit only.

Reading replays the records up to the last commit. Lines after it are a save that did not finish (a crash or a
SIGKILL while appending): they are dropped with a notice, and the session is as of its last complete save; the
next save rewrites the file whole. Anything else wrong (a bad line before the last commit, a cut out of range,
a count that does not match) is an error naming the line. Torch-free; nothing from session.py."""
from __future__ import annotations

import json
import os
import re
from typing import Any

from ..errors import TinychatError

VERSION = 3
_HEAD = re.compile(r'[ \t]*\{[ \t]*"schema"[ \t]*:[ \t]*"tinychat\.session"[ \t]*,[ \t]*"version"[ \t]*:[ \t]*3[ \t]*[,}]')
TAIL_BLOCK = 1 << 16


class LogError(TinychatError, ValueError):
    """A log file that cannot be read; str(e) is one line without the file's name (the caller adds it)."""


def is_log(text: str) -> bool:
    """Does this file's text (or its first bytes) start as a version-3 session file?"""
    return _HEAD.match(text) is not None


def dumps(obj: Any) -> str:
    """One record's line (no newline): compact JSON in ASCII, everything else as \\u escapes (DEL too: a terminal
    showing the file could act on it). ASCII, because a log is read as one string and parsed at once: a single
    character beyond Latin-1 in a 50 MB file would make all of it a wide string, and its parse ~60 % slower."""
    return json.dumps(obj, ensure_ascii=True, allow_nan=False).replace("\x7f", "\\u007f")


def header(session_id: str) -> str:
    return dumps({"schema": "tinychat.session", "version": VERSION, "id": session_id})


def commit(fields: dict, n_path: int, n_branches: int, turns: int) -> str:
    return dumps({"commit": fields, "count": [n_path, n_branches], "turns": turns})


def _loads(line: str, number: int) -> Any:
    try:
        return json.loads(line, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise LogError(f"line {number}: invalid JSON ({e.msg} at column {e.colno})") from None
    except (ValueError, RecursionError) as e:
        raise LogError(f"line {number}: invalid JSON ({' '.join(str(e).split())[:120]})") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _commit_of(line: str) -> dict | None:
    """The commit record a line holds, or None (not a commit, or not a whole one)."""
    if not line.startswith('{"commit"'):
        return None
    try:
        rec = json.loads(line, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return None
    return rec if _commit_ok(rec) else None


def _commit_ok(rec: Any) -> bool:
    return (type(rec) is dict and type(rec.get("commit")) is dict and type(rec.get("count")) is list
            and len(rec["count"]) == 2 and all(type(v) is int and v >= 0 for v in rec["count"])
            and type(rec.get("turns")) is int and rec["turns"] >= 0)


def parse(text: str, nbytes: int) -> tuple[dict, dict]:
    """A version-3 file's text (`nbytes` bytes on disk) -> (the session as a version-2 document would hold it: its
    fields, "messages" and "branches"; what the writer needs to know of the file: {"dead": lines that no longer
    count, "lines": records, "torn": bytes dropped after the last commit, "size": bytes up to it}). Raises
    LogError."""
    first = text.find("\n")
    head = _loads(text if first < 0 else text[:first], 1)
    if not isinstance(head, dict) or head.get("version") != VERSION:
        raise LogError("line 1: not a version-3 session header")
    at = text.rfind('\n{"commit"')                 # the last whole commit line: found from the end
    while at >= first >= 0:
        stop = text.find("\n", at + 1)
        stop = len(text) if stop < 0 else stop
        if _commit_of(text[at + 1:stop]) is not None:
            break
        at = text.rfind('\n{"commit"', 0, at)
    else:
        raise LogError("no complete save in it (no commit line)")
    # what follows the last commit is a save that did not finish; no newline after it: an append cut just before
    # its newline (whole, but nothing may be appended to it as it is: the next save rewrites the file)
    torn = len(text[stop + 1:].encode("utf-8")) if stop < len(text) else 0
    body = text[first + 1:stop]
    try:        # one parse of the whole body ("\n" never occurs inside a JSON line: it is written as an escape)
        records = json.loads("[" + body.replace("\n", ",") + "]", parse_constant=_reject_constant)
    except (ValueError, RecursionError):      # name the first bad line
        records = [_loads(line, i) for i, line in enumerate(body.split("\n"), 2)]
    path: list = []
    branches: list = []
    written = dead = 0
    fields: dict = {}
    for i, rec in enumerate(records, 2):
        if type(rec) is not dict:
            raise LogError(f"line {i}: a record must be an object")
        if "path" in rec and len(rec) == 1:
            path.append(rec["path"])
            written += 1
        elif "branch" in rec and len(rec) == 1:
            branches.append(rec["branch"])
            written += 1
        elif "cut" in rec and len(rec) == 1:
            cut = rec["cut"]
            if not (type(cut) is list and len(cut) == 2 and all(type(v) is int for v in cut)
                    and 0 <= cut[0] <= len(path) and 0 <= cut[1] <= len(branches)):
                raise LogError(f"line {i}: a cut must be [p, b] within the lists' lengths "
                               f"({len(path)}, {len(branches)}), got {' '.join(json.dumps(cut).split())[:40]}")
            del path[cut[0]:], branches[cut[1]:]
            dead += 1
        elif "commit" in rec:
            if not _commit_ok(rec):
                raise LogError(f"line {i}: a commit must be {{commit: object, count: [p, b], turns: n}}")
            if rec["count"] != [len(path), len(branches)]:
                raise LogError(f"line {i}: the commit counts {rec['count'][0]} + {rec['count'][1]} messages, the "
                               f"lines before it hold {len(path)} + {len(branches)} (a line is missing)")
            fields = rec["commit"]
            dead += 1
        else:
            raise LogError(f"line {i}: not a session record (path, branch, cut or commit)")
    dead += written - len(path) - len(branches) - 1         # the last commit counts
    if fields.get("id", head.get("id")) != head.get("id"):
        raise LogError(f"the header's id {head.get('id')!r} is not the one its commits hold")
    doc = {**fields, "schema": head.get("schema"), "version": VERSION, "messages": path, "branches": branches}
    return doc, {"dead": dead, "lines": len(records) + 1, "torn": torn, "size": nbytes - torn,
                 "appendable": stop < len(text)}


def summary(path: str | os.PathLike, max_bytes: int) -> tuple[dict, dict] | None:
    """(header, last commit record) of a version-3 file, read from its first and last bytes only (the listing);
    None when the file is not one (a version-1/2 file: parse it whole). Raises LogError, OSError."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        first = f.read(4096)
        try:
            start = first.decode("utf-8", errors="strict") if b"\n" not in first else \
                first[:first.index(b"\n")].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if not is_log(start.lstrip("\ufeff")):
            return None
        if st.st_size > max_bytes:
            raise LogError(f"too large for a session file ({st.st_size >> 20} MiB; the limit is {max_bytes >> 20} MiB)")
        if b"\n" not in first:
            raise LogError("no complete save in it (no commit line)")
        head = _loads(start.lstrip("\ufeff"), 1)
        end, tail = st.st_size, b""
        while end > 0:
            step = min(TAIL_BLOCK, end)
            f.seek(end - step)
            tail = f.read(step) + tail
            end -= step
            lines = tail.split(b"\n")
            for raw in reversed(lines[1:]):          # lines[0] may be cut short (or is the header)
                rec = _commit_of(raw.decode("utf-8", errors="replace"))
                if rec is not None:
                    if not isinstance(head, dict):
                        raise LogError("line 1: not a version-3 session header")
                    return head, rec
        raise LogError("no complete save in it (no commit line)")
