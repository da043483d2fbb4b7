"""The int4 weights' byte layout in PyTorch (native_q4_layout.h is the kernels' side and says it in full): rows by
groups of four, each group's bytes and scales interleaved in super-blocks of 512 columns so the GEMV reads one
stream; the last N % 4 rows plain. `plain` is the row-major form (per 64-column chunk byte j: column j in the low
nibble, column j + 32 in the high one; a row's scales in column order) that quantizing and slicing work in;
`grouped` / `plain` convert between the two, exactly (the same nibbles and scales, moved).

A row range [a, b) with a % 4 == 0 and (b % 4 == 0 or b == N) of a grouped matrix is a grouped matrix itself
(`rows`), and grouped matrices concatenate (`cat`) where all but the last have a multiple of four rows; anything
else goes through the plain form."""
from __future__ import annotations

import torch

SB = 512            # columns of a super-block


def _pad64(k: int) -> int:
    return (k + 63) // 64 * 64


def unpack_plain(packed: torch.Tensor) -> torch.Tensor:
    """Plain packed rows (N, Kp / 2) uint8 -> u (N, Kp) uint8 in 0..15, column order."""
    N = packed.size(0)
    b = packed.reshape(N, -1, 32)
    return torch.stack([b & 15, b >> 4], dim=2).reshape(N, -1)


def pack_plain(u: torch.Tensor) -> torch.Tensor:
    """u (N, Kp) uint8 in 0..15 -> plain packed rows (N, Kp / 2)."""
    N = u.size(0)
    c = u.reshape(N, -1, 2, 32)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(N, -1).contiguous()


def _geometry(packed: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(bytes a row, padded columns Kp, row groups, whole super-blocks, tail columns) of a packed matrix."""
    N, half = packed.shape
    Kp = 2 * half
    return half, Kp, N // 4, Kp // SB, Kp - SB * (Kp // SB)


def _as_is(packed: torch.Tensor, scales: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A matrix of fewer than four rows: plain in both layouts."""
    return packed.contiguous(), None if scales is None else scales.contiguous()


def grouped(packed: torch.Tensor, scales: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain (packed (N, Kp / 2) uint8, scales (N, Kp / 32) fp16 or None) -> the grouped layout, the same shapes
    (None for no scales)."""
    half, Kp, ng, nsb, T = _geometry(packed)
    if ng == 0:
        return _as_is(packed, scales)
    u = unpack_plain(packed[:4 * ng]).view(ng, 4, Kp)
    v = u[:, :, :SB * nsb].reshape(ng, 4, nsb, 16, 8, 4)               # g r b l s j
    sb = (v[:, :, :, :8] | (v[:, :, :, 8:] << 4)).permute(0, 2, 4, 1, 3, 5).reshape(ng, nsb * 1024)
    t = u[:, :, SB * nsb:].reshape(ng, 4, T // 64, 2, 32)              # g r c half j
    tail = (t[:, :, :, 0] | (t[:, :, :, 1] << 4)).permute(0, 2, 1, 3).reshape(ng, 2 * T)
    q = torch.cat([torch.cat([sb, tail], dim=1).view(4 * ng, half), packed[4 * ng:]])
    if scales is None:
        return q.contiguous(), None
    s = scales[:4 * ng].reshape(ng, 4, Kp // 32)
    ssb = s[:, :, :16 * nsb].reshape(ng, 4, nsb, 16).permute(0, 2, 1, 3).reshape(ng, 64 * nsb)
    st = s[:, :, 16 * nsb:].reshape(ng, 4 * (T // 32))
    ws = torch.cat([torch.cat([ssb, st], dim=1).view(4 * ng, Kp // 32), scales[4 * ng:]])
    return q.contiguous(), ws.contiguous()


def plain(packed: torch.Tensor, scales: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The grouped layout -> plain (grouped's inverse), the same shapes."""
    half, Kp, ng, nsb, T = _geometry(packed)
    if ng == 0:
        return _as_is(packed, scales)
    g = packed[:4 * ng].reshape(ng, 2 * Kp)
    sb = g[:, :nsb * 1024].reshape(ng, nsb, 8, 4, 8, 4)                 # g b s r l' j
    lo, hi = sb & 15, sb >> 4
    ub = torch.cat([lo, hi], dim=4).permute(0, 3, 1, 4, 2, 5).reshape(ng, 4, SB * nsb)    # g r b l s j
    t = g[:, nsb * 1024:].reshape(ng, T // 64, 4, 32)                   # g c r j
    ut = torch.stack([t & 15, t >> 4], dim=3).permute(0, 2, 1, 3, 4).reshape(ng, 4, T)   # g r c half j
    u = torch.cat([ub, ut], dim=2).reshape(4 * ng, Kp)
    q = torch.cat([pack_plain(u), packed[4 * ng:]])
    if scales is None:
        return q.contiguous(), None
    s = scales[:4 * ng].reshape(ng, Kp // 8)
    ssb = s[:, :64 * nsb].reshape(ng, nsb, 4, 16).permute(0, 2, 1, 3).reshape(ng, 4, 16 * nsb)
    st = s[:, 64 * nsb:].reshape(ng, 4, T // 32)
    ws = torch.cat([torch.cat([ssb, st], dim=2).reshape(4 * ng, Kp // 32), scales[4 * ng:]])
    return q.contiguous(), ws.contiguous()


def aligned(a: int, b: int, n: int) -> bool:
    """Whether rows [a, b) of a grouped matrix of n rows are a grouped matrix as they lie (views)."""
    return a % 4 == 0 and (b % 4 == 0 or b == n)


def rows(packed: torch.Tensor, scales: torch.Tensor, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [a, b) of a grouped matrix as a grouped matrix: views where the range keeps whole groups, else a
    copy through the plain form."""
    n = packed.size(0)
    if aligned(a, b, n):
        return packed[a:b], scales[a:b]
    g0, g1 = a - a % 4, min(n, -(-b // 4) * 4)                           # the groups holding the range
    p, s = plain(packed[g0:g1], scales[g0:g1])
    return grouped(p[a - g0:b - g0], s[a - g0:b - g0])


def cat(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped matrices (packed, scales) stacked by rows, as one grouped matrix."""
    if all(p.size(0) % 4 == 0 for p, _ in parts[:-1]):
        return torch.cat([p for p, _ in parts]).contiguous(), torch.cat([s for _, s in parts]).contiguous()
    flat = [plain(p, s) for p, s in parts]
    return grouped(torch.cat([p for p, _ in flat]), torch.cat([s for _, s in flat]))


def int4_pairs(sd: dict) -> list[tuple[str, str]]:
    """(packed key, scales key) of every int4 matrix in a state dict: a uint8 P.qweight with P.scale (an Int4Linear),
    a uint8 P.q4weight with P.q4scale (the two-level head's copy)."""
    out = []
    for k, v in sd.items():
        if v.dtype != torch.uint8:
            continue
        sk = k.removesuffix("q4weight") + "q4scale" if k.endswith(".q4weight") else \
            k.removesuffix("qweight") + "scale" if k.endswith(".qweight") else None
        if sk in sd:
            out.append((k, sk))
    return out
