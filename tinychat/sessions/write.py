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

No torch; nothing from session.py (it hands its checks in), so no import cycle."""
from __future__ import annotations

import json
import operator
import re
from typing import Any, Callable

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
    session._valid = (list(session.messages), list(session.branches))


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
    unchanged = valid is not None and len(msgs) >= n and len(branches) == len(valid[1]) and \
        all(map(operator.is_, branches, valid[1])) and all(map(operator.is_, msgs[:n], valid[0]))
    if unchanged:                       # only messages appended to the active path: their order, from where it was good
        problem = order_problem(msgs, start=n)
    else:
        problem = order_problem(msgs) or tree_problem(msgs, branches)
    if problem:
        raise error(f"{where}: {problem}")
    known_good(session)
