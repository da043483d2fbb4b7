"""Pages of memory-mapped weight files handed back once they have been read.

safetensors maps a model file into memory (private, copy-on-write). Weights used where they lie (the Linear
weights of a model about to be quantized) are read twice, once to hash the model and once to quantize it, and every
page read stays resident: an imported fp32 SmolLM2-135M (650 MB) had its whole file in the process's memory on top
of the int8 weights made from it. Nothing ever writes those pages, so they are the file's own: dropping them from
the process (madvise MADV_DONTNEED) loses nothing, and a later read faults them back in from the page cache.

Only whole pages inside a file mapping whose path ends in .safetensors are dropped, and only for tensors alive when
the mappings were listed (a tensor holds its mapping, so its range cannot have been reused meanwhile). Elsewhere
than Linux, or where /proc or libc is missing, this does nothing.
"""
from __future__ import annotations

import ctypes
import mmap
import sys

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE
BLOCK = 4 << 20     # bytes read between drops (blocks): a tensor's pages never all resident at once


class MappedWeights:
    """The address ranges of the weight files mapped into this process when it was made."""

    def __init__(self, suffix: str = ".safetensors"):
        self.ranges: list[tuple[int, int]] = []
        self._madvise = None
        if not sys.platform.startswith("linux"):
            return
        try:
            with open("/proc/self/maps") as f:
                lines = f.read().splitlines()
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
        except (OSError, AttributeError):
            return
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        for line in lines:                  # "start-end perms offset dev inode path"
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].endswith(suffix):
                start, end = (int(x, 16) for x in parts[0].split("-"))
                self.ranges.append((start, end))
        self._madvise = madvise if self.ranges else None

    def holds(self, t) -> bool:
        """Whether tensor t's bytes lie in one of the mapped weight files."""
        if self._madvise is None or t.device.type != "cpu" or t.numel() == 0:
            return False
        st = t.untyped_storage()
        a, b = st.data_ptr(), st.data_ptr() + st.nbytes()
        return any(start <= a and b <= end for start, end in self.ranges)

    def page_span(self, t) -> tuple[int, int] | None:
        """(first address, bytes) of the whole pages inside t's bytes when t is a contiguous tensor in a mapped
        weight file (a neighbour keeps the edge pages it shares), else None (also: no whole page)."""
        if not (t.is_contiguous() and self.holds(t)):
            return None
        a = t.data_ptr()
        b = a + t.numel() * t.element_size()
        lo, hi = -(-a // PAGE) * PAGE, b // PAGE * PAGE
        return (lo, hi - lo) if hi > lo else None

    def drop(self, t) -> int:
        """Drop the whole pages of t's bytes from the process (t stays valid: its next read faults them back from
        the file). Returns the bytes dropped: 0 when t is not in a mapped weight file."""
        span = self.page_span(t)
        if span is None or self._madvise(span[0], span[1], MADV_DONTNEED) != 0:
            return 0
        return span[1]

    def drop_span(self, lo: int, n: int) -> bool:
        """Drop the n bytes of whole pages at lo, a page_span of a tensor this process still holds (its mapping
        alive: a freed mapping's range could be other memory by now). True when dropped."""
        return self._madvise is not None and n > 0 and self._madvise(lo, n, MADV_DONTNEED) == 0

    def blocks(self, t):
        """t's leading-dim slices of about BLOCK bytes, in order, each one's pages dropped once the caller has read
        it and asked for the next (and t's last pages after the last): reading a big mapped tensor (an imported
        model's 113 MB head) then keeps only a block of it resident, not the whole. t whole (one block) when it is
        not in a mapped weight file."""
        if t.dim() == 0 or not (t.is_contiguous() and self.holds(t)):
            yield t
            return
        rows = max(1, BLOCK // max(1, t[0].numel() * t.element_size()))
        for r in range(0, t.size(0), rows):
            part = t[r:r + rows]
            yield part
            self.drop(part)
        self.drop(t)                        # the pages two blocks shared

    def copy_out(self, t, dtype):
        """A copy of t in dtype, made block by block (blocks()): its peak is the copy and one block of t."""
        out = t.new_empty(t.shape, dtype=dtype)
        if t.dim() == 0:
            return out.copy_(t)
        r = 0
        for part in self.blocks(t):
            out[r:r + part.size(0)].copy_(part)
            r += part.size(0)
        return out
