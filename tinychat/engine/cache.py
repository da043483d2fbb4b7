"""The small KV cache: one global K/V per layer GROUP (grows with the context) + one ring of `swa_window` local
K/V slots per layer (constant size). Every tensor has one extra scratch slot at its end, where padded / no-op
writes land, so steps need no boolean filtering and no host syncs. Row lengths are mirrored on the CPU.

dtype: fp32 on the CPU, bf16 on GPUs, or fp16 on the CPU (EngineOptions.kv_cache, plan.kv_cache_dtype: half the
memory and the bytes a decode step reads): every write rounds K/V to fp16 once, every reader widens them back to fp32
(attn_dtype) and computes as with an fp32 cache."""
from __future__ import annotations

import math
import mmap

import torch


def lazy_zeros(shape, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Zeros. On the CPU, past 1 MiB, in an anonymous memory mapping: the system commits a page when it is first
    written (reads of the others see its shared zero page), so a global K/V sized for the model's whole context
    holds memory for the positions used, not for max_len (SmolLM2-135M: 189 MB at 4,096 positions, in fp32)."""
    n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or n < (1 << 20):
        return torch.zeros(shape, device=device, dtype=dtype)
    buf = mmap.mmap(-1, n)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):     # where huge pages are always on, a 2 MB page would span several heads'
        buf.madvise(mmap.MADV_NOHUGEPAGE)    # rows and commit them all at the first token
    return torch.frombuffer(buf, dtype=dtype).view(shape)                 # the tensor keeps the mapping alive


class KVCache:
    def __init__(self, model, B: int, max_len: int, device, dtype=torch.bfloat16):
        c = model.cfg
        self.cfg, self.B, self.max_len, self.device = c, B, max_len, torch.device(device)
        G = math.ceil(c.n_layers / c.kv_group)
        Hk, D, W = c.n_kv_heads, c.head_dim, c.swa_window
        if max_len > c.max_seq_len:
            raise ValueError(f"cache of {max_len} positions exceeds the model's max_seq_len {c.max_seq_len}")
        self.gk = lazy_zeros((G, B, Hk, max_len + 1, D), self.device, dtype)           # (G, B, Hk, M + 1, D)
        self.gv = lazy_zeros(self.gk.shape, self.device, dtype)
        self.lk = torch.zeros(c.n_layers, B, Hk, W + 1, D, device=device, dtype=dtype)  # (L, B, Hk, W + 1, D) rings
        self.lv = torch.zeros_like(self.lk)
        self.lpos = torch.full((B, W + 1), -1, device=device, dtype=torch.long)        # position held by each slot
        self.lens = torch.zeros(B, device=device, dtype=torch.long)
        self.lens_cpu = torch.zeros(B, dtype=torch.long)
        self.tokens = torch.zeros(B, max_len + 1, device=device, dtype=torch.long)      # history (Engram context)
        self.static_feed = None   # set by a GPU Decoder: append() replays captured graphs for short batch-1 chunks
        self._host = None                             # numpy views (host()), made on first use

    @property
    def attn_dtype(self) -> torch.dtype:
        """The dtype attention computes in against this cache: its own, but fp32 for an fp16 cache (K/V stored rounded
        to IEEE fp16, read back exactly as fp32: fp32 products, softmax and sums, as the native kernels do)."""
        return torch.float32 if self.gk.dtype == torch.float16 else self.gk.dtype

    @property
    def kv16(self) -> bool:
        """The cache holds fp16 K/V (a step on it rounds as the "+kv16" steps sessions record)."""
        return self.gk.dtype == torch.float16

    def length(self, row: int = 0) -> int:
        """Row's current length (its CPU mirror), read without a tensor op."""
        return int(self._views()[3][row])

    def host(self):
        """numpy views of a CPU cache's bookkeeping: (tokens, lpos, lens, lens_cpu). The CPU decode step reads and
        writes single entries through them: a numpy scalar access costs ~0.1 us where an indexed tensor op costs a
        few us and hands the GIL over (to the app's UI thread) and back. The cache changes these tensors in place;
        a view is made again if one was replaced (or the cache copied)."""
        if self.device.type != "cpu":
            raise ValueError("host views need a CPU cache")
        return self._views()

    def _views(self):
        h = self._host
        if h is None or h[3].ctypes.data != self.lens_cpu.data_ptr() or (
                self.device.type == "cpu" and h[0] is not None and h[0].ctypes.data != self.tokens.data_ptr()):
            cpu = self.device.type == "cpu"
            h = self._host = (*((t.numpy() if cpu else None) for t in (self.tokens, self.lpos, self.lens)),
                              self.lens_cpu.numpy())
        return h

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.gk, self.gv, self.lk, self.lv))

    def used_bytes(self, row: int = 0) -> int:
        """Bytes of K/V that row's current context occupies (global part up to its length + the rings)."""
        L = int(self.lens_cpu[row])
        per_pos = self.gk.size(0) * self.gk.size(2) * self.gk.size(4) * self.gk.element_size() * 2
        ring = self.lk.size(0) * self.lk.size(2) * (self.lk.size(3) - 1) * self.lk.size(4) * self.lk.element_size()
        return L * per_pos + 2 * ring

    def reset(self, rows) -> None:
        """Empty these rows so a new sequence can start there (old K/V is masked by length)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        self.lens_cpu[rows] = 0
        rows = rows.to(self.device)
        self.lens[rows] = 0
        self.lpos[rows] = -1

    # --- rollback (regenerate / undo a turn without re-prefilling the conversation) -----------------------------
    def mark(self, row: int = 0) -> dict:
        """What truncate() needs to return `row` to its current state: the length and copies of the small parts
        (rings, lpos). The global K/V and the token history need no copy: positions past the length are masked and
        rewritten in order."""
        return {"len": int(self.lens_cpu[row]), "lk": self.lk[:, row].clone(), "lv": self.lv[:, row].clone(),
                "lpos": self.lpos[row].clone()}

    def truncate(self, mark: dict, row: int = 0) -> None:
        """Return `row` to a mark() taken earlier (in place: captured graphs keep their tensors)."""
        self.lk[:, row].copy_(mark["lk"])
        self.lv[:, row].copy_(mark["lv"])
        self.lpos[row].copy_(mark["lpos"])
        self.lens[row] = mark["len"]
        self.lens_cpu[row] = mark["len"]

    # --- snapshots (sessions: restore a conversation without re-prefilling it) ---------------------------------
    def state_dict(self, row: int = 0) -> dict[str, torch.Tensor]:
        """Row's K/V up to its length, rings, lpos and token history: enough to rebuild it in a fresh cache."""
        L = int(self.lens_cpu[row])
        return {"gk": self.gk[:, row, :, :L].cpu().contiguous(), "gv": self.gv[:, row, :, :L].cpu().contiguous(),
                "lk": self.lk[:, row].cpu().contiguous(), "lv": self.lv[:, row].cpu().contiguous(),
                "lpos": self.lpos[row].cpu().contiguous(), "tokens": self.tokens[row, :L].cpu().contiguous()}

    def load_state_dict(self, sd: dict[str, torch.Tensor], row: int = 0) -> None:
        L = int(sd["tokens"].numel())
        shapes = {"gk": (self.gk.size(0), self.gk.size(2), L, self.gk.size(4)), "lk": tuple(self.lk[:, row].shape),
                  "lpos": tuple(self.lpos[row].shape)}
        if L > self.max_len or tuple(sd["gk"].shape) != shapes["gk"] or tuple(sd["gv"].shape) != shapes["gk"] \
                or tuple(sd["lk"].shape) != shapes["lk"] or tuple(sd["lv"].shape) != shapes["lk"] \
                or tuple(sd["lpos"].shape) != shapes["lpos"]:
            raise ValueError("KV snapshot does not fit this model / cache")
        self.gk[:, row, :, :L].copy_(sd["gk"])
        self.gv[:, row, :, :L].copy_(sd["gv"])
        self.lk[:, row].copy_(sd["lk"])
        self.lv[:, row].copy_(sd["lv"])
        self.lpos[row].copy_(sd["lpos"])
        self.tokens[row, :L].copy_(sd["tokens"])
        self.lens[row] = L
        self.lens_cpu[row] = L
