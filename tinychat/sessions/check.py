"""The one set of rules a session file's content must follow, beyond field types (read.py checks those): the
sampler settings by type and range (as the flags are checked), the order of messages, and the token ids against a
model's vocabulary. `session.load` applies the first two to every file it reads, so `--session`, `sessions show`,
`replay` and the app all accept and refuse the same files; the vocabulary check needs the model and runs when a
chat restores or replays a session.

Each function returns a problem as text ('field messages[3].settings.ban must be a boolean, got 'no'') or None;
read.py or session.py turns it into a SessionError naming the file. Torch-free."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..jsonfields import is_int, show
from ..settings import DEAD_END_RULES, ChatSettings

MAX_SEED = 2**63 - 1             # the flags' range (ChatSettings): a file may not hold a seed the chat cannot take

_NUMBERS = ("temperature", "top_p", "penalty")
_INTEGERS = ("penalty_window", "max_new")
_BOOLS = tuple(f.name for f in dataclasses.fields(ChatSettings) if f.type in (bool, "bool"))   # ban, no_parrot, ...


def seed_ok(v: Any) -> bool:
    return is_int(v) and 0 <= v <= MAX_SEED


def sampler_problem(d: dict, prefix: str) -> str | None:
    """Known sampler keys of a settings object, by type and range; unknown keys are ignored (newer files)."""
    for key in _NUMBERS:
        if key in d:
            v, (lo, hi) = d[key], ChatSettings.LIMITS[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"field {prefix}{key} must be a number, got {show(v)}"
            if not lo <= v <= hi:
                return f"field {prefix}{key} must be between {lo:g} and {hi:g}, got {show(v)}"
    for key in _INTEGERS:
        if key in d:
            v, (lo, hi) = d[key], ChatSettings.LIMITS[key]
            if not is_int(v):
                return f"field {prefix}{key} must be an integer, got {show(v)}"
            if not lo <= v <= hi:
                return f"field {prefix}{key} must be between {lo:g} and {hi:g}, got {show(v)}"
    for key in _BOOLS:
        if key in d and not isinstance(d[key], bool):
            return f"field {prefix}{key} must be true or false, got {show(d[key])}"
    if "seed" in d and d["seed"] is not None and not seed_ok(d["seed"]):
        return f"field {prefix}seed must be an integer in 0..2^63-1 or null, got {show(d['seed'])}"
    if "system_prompt" in d and not isinstance(d["system_prompt"], str):
        return f"field {prefix}system_prompt must be a string, got {show(d['system_prompt'])}"
    if "step" in d and d["step"] is not None and not isinstance(d["step"], str):
        return f"field {prefix}step must be a string or null, got {show(d['step'])}"
    if "dead_end" in d and d["dead_end"] not in DEAD_END_RULES:
        return f"field {prefix}dead_end must be one of {', '.join(DEAD_END_RULES)}, got {show(d['dead_end'])}"
    return None


def order_problem(messages: list, start: int = 0) -> str | None:
    """Messages (objects with role / settings / seed) in the order a chat writes them: an optional system message
    first, then user, assistant, user, assistant ...; each assistant turn with its settings and seed, and a
    `context_start` (a shortened context) pointing at an earlier user message. start: check from that index on (those
    before it are known to follow the rules: a save after messages were appended)."""
    first = 1 if messages and messages[0].role == "system" else 0
    if len(messages) == 1 and first == 1:
        return None
    i = first if start <= first else start - (start - first) % 2        # from the turn holding `start`
    while i < len(messages):
        m = messages[i]
        if m.role != "user":
            return f"messages[{i}] is a {m.role} message where a user message must come (a system message may " \
                   f"only come first; turns alternate user, assistant)"
        if i + 1 >= len(messages):
            return f"messages[{i}] is a user message without a reply"
        r = messages[i + 1]
        if r.role != "assistant":
            return f"messages[{i + 1}] is a {r.role} message where the reply to messages[{i}] must come"
        where = f"messages[{i + 1}]."
        if r.settings is None:
            return f"field {where}settings must be an object for an assistant message, got null"
        if r.seed is None:
            return f"field {where}seed must be an integer for an assistant message, got null"
        problem = sampler_problem(r.settings, where + "settings.")
        if problem:
            return problem
        at = r.settings.get("context_start")     # a user message's index: first, first + 2, ..., up to i
        if at is not None and not (is_int(at) and first <= at <= i and not (at - first) % 2):
            return f"field {where}settings.context_start must be the index of a user message up to {i}, " \
                   f"got {show(at)}"
        i += 2
    return None


def vocab_problem(messages: list, vocab_size: int, name: str = "messages") -> str | None:
    """The first token id the model has no row for, named by message and position."""
    for i, m in enumerate(messages):
        for j, t in enumerate(m.token_ids):
            if t >= vocab_size:
                return f"{name}[{i}].token_ids[{j}] = {t} is outside the model's vocabulary (0..{vocab_size - 1})"
        if m.fork is not None and m.fork["token"] >= vocab_size:
            return f"{name}[{i}].fork.token = {m.fork['token']} is outside the model's vocabulary (0..{vocab_size - 1})"
    return None


def fork_ok(v: Any) -> bool:
    """A fork record: {"position": n, "token": id}, both non-negative integers."""
    return isinstance(v, dict) and set(v) == {"position", "token"} and all(is_int(x) and x >= 0 for x in v.values())


def fork_problem(m: Any) -> str | None:
    """A fork record (a valid shape) on a message it cannot belong to: only a reply is forked, at a position within
    its tokens (the frame's tokens bound it; replay checks it against the reply's content)."""
    if m.fork is None:
        return None
    if m.role != "assistant":
        return f"is only for a reply, not a {m.role} message"
    if m.fork["position"] >= len(m.token_ids):
        return f"position {m.fork['position']} is past the message's {len(m.token_ids):,} tokens"
    return None


def tree_problem(messages: list, branches: list) -> str | None:
    """The tree of a version-2 file: unique ids, the active path (`messages`) linked in order, every branch message
    linked to a message that exists (no cycles), and every path from a root to a leaf in chat order.

    Linear in the number of messages: one walk down from the roots gives each message its place on its path (its
    parent's plus one), and a message's rules depend only on that place and on whether its path starts with a system
    message, so each message is checked once however many paths share it (walking each branch up to the active path
    was quadratic: a 30,000-message chain took minutes). Only a problem found is described along a whole path."""
    ids = [m.id for m in messages] + [m.id for m in branches]
    if len(set(ids)) != len(ids):
        seen: dict[int, str] = {}
        for name, msgs in (("messages", messages), ("branches", branches)):
            for i, m in enumerate(msgs):
                if m.id in seen:
                    return f"field {name}[{i}].id = {m.id} is also the id of {seen[m.id]}"
                seen[m.id] = f"{name}[{i}]"
    prev = None
    for i, m in enumerate(messages):
        if m.parent != prev:
            return f"field messages[{i}].parent must be {show(prev)} (the message before it), got {show(m.parent)}"
        prev = m.id
    known = set(ids)
    for i, m in enumerate(branches):
        if m.parent is not None and m.parent not in known:
            return f"field branches[{i}].parent = {m.parent} names no message (a broken parent link)"
    kids: dict[int | None, list] = {}
    for m in messages:
        kids.setdefault(m.parent, []).append(m)
    for m in branches:
        kids.setdefault(m.parent, []).append(m)
    # (message, its index on its path, 1 when its path starts with a system message); each message's rule follows
    # from its index (order_problem's rules, one message at a time)
    stack = [(m, 0, int(m.role == "system")) for m in kids.get(None, ())]
    reached = 0
    while stack:
        m, i, first = stack.pop()
        reached += 1
        below = kids.get(m.id)
        k = i - first
        if k >= 0:
            if not k & 1:
                if m.role != "user" or not below:
                    return _describe(m, messages, branches, kids)
            elif m.role != "assistant" or _reply_problem(m, i, first):
                return _describe(m, messages, branches, kids)
        if below:
            i += 1
            stack.extend([(c, i, first) for c in below])
    if reached < len(ids):              # what no root reaches hangs in (or from) a loop of parent links
        on_tree = _reachable(kids)
        for i, m in enumerate(branches):
            if m.id not in on_tree:
                return f"field branches[{i}].parent: the parent links form a cycle"
    return None


def _reply_problem(m: Any, i: int, first: int) -> bool:
    """A reply at index i of its path without its settings and seed, or with a context_start that is not a user
    message before it."""
    st = m.settings
    if st is None or m.seed is None or sampler_problem(st, ""):
        return True
    start = st.get("context_start")
    return start is not None and not (is_int(start) and first <= start < i and not (start - first) & 1)


def _reachable(kids: dict) -> set:
    out, todo = set(), list(kids.get(None, ()))
    while todo:
        m = todo.pop()
        out.add(m.id)
        todo.extend(kids.get(m.id, ()))
    return out


def _describe(bad: Any, messages: list, branches: list, kids: dict) -> str:
    """The problem at message `bad`, told along the path from a root to a leaf below it (as order_problem tells it)."""
    leaf = bad
    while kids.get(leaf.id):
        leaf = kids[leaf.id][-1]
    nodes = {m.id: m for m in list(messages) + list(branches)}
    path = [leaf]
    while path[-1].parent is not None:
        path.append(nodes[path[-1].parent])
    path.reverse()
    problem = order_problem(path) or f"messages[{path.index(bad)}] breaks the chat order"
    i = next((j for j, m in enumerate(branches) if m is leaf), None)
    if i is None:
        return problem
    return f"the branch ending at branches[{i}]: {problem} (indices along that branch)"



def text_problem(messages: list, tok: Any, name: str = "messages", frames_only: bool = False) -> str | None:
    """The first message whose text is not what its token ids hold (replay regenerates from the ids, while `sessions
    show`, export and --grep show the text: a reply edited to say something else still replayed "token-exact"), or
    whose ids lack the chat frame. A user or system message's ids are its text framed (tok.message_ids), and so are
    an edited reply's (it was written, not sampled); a sampled reply's ids are the chat frame around the sampled
    tokens, whose decoding is its text. frames_only: only the frames (replay tells each turn's text itself).
    The ids must be within the vocabulary already (vocab_problem)."""
    gen, end = tok.generation_prompt_ids(), tok.end_ids()
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.finish != "edited" and not _framed(m.token_ids, gen, end):
            return f"{name}[{i}]: a reply whose token ids lack the chat frame (the assistant header and the end)"
        if not frames_only and not text_matches(m, tok, gen, end):
            return f"{name}[{i}]: its text is not what its token ids hold (the file was edited by hand?)"
    return None


def _framed(ids: list, gen: list, end: list) -> bool:
    return len(ids) >= len(gen) + len(end) and ids[:len(gen)] == gen and ids[len(ids) - len(end):] == end


def text_matches(m: Any, tok: Any, gen: list | None = None, end: list | None = None) -> bool:
    """Is message m's text what its token ids hold? (text_problem's rule for one message.)"""
    if m.role != "assistant" or m.finish == "edited":
        return m.token_ids == tok.message_ids(m.role, m.content)
    gen = tok.generation_prompt_ids() if gen is None else gen
    end = tok.end_ids() if end is None else end
    ids = m.token_ids
    return _framed(ids, gen, end) and tok.decode(ids[len(gen):len(ids) - len(end)], skip_special=True) == m.content
