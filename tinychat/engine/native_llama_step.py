"""The llama family's int8 decode step in native kernels (native_llama.h's tc_llama_step through engine/native.py):
`_NativeLlama`, the kernels' view of an imported llama-family model (raw weight pointers, fp32 buffers, the plan),
and `_decode_native_llama`, the native path of the lean CPU step for those configs (cpu_step.py builds it; the
PyTorch step it must equal is lean_step._decode_lean).

What it expresses: every layer global (kv_group 1, no local ring), no QK-norm, SwiGLU, RMSNorm with an epsilon,
optional q/k/v biases, an optional softcap, no Engram, int8 Linears (no bias on w_o, up, down or the head), an
fp32 or fp16 cache of batch 1 (fp16: the token's K/V rounded once as written, attention on the rounded rows widened to
fp32: native_attn_kv.h); input gains (the norm gains kept apart: engine/quant.py's in_gain) on the fused QKV and up
only, applied to the norm's output. Anything else runs lean_step. `--quant int4`: the same step on int4 layer weights (native_q4.h),
the head int8, each layer's Linears in their own formats (the table's last column: quant.py's per-layer mix), or (the
two-level head, two_level_head.py) the head scanned on its int4 copy and the best RESCORE_K rescored from the int8
rows. The embedding: an fp32 or bf16 table by pointer, or (a tied stored-quantized model: head_embed.py) the head's
own int8 rows, their fp32 scales and the inverse final gain, dequantized per token in C to the bits
HeadRowsEmbedding gives (the step's rounding is unchanged: the row is the model's, exactly)."""
from __future__ import annotations

import ctypes
import time
import weakref

import torch

from .append import RESCORE_K
from .cache import KVCache
from .head_embed import HeadRowsEmbedding
from . import page_drop
from . import two_level_head as head4
from .native import act_scratch
from .native_step import _PointerView, layer_formats
from .quant import Int8Linear
from .threads import ThreadTuner


def expresses(model, fs) -> bool:
    """Can tc_llama_step run this quantized model (fs: its cpu_step.CpuStep)?"""
    c = model.cfg
    lin = [b.attn.w_o for b in model.blocks] + [b.mlp.up for b in model.blocks] + [b.mlp.down for b in model.blocks]
    no_gain = [b.attn.w_o for b in model.blocks] + [b.mlp.down for b in model.blocks] + [fs.head]
    return (not c.has_local and c.kv_group == 1 and c.mlp_kind == "swiglu" and not c.qk_norm
            and all(getattr(m, "in_gain", None) is None for m in no_gain)
            and all(b.engram is None and b.attn.mode == "full" for b in model.blocks)
            and layer_formats(model, fs) is not None and type(fs.head) is Int8Linear and fs.head.bias is None
            and all(m.bias is None for m in lin)
            and _embed_ok(model, fs))


def _embed_ok(model, fs) -> bool:
    """An fp32 / bf16 table, or the int8 rows of the head the step runs (with fp32 inverse gains)."""
    emb = model.embed
    if isinstance(emb, HeadRowsEmbedding):
        return emb.head is fs.head and emb.inv_gain.dtype == torch.float32 and emb.inv_gain.is_contiguous()
    return emb.weight.dtype in (torch.float32, torch.bfloat16)


def _embed_table(model) -> torch.Tensor:
    """The tensor tc_llama_step reads the embedding rows from: the table, or the head's int8 rows."""
    emb = model.embed
    return emb.head.qweight if isinstance(emb, HeadRowsEmbedding) else emb.weight


class _NativeLlama(_PointerView):
    """The kernels' view of a llama-family int8 model: per layer the raw pointers of its int8 weights, fp32 scales
    and fused QKV bias (kept alive here), the buffers the step writes in place, and tc_llama_step's plan per cache."""

    @classmethod
    def build(cls, model, fs):
        from . import native
        if not expresses(model, fs):
            return None
        lib = native.load()
        return None if lib is None else cls(model, fs, lib)

    def __init__(self, model, fs, lib):
        from .native import LTAB_COLS
        c = model.cfg
        self.lib = lib
        self._keep = []
        fmts = layer_formats(model, fs)                     # each layer's formats (native_q4.h's TC_F_*); head int8

        def w(lin):                                         # (weights, scales)
            return self._ptrs(lin)[:2]

        rows = []
        for li, b in enumerate(model.blocks):
            q = fs.qkv[li]
            bias = 0
            if q.bias is not None:
                bt = q.bias.detach().float().contiguous()
                self._keep.append(bt)
                bias = bt.data_ptr()
            rows.append([*self._ptrs(q), bias, *w(b.attn.w_o), *w(b.mlp.up), *w(b.mlp.down),
                         self._gain(q), self._gain(b.mlp.up), fmts[li]])
        self.tab = torch.tensor(rows, dtype=torch.int64)
        assert self.tab.size(1) == LTAB_COLS
        self.head = self._ptrs(fs.head)
        h4 = head4.active(fs.head)                          # the two-level head: scan the int4 copy (two_level_head.py)
        self.head4 = (getattr(fs.head, head4.Q4W).data_ptr(), getattr(fs.head, head4.Q4S).data_ptr()) if h4 else (0, 0)
        d, hid, HD = c.d_model, c.mlp_hidden, c.n_heads * c.head_dim
        self.x, self.h = torch.empty(d), torch.empty(d)
        self.xq = act_scratch(lib, max(d, hid, HD))
        self.u = torch.empty(2 * hid)                       # [gate | up], then silu(gate) * up in the first half
        self.y = torch.empty(HD)
        self.qkv = torch.empty(max(r[2] for r in rows))
        self.logits = torch.empty(1, c.vocab_size)
        self.sc = torch.empty(0)                            # scores: threads * H / Hk * (max_len + 1)
        self.eps = c.norm_eps if c.norm_eps is not None else torch.finfo(torch.float32).eps
        self.tuner = ThreadTuner()
        self.rescore_k = head4.RESCORE_K if h4 else RESCORE_K   # head candidates recomputed exactly (0: none)
        self._plan = (lambda: None, None, None)             # (a weak reference to the cache, its key, the plan)
        self.drops = page_drop.step_table(model, fs)      # (table, what it keeps alive) or None: no drops

    def _gain(self, lin) -> int:
        """The address of lin's (d) fp32 input gain (kept alive here), or 0 for none (engine/quant.py's in_gain)."""
        g = getattr(lin, "in_gain", None)
        if g is None:
            return 0
        g = g.float().contiguous()
        self._keep.append(g)
        return g.data_ptr()

    def plan(self, model, cache: KVCache) -> int | None:
        """The address of tc_llama_step's plan for this cache (rebuilt when one of the tensors it points into is
        another), or None for a cache the kernel cannot read (not fp32 / fp16, batch > 1, not contiguous)."""
        key = (self.sc.data_ptr(), _embed_table(model).data_ptr(),
               *(t.data_ptr() for t in (cache.gk, cache.gv, cache.tokens, cache.lens, cache.lens_cpu)))
        ref, k, built = self._plan
        if ref() is cache and k == key:
            return built
        built = self._build_plan(model, cache)
        self._plan = (weakref.ref(cache), key, built)
        return built

    def _build_plan(self, model, cache: KVCache) -> int | None:
        from .native import EMB_BF16, EMB_F32, EMB_Q8, TcLlamaPlan
        c = model.cfg
        emb = _embed_table(model)
        q8 = isinstance(model.embed, HeadRowsEmbedding)
        if not (cache.gk.dtype in (torch.float32, torch.float16) and cache.B == 1 and emb.is_contiguous()
                and all(t.is_contiguous() for t in (cache.gk, cache.gv, cache.tokens, model.rope.cos, model.rope.sin))):
            return None
        p = TcLlamaPlan(d=c.d_model, hidden=c.mlp_hidden, H=c.n_heads, Hk=c.n_kv_heads, D=c.head_dim,
                        gstride=cache.max_len + 1, V=self.head[2], n_layers=len(model.blocks), rescore_k=self.rescore_k,
                        embed_fmt=EMB_Q8 if q8 else EMB_BF16 if emb.dtype == torch.bfloat16 else EMB_F32,
                        kv16=int(cache.kv16))
        for name in ("x", "h", "xq", "qkv", "y", "u", "logits", "sc"):
            setattr(p, name, getattr(self, name).data_ptr())
        p.tab, p.embed = self.tab.data_ptr(), emb.data_ptr()
        p.cos_, p.sin_ = model.rope.cos.data_ptr(), model.rope.sin.data_ptr()
        for name in ("gk", "gv", "tokens", "lens", "lens_cpu"):
            setattr(p, name, getattr(cache, name).data_ptr())
        p.head_q, p.head_s = self.head[0], self.head[1]
        p.head4_q, p.head4_s = self.head4
        p.drop = 0 if self.drops is None else self.drops[0].data_ptr()
        if q8:                                          # the head's fp32 scales (kept alive here) and inv_gain
            p.embed_s, p.embed_g = self.head[1], model.embed.inv_gain.data_ptr()
        self._plan_keep = p
        return ctypes.addressof(p)


def _decode_native_llama(model, cache: KVCache, tok: int, L: int, fs, nat: _NativeLlama):
    """The token tok at position L of row 0 through tc_llama_step; returns the logits (1, V), or None when the cache
    is one the kernel cannot read (the caller runs the PyTorch step then)."""
    ceiling = nat.tuner.ceiling()
    c = model.cfg
    need = max(ceiling, 1) * (c.n_heads // c.n_kv_heads) * (cache.max_len + 1)    # a group's heads at once
    if nat.sc.numel() < need:
        nat.sc = torch.empty(need)
    plan = nat.plan(model, cache)
    if plan is None:
        return None
    nt = nat.tuner.threads(ceiling)
    nat.tuner.sync_torch(nt, ceiling)                   # the sampler's torch ops at the step's count too
    t0 = time.perf_counter()
    nat.lib.tc_llama_step(plan, tok, L, nat.eps, model.cfg.logit_softcap, nt)
    nat.tuner.record(time.perf_counter() - t0, ceiling)
    return nat.logits.clone()                           # callers keep logits across steps; the buffer is reused
