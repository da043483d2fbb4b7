"""The weights a decode step streams, moved into one anonymous mapping on transparent huge pages.

A decode step reads every weight matrix once a token, in layer order: ~720 MB of int4 on a 1B model. A mapped
weight file (or torch's own allocations) gives 4 KB pages: ~175,000 TLB misses a token, and the hardware prefetchers
start afresh at every 4 KB boundary. The same bytes copied into one private anonymous mapping advised MADV_HUGEPAGE
(2 MB pages where the kernel gives them) decode a 1B int4 model ~12 % faster on one thread (docs/benchmarks.md,
"Weights on huge pages").

What moves: the storages of the quant Linears' packed weights and scales (qweight, scale; a two-level head's int4
copy, q4weight / q4scale), each whole and in the model's order, and every tensor viewing one of them follows it
(Tensor.set_ at the same offset: the fused q/k/v Linears' pieces stay views of their rows). Not moved: a two-level
head's int8 rows (a few read a token), embeddings, biases, gains. A moved tensor's mapped file pages go back
(MappedWeights.drop): the arena holds the one resident copy. The values are the same bytes, so nothing a session
records changes.

Off where the kernel has no transparent huge pages (or they are "never"), off the CPU, for models whose mapped pages
go back per layer (plan.drop_pages: memory over speed), and with EngineOptions.huge_pages False
(TINYCHAT_HUGE_PAGES=0)."""
from __future__ import annotations

import mmap
import re
import sys

import torch

HUGE = 2 << 20              # bytes of a transparent huge page (x86-64, arm64 with 4 KB base pages)
ALIGN = 64                  # each storage's start in the arena: the kernels' vector loads
MIN_BYTES = 2 << 20         # less than a huge page of streamed weights: not worth a copy
NAMES = ("qweight", "scale", "q4weight", "q4scale")
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_ENABLED) -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise" or "never"), None where it has none."""
    try:
        with open(path) as f:
            m = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def available() -> bool:
    """Whether an advised anonymous mapping can get huge pages here (Linux, THP "always" or "madvise")."""
    return sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


def _modules(model) -> list:
    """The model's modules in order, then its fused q/k/v Linears (held in a list, not registered)."""
    seen, out = set(), []
    for m in [*model.modules(), *getattr(model, "fused_qkv", [])]:
        if id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def streamed(model, head4: bool) -> list[tuple[torch.UntypedStorage, list[torch.Tensor]]]:
    """(storage, the module tensors viewing it) of every streamed weight storage on the CPU, in model order. head4:
    the head scans with its int4 copy, so its int8 rows (qweight, scale) stay where they are."""
    head = getattr(model, "head", None)
    mods = _modules(model)
    order: dict[int, torch.UntypedStorage] = {}
    for m in mods:
        for name in NAMES:
            t = m._buffers.get(name)
            if t is None or t.device.type != "cpu" or t.numel() == 0:
                continue
            if head4 and m is head and name in ("qweight", "scale"):
                continue
            order.setdefault(_key(t), t.untyped_storage())
    views: dict[int, list[torch.Tensor]] = {k: [] for k in order}
    for m in mods:
        for t in [*m._buffers.values(), *m._parameters.values()]:
            if t is not None and t.device.type == "cpu" and _key(t) in views:
                if not any(t is u for u in views[_key(t)]):
                    views[_key(t)].append(t)
    return [(st, views[k]) for k, st in order.items()]


def _in_arena(model, st: torch.UntypedStorage) -> bool:
    """Whether st is already an arena's (a model decided twice keeps what moved the first time)."""
    return any(st.data_ptr() == a.untyped_storage().data_ptr() for a in getattr(model, "weight_arenas", []))


def place(model, head4: bool, min_bytes: int | None = None) -> int:
    """Move the model's streamed weights (streamed()) into a new huge-page arena; returns the bytes of the model's
    weights on arenas, this call's and earlier ones' (0: none; less than min_bytes, default MIN_BYTES, to move stays
    put). An arena lives as long as any tensor on it (model.weight_arenas lists them)."""
    from ..mapped import MappedWeights
    groups = [(st, ts) for st, ts in streamed(model, head4) if not _in_arena(model, st)]
    total = sum(-(-st.nbytes() // ALIGN) * ALIGN for st, _ in groups)
    if total < (MIN_BYTES if min_bytes is None else min_bytes) or total == 0:
        return getattr(model, "weight_arena_bytes", 0)
    mm = mmap.mmap(-1, total + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)      # before the first write: the faults then take whole 2 MB pages
    except OSError:                         # refused (a kernel without THP): 4 KB pages, the same bytes
        pass
    arena = torch.frombuffer(mm, dtype=torch.uint8)   # holds mm for as long as its storage lives
    ast = arena.untyped_storage()
    off = -arena.data_ptr() % HUGE          # (arena bytes) the first storage on a huge page boundary
    mapped = MappedWeights()
    for st, ts in groups:
        n = st.nbytes()
        src = torch.empty(0, dtype=torch.uint8).set_(st, 0, (n,), (1,))
        arena[off:off + n].copy_(src)
        mapped.drop(src)                    # a mapped file's pages of it: the arena's copy is the one read now
        for t in ts:                        # the same offset in the arena: views stay views
            es = t.element_size()
            t.set_(ast, (off + t.storage_offset() * es) // es, t.size(), t.stride())
        off += -(-n // ALIGN) * ALIGN
    model.weight_arenas = [*getattr(model, "weight_arenas", []), arena]
    model.weight_arena_bytes = getattr(model, "weight_arena_bytes", 0) + total
    return model.weight_arena_bytes
