"""CPU speed modes (`--quant int8|bf16`): weight-only quantized Linears and the lean batch-1 CPU decode step.

Batch-1 decode on a CPU is memory-bound: every token streams all Linear weights once. Storing them in bf16 halves
the bytes, int8 quarters them. The kernels take bf16 activations (fp32 accumulation inside); the residual stream,
norms, attention, softmax and the KV cache stay fp32. Every quant Linear has mm(xb): bf16 (rows, in) -> bf16
(rows, out), the call _decode_fast makes. These modes change the logits slightly."""
from __future__ import annotations

import threading
import warnings

import torch

from .append import _engram_addrs
from .cache import KVCache

QUANT_GEMV_ROWS = 8    # BF16Linear: up to this many rows use the bf16 kernel (on AVX2 bf16 GEMM is ~3x slower than fp32)
INT8_GEMV_ROWS = 128   # Int8Linear: up to this many rows use the int8 kernel; beyond, dequantize + fp32 GEMM (the
                       # kernel costs per row, the GEMM per weight byte)
INT8_GEMV_ROWS_BF16 = 12   # the same where prefill runs bf16 GEMMs: they win from ~12 rows on (full-config shapes)
PREFILL_BF16 = None    # prefill GEMMs of the quant Linears in bf16 (oneDNN, fp32 accumulation): None = where the CPU
                       # has native bf16 dot products (AVX512-BF16 / AMX; ~2.5x faster than fp32 there), else fp32
_SCRATCH_MAX = 16 << 20
_tls = threading.local()


def _scratch(shape, dtype):
    """A reused buffer for prefill's dequantized weights (no 10 MB malloc + page faults per call). Per thread."""
    d = getattr(_tls, "d", None)
    if d is None:
        d = _tls.d = {}
    key = (tuple(shape), dtype)
    t = d.get(key)
    if t is None:
        t = torch.empty(shape, dtype=dtype)
        if t.numel() * t.element_size() <= _SCRATCH_MAX:
            d[key] = t
    return t


def prefill_bf16() -> bool:
    """Do quant Linears prefill through bf16 GEMMs? PREFILL_BF16, or (None) whether this CPU has native bf16 dot
    products (AVX512-BF16 or AMX tiles): there oneDNN's bf16 GEMM beats fp32 by ~2.5x; on AVX2 it is ~3x slower."""
    if PREFILL_BF16 is not None:
        return bool(PREFILL_BF16)
    if not hasattr(prefill_bf16, "ok"):
        try:
            cpu = torch.cpu
            prefill_bf16.ok = bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
        except Exception:  # noqa: BLE001  older torch: no probes
            prefill_bf16.ok = False
    return prefill_bf16.ok


class BF16Linear(torch.nn.Module):
    """A Linear whose weight is stored in bf16: half the bytes to stream per token. The matmul runs on bf16 inputs
    (fp32 accumulation inside oneDNN), the output is returned in the input dtype."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.weight = torch.nn.Parameter(lin.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().to(torch.bfloat16),
                                                                      requires_grad=False)

    def mm(self, xb):
        return torch.nn.functional.linear(xb, self.weight, self.bias)

    def forward(self, x):
        if x.numel() // x.size(-1) > QUANT_GEMV_ROWS and not prefill_bf16():   # prefill: fp32 GEMM, upcast weight
            b = None if self.bias is None else self.bias.to(x.dtype)
            w = self.weight
            return torch.nn.functional.linear(x, _scratch(w.shape, x.dtype).copy_(w), b)
        return torch.nn.functional.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)


class Int8Linear(torch.nn.Module):
    """Weight-only int8 Linear: int8 weights with one scale per output channel (symmetric, max-abs; the scale is
    stored in bf16, the kernel's dtype, and the weights are rounded against that stored value), bf16 activations into
    aten._weight_int8pack_mm (dequantizes on the fly, fp32 accumulation). A quarter of the fp32 bytes per token.
    Activations are not quantized (dynamic activation quantization is lossy for the ReLU^2 MLP).
    More than INT8_GEMV_ROWS rows (long prefill): dequantize into a scratch buffer + fp32 GEMM."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        w = lin.weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).to(torch.bfloat16)
        q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().float(), requires_grad=False)

    @property
    def weight(self):   # dequantized copy, for code that reads .weight (the fused device step; not used on CPU)
        return self.qweight.float() * self.scale.float()[:, None]

    def mm(self, xb):
        y = torch.ops.aten._weight_int8pack_mm(xb, self.qweight, self.scale)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def forward(self, x):
        shape = x.shape
        rows = x.numel() // shape[-1]
        if rows > INT8_GEMV_ROWS_BF16 and prefill_bf16():
            # bf16 GEMM on the int8 values (exact in bf16), the per-channel scale applied to the output columns
            wq = _scratch(self.qweight.shape, torch.bfloat16).copy_(self.qweight)
            y = torch.nn.functional.linear(x.to(torch.bfloat16), wq).to(x.dtype).mul_(self.scale.to(x.dtype))
            return y if self.bias is None else y.add_(self.bias.to(x.dtype))
        if rows > INT8_GEMV_ROWS:
            w = torch.mul(self.qweight, self.scale.float()[:, None],
                          out=_scratch(self.qweight.shape, torch.float32)).to(x.dtype)
            return torch.nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))
        y = self.mm(x.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous())
        return y.view(*shape[:-1], self.out_features).to(x.dtype)


class _FullMM(torch.nn.Module):
    """mm() for a Linear left in full precision (quantize_cpu(head=False))."""

    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def mm(self, xb):
        return torch.nn.functional.linear(xb.to(self.lin.weight.dtype), self.lin.weight, self.lin.bias)


QUANT_CLASSES = {"int8": Int8Linear, "bf16": BF16Linear}
QUANT_MODES = ("none", *QUANT_CLASSES)


def int8_kernel_ok() -> bool:
    """Does this torch build run aten._weight_int8pack_mm on bf16 inputs (and get it right)? Checked once."""
    if not hasattr(int8_kernel_ok, "ok"):
        try:
            g = torch.Generator().manual_seed(0)
            w = torch.randint(-127, 128, (64, 64), dtype=torch.int8, generator=g)
            s = torch.rand(64, generator=g).add_(0.5).to(torch.bfloat16)
            x = torch.randn(2, 64, generator=g).to(torch.bfloat16)
            y = torch.ops.aten._weight_int8pack_mm(x, w, s).float()
            ref = x.float() @ (w.float() * s.float()[:, None]).t()
            int8_kernel_ok.ok = bool(torch.allclose(y, ref, rtol=0.02, atol=0.02 * float(ref.abs().max())))
        except Exception:  # noqa: BLE001  op missing / unsupported dtype on this build
            int8_kernel_ok.ok = False
    return int8_kernel_ok.ok


def quantize_cpu(model, mode: str, head: bool = True):
    """In place. mode "int8": weight-only int8 Linear layers (Int8Linear, per-channel scales, bf16 activations).
    "bf16": Linear weights stored in bf16 (BF16Linear). Embeddings, Engram tables, norms, RoPE and the KV cache stay
    as they are. head=False keeps the output head in full precision. Use an fp32 KV cache with these.
    Also builds model._cpu_fast, the packed weights of the lean CPU decode step (_decode_fast, used by Decoder.step)."""
    if mode in (None, "", "none", "fp32"):
        return model
    cls = QUANT_CLASSES.get(mode)
    if cls is None:
        raise ValueError(f"unknown quant mode {mode!r} (none, {', '.join(QUANT_CLASSES)})")
    if cls is Int8Linear and not int8_kernel_ok():
        warnings.warn("this PyTorch build has no CPU int8 kernel for bf16 inputs (aten._weight_int8pack_mm); "
                      "using --quant bf16 instead")
        mode, cls = "bf16", BF16Linear
    fused = []
    Hk, D = model.cfg.n_kv_heads, model.cfg.head_dim
    for blk in model.blocks:   # [q | k_local | k_global | v_local | v_global]: per-row formats, so fusing is exact
        a = blk.attn
        kv = [m for m in (a.w_kv_local, a.w_kv_global) if m is not None]   # the llama family: no local K/V
        lin = torch.nn.Linear(model.cfg.d_model, 1, bias=False)
        lin.weight = torch.nn.Parameter(torch.cat([a.w_q.weight.detach()] + [m.weight.detach()[:Hk * D] for m in kv]
                                                  + [m.weight.detach()[Hk * D:] for m in kv]).float(),
                                        requires_grad=False)
        if a.w_q.bias is not None:
            lin.bias = torch.nn.Parameter(torch.cat([a.w_q.bias.detach()] + [m.bias.detach()[:Hk * D] for m in kv]
                                                    + [m.bias.detach()[Hk * D:] for m in kv]).float(),
                                          requires_grad=False)
        fused.append(cls(lin))
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)
               and (head or name != "head")]
    for name, mod in targets:
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], cls(mod))
    model._cpu_fast = _CpuFast(model, fused)
    model._quant = mode
    return model


class _CpuFast:
    """What _decode_fast needs besides the model: the fused QKV weights (one weight stream and one kernel call per
    layer instead of 2-3; the q/k heads contiguous, so one norm and one RoPE matmul cover them), per-head norm
    divisors, the RoPE helper matrices and a bf16 activation buffer. The fused weights duplicate w_q/w_kv_* (prefill
    keeps using those)."""

    def __init__(self, model, fused):
        c = model.cfg
        H, Hk, D = c.n_heads, c.n_kv_heads, c.head_dim
        self.qkv = fused
        self.nqk, self.ndiv = [], []
        for blk in model.blocks:
            nk = sum(m is not None for m in (blk.attn.w_kv_local, blk.attn.w_kv_global))
            self.nqk.append(H + Hk * nk)
            # q heads: divide by |q| (= rms_norm(q) / sqrt(D): the attention's 1/sqrt(D) folded in);
            # k heads: by |k| / sqrt(D) (= rms_norm(k), what the cache holds)
            self.ndiv.append(torch.cat([torch.ones(H, 1), torch.full((Hk * nk, 1), D ** -0.5)]))
        self.head = model.head if hasattr(model.head, "mm") else _FullMM(model.head)
        self.inv_sqrt_d = c.d_model ** -0.5
        half = D // 2
        self.eye = torch.eye(D)
        P = torch.zeros(D, D)
        j = torch.arange(half)
        P[j + half, j] = -1
        P[j, j + half] = 1
        self.P = P
        self.act = getattr(type(fused[0]), "ACT_DTYPE", torch.bfloat16)   # what mm() takes (tests: float64)
        self.hb = torch.empty(1, c.d_model, dtype=self.act)
        # the native kernels express TinyAgentLM only (QK-norm, ReLU^2, local rings, softcap): other configs (the
        # llama family) run the PyTorch lean step (lean_step.py)
        self.nat = _NativeStep.build(model, self) if NATIVE and c.is_tinyagent else None


NATIVE = True   # int8 models: run _decode_fast's GEMVs and everything after attention through the native kernels
                # (engine/native.py) when they build here; False: the PyTorch ops only (set before quantize_cpu)


def _decode_fast(model, cache: KVCache, idx, L: int, fs: _CpuFast, tok: int | None = None):
    """_decode_one for a quantize_cpu model, with far fewer ops (at batch 1 on a CPU every op costs a few us of
    dispatch, about as much as the weights take to stream): fused QKV, norms as x / |x| (one vector_norm), RoPE as one
    DxD matmul for all q/k heads, the token's K/V written into the cache first so attention reads the cache directly
    (no K/V concatenation), each Linear fed from one bf16 buffer and added into the fp32 residual in place.
    Same math as _decode_one up to float rounding (norm epsilon, summation order).
    With native kernels (an int8 model, NATIVE, a C compiler): _decode_native. tok: the token as a host int (then
    idx is only a buffer: the native step needs no tensor of it)."""
    nat = fs.nat
    if nat is not None and NATIVE:
        return _decode_native(model, cache, int(idx[0, 0]) if tok is None else tok, L, fs, nat)
    if not model.cfg.is_tinyagent:
        return _decode_lean(model, cache, idx, L, fs, tok)
    if tok is not None:
        idx.fill_(tok)
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
    R = fs.eye * torch.cat([cs, cs]) + fs.P * torch.cat([sn, sn])   # x @ R == RoPE(x) at position L
    lk, lv, gk, gv = cache.lk[:, 0], cache.lv[:, 0], cache.gk[:, 0], cache.gv[:, 0]
    lk_new, lv_new, gk_new, gv_new = lk[:, :, slot], lv[:, :, slot], gk[:, :, L], gv[:, :, L]
    Vl, Vg_all = lv[:, :, :W], gv[:, :, :L + 1]
    KlT, KgT_all = lk[:, :, :W].transpose(-1, -2), gk[:, :, :L + 1].transpose(-1, -2)
    kdt = cache.gk.dtype
    hb, inv = fs.hb, fs.inv_sqrt_d
    x = model.embed.weight[idx[0]]                                               # (1, d), a copy
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


# the native step reads this module's Int8Linear: imported after it is defined
from .lean_step import _decode_lean  # noqa: E402
from .native_step import _decode_native, _NativeStep  # noqa: E402
