"""The sampler A/B (issue #14): decode the last user turn twice with one seed, the chat's settings (side A) against
changed ones (side B), and say at which token the two replies part and why, from the two sides' traces.

How the sides are kept: each side is a regeneration of the last reply (Chat.regenerate with that side's settings
and the shared seed), so both become siblings of the reply that was there (which stays, as every alternative does).
Each records its own settings and seed, so `replay --check` reproduces it like any other reply. After the A/B,
side A is the active reply; `keep(chat, result, "B")` makes B active instead (A stays a sibling). The chat's own
settings never change here: `keep(..., adopt=True)` applies B's changes from the next turn.

Why two tokens differ at the first differing position j (the prefixes are equal, so are the phrase-ban contexts):
A's token is banned, penalised or cut by top-p on side B (or B's on side A), read off the traces at j; when none
is, the same seeded draw landed on another token because the distribution changed (temperature, or a penalty or
ban that moved probability mass among other candidates)."""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..sessions import tree
from ..sampler import BAN_N, TRACE_TOP, TokenTrace
from ..settings import ChatError, ChatSettings
from ..textsafe import safe_line

if TYPE_CHECKING:
    from .runtime import Chat

FIXED = {"system_prompt": "a new system prompt applies from the next new chat, not to an A/B of this turn",
         "seed": "both sides use one seed: /set seed N chooses it (else a fresh one is drawn for the pair)"}


@dataclass
class Side:
    """One decode of the A/B."""
    name: str                       # "A" (the chat's settings) or "B" (the changed ones)
    settings: ChatSettings          # what this side was sampled with (seed: the shared one)
    tokens: list[int]               # sampled content tokens (the stop token excluded)
    text: str
    finish: str                     # "stop", "length" or "cancelled"
    traces: list[TokenTrace] = field(default_factory=list)   # one per draw, the stop token's included
    message_id: int = 0             # the reply in the session tree
    before: str = ""                # the text before the first differing token (the whole text when none differs)
    token_text: str = ""            # the first differing token ("" when none, or this side had ended there)
    after: str = ""                 # the text after it


@dataclass
class ABResult:
    a: Side
    b: Side
    seed: int
    changes: dict[str, str]         # setting (field name) -> the value given, as typed
    diff: int | None                # first token index where the sides differ (None: identical replies)
    cause: str                      # why they differ there, one line (or why they do not)
    kept: str = "A"                 # the side that is the active reply

    @property
    def label(self) -> str:
        """'top-p=0.5 penalty=1.5': side B's changes."""
        return " ".join(f"{k.replace('_', '-')}={v}" for k, v in self.changes.items())

    def side(self, name: str) -> Side:
        return self.a if name.upper() == "A" else self.b

    def summary(self) -> dict:
        """A JSON-able record (the plain mode's --json)."""
        def one(s: Side) -> dict:
            return {"text": s.text, "n_tokens": len(s.tokens), "finish": s.finish, "message_id": s.message_id,
                    "settings": {k: v for k, v in s.settings.sampler().items()}}
        return {"ab": {"seed": self.seed, "changes": self.label, "first_difference": self.diff, "cause": self.cause,
                       "kept": self.kept, "a": one(self.a), "b": one(self.b)}}


def parse_changes(chat: Chat, changes: dict[str, str]) -> tuple[ChatSettings, dict[str, str]]:
    """Side B's settings from KEY=VALUE changes to the chat's (the `/set` parser): (settings, {field: value}).
    ChatError, one line, for an unknown key, a bad value, or a setting an A/B cannot vary."""
    if not changes:
        raise ChatError("usage: /ab KEY=VALUE [...] (e.g. /ab top-p=0.5 penalty=1.5)")
    st = chat.settings
    named: dict[str, str] = {}
    for key, value in changes.items():
        name = ChatSettings.field_name(key)
        if name in FIXED:
            raise ChatError(f"/ab cannot vary {key}: {FIXED[name]}")
        st = st.with_value(key, value)
        named[name] = value
    if st.max_new != chat.settings.max_new:
        chat.check_max_new(st.max_new)
    return st, named


def run_ab(chat: Chat, changes: dict[str, str], on_token=None) -> ABResult:
    """Decode the last user turn with the chat's settings (A) and with `changes` (B), one seed for both, traces on;
    both replies become alternatives of the last reply, A the active one. on_token(side, index, token, text, trace,
    ms) while a side decodes. ChatError for bad changes or no turn to compare (nothing changed then)."""
    settings_b, named = parse_changes(chat, changes)
    msgs = chat.session.messages
    if len(msgs) < 2 or msgs[-1].role != "assistant":
        raise ChatError("no reply to compare yet: send a message first")
    seed = chat.settings.seed if chat.settings.seed is not None else random.SystemRandom().randrange(2 ** 63)
    sides = []
    for name, st in (("A", chat.settings), ("B", settings_b)):
        st = dataclasses.replace(st, seed=seed)
        cb = None if on_token is None else (lambda *a, _n=name: on_token(_n, *a))
        res = chat.regenerate(on_token=cb, trace=True, settings=st)
        side = Side(name, st, list(res.token_ids), res.text, res.finish, list(res.traces),
                    chat.session.messages[-1].id)
        sides.append(side)
        if res.finish == "cancelled":
            break
    if len(sides) < 2:
        raise ChatError("A/B stopped: side A was kept as an alternative of the reply, side B was not decoded")
    a, b = sides
    keep(chat, a)
    diff = first_difference(a, b, chat.stop_id)
    result = ABResult(a, b, seed, named, diff, explain(a, b, diff, chat))
    for s in (a, b):
        _split_text(s, diff, chat)
    return result


def keep(chat: Chat, side: Side, adopt: bool = False, changes: dict[str, str] | None = None) -> tuple[int, int]:
    """Make `side`'s reply the active one (the other stays a sibling); returns its (place, count) among the
    alternatives. adopt: also apply `changes` (side B's) to the chat's settings from the next turn."""
    index = len(chat.session.messages) - 1
    sibs, at = tree.siblings(chat.session, index)
    to = next((i for i, m in enumerate(sibs) if m.id == side.message_id), None)
    if to is None:
        raise ChatError("that reply is no longer an alternative of the last turn")
    place = chat.switch_alternative(to + 1) if to != at else (at + 1, len(sibs))
    if adopt:
        for k, v in (changes or {}).items():
            chat.set(k, v)
    return place


def keep_side(chat: Chat, result: ABResult, name: str, adopt: bool = False) -> tuple[int, int]:
    """keep() by the side's name ("A" or "B"); records which side is kept in the result."""
    side = result.side(name)
    place = keep(chat, side, adopt=adopt and side is result.b, changes=result.changes)
    result.kept = side.name
    return place


def place_of(chat: Chat, side: Side) -> int | None:
    """The 1-based place of `side`'s reply among the last reply's alternatives (None: not one of them)."""
    sibs, _ = tree.siblings(chat.session, len(chat.session.messages) - 1)
    return next((i + 1 for i, m in enumerate(sibs) if m.id == side.message_id), None)


def _drawn(side: Side, stop: int) -> list[int]:
    """The side's draws: its tokens, and the stop token when it stopped by itself."""
    return side.tokens + ([stop] if side.finish == "stop" else [])


def first_difference(a: Side, b: Side, stop: int) -> int | None:
    """The first draw where the sides differ (one side having ended there counts), None when they are equal."""
    da, db = _drawn(a, stop), _drawn(b, stop)
    for j in range(max(len(da), len(db))):
        if j >= len(da) or j >= len(db) or da[j] != db[j]:
            return j
    return None


def _candidate(tr: TokenTrace | None, token: int):
    return next((c for c in tr.candidates if c.token == token), None) if tr is not None else None


def _trace(side: Side, j: int) -> TokenTrace | None:
    return next((t for t in side.traces if t.index == j), None)


def explain(a: Side, b: Side, j: int | None, chat: Chat) -> str:
    """Why the sides part at draw j, one line (see the module's doc for the rules)."""
    if j is None:
        return "no difference: both sides sampled the same tokens"
    tok = chat.tok

    def q(t: int) -> str:
        return "«end»" if t == chat.stop_id else f"«{safe_line(tok.decode([t]))}»"

    da, db = _drawn(a, chat.stop_id), _drawn(b, chat.stop_id)
    for s, d in ((a, da), (b, db)):
        if j >= len(d):
            why = f"max-new {s.settings.max_new:,}" if s.finish == "length" else "it was stopped"
            return f"side {s.name} ended at token {j} ({why})"
    ta, tb = da[j], db[j]
    tra, trb = _trace(a, j), _trace(b, j)
    prefix = da[:j]
    for mine, tr_mine, other, tr_other, t in ((a, tra, b, trb, ta), (b, trb, a, tra, tb)):
        if tr_other is not None and t in tr_other.banned:
            gram = prefix[-(BAN_N - 1):] + [t]
            return f"{mine.name}'s {q(t)} is banned on side {other.name} by the {BAN_N}-gram " \
                   f"«{safe_line(tok.decode(gram))}»"
    for mine, tr_mine, other, tr_other, t in ((a, tra, b, trb, ta), (b, trb, a, tra, tb)):
        if tr_other is None:
            continue
        c_other, c_mine = _candidate(tr_other, t), _candidate(tr_mine, t)
        why = []
        pen_o = c_other is not None and c_other.penalised and other.settings.penalty != 1.0
        pen_m = c_mine is not None and c_mine.penalised and mine.settings.penalty != 1.0
        if pen_o and not (pen_m and mine.settings.penalty == other.settings.penalty):
            why.append(f"penalised (x{other.settings.penalty:g}" +
                       (f", x{mine.settings.penalty:g} on {mine.name})" if pen_m else f"; not on {mine.name})"))
        if other.settings.temperature > 0 and _cut(tr_other, t) and not _cut(tr_mine, t):   # greedy: no nucleus
            why.append(f"top-p cut (top-p {other.settings.top_p:g})")
        if why:
            return f"{mine.name}'s {q(t)} is {' and '.join(why)} on side {other.name}"
    greedy = [s for s in (a, b) if s.settings.temperature <= 0]
    if len(greedy) == 2:
        how = "both sides take their most likely token, and it moved"
    elif greedy:
        drawn = b if greedy[0] is a else a
        how = f"{greedy[0].name} takes its most likely token, {drawn.name} draws at temperature " \
              f"{drawn.settings.temperature:g}"
    else:
        how = "the same seeded draw landed on another token as the distribution changed"
    return f"a different draw: {how} (p {q(ta)} {_p(tra, ta)} on A, {_p(trb, ta)} on B; " \
           f"{q(tb)} {_p(tra, tb)} on A, {_p(trb, tb)} on B)"


def _top_final(tr: TokenTrace) -> list:
    """The trace's candidates with the TRACE_TOP highest final probabilities (the trace holds all of those)."""
    return sorted(tr.candidates, key=lambda c: -c.p_final)[:TRACE_TOP]


def _cut(tr: TokenTrace | None, t: int) -> bool:
    """Token t was outside this draw's top-p nucleus. A token the trace does not list lies below its TRACE_TOP
    highest final probabilities: cut when one of those already is."""
    if tr is None:
        return False
    c = _candidate(tr, t)
    if c is not None:
        return not c.in_nucleus
    return any(not c.in_nucleus for c in _top_final(tr))


def _p(tr: TokenTrace | None, t: int) -> str:
    """Token t's final probability at this draw ('<x': below the trace's listed candidates, '?': no trace)."""
    if tr is None:
        return "?"
    c = _candidate(tr, t)
    if c is not None:
        return f"{c.p_final:.2f}"
    top = _top_final(tr)
    return f"<{top[-1].p_final:.2f}" if top else "?"


def _split_text(side: Side, j: int | None, chat: Chat) -> None:
    """The side's text around its first differing token (for display)."""
    tok = chat.tok
    if j is None or j > len(side.tokens):
        side.before, side.token_text, side.after = side.text, "", ""
        return
    side.before = tok.decode(side.tokens[:j], skip_special=True)
    if j == len(side.tokens):
        side.token_text = "«end»" if side.finish == "stop" else ""
        side.after = ""
        return
    side.token_text = tok.decode([side.tokens[j]], skip_special=True)
    side.after = tok.decode(side.tokens[j + 1:], skip_special=True)
