"""The cache of branches this chat has left (issue #14): switching back to one restores its cache instead of feeding
its turns again.

When the chat moves off a path at turn t, it keeps what its cache held from turn t's mark on: the global K/V rows
and token history past the mark's length, the local rings and their positions, the row's length, the marks of the
turns after t and the pending ids. That is the exact state the branch was decoded with (or restored to by the feed
rule), so putting it back is bit-identical by construction, and costs a copy instead of a prefill and a decoder step
per token. Kept for the last few paths left (each costs its tail of global K/V plus one ring copy per turn); a path
not kept is fed again by the restore rule. Keyed by the path's message ids, so a stash is only used for the very
path (and the very prefix) it was taken on."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

KEEP = 8          # paths kept


@dataclass
class _Tail:
    start: int                  # the mark's length: rows from here on are the branch's own
    gk: torch.Tensor            # (G, Hk, L - start, D)
    gv: torch.Tensor
    tokens: torch.Tensor        # (L - start,)
    lk: torch.Tensor            # (n_layers, Hk, W + 1, D): the whole ring
    lv: torch.Tensor
    lpos: torch.Tensor          # (W + 1,)
    length: int
    marks: list                 # the marks of the path's turns from the switched one on
    pending: list[int]


class BranchCache:
    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._tails: OrderedDict[tuple, _Tail] = OrderedDict()

    def clear(self) -> None:
        self._tails.clear()

    def leave(self, key: tuple, cache, mark: dict, marks: list, pending: list[int], row: int = 0) -> None:
        """Keep row's cache from `mark` on, as path `key` (message ids) leaves it."""
        if any(m is None for m in marks):       # a later turn re-prefilled a shortened context over the prefix
            self._tails.pop(key, None)
            return
        s, L = mark["len"], int(cache.lens_cpu[row])
        self._tails[key] = _Tail(s, cache.gk[:, row, :, s:L].clone(), cache.gv[:, row, :, s:L].clone(),
                                 cache.tokens[row, s:L].clone(), cache.lk[:, row].clone(), cache.lv[:, row].clone(),
                                 cache.lpos[row].clone(), L, list(marks), list(pending))
        self._tails.move_to_end(key)
        while len(self._tails) > self.keep:
            self._tails.popitem(last=False)

    def enter(self, key: tuple, cache, mark: dict, row: int = 0) -> tuple[list, list[int]] | None:
        """Put path `key`'s kept cache back on top of `mark` (the same turn's mark it was taken from); returns the
        path's (marks, pending), or None when it is not kept (the caller feeds it)."""
        t = self._tails.get(key)
        if t is None or t.start != mark["len"]:
            return None
        s, L = t.start, t.length
        cache.gk[:, row, :, s:L].copy_(t.gk)
        cache.gv[:, row, :, s:L].copy_(t.gv)
        cache.tokens[row, s:L].copy_(t.tokens)
        cache.lk[:, row].copy_(t.lk)
        cache.lv[:, row].copy_(t.lv)
        cache.lpos[row].copy_(t.lpos)
        cache.lens[row] = L
        cache.lens_cpu[row] = L
        self._tails.move_to_end(key)
        return list(t.marks), list(t.pending)
