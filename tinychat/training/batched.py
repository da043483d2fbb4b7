"""Continuous-batching sampler for the teacher (:class:`tinychat.training.teacher.Llama`).

The batch is ``batch_size`` cache rows. Each row holds one conversation at a time; a conversation is
driven by a *driver* object (see :class:`Driver`) that supplies the prompt, receives every finished
reply and answers with the next user turn or ``None`` when it is done. A finished row is refilled
with the next driver at once, so the batch stays full (continuous batching) and ragged: every row
sits at its own position and attends only to its own keys.

Every step is one :meth:`Llama.step` call: one token for each decoding row, the whole prompt (or
next user turn) for rows that just started or finished a reply (mixed batching: prompts share the
GEMMs of the decode tokens instead of running as separate small forwards). The shared system prompt
is prefilled once and its KV copied into a row on refill.

Sampling: temperature + top-p, within the top-k (k = 40) candidates whose logits are recomputed in
fp32 (see :meth:`Llama.candidates`). ``temperature == 0`` means greedy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

import torch

from .teacher import Llama


class Driver(Protocol):
    def first_prompt(self) -> list[int]:
        """Tokens that follow the shared prefix, ending with ``<|im_start|>assistant\\n``."""

    def on_reply(self, ids: list[int], stopped: bool, room: int) -> list[int] | None:
        """A reply finished: ``ids`` without the stop token; ``stopped`` False when it was cut by
        max_new (or the cache). ``room``: cache positions left for the continuation *and* the next
        reply. Return the tokens to feed next (normally ``<|im_end|>\\n<|im_start|>user\\n...
        <|im_start|>assistant\\n``, fitting in ``room - max_new``) or None to end the row."""


@dataclass
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 40
    max_new: int = 120


@dataclass
class GenStats:
    steps: int = 0
    generated: int = 0        # sampled tokens (stop tokens included)
    fed: int = 0              # tokens fed through the model (sampled ones and prompts)
    replies: int = 0
    finished: int = 0         # drivers completed
    seconds: float = 0.0
    occupancy: float = 0.0    # sum over steps of busy rows / batch size
    extra: dict = field(default_factory=dict)

    @property
    def tok_per_s(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0


def sample(ids: torch.Tensor, logits: torch.Tensor, s: Sampling, gen: torch.Generator | None
           ) -> torch.Tensor:
    """Pick one token per row. ids, logits [B, k] (candidates, fp32) -> tokens [B] long."""
    if s.temperature <= 0:
        return ids.gather(1, logits.argmax(-1, keepdim=True))[:, 0]
    logits, order = logits.sort(dim=-1, descending=True)
    ids = ids.gather(1, order)
    probs = (logits / s.temperature).softmax(-1)
    # top-p (nucleus): keep the smallest prefix whose mass reaches top_p (always >= 1 token)
    drop = probs.cumsum(-1) - probs > s.top_p
    probs = probs.masked_fill(drop, 0.0)
    pick = torch.multinomial(probs, 1, generator=gen)                         # [B, 1]
    return ids.gather(1, pick)[:, 0]


class BatchedGenerator:
    """Samples replies for a stream of drivers, ``batch_size`` conversations at a time.

    Every step feeds, for each busy row, its pending tokens (the last sampled token, or a whole
    prompt / next user turn) through one :meth:`Llama.step`, then samples one token for each row
    whose pending tokens are all in. Rows are refilled from ``drivers`` as soon as they finish.
    """

    def __init__(self, model: Llama, batch_size: int, sampling: Sampling, stop_id: int,
                 prefix: list[int] | None = None, seed: int = 0, max_chunk: int = 512):
        self.model, self.B, self.s, self.stop_id = model, batch_size, sampling, stop_id
        self.prefix = list(prefix or [])
        self.max_chunk = max_chunk   # prompt tokens fed per row per step (bounds the step size)
        self.gen = torch.Generator().manual_seed(seed)
        self.stats = GenStats()

    def run(self, drivers: Iterable[Driver]) -> Iterator[Driver]:
        """Generate until ``drivers`` is exhausted and every row is done; yields finished drivers.

        Stopping early (closing the iterator) abandons the conversations in flight.
        """
        m, B, s, st = self.model, self.B, self.s, self.stats
        drivers = iter(drivers)
        m.allocate(B)
        P = len(self.prefix)
        prefix_kv = None
        if P:
            m.prefill(0, self.prefix, 0)
            prefix_kv = m.save_prefix(0, P)
        row_driver: list[Driver | None] = [None] * B
        length = [0] * B                           # tokens in the row's cache
        pending: list[list[int]] = [[] for _ in range(B)]   # tokens to feed next
        reply: list[list[int]] = [[] for _ in range(B)]
        t0 = time.perf_counter()

        def refill(r: int) -> None:
            d = next(drivers, None)
            row_driver[r], reply[r], pending[r] = d, [], []
            if d is None:
                return
            if prefix_kv is not None:
                m.copy_prefix(r, prefix_kv)
            length[r] = P
            pending[r] = list(d.first_prompt())
            if P + len(pending[r]) + s.max_new > m.max_len:
                raise ValueError(f"prompt of {len(pending[r])} tokens does not fit the cache")

        for r in range(B):
            refill(r)
        while any(d is not None for d in row_driver):
            toks: list[int] = []
            pos: list[int] = []
            rows: list[int] = []
            segs: list[tuple[int, int, int, int]] = []
            to_sample: list[int] = []      # rows sampled this step
            at: list[int] = []             # index of their last fed token
            for r in range(B):
                if row_driver[r] is None:
                    continue
                chunk, pending[r] = pending[r][:self.max_chunk], pending[r][self.max_chunk:]
                segs.append((r, length[r], len(toks), len(chunk)))
                toks += chunk
                pos += range(length[r], length[r] + len(chunk))
                rows += [r] * len(chunk)
                length[r] += len(chunk)
                if not pending[r]:
                    to_sample.append(r)
                    at.append(len(toks) - 1)
            h = m.step(torch.tensor(toks), torch.tensor(pos), torch.tensor(rows),
                       torch.tensor(segs, dtype=torch.long))                    # [N, dim]
            st.steps += 1
            st.fed += len(toks)
            st.occupancy += len(segs) / B
            if not to_sample:
                continue
            ids, logits = m.candidates(h[at], s.top_k)
            new = sample(ids, logits, s, self.gen).tolist()
            st.generated += len(new)
            for r, tok in zip(to_sample, new):
                stopped = tok == self.stop_id
                if not stopped:
                    reply[r].append(tok)
                full = length[r] + 1 >= m.max_len
                if not (stopped or len(reply[r]) >= s.max_new or full):
                    pending[r] = [tok]
                    continue
                st.replies += 1
                d = row_driver[r]
                # the sampled token (stop or not) is not in the cache: the driver's continuation
                # (which normally starts with <|im_end|>) is fed from position length[r]
                cont = d.on_reply(reply[r], stopped, m.max_len - length[r])
                if cont:
                    if length[r] + len(cont) + 1 > m.max_len:   # the driver must respect ``room``
                        raise ValueError("driver continuation does not fit the cache")
                    reply[r], pending[r] = [], list(cont)
                else:
                    st.finished += 1
                    st.seconds = time.perf_counter() - t0
                    yield d
                    refill(r)
        st.seconds = time.perf_counter() - t0
