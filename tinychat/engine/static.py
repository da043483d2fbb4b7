"""The static-shape device step (`_step_static`) that CUDA/XPU graphs capture, its per-model helper tensors
(`_StaticAux`) and the captured-graph prefill feeds (`_StaticFeed`). On a CPU the same step runs uncaptured
(Decoder(graph="static")): that is how its equivalence with the eager path is tested without a GPU."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..model import CacheView, mlp_act_, rms_norm
from .append import _rope_cs, _softcap
from .cache import KVCache
from .fused import fused_qkv_bias, fused_qkv_weight, n_qk_heads, rope_basis, rope_matrix
from .head_embed import embed_dtype


def _graph_api(dev: torch.device):
    """(Graph, graph context, Stream, stream context, current_stream) for a device that can capture, else None."""
    if dev.type == "cuda":
        return torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.Stream, torch.cuda.stream, torch.cuda.current_stream
    if dev.type == "xpu" and hasattr(torch, "xpu") and hasattr(torch.xpu, "XPUGraph"):
        return torch.xpu.XPUGraph, torch.xpu.graph, torch.xpu.Stream, torch.xpu.stream, torch.xpu.current_stream
    return None


class _StaticAux:
    """Per-model tensors for the fused graph step: per layer one weight for [q | k_local | k_global | v_local |
    v_global] (one GEMM instead of 2-3, and the q/k heads contiguous so one norm + one RoPE matmul covers them),
    plus the RoPE helper matrices. Built once per Decoder."""

    def __init__(self, model, cache: KVCache):
        c = model.cfg
        Hk, D = c.n_kv_heads, c.head_dim
        dev = cache.gk.device
        self.wf = [fused_qkv_weight(blk.attn, Hk, D) for blk in model.blocks]
        self.bf = [fused_qkv_bias(blk.attn, Hk, D) for blk in model.blocks]       # None: bias-free projections
        self.nqk = [n_qk_heads(blk.attn, c.n_heads, Hk) for blk in model.blocks]
        self.kpos = torch.arange(cache.max_len, device=dev)
        self.ar = torch.arange(max(_StaticFeed.BUCKETS), device=dev)
        max_n = max(c.engram_orders) if model.engram_modules() else 1
        self.back = torch.arange(-(max_n - 1), 0, device=dev)
        self.eye, self.P = rope_basis(D, dev, embed_dtype(model.embed))


def _step_static(model, cache: KVCache, idx, n, aux: _StaticAux):
    """Append the first n of the C tokens idx (1, C) to row 0 with static shapes and no host values (CUDA/XPU graph
    capture). n (1,) long on the device; n == 0 is a no-op on the cache (writes go to the scratch slots, the length
    stays), so a captured decode loop can run past the end of a turn without touching the window. The position is
    cache.lens on the device; global attention runs over all max_len slots with a length mask. Returns softcapped
    logits (1, V) at the last real token. The layers are the model's Block.forward with StaticView's kernels. Same
    math as append; results differ by rounding (GEMM shapes, RoPE as a matmul)."""
    view = StaticView(model, cache, idx, n, aux)
    x = model.run_blocks(model.embed(idx[0]), view, view.addrs)               # (C, d): row 0 without its batch dim
    cache.lpos[0].index_copy_(0, view.slot, torch.where(view.keep, view.pos, torch.full_like(view.pos, -1)))
    cache.lens.add_(n)
    return _softcap(model, x.index_select(0, (n - 1).clamp_min(0)))


class StaticView(CacheView):
    """_step_static's view of the chunk: fused for few kernels (launch overhead is the cost at batch 1): one QKV GEMM
    per layer (_StaticAux's weights), one norm and one RoPE over the q/k heads (a matmul when C == 1), the new K/V
    written with index_copy_ (padding to the scratch slots), attention by baddbmm with an additive mask over all
    max_len global slots, the ring and the chunk's local keys, and the residual adds inside addmm. Holds no host
    values: the position is cache.lens on the device. The hidden states are row 0's, (C, d), without a batch dim
    (its Engram addresses (C, n_tables) too): no view op a layer around the addmm calls."""

    def __init__(self, model, cache: KVCache, idx, n, aux: _StaticAux):
        c = model.cfg
        H, Hk, D, W = c.n_heads, c.n_kv_heads, c.head_dim, c.swa_window
        rep = H // Hk
        M = cache.max_len
        C = idx.size(1)
        self.cache, self.aux, self.C, self.M = cache, aux, C, M
        dt = cache.gk.dtype
        rope = model.rope
        lens = cache.lens[:1]                                                    # (1,)
        ar = aux.ar[:C]
        pos = self.pos = lens + ar                                               # (C,)
        valid = ar < n
        new_len = lens + n
        self.gpos = torch.where(valid, pos, torch.full_like(pos, M))
        keep = self.keep = valid & (pos >= new_len - W)
        self.slot = torch.where(keep, pos % max(W, 1), torch.full_like(pos, W))   # W 0: no ring, scratch slot
        lnew = torch.where(valid, pos, torch.full_like(pos, -1))
        self.addrs = {}
        if model.engram_modules():
            prev_pos = lens + aux.back                                           # (max_n - 1,)
            # index_select, not gather: XPU's gather kernel trips an index assert under graph replay
            prev = cache.tokens[0].index_select(0, prev_pos.clamp_min(0))
            prev = torch.where(prev_pos >= 0, prev, torch.zeros_like(prev))
            self.addrs = {li: a[0] for li, a in model.engram_addresses(idx, prev[None]).items()}
        cache.tokens[0].index_copy_(0, self.gpos, idx[0])
        lp = torch.cat([cache.lpos[0], lnew])                                   # (W+1+C,) local key positions
        pq = pos[:, None]
        mask = (aux.kpos[None, :] <= pq) & (aux.kpos[None, :] < new_len)
        if c.has_local:
            mask = torch.cat([mask, (lp[None, :] >= 0) & (lp[None, :] <= pq) & (pq - lp[None, :] < W)], dim=1)
        mask[:, 0] |= ~valid                 # padding / no-op queries: never an all-masked row (NaN)
        xdt = embed_dtype(model.embed)
        bias = torch.zeros(mask.shape, device=idx.device, dtype=dt).masked_fill_(~mask, float("-inf"))
        self.bias = bias.repeat(rep, 1)[None]                                    # (1, rep*C, L), rows r*C + i
        if C == 1:
            cs, sn = rope.cos[pos].to(xdt), rope.sin[pos].to(xdt)                # (1, D/2)
            R = rope_matrix(aux.eye, aux.P, cs, sn)                              # x @ R == RoPE(x)
            self.rot = lambda t: t @ R
        else:
            cs, sn = rope.cos[pos][:, None].to(xdt), rope.sin[pos][:, None].to(xdt)   # (C, 1, D/2)
            self.rot = lambda t: _rope_cs(t, cs, sn)
        self.scale = 1.0 / math.sqrt(D)

    def attend(self, attn, h):
        cache, aux, C, M = self.cache, self.aux, self.C, self.M
        li, H, Hk, D = attn.layer, attn.n_heads, attn.n_kv_heads, attn.head_dim
        rep, dt, local = H // Hk, cache.gk.dtype, attn.w_kv_local is not None
        nqk = aux.nqk[li]
        heads = F.linear(h, aux.wf[li], aux.bf[li]).view(C, -1, D)                   # (C, nqk+nv, D)
        qk = rms_norm(heads[:, :nqk], attn.eps) if attn.qk_norm else heads[:, :nqk]
        qk = self.rot(qk)                                                        # normed + rotated q / k heads
        q = qk[:, :H].reshape(C, Hk, rep, D).permute(1, 2, 0, 3).reshape(Hk, rep * C, D)
        if local:
            kl = qk[:, H:H + Hk].transpose(0, 1).to(cache.lk.dtype)              # (Hk, C, D)
        if attn.mode == "full":
            group = attn.group
            vl, vg = (heads[:, nqk:nqk + Hk], heads[:, nqk + Hk:]) if local else (None, heads[:, nqk:])
            cache.gk[group][0].index_copy_(1, self.gpos, qk[:, nqk - Hk:].transpose(0, 1).to(dt))
            cache.gv[group][0].index_copy_(1, self.gpos, vg.transpose(0, 1).to(dt))
            self.Kg, self.Vg = cache.gk[group][0, :, :M], cache.gv[group][0, :, :M]
        else:
            vl = heads[:, nqk:]
        if local:
            vl = vl.transpose(0, 1).to(cache.lv.dtype)                           # (Hk, C, D)
            Kb = torch.cat([self.Kg, cache.lk[li][0], kl], dim=1)                # (Hk, M + W + 1 + C, D)
            Vb = torch.cat([self.Vg, cache.lv[li][0], vl], dim=1)
        else:
            Kb, Vb = self.Kg, self.Vg
        sc = torch.baddbmm(self.bias, q.to(dt), Kb.transpose(1, 2), alpha=self.scale)
        p = torch.softmax(sc, dim=-1, dtype=torch.float32).to(dt)
        y = torch.bmm(p, Vb).view(Hk, rep, C, D).permute(2, 0, 1, 3).reshape(C, H * D).to(h.dtype)
        if local:
            cache.lk[li][0].index_copy_(1, self.slot, kl)
            cache.lv[li][0].index_copy_(1, self.slot, vl)
        return y

    def add_out(self, x, w_o, y):
        return torch.addmm(x, y, w_o.weight.t())

    def add_mlp(self, x, mlp, h):
        return torch.addmm(x, mlp_act_(mlp.kind, F.linear(h, mlp.up.weight)), mlp.down.weight.t())


class _StaticFeed:
    """Graph-captured append() for one row-0 chunk of up to max(BUCKETS) tokens (a new turn, a tool result) on a
    CUDA/XPU cache: the chunk is padded to the next bucket, one graph per bucket, captured on first use. Attached to
    the cache by the Decoder (cache.static_feed); append() uses it for batch-1 chunks that fit."""
    BUCKETS = (16, 32, 64, 128, 256, 512)

    def __init__(self, model, cache: KVCache, aux: _StaticAux, capture: bool = True):
        self.model, self.cache, self.aux, self.capture = model, cache, aux, capture
        self.max_c = self.BUCKETS[-1]
        self.n = torch.zeros(1, dtype=torch.long, device=cache.gk.device)
        self.inp, self.out, self.g, self.fns = {}, {}, {}, {}

    def _graph(self, C):
        dev = self.cache.gk.device
        self.inp[C] = torch.zeros(1, C, dtype=torch.long, device=dev)
        model, cache, aux, inp, n = self.model, self.cache, self.aux, self.inp[C], self.n

        def fn():
            self.out[C] = _step_static(model, cache, inp, n, aux)

        self.fns[C] = fn
        if not self.capture:
            self.g[C] = fn
            return
        Graph, graph_ctx, Stream, stream_ctx, current = _graph_api(dev)
        n.zero_()                                    # warm-up / capture as no-ops: writes land in scratch slots
        s = Stream()
        s.wait_stream(current())
        with stream_ctx(s):
            for _ in range(2):
                fn()
        current().wait_stream(s)
        g = Graph()
        with graph_ctx(g):
            fn()
        self.g[C] = g.replay

    def feed(self, idx, w: int):
        C = next(b for b in self.BUCKETS if b >= w)
        if C not in self.g:
            self._graph(C)
        inp = self.inp[C]
        inp[:, :w].copy_(idx[:1, :w])
        if w < C:
            inp[:, w:].zero_()
        self.n.fill_(w)
        self.g[C]()
        self.cache.lens_cpu[0] += w
        return self.out[C].clone()
