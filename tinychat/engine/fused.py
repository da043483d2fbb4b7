"""Helpers the fused decode steps share (the static device step in static.py, the lean CPU step in cpu_step.py):
the fused QKV projection's row layout and RoPE as one DxD matrix.

Fused QKV: one weight [q | k_local | k_global | v_local | v_global] per layer (k_global / v_global on "full"
layers only; no k_local / v_local in a config without a local ring, swa_window 0: the llama family), so a step runs
one GEMM instead of 2-3 and the q/k heads are contiguous (one norm and one RoPE over them). q/k/v biases (Qwen2)
fuse the same way. Every quant format here is per output row, so fusing quantized rows is exact."""
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
