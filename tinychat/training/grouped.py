"""Best-of-N continuous batching for the teacher: each conversation samples N replies per turn and keeps one.

The batch is ``groups * n`` cache rows; a conversation holds one group of ``n`` rows. Per turn:

1. feed: the turn's prompt tokens go into the group's *lead* row only (the rows share the history up to here);
2. fork: once they are in, the lead's cache positions written since the rows last agreed are copied into the
   other rows of the group (``Llama.copy_rows``), and each of the ``n`` rows samples its own first token from the
   lead's last hidden state;
3. sample: every row of the group decodes its own reply (one token a step, mixed in one ``Llama.step`` with the
   other groups' rows, like :class:`~tinychat.training.batched.BatchedGenerator`); a row that finished waits;
4. choose: when all ``n`` replies are in, the driver gets them with each token's log-probability and returns the
   winner's index and the next tokens (or None to end); the winner's row becomes the lead.

A group is refilled with the next driver as soon as its conversation ends. ``n == 1`` is plain continuous
batching with log-probabilities. Log-probabilities are the teacher's at temperature 1 over its top-k candidates
(the exact fp32 logits of :meth:`Llama.candidates`, renormalised over those k: the mass outside them is tiny).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

import torch

from .batched import GenStats, Sampling, sample
from .teacher import Llama


@dataclass
class Candidate:
    ids: list[int]              # the reply without its stop token
    stopped: bool               # ended with the stop token (False: cut at max_new or by the cache)
    logprobs: list[float]       # one per sampled token, the stop token included


class GroupDriver(Protocol):
    def first_prompt(self) -> list[int]:
        """Tokens after the shared prefix, ending with ``<|im_start|>assistant\\n``."""

    def on_replies(self, cands: list[Candidate], room: int) -> tuple[int, list[int] | None]:
        """All n replies of a turn are in: (index of the kept one, the tokens to feed next or None to end).
        ``room``: cache positions left after the kept reply, for the continuation and the next reply."""


@dataclass
class _Row:
    length: int = 0                                     # tokens in the row's cache
    pending: list[int] = field(default_factory=list)    # tokens to feed next
    reply: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    stopped: bool = False
    busy: bool = False                                  # decoding a reply


@dataclass
class _Group:
    rows: range
    driver: GroupDriver | None = None
    lead: int = 0                                       # the row that takes in the turn's prompt
    synced: int = 0                                     # positions below this are the same in every row
    feeding: bool = False                               # the lead is taking in a turn's prompt


class _Batch:
    """One ``Llama.step``'s inputs: runs of tokens, each for one row at that row's next positions."""

    def __init__(self):
        self.toks: list[int] = []
        self.pos: list[int] = []
        self.rows: list[int] = []
        self.segs: list[tuple[int, int, int, int]] = []     # (row, start, offset, count)

    def feed(self, r: int, row: _Row, chunk: list[int]) -> int:
        """Queue chunk for row r; returns the index of its last token in the step's output."""
        self.segs.append((r, row.length, len(self.toks), len(chunk)))
        self.toks += chunk
        self.pos += range(row.length, row.length + len(chunk))
        self.rows += [r] * len(chunk)
        row.length += len(chunk)
        return len(self.toks) - 1


class GroupedGenerator:
    def __init__(self, model: Llama, groups: int, n: int, sampling: Sampling, stop_id: int,
                 prefix: list[int] | None = None, seed: int = 0, max_chunk: int = 512):
        if n < 1 or groups < 1:
            raise ValueError("best-of needs n >= 1 and at least one group")
        self.model, self.G, self.n, self.s, self.stop_id = model, groups, n, sampling, stop_id
        self.prefix = list(prefix or [])
        self.max_chunk = max_chunk
        self.gen = torch.Generator().manual_seed(seed)
        self.stats = GenStats()

    def run(self, drivers: Iterable[GroupDriver]) -> Iterator[GroupDriver]:
        """Generate until ``drivers`` is exhausted and every group is done; yields finished drivers."""
        m, n, st = self.model, self.n, self.stats
        drivers = iter(drivers)
        m.allocate(self.G * n)
        prefix_kv = None
        if self.prefix:
            m.prefill(0, self.prefix, 0)
            prefix_kv = m.save_prefix(0, len(self.prefix))
        self.rows = [_Row() for _ in range(self.G * n)]
        self.groups = groups = [_Group(range(g * n, g * n + n)) for g in range(self.G)]
        t0 = time.perf_counter()
        for grp in groups:
            self._refill(grp, drivers, prefix_kv)
        while any(grp.driver is not None for grp in groups):
            batch, forks, decodes = self._inputs(groups)
            h = m.step(torch.tensor(batch.toks), torch.tensor(batch.pos), torch.tensor(batch.rows),
                       torch.tensor(batch.segs, dtype=torch.long))
            st.steps += 1
            st.fed += len(batch.toks)
            st.occupancy += len(batch.segs) / len(self.rows)
            if not forks and not decodes:
                continue
            for grp in self._sample(h, forks, decodes):
                cont = self._choose(grp)
                if cont is None:
                    st.finished += 1
                    st.seconds = time.perf_counter() - t0
                    yield grp.driver
                    self._refill(grp, drivers, prefix_kv)
        st.seconds = time.perf_counter() - t0

    def _refill(self, grp: _Group, drivers, prefix_kv) -> None:
        grp.driver = next(drivers, None)
        if grp.driver is None:
            return
        P = len(self.prefix)
        for r in grp.rows:
            if prefix_kv is not None:
                self.model.copy_prefix(r, prefix_kv)
            self.rows[r] = _Row(length=P)
        grp.lead, grp.synced, grp.feeding = grp.rows[0], P, True
        lead = self.rows[grp.lead]
        lead.pending = list(grp.driver.first_prompt())
        if P + len(lead.pending) + self.s.max_new > self.model.max_len:
            raise ValueError(f"prompt of {len(lead.pending)} tokens does not fit the cache")

    def _inputs(self, groups: list[_Group]):
        """The step's tokens: a prompt chunk for each feeding lead, the last sampled token of each decoding row.
        Returns (batch, forks: [(group, output index)] whose prompt is all in, decodes: [(row, output index)])."""
        batch, forks, decodes = _Batch(), [], []
        for grp in groups:
            if grp.driver is None:
                continue
            if grp.feeding:
                lead = self.rows[grp.lead]
                chunk, lead.pending = lead.pending[:self.max_chunk], lead.pending[self.max_chunk:]
                at = batch.feed(grp.lead, lead, chunk)
                if not lead.pending:
                    grp.feeding = False
                    forks.append((grp, at))
                continue
            for r in grp.rows:
                row = self.rows[r]
                if row.busy and row.pending:
                    decodes.append((r, batch.feed(r, row, row.pending)))
                    row.pending = []
        if not batch.toks:
            raise RuntimeError("grouped generator stalled (a group with nothing to feed)")
        return batch, forks, decodes

    def _sample(self, h: torch.Tensor, forks, decodes) -> list[_Group]:
        """Sample n first tokens for each fork (its rows made copies of the lead first) and one token for each
        decoding row; returns the groups whose n replies are now all in."""
        m, n, s = self.model, self.n, self.s
        ids, logits = m.candidates(h[[at for _, at in forks] + [at for _, at in decodes]], s.top_k)
        reps = torch.tensor([n] * len(forks) + [1] * len(decodes))
        ids, logits = ids.repeat_interleave(reps, 0), logits.repeat_interleave(reps, 0)
        new = sample(ids, logits, s, self.gen)
        lp = (logits.gather(1, (ids == new[:, None]).float().argmax(1, keepdim=True))[:, 0]
              - logits.logsumexp(-1)).tolist()
        targets: list[int] = []
        for grp, _ in forks:
            lead = self.rows[grp.lead]
            others = [r for r in grp.rows if r != grp.lead]
            m.copy_rows(grp.lead, others, grp.synced, lead.length)      # (the siblings diverged from synced on)
            grp.synced = lead.length
            for r in grp.rows:
                row = self.rows[r]
                row.length, row.reply, row.logprobs, row.busy, row.stopped = lead.length, [], [], True, False
            targets += grp.rows
        targets += [r for r, _ in decodes]
        self.stats.generated += len(targets)
        done = []
        for r, tok, p in zip(targets, new.tolist(), lp):
            row = self.rows[r]
            row.logprobs.append(p)
            if tok == self.stop_id:
                row.stopped, row.busy = True, False
            else:
                row.reply.append(tok)
                if len(row.reply) >= s.max_new or row.length + 1 >= m.max_len:
                    row.busy = False                         # (the last sampled token is never fed)
                else:
                    row.pending = [tok]
            if not row.busy:
                done.append(r // n)
        return [self.groups[g] for g in sorted(set(done))
                if not any(self.rows[r].busy for r in self.groups[g].rows)]

    def _choose(self, grp: _Group) -> list[int] | None:
        """All n replies of the group are in: the driver picks one; its row leads the next turn. None: ended."""
        rows = [self.rows[r] for r in grp.rows]
        self.stats.replies += 1
        cands = [Candidate(list(r.reply), r.stopped, list(r.logprobs)) for r in rows]
        win, cont = grp.driver.on_replies(cands, self.model.max_len - max(r.length for r in rows))
        w = grp.rows[win]
        if not cont or self.rows[w].length + len(cont) + 1 > self.model.max_len:
            return None
        grp.lead, grp.feeding = w, True
        for r in grp.rows:
            self.rows[r].pending = list(cont) if r == w else []
        return cont
