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
from dataclasses import dataclass
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
        m, G, n, s, st = self.model, self.G, self.n, self.s, self.stats
        drivers = iter(drivers)
        B = G * n
        m.allocate(B)
        P = len(self.prefix)
        prefix_kv = None
        if P:
            m.prefill(0, self.prefix, 0)
            prefix_kv = m.save_prefix(0, P)
        driver: list[GroupDriver | None] = [None] * G
        lead = [g * n for g in range(G)]
        synced = [0] * G                  # positions below this are the same in every row of the group
        length = [0] * B                  # tokens in each row's cache
        pending: list[list[int]] = [[] for _ in range(B)]
        reply: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        stopped = [False] * B
        busy = [False] * B                # the row is decoding a reply
        feeding = [False] * G             # the group's lead is taking in a turn's prompt
        t0 = time.perf_counter()

        def refill(g: int) -> None:
            d = next(drivers, None)
            driver[g] = d
            if d is None:
                return
            rows = range(g * n, g * n + n)
            for r in rows:
                if prefix_kv is not None:
                    m.copy_prefix(r, prefix_kv)
                length[r], pending[r], reply[r], lps[r], busy[r] = P, [], [], [], False
            lead[g], synced[g], feeding[g] = g * n, P, True
            pending[lead[g]] = list(d.first_prompt())
            if P + len(pending[lead[g]]) + s.max_new > m.max_len:
                raise ValueError(f"prompt of {len(pending[lead[g]])} tokens does not fit the cache")

        for g in range(G):
            refill(g)
        while any(d is not None for d in driver):
            toks: list[int] = []
            pos: list[int] = []
            rows: list[int] = []
            segs: list[tuple[int, int, int, int]] = []
            fork: list[tuple[int, int]] = []     # (group, index of its lead's last fed token): sample n first tokens
            dec: list[tuple[int, int]] = []      # (row, index of its last fed token)

            def feed(r: int, chunk: list[int]) -> None:
                segs.append((r, length[r], len(toks), len(chunk)))
                toks.extend(chunk)
                pos.extend(range(length[r], length[r] + len(chunk)))
                rows.extend([r] * len(chunk))
                length[r] += len(chunk)

            for g in range(G):
                if driver[g] is None:
                    continue
                L = lead[g]
                if feeding[g]:                                   # the turn's prompt goes into the lead
                    chunk, pending[L] = pending[L][:self.max_chunk], pending[L][self.max_chunk:]
                    feed(L, chunk)
                    if not pending[L]:
                        feeding[g] = False
                        fork.append((g, len(toks) - 1))
                    continue
                for r in range(g * n, g * n + n):
                    if busy[r] and pending[r]:
                        feed(r, pending[r])
                        pending[r] = []
                        dec.append((r, len(toks) - 1))
            if not toks:
                raise RuntimeError("grouped generator stalled (a group with nothing to feed)")
            h = m.step(torch.tensor(toks), torch.tensor(pos), torch.tensor(rows),
                       torch.tensor(segs, dtype=torch.long))
            st.steps += 1
            st.fed += len(toks)
            st.occupancy += len(segs) / B
            # one candidate set per fork (repeated n times) and per decoding row
            at = [i for _, i in fork] + [i for _, i in dec]
            if not at:
                continue
            ids, logits = m.candidates(h[at], s.top_k)
            reps = torch.tensor([n] * len(fork) + [1] * len(dec))
            ids, logits = ids.repeat_interleave(reps, 0), logits.repeat_interleave(reps, 0)
            new = sample(ids, logits, s, self.gen)
            lp = (logits.gather(1, (ids == new[:, None]).float().argmax(1, keepdim=True))[:, 0]
                  - logits.logsumexp(-1)).tolist()
            new = new.tolist()
            targets: list[int] = []
            for g, _ in fork:
                Lr = lead[g]
                others = [r for r in range(g * n, g * n + n) if r != Lr]
                m.copy_rows(Lr, others, synced[g], length[Lr])
                for r in others:
                    length[r] = length[Lr]
                synced[g] = length[Lr]
                for r in range(g * n, g * n + n):
                    reply[r], lps[r], busy[r], stopped[r] = [], [], True, False
                    targets.append(r)
            targets += [r for r, _ in dec]
            st.generated += len(new)
            done_groups = set()
            for r, tok, p in zip(targets, new, lp):
                lps[r].append(p)
                if tok == self.stop_id:
                    stopped[r], busy[r] = True, False
                else:
                    reply[r].append(tok)
                    if len(reply[r]) >= s.max_new or length[r] + 1 >= m.max_len:
                        busy[r] = False
                    else:
                        pending[r] = [tok]
                if not busy[r]:
                    done_groups.add(r // n)
            for g in sorted(done_groups):
                grp = range(g * n, g * n + n)
                if any(busy[r] for r in grp):
                    continue
                st.replies += 1
                cands = [Candidate(list(reply[r]), stopped[r], list(lps[r])) for r in grp]
                win, cont = driver[g].on_replies(cands, m.max_len - max(length[r] for r in grp))
                w = g * n + win
                if cont and length[w] + len(cont) + 1 <= m.max_len:
                    lead[g], feeding[g] = w, True
                    pending[w] = list(cont)
                    for r in grp:
                        if r != w:
                            pending[r] = []
                else:
                    st.finished += 1
                    st.seconds = time.perf_counter() - t0
                    yield driver[g]
                    refill(g)
        st.seconds = time.perf_counter() - t0
