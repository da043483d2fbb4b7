"""The chat's sampler policy on top of the engine's samplers: the phrase ban (3-grams already said), the repetition
penalty's window, the dead-end guard and the per-token trace. Token ids in, token ids out; no text.

`TurnHook` is the `logits_hook` a turn hands to `Decoder.generate`. It has the engine's phrase-ban shape (`table`,
`k`), so the device-graph path matches the ban on the device and keeps its graphs; in the eager loop it is called
before every draw, which is where the dead-end guard, streaming, cancellation and the trace happen."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy
import torch

from .engine import apply_ban_and_penalty
from .settings import DEAD_END_RULES, KEEP_REPLY, LIFT_ALL  # noqa: F401  (what a dead end lifts; see there)

BAN_N = 3                 # the phrase ban's n-gram order: a token is banned after the (n-1) tokens that preceded it
DEAD_END_MIN_MASS = 0.05  # a dead end: the ban would leave less than this probability mass

TRACE_TOP = 8             # candidates recorded per token (the raw top and the final top; a hook given trace=N > 8
                          # records the final top N: `tinychat serve`'s top_logprobs, up to 20)
NUCLEUS_PROBE = 32        # top final probabilities ranked to tell the candidates' nucleus membership


def _host(p: torch.Tensor):
    """A numpy view of a CPU distribution (a copy of a device one): single values read without tensor ops."""
    return p.numpy() if p.device.type == "cpu" else p.cpu().numpy()


def ngram_table(sequences, n: int = BAN_N, table: dict | None = None) -> dict[tuple[int, ...], list[int]]:
    """{(a, b): [c, ...]} for every n-gram (a, b, c) of the given token sequences (each id listed once)."""
    table = {} if table is None else table
    for seq in sequences:
        for i in range(len(seq) - n + 1):
            ctx, nxt = tuple(seq[i:i + n - 1]), seq[i + n - 1]
            row = table.setdefault(ctx, [])
            if nxt not in row:
                row.append(nxt)
    return table


def penalty_ids(recent: list[int], window: int, exclude=()) -> list[int]:
    """The ids the repetition penalty applies to: the distinct ids among the last `window` content tokens of the
    conversation (chat frames and special tokens excluded), fixed for the whole turn."""
    ex = set(exclude)
    return sorted({t for t in (recent[-window:] if window > 0 else []) if t not in ex})


@dataclass
class Candidate:
    token: int
    p_raw: float            # softmax(logits / T) before penalty and ban
    p_final: float          # after penalty and ban (before the nucleus cut)
    banned_by: tuple[int, ...] | None = None   # the earlier n-gram's context (a, b) that banned it
    penalised: bool = False
    in_nucleus: bool = True


@dataclass
class TokenTrace:
    """How one token was chosen."""
    index: int              # position in the turn
    token: int
    rank: int               # of the chosen token in the final distribution (0 = most likely; -1 unknown)
    p_raw: float
    p_final: float
    candidates: list[Candidate]
    banned: list[int] = field(default_factory=list)     # ids banned at this step
    banned_mass: float = 0.0                            # raw probability mass the ban removed
    lifted: bool = False                                # the dead-end guard lifted (the earlier turns') bans this step
    ended: bool = False                                 # a dead end with nothing left but the reply's own 3-grams:
                                                        # the reply ended here (the stop token forced)
    ms: float = 0.0                                     # time since the previous token

    def to_dict(self) -> dict:
        from dataclasses import asdict
        return asdict(self)


@dataclass
class TurnStats:
    banned_steps: int = 0       # steps where the ban removed at least one candidate
    banned_tokens: int = 0      # candidates removed, summed over steps
    banned_mass: float = 0.0    # raw probability mass removed, summed over steps
    lifts: int = 0              # dead-end guard lifts
    ended: int = 0              # replies ended at a dead end of their own 3-grams (0 or 1)
    penalised: int = 0          # ids under the repetition penalty this turn


class Cancelled(Exception):
    """Raised inside the decode loop when the turn is stopped from another thread."""


class TurnHook:
    """One turn's logits hook. Calls on_token(index, token, trace | None, ms) for each sampled token as soon as it
    is known (the eager loop hands the hook the tokens sampled so far), except the stop token."""

    def __init__(self, table: dict, temperature: float, top_p: float, pen: float, pen_ids: list[int], stop: int,
                 trace: bool = False, on_token=None, cancel: threading.Event | None = None, guard: bool = True,
                 keep_probs: bool = False, reply: bool = False, given: list[int] | None = None,
                 dead_end: str = KEEP_REPLY):
        self.table, self.k = table, BAN_N - 1
        if dead_end not in DEAD_END_RULES:
            raise ValueError(f"dead_end must be one of {', '.join(DEAD_END_RULES)} (got {dead_end!r})")
        self.keep_reply = dead_end == KEEP_REPLY      # a dead end keeps the reply's own 3-grams banned
        self.given = list(given or ())    # a fork: the reply's tokens before the decoder's own (kept, then forced):
                                          # the ban contexts, the reply's n-grams and the indices count them
        self.reply = reply                # the ban also covers the n-grams of the reply being sampled
        self._reply_table: dict = {}      # ... indexed up to _reply_upto tokens of it
        self._reply_upto = 0
        self.temperature, self.top_p, self.pen = temperature, top_p, pen
        self.pen_ids = pen_ids
        self.stop, self.trace, self.on_token, self.cancel, self.guard = stop, trace, on_token, cancel, guard
        # trace: False, True (TRACE_TOP candidates), or an int N: the final distribution's top max(N, TRACE_TOP)
        self.trace_top = TRACE_TOP if isinstance(trace, bool) else max(TRACE_TOP, int(trace))
        self.keep_probs = keep_probs      # replay: every step's final distribution, to report divergences
        self.probs: list[torch.Tensor] = []
        self.stats = TurnStats(penalised=len(pen_ids))
        self.traces: list[TokenTrace] = []
        self.out: list[int] = []          # the decoder's list of sampled tokens (the same object)
        self._pending: TokenTrace | None = None   # trace of the draw whose token is not known yet
        self._pen_mask = None
        self._pen_ix = None
        self._pen_set: set[int] = set()
        self._t_last = time.perf_counter()
        self.t_first: float | None = None
        self.emitted = 0
        self.times: list[float] = []      # ms between consecutive sampled tokens (the first: since the hook began)

    # -- called by Decoder.generate before every draw -------------------------------------------------------------
    def __call__(self, out: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.given:
            out = self.given + out
        self.out = out
        self._emit_new()
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled
        return self._process(out, logits)

    def on_sync(self, toks: list[int]) -> bool:
        """The device loop's read-back (every few tokens): stream them; False stops the turn."""
        self.finish(self.given + toks if self.given else toks)
        return not (self.cancel is not None and self.cancel.is_set())

    def traces_from_logits(self, out: list[int], rows: torch.Tensor) -> None:
        """Traces after a device-loop turn, from each draw's logits (rows (n, V)): what the device did, so no
        dead-end guard (the device loop has none) and no per-token timing."""
        self.guard = False
        self.stats = TurnStats(penalised=self.stats.penalised)
        self.traces = []
        self.out = []
        for i in range(min(len(out), rows.size(0))):
            self.out = out[:i]
            self._process(out[:i], rows[i:i + 1])
            self._finish_trace(out[i])

    def _process(self, out: list[int], logits: torch.Tensor) -> torch.Tensor:
        banned, own, ctx = self._banned(out)
        if not banned and not self.trace:
            return logits
        V = logits.size(-1)
        pen_mask = self._penalty_mask(V, logits.device)
        raw = apply_ban_and_penalty(logits, self.pen, pen_mask if self.pen != 1.0 else None,   # penalty only
                                    pen_ix=self._pen_ix)
        T = self.temperature if self.temperature > 0 else 1.0
        lifted = ended = False
        mass = 0.0
        ban_ix = None
        if banned:
            p_pen = torch.softmax(raw / T, dim=-1)[0]
            ban_ix = torch.tensor(banned, dtype=torch.long)       # one index tensor for the mass and both masks
            mass = float(p_pen[ban_ix].sum())
            if self.guard and 1.0 - mass < DEAD_END_MIN_MASS:     # a dead end (see KEEP_REPLY / LIFT_ALL)
                keep = [t for t in banned if t in own] if self.keep_reply else []
                lifted = len(keep) < len(banned)
                banned = keep
                if keep:
                    ban_ix = torch.tensor(keep, dtype=torch.long)
                    mass = float(p_pen[ban_ix].sum())
                    rest = raw.clone()
                    rest[0, ban_ix] = float("-inf")
                    ended = not bool(torch.isfinite(rest).any())     # nothing left but the reply's own 3-grams
                else:
                    mass = 0.0
                if lifted:
                    self.stats.lifts += 1
            if banned and not ended:
                self.stats.banned_steps += 1
                self.stats.banned_tokens += len(banned)
                self.stats.banned_mass += mass
        result = logits
        if ended:                                   # the reply ends: the stop token is all that can be drawn
            self.stats.ended += 1
            result = torch.full_like(logits, float("-inf"))
            result[0, self.stop] = 0.0
        elif banned:
            result = logits.clone()
            result[0, ban_ix] = float("-inf")
        if self.trace:
            final = raw
            if ended:
                final = result.float()
            elif banned:
                final = raw.clone()
                final[0, ban_ix] = float("-inf")
            self._pending = self._make_trace(logits, final, banned, ctx, mass, lifted, ended)
        return result

    def _banned(self, out):
        """(ids banned after the last k tokens, those of them the reply itself said, the k-token context)."""
        if len(out) < self.k or not (self.table or self.reply):
            return [], set(), None
        ctx = tuple(out[-self.k:])
        banned = list(self.table.get(ctx, ()))
        own: set[int] = set()
        if self.reply:
            own = set(self._reply_ngrams(out).get(ctx, ()))
            seen = set(banned)
            banned += [t for t in own if t not in seen]
        return banned, own, ctx

    def _reply_ngrams(self, out) -> dict:
        """{context: [next ids]} of the n-grams in out (the reply so far), kept up to date as it grows (rebuilt when
        out is another, shorter list: the device loop's traces replay the draws from the start)."""
        if len(out) < self._reply_upto:
            self._reply_table, self._reply_upto = {}, 0
        start = max(self._reply_upto - self.k, 0)
        if len(out) > self._reply_upto:
            ngram_table([out[start:]], BAN_N, self._reply_table)
            self._reply_upto = len(out)
        return self._reply_table

    def _penalty_mask(self, V, device):
        if self._pen_mask is None:
            m = torch.zeros(V, dtype=torch.bool, device=device)
            if self.pen_ids and self.pen != 1.0:
                m[torch.tensor(self.pen_ids, dtype=torch.long)] = True
            self._pen_mask = m
            self._pen_ix = m.nonzero().squeeze(-1) if device.type == "cpu" else None
            self._pen_set = set(self.pen_ids) if self.pen != 1.0 else set()
        return self._pen_mask

    def _make_trace(self, logits, final, banned, ctx, mass, lifted, ended=False) -> TokenTrace:
        """final: fp32 logits after the penalty and the (unlifted) ban. Costs O(V) a few times, never a sort of V;
        a dozen tensor ops (each hands the GIL away and back: the app's UI thread shares it), the single values
        read through numpy views of the two distributions."""
        T = self.temperature if self.temperature > 0 else 1.0
        if logits.dtype != torch.float32:
            logits = logits.float()
        p_raw = torch.softmax(logits / T, dim=-1)[0]
        p_fin = torch.softmax(final / T, dim=-1)[0]
        raw_h, fin_h = _host(p_raw), _host(p_fin)
        # candidates: the top of the raw and of the final distribution (a banned favourite stays visible)
        sp, si = p_fin.topk(min(max(NUCLEUS_PROBE, self.trace_top), p_fin.numel()))   # sorted descending
        si_l = si.tolist()
        top = list(dict.fromkeys(p_raw.topk(min(TRACE_TOP, p_raw.numel())).indices.tolist() + si_l[:self.trace_top]))
        pf = fin_h[top].tolist()
        if self.temperature > 0:
            nucleus = self._nucleus_members(top, pf, p_fin, sp, si_l)
        else:
            nucleus = [t == si_l[0] for t in top]
        pens = self._pen_set
        bset = set(banned)
        cands = [Candidate(t, pr, pfi, ctx if t in bset else None, t in pens, nu)
                 for t, pr, pfi, nu in zip(top, raw_h[top].tolist(), pf, nucleus)]
        cands.sort(key=lambda c: -c.p_raw)
        tr = TokenTrace(index=len(self.out), token=-1, rank=-1, p_raw=0.0, p_final=0.0, candidates=cands,
                        banned=banned, banned_mass=mass, lifted=lifted, ended=ended)
        tr._p_fin, tr._h = p_fin, (raw_h, fin_h)     # kept until the token is known
        return tr

    def _nucleus_members(self, top, pf, p_fin, sp, si_l) -> list[bool]:
        """A token is in the nucleus when the mass ranked before it is under top_p (as the sampler's sort +
        cumsum): read off the top NUCLEUS_PROBE for candidates there; one O(V) pass for any other candidate, and
        only when the probe's mass has not already reached top_p (then every lower token is out)."""
        before = dict(zip(si_l, (sp.cumsum(0) - sp).tolist()))
        probe_full = float(sp.sum()) >= self.top_p
        res = []
        for t, p in zip(top, pf):
            if t in before:
                res.append(before[t] < self.top_p)
            elif probe_full:
                res.append(False)
            else:
                res.append(float(p_fin[p_fin > p].sum()) < self.top_p)
        return res

    def _finish_trace(self, token: int) -> TokenTrace | None:
        tr = self._pending
        if tr is None:
            return None
        self._pending = None
        tr.token = token
        raw_h, fin_h = tr._h
        tr.p_raw, tr.p_final = float(raw_h[token]), float(fin_h[token])
        tr.rank = int(numpy.count_nonzero(fin_h > fin_h[token]))
        if self.keep_probs:
            self.probs.append(tr._p_fin)
        del tr._p_fin, tr._h
        self.traces.append(tr)
        return tr

    def _emit_new(self):
        """Hand every newly sampled token (the stop excluded) to on_token."""
        while self.emitted < len(self.out):
            tok = self.out[self.emitted]
            now = time.perf_counter()
            if self.t_first is None:
                self.t_first = now
            tr = self._finish_trace(tok)
            ms = (now - self._t_last) * 1000
            self._t_last = now
            self.times.append(ms)
            if tr is not None:
                tr.ms = ms
            if tok != self.stop and self.on_token is not None:
                self.on_token(self.emitted, tok, tr, ms)
            self.emitted += 1

    def finish(self, out: list[int]) -> None:
        """After generate returns (or was cancelled): emit what the loop sampled after the last hook call (out: the
        whole reply, given tokens included)."""
        self.out = out
        self._emit_new()
