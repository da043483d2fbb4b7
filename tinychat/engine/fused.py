"""Helpers the fused decode steps share (the static device step in static.py, the lean CPU step in cpu_step.py):
the fused QKV projection's row layout and RoPE as one DxD matrix.

Fused QKV: one weight [q | k_local | k_global | v_local | v_global] per layer (k_global / v_global on "full"
layers only; no k_local / v_local in a config without a local ring, swa_window 0: the llama family), so a step runs
one GEMM instead of 2-3 and the q/k heads are contiguous (one norm and one RoPE over them). q/k/v biases (Qwen2)
fuse the same way. Every quant format here is per output row, so fusing quantized rows is exact.

A quantized model owns its fused projections (fuse_qkv, run by quantize_cpu: `model.fused_qkv`, one per block): the
lean decode step and the native prefill both run them, and the q/k/v Linears keep their rows as views of the fused
weight wherever those rows lie contiguous in it (w_q always; w_kv_* when it is the layer's only K/V Linear), so the
weights are held once."""
from __future__ import annotations

import torch


def _kv_linears(attn) -> list:
    """The layer's K/V Linears in fused order: w_kv_local (None without a local ring), then w_kv_global ("full")."""
    return [lin for lin in (attn.w_kv_local, attn.w_kv_global) if lin is not None]


def qkv_rows(attn, kv_heads: int, head_dim: int) -> list[tuple[torch.nn.Module, int, int]]:
    """The fused projection as (Linear, first row, end row) pieces of the attention's own Linears, in order."""
    n = kv_heads * head_dim
    kv = _kv_linears(attn)                                             # w_kv_*: K rows then V rows
    return [(attn.w_q, 0, attn.w_q.out_features), *[(lin, 0, n) for lin in kv], *[(lin, n, 2 * n) for lin in kv]]


def n_qk_heads(attn, n_heads: int, kv_heads: int) -> int:
    """Heads of the fused output that get normed and rotated: the q heads and the layer's k heads."""
    return n_heads + kv_heads * len(_kv_linears(attn))


def fused_qkv_weight(attn, kv_heads: int, head_dim: int) -> torch.Tensor:
    """The fused weight (rows of every piece's .weight, in its dtype), contiguous."""
    return torch.cat([lin.weight.detach()[a:b] for lin, a, b in qkv_rows(attn, kv_heads, head_dim)]).contiguous()


def fused_qkv_bias(attn, kv_heads: int, head_dim: int) -> torch.Tensor | None:
    """The fused bias (q/k/v biases: the llama family's Qwen2-style models), or None for bias-free projections."""
    if attn.w_q.bias is None:
        return None
    return torch.cat([lin.bias.detach()[a:b] for lin, a, b in qkv_rows(attn, kv_heads, head_dim)])


def piece_runs(pieces) -> dict:
    """{Linear: [(first row, end row, fused row of the first), ...]}: where each piece Linear's rows lie in the
    fused projection of `pieces` (qkv_rows), in order."""
    parts, off = {}, 0
    for lin, a, b in pieces:
        parts.setdefault(lin, []).append((a, b, off))
        off += b - a
    return parts


def contiguous_run(lin, runs) -> slice | None:
    """The fused rows holding all of lin's rows as one in-order run (runs: piece_runs' entry), or None where its rows
    split around another piece's (a layer with both a local and a global K/V Linear)."""
    start = runs[0][2] - runs[0][0]                        # fused row of the piece's row 0
    if any(o - a != start for a, _, o in runs) or sum(b - a for a, b, _ in runs) != lin.out_features:
        return None
    return slice(start, start + lin.out_features)


def piece_rows(t: torch.Tensor, lin, runs) -> torch.Tensor:
    """lin's rows of the fused per-row tensor t (weights, scales or bias): a view where they lie as one run
    (contiguous_run), else a copy of its runs in its own row order."""
    rows = contiguous_run(lin, runs)
    return t[rows] if rows is not None else torch.cat([t[o:o + b - a] for a, b, o in sorted(runs)])


def piece_packed(f, lin, runs) -> tuple[torch.Tensor, torch.Tensor]:
    """lin's (qweight, scale) rows of the fused quant Linear f: views where they lie as one run that f's format can
    view (views_ok), else a copy of its runs in its own row order (f's _cat_rows)."""
    rows = contiguous_run(lin, runs)
    if rows is not None and f.views_ok(rows.start, rows.stop):
        return f.qweight[rows], f.scale[rows]
    return f._cat_rows([(f, o, o + b - a) for a, b, o in sorted(runs)])


def _share_rows(fused, pieces) -> None:
    """Point each piece Linear's per-row tensors (weights, scales, bias) at the fused Linear's rows, where all of the
    piece's rows lie in the fused weight as one in-order run: the same values, held once."""
    views_ok = getattr(fused, "views_ok", None)            # the packed Linears' (int4: whole row groups only)
    for lin, runs in piece_runs(pieces).items():
        rows = contiguous_run(lin, runs)
        if rows is None or (views_ok is not None and not views_ok(rows.start, rows.stop)):
            continue                                       # its rows split around another piece's: keep the copy
        for name, t in [*lin.named_buffers(recurse=False), *lin.named_parameters(recurse=False)]:
            if name == "in_gain":                          # per column, not per row: the fused one is the same
                continue
            mine = getattr(fused, name)[rows]
            setattr(lin, name, torch.nn.Parameter(mine, requires_grad=False) if isinstance(t, torch.nn.Parameter)
                    else mine)


def fuse_qkv(model) -> list:
    """model.fused_qkv: per block, one Linear of the rows of its q/k/v Linears (from_rows of their own class), the
    pieces' rows then shared with it (views). A plain list, not a submodule: state_dict and modules() stay the
    model's own (the rows are the q/k/v Linears' already)."""
    c = model.cfg
    fused = []
    for blk in model.blocks:
        pieces = qkv_rows(blk.attn, c.n_kv_heads, c.head_dim)
        f = type(blk.attn.w_q).from_rows(pieces)
        _share_rows(f, pieces)
        fused.append(f)
    model.fused_qkv = fused
    return fused


def split_qkv(y: torch.Tensor, attn, n_heads: int, kv_heads: int, head_dim: int):
    """The fused projection's output y (..., rows) as views: q (..., H, D) and, per K/V Linear of the layer by name
    ("w_kv_local", "w_kv_global"), its (k, v), each (..., Hk, D): what q / k / v of the separate Linears would be."""
    nq, n = n_heads * head_dim, kv_heads * head_dim
    names = [name for name in ("w_kv_local", "w_kv_global") if getattr(attn, name) is not None]
    heads = (kv_heads, head_dim)
    kv = {name: (y[..., nq + i * n:nq + (i + 1) * n].unflatten(-1, heads),
                 y[..., nq + (len(names) + i) * n:nq + (len(names) + i + 1) * n].unflatten(-1, heads))
          for i, name in enumerate(names)}
    return y[..., :nq].unflatten(-1, (n_heads, head_dim)), kv


def rope_basis(head_dim: int, device=None, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(eye, P), both (D, D): x @ (eye * cat(cos, cos) + P * cat(sin, sin)) == the half-split RoPE of x."""
    half = head_dim // 2
    eye = torch.eye(head_dim, device=device, dtype=dtype)
    P = torch.zeros(head_dim, head_dim, device=device, dtype=dtype)
    j = torch.arange(half, device=device)
    P[j + half, j] = -1
    P[j, j + half] = 1
    return eye, P


def rope_matrix(eye: torch.Tensor, P: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R with x @ R == RoPE(x) at the position whose cos / sin rows (..., D/2) are given."""
    return eye * torch.cat([cos, cos], dim=-1) + P * torch.cat([sin, sin], dim=-1)
