"""The fast batch-1 CPU decode steps of a quantize_cpu model (Decoder.step on a CPU): `CpuStep`, built by the
Decoder, holds what they need besides the model; `_decode_fast` is TinyAgentLM's in PyTorch ops (the "lean" variant of
engine/steps.py's table). The others: an int8 model where the kernels build runs native kernels
(engine/native_step.py's `_decode_native`); configs other than TinyAgentLM's (the llama family: no local ring, no
QK-norm, SwiGLU, q/k/v biases, no softcap) run the general PyTorch step in engine/lean_step.py (`_decode_lean`), or
for an int8 llama native kernels too (engine/native_llama_step.py).

Batch-1 decode on a CPU is dispatch-bound as much as memory-bound: every op costs a few us, about as much as the
weights take to stream. So the step uses far fewer ops than _decode_one: fused QKV (one weight stream and one
kernel call per layer instead of 2-3), norms as x / |x|, RoPE as one DxD matmul for all q/k heads, the token's K/V
written into the cache first so attention reads the cache directly, each Linear fed from one bf16 buffer and added
into the fp32 residual in place. The fused weights are the model's own (quantize_cpu fuses its quantized rows,
exact), so a deep copy of a model gets a step of its own from its own Decoder."""
from __future__ import annotations

import torch

from .append import _engram_addrs
from .cache import KVCache
from .fused import fuse_qkv, n_qk_heads, rope_basis, rope_matrix
from .head_embed import embed_rows
from . import page_drop
from .native_llama_step import _NativeLlama
from .native_step import _NativeStep
from ..options import EngineOptions
from .quant import quant_mode
from .threads import ThreadTuner


class _FullMM(torch.nn.Module):
    """mm() for a Linear left in full precision (quantize_cpu(head=False))."""

    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def mm(self, xb):
        return torch.nn.functional.linear(xb.to(self.lin.weight.dtype), self.lin.weight, self.lin.bias)


class CpuStep:
    """What the lean step needs besides the model: the fused QKV weights (the model's own, fused.py's fuse_qkv; the
    q/k heads contiguous, so one norm and one RoPE matmul cover them), per-head norm divisors, the
    RoPE helper matrices, a bf16 activation buffer and, for an int8 model with native kernels, their view of the
    model (`nat`). Build with CpuStep.build(model, options): None for a model quantize_cpu did not touch.
    mode, native, drop: the plan's quant mode, whether the native step may run and whether it hands the mapped
    weight pages back once read (a Decoder given an ExecutionPlan passes them; None: asked of the model's Linears,
    options.native and page_drop.resolve(options.drop_pages), for engine callers without a plan)."""

    def __init__(self, model, options: EngineOptions, mode: str | None = None, native: bool | None = None,
                 drop: bool | None = None):
        c = model.cfg
        H, Hk, D = c.n_heads, c.n_kv_heads, c.head_dim
        self.mode = quant_mode(model) if mode is None else mode
        self.qkv = getattr(model, "fused_qkv", None) or fuse_qkv(model)
        self.nqk, self.ndiv = [], []
        for blk in model.blocks:
            nqk = n_qk_heads(blk.attn, H, Hk)
            self.nqk.append(nqk)
            # q heads: divide by |q| (= rms_norm(q) / sqrt(D): the attention's 1/sqrt(D) folded in);
            # k heads: by |k| / sqrt(D) (= rms_norm(k), what the cache holds)
            self.ndiv.append(torch.cat([torch.ones(H, 1), torch.full((nqk - H, 1), D ** -0.5)]))
        self.head = model.head if hasattr(model.head, "mm") else _FullMM(model.head)
        self.inv_sqrt_d = c.d_model ** -0.5
        self.eye, self.P = rope_basis(D)
        self.act = torch.bfloat16                 # what mm() takes
        self.hb = torch.empty(1, c.d_model, dtype=self.act)
        self.step_in_c = options.step_in_c
        self.tinyagent = c.is_tinyagent
        self.drop_pages = page_drop.resolve(options.drop_pages, model) if drop is None else drop   # the native steps'
        self.drop_head_rows = options.drop_pages is None    # the default: a two-level head's int8 rows (step_table)
        # native kernels: TinyAgentLM's step (native_step.py) or the llama family's (native_llama_step.py); other
        # configs, and every model without the kernels, run the PyTorch steps (lean_step.py picks its own threads)
        builder = _NativeStep if self.tinyagent else _NativeLlama
        self.nat = builder.build(model, self) if (options.native if native is None else native) else None
        if self.nat is not None:
            self.nat.tuner = ThreadTuner(auto=options.tune_threads)
        self.lean_tuner = ThreadTuner(auto=options.tune_threads)       # lean_step.py's

    @classmethod
    def build(cls, model, options: EngineOptions, mode: str | None = None,
              native: bool | None = None, drop: bool | None = None) -> "CpuStep | None":
        mode = quant_mode(model) if mode is None else mode
        return None if mode == "none" else cls(model, options, mode, native, drop)


def _decode_fast(model, cache: KVCache, idx, L: int, fs: CpuStep):
    """_decode_one for a quantize_cpu model, with far fewer ops (at batch 1 on a CPU every op costs a few us of
    dispatch, about as much as the weights take to stream): fused QKV, norms as x / |x| (one vector_norm), RoPE as one
    DxD matmul for all q/k heads, the token's K/V written into the cache first so attention reads the cache directly
    (no K/V concatenation), each Linear fed from one bf16 buffer and added into the fp32 residual in place.
    Same math as _decode_one up to float rounding (norm epsilon, summation order). idx (1, 1): the token."""
    c = model.cfg
    H, Hk, D, W = c.n_heads, c.n_kv_heads, c.head_dim, c.swa_window
    rep = H // Hk
    bf = fs.act
    vnorm = torch.linalg.vector_norm
    addrs = _engram_addrs(model, cache.tokens[:1], torch.tensor([L], device=idx.device), idx)
    cache.tokens[0, L] = idx[0, 0]
    slot = L % W
    cache.lpos[0, slot] = L
    lp = cache.lpos[0, :W]
    ok = (lp >= 0) & (L - lp < W)                     # ring slots holding a position of this token's window
    lbias = None if bool(ok.all()) else torch.zeros(W).masked_fill_(~ok, float("-inf"))
    cs, sn = model.rope.cos[L], model.rope.sin[L]
    R = rope_matrix(fs.eye, fs.P, cs, sn)                           # x @ R == RoPE(x) at position L
    lk, lv, gk, gv = cache.lk[:, 0], cache.lv[:, 0], cache.gk[:, 0], cache.gv[:, 0]
    lk_new, lv_new, gk_new, gv_new = lk[:, :, slot], lv[:, :, slot], gk[:, :, L], gv[:, :, L]
    Vl, Vg_all = lv[:, :, :W], gv[:, :, :L + 1]
    KlT, KgT_all = lk[:, :, :W].transpose(-1, -2), gk[:, :, :L + 1].transpose(-1, -2)
    kdt = cache.gk.dtype
    hb, inv = fs.hb, fs.inv_sqrt_d
    x = embed_rows(model.embed, idx[0])                                          # (1, d), a copy
    xdt = x.dtype
    if R.dtype != xdt:
        R = R.to(xdt)
    group = -1
    for li, blk in enumerate(model.blocks):
        if blk.engram is not None:
            x = x + blk.engram(x[None], addrs[li])[0]
        torch.div(x, vnorm(x, dim=-1, keepdim=True).mul_(inv), out=hb)           # rms_norm(x), in bf16
        heads = fs.qkv[li].mm(hb).view(-1, D)                                    # (nqk + nv, D), bf16
        nqk = fs.nqk[li]
        qk = heads[:nqk]                                                         # / an fp32 norm: fp32 result
        qk = (qk / vnorm(qk, dim=-1, keepdim=True, dtype=xdt).mul_(fs.ndiv[li])) @ R   # normed + rotated q / k
        q = qk[:H].view(Hk, rep, D)
        lk_new[li].copy_(qk[H:H + Hk])
        lv_new[li].copy_(heads[nqk:nqk + Hk])                                    # copy_ casts to the cache dtype
        if blk.attn.mode == "full":
            group += 1
            gk_new[group].copy_(qk[H + Hk:nqk])
            gv_new[group].copy_(heads[nqk + Hk:])
            KgT, Vg = KgT_all[group], Vg_all[group]
        if q.dtype != kdt:
            q = q.to(kdt)
        sl = torch.bmm(q, KlT[li])                                               # (Hk, rep, W) local
        if lbias is not None:
            sl.add_(lbias)
        p = torch.softmax(torch.cat([torch.bmm(q, KgT), sl], dim=-1), dim=-1, dtype=torch.float32)
        p = p.to(kdt)
        y = torch.bmm(p[..., :L + 1], Vg).baddbmm_(p[..., L + 1:], Vl[li])        # (Hk, rep, D)
        x.add_(blk.attn.w_o.mm(y.view(1, H * D).to(bf)))
        torch.div(x, vnorm(x, dim=-1, keepdim=True).mul_(inv), out=hb)
        u = blk.mlp.up.mm(hb)
        torch.relu_(u)
        x.add_(blk.mlp.down.mm(u.mul_(u)))
    cache.lens[0] += 1
    cache.lens_cpu[0] += 1
    torch.div(x, vnorm(x, dim=-1, keepdim=True).mul_(inv), out=hb)
    logits = fs.head.mm(hb).float()
    sc = c.logit_softcap
    return sc * torch.tanh(logits / sc)
