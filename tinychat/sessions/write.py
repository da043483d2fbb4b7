"""A session file's bytes, built fast enough to autosave a big tree after every turn (issue #33: a 10,000-message
tree took 40 s a save, re-validated and pretty-printed whole).

Layout: the session's own fields indented for people (session._dumps); each message on one line of its own (one
json.dumps call per message: five times faster than a pretty-printer in Python, and a long list of messages reads
as one). DEL and the C1 controls are written as \\u escapes, as in the rest of the file.

Only what changed is encoded: the messages of `messages` and of `branches` go in chunks of CHUNK, and each chunk's
bytes stay on the session object until one of its messages is another object or has another id or parent (the
only fields a message's owner changes once it exists: session_tree.link; the message objects are otherwise never
modified). What load would refuse is never written, checked as cheaply: the session's own fields every save, each
message when its chunk is encoded (by the rules load applies), and the tree's order (session_check.tree_problem,
linear) only when the tree changed other than by messages appended to the active path: those are checked from
where the path was last known good. A session read by session.load starts known good.

A big session is a log instead (sessions/log.py, version 3): `append` gives the lines that bring the file from what
this process last read or wrote to the session as it is now, `encode_log` the whole file (the first save of a big
session, and the compaction of a log holding too many lines that no longer count).

No torch; nothing from session.py (it hands its checks in), so no import cycle."""
from __future__ import annotations

import json
import operator
import re
from typing import Any, Callable

from . import log as session_log
from . import tree as session_tree
from .check import order_problem, tree_problem

CHUNK = 256
_C1 = re.compile("[\x7f-\x9f]")
_ID, _PARENT = operator.attrgetter("id"), operator.attrgetter("parent")
_FIELDS = ("role", "content", "token_ids", "created", "settings", "seed", "finish", "timing_ms", "id", "parent", "fork")
_MARK = "\x00%s list\x00"           # where a message list goes in the header's text (a string no field can hold)


def message_dict(m: Any) -> dict:
    """A message as the file holds it (session.Message.to_dict without the deep copy)."""
    return {k: getattr(m, k) for k in _FIELDS}


def encode(session: Any, header: dict, where: str, dumps: Callable[[Any], str],
           check_message: Callable[[dict, str], None], error: type[Exception]) -> list[bytes]:
    """The file's bytes, in pieces (to be written one after the other: no 50 MB join). header: every field but the two message lists (already checked by the caller); dumps: the
    pretty JSON of the header (session._dumps); check_message(dict, field path) raises `error` for a message load
    would refuse. Raises `error` for a tree load would refuse."""
    state = session.__dict__.setdefault("_encoded", {"messages": [], "branches": []})
    lists = {}
    for name in ("messages", "branches"):
        msgs = getattr(session, name)
        chunks = _chunks(msgs, state[name], name, check_message, error, where)
        lists[name] = [b"[]"] if not msgs else [b"[\n", *_between(chunks, b",\n"), b"\n  ]"]
    _check_tree(session, where, error)
    text = dumps({**header, "messages": _MARK % "messages", "branches": _MARK % "branches"}) + "\n"
    head, rest = text.encode("utf-8").split(json.dumps(_MARK % "messages").encode("ascii"))
    middle, tail = rest.split(json.dumps(_MARK % "branches").encode("ascii"))
    return [head, *lists["messages"], middle, *lists["branches"], tail]


def _between(items: list, sep: bytes) -> list:
    out = [sep] * (2 * len(items) - 1)
    out[::2] = items
    return out


def known_good(session: Any) -> None:
    """Record that the session's tree as it is now follows the rules (it was just read and checked)."""
    session._valid = session_tree.linked_lists(session) or (list(session.messages), list(session.branches))


def _chunks(msgs: list, cache: list, name: str, check_message, error, where) -> list[bytes]:
    out = []
    for c, start in enumerate(range(0, len(msgs), CHUNK)):
        part = msgs[start:start + CHUNK]
        key = (tuple(part), tuple(map(_ID, part)), tuple(map(_PARENT, part)))
        if c < len(cache) and _same(cache[c][0], key):
            out.append(cache[c][1])
            continue
        lines = []
        for i, m in enumerate(part, start):
            d = message_dict(m)
            check_message(d, f"{name}[{i}].")
            try:
                line = json.dumps(d, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise error(f"{where}: cannot serialize {name}[{i}] ({' '.join(str(e).split())})") from None
            lines.append("    " + _C1.sub(lambda x: f"\\u{ord(x.group()):04x}", line))
        data = ",\n".join(lines).encode("utf-8")
        if c < len(cache):
            cache[c] = (key, data)
        else:
            cache.append((key, data))
        out.append(data)
    del cache[len(out):]
    return out


def _same(a: tuple, b: tuple) -> bool:
    """The same message objects (by identity: the objects are kept, so their addresses are never reused) with the same
    ids and parents."""
    return len(a[0]) == len(b[0]) and all(map(operator.is_, a[0], b[0])) and a[1] == b[1] and a[2] == b[2]


def _check_tree(session: Any, where: str, error) -> None:
    msgs, branches = session.messages, session.branches
    valid = getattr(session, "_valid", None)
    n = len(valid[0]) if valid is not None else 0
    unchanged = valid is not None and (session_tree.unchanged_since(session, valid) or (
        len(msgs) >= n and len(branches) == len(valid[1]) and
        all(map(operator.is_, branches, valid[1])) and all(map(operator.is_, msgs[:n], valid[0]))))
    if unchanged:                       # only messages appended to the active path: their order, from where it was good
        problem = order_problem(msgs, start=n)
    else:
        problem = order_problem(msgs) or tree_problem(msgs, branches)
    if problem:
        raise error(f"{where}: {problem}")
    known_good(session)


# -- version 3: the log (sessions/log.py) --------------------------------------------------------------------------

COMPACT_SLACK = 256                 # dead lines a log may hold beyond a quarter of its live ones before a rewrite


def encode_log(session: Any, fields: dict, where: str, check_message: Callable[[dict, str], None],
               error: type[Exception], turns: int) -> list[bytes]:
    """The whole log file of the session (header, every message, one commit), every message checked as load checks
    it and the tree too. fields: the session's own fields as the commit holds them (already checked)."""
    lines = [session_log.header(session.id)]
    for name, kind in (("messages", "path"), ("branches", "branch")):
        for i, m in enumerate(getattr(session, name)):
            d = message_dict(m)
            check_message(d, f"{name}[{i}].")
            lines.append(_line(kind, d, name, i, where, error))
    _check_tree(session, where, error)
    lines.append(_commit(session, fields, where, error, turns))
    return ["\n".join(lines).encode("utf-8") + b"\n"]


def written(session: Any, size: int, dead: int = 0) -> None:
    """Record that the log file now holds the session as it is (after a load, a rewrite or an append): `size` bytes,
    `dead` lines that no longer count."""
    lists = session_tree.linked_lists(session) or (list(session.messages), list(session.branches))
    session._log = {"messages": lists[0], "branches": lists[1], "size": size, "dead": dead}


def forget(session: Any) -> None:
    """The file is not a log this process can append to (a version-2 file, a torn tail): the next save rewrites it."""
    session.__dict__.pop("_log", None)


def append(session: Any, fields: dict, where: str, check_message: Callable[[dict, str], None],
           error: type[Exception], turns: int, size: int) -> bytes | None:
    """The lines to append to the log file (`size` bytes, as this process last read or wrote it) so that it holds
    the session as it is now, or None when the file should be rewritten whole instead: it is not such a log, or the
    change is most of the file, or the file would hold too many dead lines. The new messages are checked as load
    checks them and the tree as session_write._check_tree does (from where it was last known good).

    A message object once written keeps its id (tree.link gives ids only to new ones) and its parent (the active
    path's follow from its order), so comparing the lists by object identity finds what changed."""
    state = getattr(session, "_log", None)
    if state is None or state["size"] != size:
        return None
    lists = {"messages": session.messages, "branches": session.branches}
    if session_tree.unchanged_since(session, (state["messages"], state["branches"])):     # link() compared them
        keep = {"messages": len(state["messages"]), "branches": len(state["branches"])}
    else:
        keep = {name: _common(lists[name], state[name]) for name in lists}
    live = len(session.messages) + len(session.branches)
    new = sum(len(lists[name]) - keep[name] for name in lists)
    dropped = sum(len(state[name]) - keep[name] for name in lists)
    cut = dropped > 0
    dead = state["dead"] + dropped + cut + 1                # + the commit this one supersedes
    if new > max(COMPACT_SLACK, live // 8) or dead > live // 4 + COMPACT_SLACK:
        return None
    lines = [session_log.dumps({"cut": [keep["messages"], keep["branches"]]})] if cut else []
    for name, kind in (("messages", "path"), ("branches", "branch")):
        for i in range(keep[name], len(lists[name])):
            d = message_dict(lists[name][i])
            check_message(d, f"{name}[{i}].")
            lines.append(_line(kind, d, name, i, where, error))
    _check_tree(session, where, error)
    lines.append(_commit(session, fields, where, error, turns))
    session._log_pending = dead                                         # for written() once the append is done
    return ("\n".join(lines) + "\n").encode("utf-8")


def _common(now: list, then: list) -> int:
    """How many messages `now` starts with that `then` also starts with (the same objects)."""
    n = min(len(now), len(then))
    if n and now[n - 1] is then[n - 1] and all(map(operator.is_, now[:n], then[:n])):
        return n
    return next((i for i, (a, b) in enumerate(zip(now, then)) if a is not b), n)


def _line(kind: str, d: dict, name: str, i: int, where: str, error) -> str:
    try:
        return session_log.dumps({kind: d})
    except (TypeError, ValueError) as e:
        raise error(f"{where}: cannot serialize {name}[{i}] ({' '.join(str(e).split())})") from None


def _commit(session: Any, fields: dict, where: str, error, turns: int) -> str:
    try:
        return session_log.commit(fields, len(session.messages), len(session.branches), turns)
    except (TypeError, ValueError) as e:
        raise error(f"{where}: cannot serialize session ({' '.join(str(e).split())})") from None
