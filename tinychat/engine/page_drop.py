"""A stored-quantized model's mapped weight pages handed back once read (EngineOptions.drop_pages).

A stored model's packed weights are the mapped file's own bytes (quant_files.py), and every page a token reads stays
in the process's resident memory: a 1B int4 chat keeps its whole 834 MB file resident on top of torch and the heap
(docs/benchmarks.md, "Peak RSS"). With the option on, each layer's pages go back (madvise MADV_DONTNEED) right after
the step has read them: in C, per layer, in the native steps (native.c's tc_drop, a drop table in their plans), and
a quant Linear's after its forward (prefill: Int8Linear / Int4Linear call their `page_drop`). The mapping is private
and nothing writes the weights, so its pages are the file's own: the next read faults them back from the page cache,
the same bytes, the same tokens. The weights then live in the page cache (shared, reclaimable) instead of the
process's RSS; what it costs is the re-faults: a few % of a 1B model's decode here, and nothing won on a small model
whose file is a fraction of what torch alone holds. So the default (None) drops for a stored-quantized model whose
mapped quant weights are DROP_MIN_BYTES or more; below that only a two-level head's int8 rows go back after each
step (the rescoring reads RESCORE_K of them a token: a few re-faults, where keeping them lets the kernel's
fault-around map the whole int8 head over a chat). docs/benchmarks.md has the figures.

Only whole pages inside a mapped .safetensors file are dropped (mapped.py's MappedWeights.page_span: a neighbour
keeps its edge pages), and PageRanges keeps the tensors they are pages of alive (a tensor holds its mapping, so a
range can never be other memory). A deep copy or pickle of one is None: its addresses are this process's."""
from __future__ import annotations

import torch

from ..mapped import MappedWeights
from . import two_level_head as head4
from .native import DROP_RANGES
from .quant import Int8Linear
from .quant_int4 import Int4Linear

# the default's threshold: mapped quant weights (qweight + scale bytes) of a model. 4 GiB: a drop re-faults every
# weight page each token (~10,900 faults a token for a 1B int4 file: decode 36-47% slower on an Intel Xeon guest),
# so below that speed wins and TINYCHAT_DROP_PAGES=1 asks for the memory instead.
DROP_MIN_BYTES = 4 << 30        # the default's threshold: mapped quant weights (qweight + scale bytes) of a model


def _none():
    return None


def quant_linears(model) -> list:
    """Every Int8Linear / Int4Linear of the model, its fused q/k/v ones (model.fused_qkv) included, once each."""
    seen, out = set(), []
    for m in [*model.modules(), *(getattr(model, "fused_qkv", None) or [])]:
        if type(m) in (Int8Linear, Int4Linear) and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def mapped_quant_bytes(model, mapped: MappedWeights | None = None) -> int:
    """The bytes of the model's quant Linears' weights and scales that lie in a mapped weight file (shared rows, as
    the q/k/v views of a fused Linear, counted once)."""
    mapped = mapped or MappedWeights()
    return union_bytes((t.data_ptr(), t.numel() * t.element_size()) for m in quant_linears(model)
                       for t in (m.qweight, m.scale) if mapped.holds(t))


def union_bytes(spans) -> int:
    """The bytes of the union of (address, bytes) spans (views of one tensor's rows overlap it)."""
    end, total = 0, 0
    for a, n in sorted(spans):
        total += max(0, a + n - max(a, end))
        end = max(end, a + n)
    return total


def armed_bytes(model) -> int:
    """The bytes the model's quant Linears hand back after their forwards (page_drop set by arm), counted once."""
    return union_bytes(s for m in quant_linears(model) if (pr := m.__dict__.get("page_drop")) is not None
                       for s in pr.spans)


def resolve(option: bool | None, model, min_bytes: int = DROP_MIN_BYTES, mapped: MappedWeights | None = None) -> bool:
    """Does this model hand its mapped weight pages back once read? The option when given, else (None) whether it is
    a stored-quantized model (model.stored_quant) with min_bytes or more of mapped quant weights."""
    if option is not None:
        return bool(option)
    if getattr(model, "stored_quant", None) is None:
        return False
    return mapped_quant_bytes(model, mapped) >= min_bytes


class PageRanges:
    """The whole pages of some mapped weight tensors, as (address, bytes) pairs, with the tensors kept alive; drop()
    hands them back. Empty (false) when none of them lies in a mapped file."""

    def __init__(self, tensors, mapped: MappedWeights):
        self.keep = [t for t in tensors if t is not None]
        self.spans = [s for t in self.keep if (s := mapped.page_span(t)) is not None]
        self._mapped = mapped

    def __bool__(self) -> bool:
        return bool(self.spans)

    def drop(self) -> None:
        for lo, n in self.spans:
            self._mapped.drop_span(lo, n)

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return (_none, ())


def arm(model, on: bool, mapped: MappedWeights | None = None) -> int:
    """Set each quant Linear's page_drop (what its forward hands back after it ran): a PageRanges of its mapped
    weight and scale where on and it has any, else None. Returns the bytes armed (armed_bytes)."""
    mapped = (mapped or MappedWeights()) if on else None
    for m in quant_linears(model):
        pr = PageRanges((m.qweight, m.scale), mapped) if on else None
        m.page_drop = pr if pr else None
    return armed_bytes(model)


def step_table(model, fs) -> tuple[torch.Tensor, list] | None:
    """The drop table of a native step on the model (fs: its cpu_step.CpuStep; per layer its fused QKV, w_o, up and
    down, then the head), or None where nothing lies in a mapped file or nothing is to go back. With fs.drop_pages
    every row; else, with fs.drop_head_rows (the option's default) and a two-level head, the head's row alone and
    only its int8 rows: the step reads RESCORE_K of them a token (and the embedding's), so dropping them re-faults a
    few pages, where keeping them lets fault-around (64 KB a read) map the whole int8 head over a chat (263 MB of a
    1B model's 981 MB file)."""
    two = head4.active(fs.head)
    if getattr(fs, "drop_pages", False):
        head = (fs.head, head4.view(fs.head)) if two else fs.head                   # the two-level head: its copy too
        return drop_table([(fs.qkv[li], b.attn.w_o, b.mlp.up, b.mlp.down) for li, b in enumerate(model.blocks)],
                          head)
    if two and getattr(fs, "drop_head_rows", False):
        return drop_table([() for _ in model.blocks], fs.head)
    return None


def drop_table(layers, head, mapped: MappedWeights | None = None) -> tuple[torch.Tensor, list] | None:
    """The native steps' drop table (native.c's tc_drop): per layer one row of DROP_RANGES (address, bytes) pairs,
    the whole pages of its Linears' mapped weights and scales (layers: per layer its Linears), zero-padded, then
    one row for the head (a Linear, or a tuple of them: the two-level head's int8 rows and int4 copy). With the
    PageRanges keeping those tensors alive; None when nothing lies in a mapped file."""
    mapped = mapped or MappedWeights()
    rows, keep = [], []
    for lins in [*layers, list(head) if isinstance(head, (list, tuple)) else [head]]:
        pr = PageRanges([t for m in lins for t in (m.qweight, m.scale)], mapped)
        if len(pr.spans) > DROP_RANGES:
            raise ValueError(f"drop_table: {len(pr.spans)} ranges in a row of {DROP_RANGES}")
        rows.append([v for s in pr.spans for v in s] + [0] * (2 * (DROP_RANGES - len(pr.spans))))
        keep.append(pr)
    if not any(keep):
        return None
    return torch.tensor(rows, dtype=torch.int64), keep
