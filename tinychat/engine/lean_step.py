"""The lean batch-1 CPU decode step for configs the TinyAgentLM step (cpu_step._decode_fast) and the native kernels
do not express: the llama family (every layer global with no local ring, no QK-norm, SwiGLU, q/k/v biases, a norm
epsilon, no softcap), and any mix of those options with TinyAgentLM's own.

Same plan as _decode_fast: one fused QKV weight per layer (CpuStep's, biases included), bf16 activations into
the quant Linears' mm(), the token's K/V written into the cache first so attention reads the cache directly, the
residual stream, norms, softmax and the cache in fp32. Same math as _decode_one up to float rounding.

Threads: like the native step, the count is picked by measurement (threads.ThreadTuner): on a 2-vCPU machine with
the other core busy, PyTorch's two-thread GEMVs stall at every barrier (ten times slower than one thread:
docs/benchmarks.md, "Kernel figures moved out of the sources"), so a step runs at the tuner's choice and torch's
count is restored after.

Why not one step for both: _decode_fast keeps TinyAgentLM's shortcuts (norms as x / |x| with the attention's
1/sqrt(D) folded into the q-head divisor, ReLU^2 in place, the local ring always present), which this step cannot
assume; it shares CpuStep's fused weights, RoPE basis and buffers, and fused.py's row layout. Folding _decode_fast
into this one would put branches into the hot loop of the shipped model's step, so the two stay side by side."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..model import mlp_act, softcap
from . import two_level_head as head4
from .append import _engram_addrs, rescore_top
from .cache import KVCache
from .fused import rope_matrix
from .head_embed import embed_rows


def _decode_lean(model, cache: KVCache, idx, L: int, fs) -> torch.Tensor:
    """_decode_one for a quantize_cpu model of any config (fs: cpu_step.CpuStep; idx (1, 1): the token). Returns the
    logits (1, V) fp32."""
    tuner = fs.lean_tuner
    ceiling = torch.get_num_threads()
    nt = tuner.threads(ceiling)
    if nt != ceiling:
        torch.set_num_threads(nt)
    t0 = time.perf_counter()
    try:
        return _step(model, cache, idx, L, fs)
    finally:
        if nt != ceiling:
            torch.set_num_threads(ceiling)
        tuner.record(time.perf_counter() - t0, ceiling)


def _step(model, cache: KVCache, idx, L: int, fs):
    c = model.cfg
    H, Hk, D, W = c.n_heads, c.n_kv_heads, c.head_dim, c.swa_window
    rep, eps, local = H // Hk, c.norm_eps, c.has_local
    bf, hb = fs.act, fs.hb
    scale = D ** -0.5
    addrs = _engram_addrs(model, cache.tokens[:1], torch.tensor([L], device=idx.device), idx)
    cache.tokens[0, L] = idx[0, 0]
    lbias = None
    if local:
        slot = L % W
        cache.lpos[0, slot] = L
        lp = cache.lpos[0, :W]
        ok = (lp >= 0) & (L - lp < W)                 # ring slots holding a position of this token's window
        lbias = None if bool(ok.all()) else torch.zeros(W).masked_fill_(~ok, float("-inf"))
    cs, sn = model.rope.cos[L], model.rope.sin[L]
    R = rope_matrix(fs.eye, fs.P, cs, sn)                           # x @ R == RoPE(x) at position L
    gk, gv = cache.gk[:, 0], cache.gv[:, 0]
    KgT_all, Vg_all = gk[:, :, :L + 1].transpose(-1, -2), gv[:, :, :L + 1]
    kdt = cache.attn_dtype                          # an fp16 cache: read back as fp32 (the new rows rounded first)
    x = embed_rows(model.embed, idx[0]).float()                                  # (1, d), a copy
    if R.dtype != x.dtype:
        R = R.to(x.dtype)
    group = -1
    for li, blk in enumerate(model.blocks):
        if blk.engram is not None:
            x = x + blk.engram(x[None], addrs[li])[0]
        hb.copy_(F.rms_norm(x, (x.size(-1),), eps=eps))
        heads = fs.qkv[li].mm(hb).view(-1, D)                                    # (nqk + nv, D), act dtype
        nqk = fs.nqk[li]
        qk = heads[:nqk].to(x.dtype)
        if c.qk_norm:
            qk = F.rms_norm(qk, (D,), eps=eps)
        qk = qk @ R                                                              # rotated q / k heads
        q = qk[:H].view(Hk, rep, D).to(kdt)
        if blk.attn.mode == "full":
            group += 1
            gk[group, :, L].copy_(qk[nqk - Hk:nqk])
            gv[group, :, L].copy_(heads[nqk + (Hk if local else 0):])
            KgT, Vg = KgT_all[group].to(kdt), Vg_all[group].to(kdt)
        s = torch.bmm(q, KgT)                                                    # (Hk, rep, L + 1) global
        if local:
            cache.lk[li, 0, :, slot].copy_(qk[H:H + Hk])
            cache.lv[li, 0, :, slot].copy_(heads[nqk:nqk + Hk])
            sl = torch.bmm(q, cache.lk[li, 0, :, :W].transpose(-1, -2).to(kdt))          # (Hk, rep, W) local ring
            if lbias is not None:
                sl.add_(lbias)
            s = torch.cat([s, sl], dim=-1)
        p = torch.softmax(s.mul_(scale), dim=-1, dtype=torch.float32).to(kdt)
        y = torch.bmm(p[..., :L + 1], Vg)                                        # (Hk, rep, D)
        if local:
            y.baddbmm_(p[..., L + 1:], cache.lv[li, 0, :, :W].to(kdt))
        x.add_(blk.attn.w_o.mm(y.view(1, H * D).to(bf)))
        hb.copy_(F.rms_norm(x, (x.size(-1),), eps=eps))
        u = blk.mlp.up.mm(hb)
        x.add_(blk.mlp.down.mm(mlp_act(blk.mlp.kind, u.float()).to(bf)))
    cache.lens[0] += 1
    cache.lens_cpu[0] += 1
    h = F.rms_norm(x, (x.size(-1),), eps=eps)
    if head4.active(fs.head):                       # the two-level head (two_level_head.py): int4 scan, int8 rescoring
        return softcap(rescore_top(fs.head, h, head4.scan(fs.head, h), head4.RESCORE_K), c.logit_softcap)
    hb.copy_(h)
    logits = fs.head.mm(hb).float()
    if not c.is_tinyagent:
        logits = rescore_top(fs.head, h, logits)       # exact fp32 logits for the best candidates (append.py)
    return softcap(logits, c.logit_softcap)
