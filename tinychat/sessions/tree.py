"""A session as a tree of messages (schema v2): `session.messages` is the active path (root first), and
`session.branches` holds every message off it. Each message has an `id` (int >= 1, unique in the session, in
creation order) and a `parent` (the id of the message before it on its path, None for a root). The active path's
parent links follow its order; a branch message's link is what ties it into the tree.

Siblings are the messages that share a parent (and so a role): the alternatives of a reply are its siblings,
ordered by id (the order they were made in). Torch-free; the chat runtime (chat.py) moves the cache along."""
from __future__ import annotations

import operator
from typing import Any

_ID = operator.attrgetter("id")
_ROLE = operator.attrgetter("role")


def link(session: Any) -> None:
    """Give every message without an id (0) the next free one, and set the active path's parent links.

    Remembers what it linked (`session._linked`): when the branches are the same objects and the active path starts
    with the one it linked, only the messages after that are looked at (an autosave after a turn on a 100,000-message
    path; ids once given never change, and a path message's parent follows from the one before it)."""
    msgs, branches = session.messages, session.branches
    memo = session.__dict__.get("_linked")
    if memo is not None and len(msgs) >= len(memo[0]) and len(branches) == len(memo[1]) \
            and all(map(operator.is_, branches, memo[1])) and all(map(operator.is_, msgs, memo[0])):
        start, nxt = len(memo[0]), memo[2]
        tail = msgs[start:]
        nxt = max(nxt, max(map(_ID, tail), default=0) + 1)
        for m in tail:
            if m.id == 0:
                m.id, nxt = nxt, nxt + 1
        prev = msgs[start - 1].id if start else None
        for m in tail:
            if m.parent != prev:
                m.parent = prev
            prev = m.id
        turns = memo[3] + operator.countOf(map(_ROLE, tail), "user")
    else:
        nxt = _link_all(session)
        memo = None
        turns = operator.countOf(map(_ROLE, msgs), "user")
    session._link_same = memo        # the lists as last linked, when now they only have messages added to the path
    session._linked = (list(msgs), list(branches), nxt, turns)


def turns(session: Any) -> int:
    """The number of user messages on the active path (link() counted them, if the lists are as it saw them)."""
    if linked_lists(session) is not None:
        return session._linked[3]
    return operator.countOf(map(_ROLE, session.messages), "user")


def already_linked(session: Any) -> None:
    """Record that the session's ids and active-path links are what link() would make them (a version-2 or -3 file
    just read: its tree was checked), so that the first save after a restore compares instead of linking again."""
    msgs, branches = session.messages, session.branches
    nxt = max(max(map(_ID, msgs), default=0), max(map(_ID, branches), default=0)) + 1
    session._link_same = None
    session._linked = (list(msgs), list(branches), nxt, operator.countOf(map(_ROLE, msgs), "user"))


def linked_lists(session: Any) -> tuple[list, list] | None:
    """Copies of (messages, branches) as link() last saw them, if they are still what the session holds (cheap
    checks: lengths and last objects); None otherwise. Savers keep these instead of copies of their own, so that
    link's one comparison tells them what changed since (sessions/write.py)."""
    memo = session.__dict__.get("_linked")
    if memo is None:
        return None
    for now, then in ((session.messages, memo[0]), (session.branches, memo[1])):
        if len(now) != len(then) or (now and now[-1] is not then[-1]):
            return None
    return memo[0], memo[1]


def unchanged_since(session: Any, lists: tuple[list, list]) -> bool:
    """Whether the session's lists are `lists` (as linked_lists gave them) with only messages added to the active
    path: what link() found, without another comparison."""
    same = session.__dict__.get("_link_same")
    return same is not None and same[0] is lists[0] and same[1] is lists[1]


def _link_all(session: Any) -> int:
    """link() over the whole tree; returns the next free id."""
    lists = (session.messages, session.branches)
    ids = [list(map(_ID, msgs)) for msgs in lists]
    nxt = max(max(ids[0], default=0), max(ids[1], default=0)) + 1
    if 0 in ids[0] or 0 in ids[1]:      # new messages: found by C-level searches, not a Python loop over the tree
        for msgs, got in zip(lists, ids):
            i = -1
            while True:
                try:
                    i = got.index(0, i + 1)
                except ValueError:
                    break
                msgs[i].id, nxt = nxt, nxt + 1
    prev = None
    for m in session.messages:
        if m.parent != prev:
            m.parent = prev
        prev = m.id
    return nxt


def children(session: Any) -> dict[int | None, list]:
    """parent id -> its children (active path and branches), in id order."""
    out: dict[int | None, list] = {}
    for m in list(session.messages) + list(session.branches):
        out.setdefault(m.parent, []).append(m)
    for kids in out.values():
        kids.sort(key=lambda m: m.id)
    return out


def siblings(session: Any, index: int) -> tuple[list, int]:
    """The alternatives of the active path's message `index` (itself included, in id order) and its place there."""
    link(session)
    m = session.messages[index]
    sibs = children(session).get(m.parent, [m])
    return sibs, next(i for i, s in enumerate(sibs) if s is m)


def switch(session: Any, index: int, target: Any) -> None:
    """Make `target` (a sibling of messages[index]) active: the path from `index` on moves to the branches, and the
    new path follows target, then at each step its newest child, down to a leaf."""
    link(session)
    if index < 0 or index >= len(session.messages) or target.parent != session.messages[index].parent:
        raise ValueError("not an alternative of that message")
    kids = children(session)
    path = [target]
    while kids.get(path[-1].id):
        path.append(kids[path[-1].id][-1])
    on = {id(m) for m in path}
    session.branches = [m for m in session.branches if id(m) not in on] + session.messages[index:]
    session.messages[index:] = path


def prune(session: Any) -> None:
    """Drop the branch messages no longer tied to the tree (their parent is gone), e.g. after an undo."""
    link(session)
    live = {m.id for m in session.messages}
    pending = list(session.branches)
    kept: list = []
    changed = True
    while changed:
        changed = False
        for m in list(pending):
            if m.parent is None or m.parent in live:
                live.add(m.id)
                kept.append(m)
                pending.remove(m)
                changed = True
    session.branches = sorted(kept, key=lambda m: m.id)


def paths(session: Any) -> list[list]:
    """Every root-to-leaf path, the active path first, then the others in id order of their leaves."""
    link(session)
    nodes = {m.id: m for m in list(session.messages) + list(session.branches)}
    kids = children(session)
    leaves = [m for m in nodes.values() if not kids.get(m.id)]
    active_leaf = session.messages[-1] if session.messages else None
    out = [list(session.messages)]
    for leaf in sorted(leaves, key=lambda m: m.id):
        if leaf is active_leaf:
            continue
        path = [leaf]
        while path[-1].parent is not None:
            path.append(nodes[path[-1].parent])
        out.append(path[::-1])
    return out


def describe_path(session: Any, path: list) -> str:
    """Where a path forks off: 'turn 2 reply 2/3' for each message that has siblings, '(forked at token 4)' added for
    a reply forked at a token ('the only path' when none has siblings)."""
    kids = children(session)
    parts = []
    turn = 0
    for m in path:
        if m.role == "user":
            turn += 1
        sibs = kids.get(m.parent, [m])
        if len(sibs) > 1:
            what = "reply" if m.role == "assistant" else "message"
            at = next(i for i, s in enumerate(sibs) if s is m)
            fork = f" (forked at token {m.fork['position']})" if getattr(m, "fork", None) else ""
            parts.append(f"turn {turn} {what} {at + 1}/{len(sibs)}{fork}")
    return ", ".join(parts) or "the only path"
