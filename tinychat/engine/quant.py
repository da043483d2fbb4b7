"""CPU speed modes (`--quant int8|bf16`): weight-only quantized Linears and the lean batch-1 CPU decode step.

Batch-1 decode on a CPU is memory-bound: every token streams all Linear weights once. Storing them in bf16 halves
the bytes, int8 quarters them. The kernels take bf16 activations (fp32 accumulation inside); the residual stream,
norms, attention, softmax and the KV cache stay fp32. Every quant Linear has mm(xb): bf16 (rows, in) -> bf16
(rows, out), the call _decode_fast makes. These modes change the logits slightly."""
from __future__ import annotations

import threading
import time
import weakref
import warnings

import torch

from .append import _engram_addrs
from .cache import KVCache
from .threads import ThreadTuner

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
        wl = a.w_kv_local.weight.detach()
        ks, vs = [wl[:Hk * D]], [wl[Hk * D:]]
        if a.mode == "full":
            wg = a.w_kv_global.weight.detach()
            ks.append(wg[:Hk * D])
            vs.append(wg[Hk * D:])
        lin = torch.nn.Linear(model.cfg.d_model, 1, bias=False)
        lin.weight = torch.nn.Parameter(torch.cat([a.w_q.weight.detach()] + ks + vs).float(), requires_grad=False)
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
            nk = 2 if blk.attn.mode == "full" else 1
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
        self.nat = _NativeStep.build(model, self) if NATIVE else None


NATIVE = True   # int8 models: run _decode_fast's GEMVs and everything after attention through the native kernels
                # (engine/native.py) when they build here; False: the PyTorch ops only (set before quantize_cpu)


def _no_native():
    return None


class _NativeStep:
    """The native kernels' view of an int8 model: per layer the raw pointers of the int8 weights and their fp32
    scales (kept alive here), and the fp32 / int16 buffers the kernels read and write in place."""

    def __deepcopy__(self, memo):   # raw pointers into the original model's weights: a copy runs the PyTorch step
        return None

    def __reduce__(self):
        return (_no_native, ())

    @classmethod
    def build(cls, model, fs):
        from . import native
        heads_int8 = isinstance(fs.head, Int8Linear)
        if not (all(type(m) is Int8Linear for m in fs.qkv) and heads_int8
                and all(type(b.attn.w_o) is Int8Linear and type(b.mlp.up) is Int8Linear
                        and type(b.mlp.down) is Int8Linear and b.attn.w_o.bias is None and b.mlp.up.bias is None
                        and b.mlp.down.bias is None for b in model.blocks)
                and all(m.bias is None for m in fs.qkv) and fs.head.bias is None):
            return None
        lib = native.load()
        return None if lib is None else cls(model, fs, lib)

    def __init__(self, model, fs, lib):
        c = model.cfg
        self.lib = lib
        keep = self._keep = []

        def w(lin):
            s = lin.scale.float().contiguous()
            keep.append(s)
            return lin.qweight.data_ptr(), s.data_ptr(), lin.qweight.size(0)   # (the fused QKV: out_features 1)

        self.qkv = [w(m) for m in fs.qkv]
        self.wo = [w(b.attn.w_o) for b in model.blocks]
        self.up = [w(b.mlp.up) for b in model.blocks]
        self.down = [w(b.mlp.down) for b in model.blocks]
        self.head = w(fs.head)
        self.has_engram = [b.engram is not None for b in model.blocks]
        d, hid, HD = c.d_model, c.mlp_hidden, c.n_heads * c.head_dim
        self.x = torch.empty(d)
        self.h = torch.empty(d)
        self.xq = torch.empty(max(d, hid, HD, 64), dtype=torch.int16)
        self.u = torch.empty(hid)
        self.y = torch.empty(HD)
        self.qkvbuf = torch.empty(max(n for _, _, n in self.qkv))
        self.logits = torch.empty(1, c.vocab_size)
        self.sc = torch.empty(0)               # attention scores scratch (grown to threads * (max_len + 1 + W))
        self.tuner = ThreadTuner()             # threads per step, by measurement (threads.py)
        self.p = {k: getattr(self, k).data_ptr() for k in ("x", "h", "xq", "u", "y", "qkvbuf", "logits")}
        rows, group = [], -1
        for li, b in enumerate(model.blocks):               # tc_layers' table (native.py: TAB_COLS per layer)
            full = b.attn.mode == "full"
            group += full
            rows.append([*self.qkv[li], int(full), group, *self.wo[li][:2], *self.up[li][:2], *self.down[li][:2]])
        self.tab = torch.tensor(rows, dtype=torch.int64)
        starts = [0] + [i for i, e in enumerate(self.has_engram) if e and i > 0]
        self.segments = list(zip(starts, starts[1:] + [len(model.blocks)]))   # [start, end): Engram only at a start
        self.engrams = [(i, b.engram.orders, b.engram.heads, b.engram.size, b.engram.mult.tolist(),
                         b.engram.offset.tolist()) for i, b in enumerate(model.blocks) if b.engram is not None]
        self.n1 = max(c.engram_orders) - 1 if self.engrams else 0
        # tc_engram per Engram block (fp32 table, int8 w_v / w_k), else None: the block's PyTorch forward
        self.engram_native = {}
        ne = 1                                              # the widest Engram input (tables x dim)
        for i, b in enumerate(model.blocks):
            en = b.engram
            if en is None:
                continue
            ne = max(ne, en.table.weight.size(1) * len(en.orders) * en.heads)
            ok = (en.table.weight.dtype == torch.float32 and en.table.weight.is_contiguous()
                  and type(en.w_v) is Int8Linear and type(en.w_k) is Int8Linear
                  and en.w_v.bias is None and en.w_k.bias is None)
            self.engram_native[i] = (en.table.weight, *w(en.w_v)[:2], *w(en.w_k)[:2]) if ok else None
        self.e, self.ek, self.ev = torch.empty(ne), torch.empty(d), torch.empty(d)
        self.exq = torch.empty(ne, dtype=torch.int16)
        self._cid_map = model.cid_map
        self._cid: list[int] = []
        self._cid_version = -1
        # per Engram block: its addresses' buffer (1, 1, n) and a numpy view of it (filled without a tensor op)
        self._addr_buf = {}
        for li, orders, heads, *_ in self.engrams:
            t = torch.zeros(1, 1, len(orders) * heads, dtype=torch.int64)
            self._addr_buf[li] = (t, t.numpy().reshape(-1))
        self.x_np = self.x.numpy()
        self._embed = (None, None)             # (the embedding weight, its numpy view when fp32 on the CPU)
        self._attn_ok = (lambda: None, False)  # (a weak reference to the cache, whether tc_attn can read it)

    def embed_row(self, model, tok: int) -> None:
        """x = the token's embedding row (a numpy copy for an fp32 table: no tensor op)."""
        wt = model.embed.weight
        if self._embed[0] is not wt:
            ok = wt.dtype == torch.float32 and wt.device.type == "cpu" and wt.is_contiguous()
            self._embed = (wt, wt.detach().numpy() if ok else None)
        e = self._embed[1]
        if e is not None:
            self.x_np[:] = e[tok]
        else:
            self.x.copy_(wt[tok])

    def attn_ok(self, cache, model) -> bool:
        """tc_attn reads this cache directly: fp32, batch 1, contiguous (as the RoPE tables). Asked once per cache."""
        if self._attn_ok[0]() is not cache:
            ok = cache.gk.dtype == torch.float32 and cache.B == 1 and all(t.is_contiguous() for t in (
                cache.lk, cache.lv, cache.gk, cache.gv, cache.lpos, model.rope.cos, model.rope.sin))
            self._attn_ok = (weakref.ref(cache), ok)
        return self._attn_ok[1]

    def engram_addrs(self, tokens: list[int]) -> dict[int, torch.Tensor]:
        """_engram_addrs for one new token in Python ints (a few dozen multiplies and XORs instead of ~30 tensor
        ops): tokens = the n_max - 1 previous ids (0 before position 0) then the new one. Same values: products of
        ids below 2^31 stay exact, addresses are non-negative, so % equals torch.remainder. The returned tensors
        are this step's buffers: valid until the next call."""
        cm = self._cid_map
        if cm._version != self._cid_version:             # set_token_strings after quantizing: re-read
            self._cid, self._cid_version = cm.tolist(), cm._version
        c = [self._cid[t] for t in tokens]
        out = {}
        for li, orders, heads, size, mult, offset in self.engrams:
            a, t = [], 0
            for n in orders:
                for _ in range(heads):
                    acc, m = 0, mult[t]
                    for j in range(n):
                        acc ^= c[-1 - j] * m[j]
                    a.append(acc % size + offset[t])
                    t += 1
            buf, view = self._addr_buf[li]
            view[:] = a
            out[li] = buf
        return out


def _decode_native(model, cache: KVCache, tok: int, L: int, fs: _CpuFast, nat: _NativeStep):
    """_decode_fast in native kernels (engine/native.py). With an fp32 cache, one tc_layers call per run of layers
    between Engram blocks (per layer: tc_attn = q/k norms, RoPE, the cache writes, one softmax over [global | local]
    keys; tc_tail = w_o + residual, norm, MLP + residual, next norm, next fused QKV), tc_engram for an Engram block,
    the softcap in C. Other caches (bf16): PyTorch attention ops between tc_tail calls. Same math as _decode_fast; the activations enter
    the int8 products as int16 (per-vector scale) instead of bf16."""
    c = model.cfg
    H, Hk, D, W = c.n_heads, c.n_kv_heads, c.head_dim, c.swa_window
    rep = H // Hk
    d, hid = c.d_model, c.mlp_hidden
    vnorm = torch.linalg.vector_norm
    lib, P = nat.lib, nat.p
    ceiling = torch.get_num_threads()
    nt = nat.tuner.threads(ceiling)
    t0 = time.perf_counter()
    inv = fs.inv_sqrt_d
    # the bookkeeping through numpy views (cache.host): no tensor op, so the GIL stays with this thread
    toks_h, lpos_h, lens_h, lens_cpu_h = cache.host()
    addrs = {}
    if nat.engrams:
        n1 = nat.n1
        prev = toks_h[0, max(0, L - n1):L].tolist()
        addrs = nat.engram_addrs([0] * (n1 - len(prev)) + prev + [tok])
    toks_h[0, L] = tok
    slot = L % W
    lpos_h[0, slot] = L
    kdt = cache.gk.dtype
    native_attn = nat.attn_ok(cache, model)
    if not native_attn:                                      # the PyTorch attention ops (e.g. a bf16 cache)
        lp = cache.lpos[0, :W]
        ok = (lp >= 0) & (L - lp < W)
        lbias = None if bool(ok.all()) else torch.zeros(W).masked_fill_(~ok, float("-inf"))
        cs, sn = model.rope.cos[L], model.rope.sin[L]
        R = fs.eye * torch.cat([cs, cs]) + fs.P * torch.cat([sn, sn])
        lk, lv, gk, gv = cache.lk[:, 0], cache.lv[:, 0], cache.gk[:, 0], cache.gv[:, 0]
        lk_new, lv_new, gk_new, gv_new = lk[:, :, slot], lv[:, :, slot], gk[:, :, L], gv[:, :, L]
        Vl, Vg_all = lv[:, :, :W], gv[:, :, :L + 1]
        KlT, KgT_all = lk[:, :, :W].transpose(-1, -2), gk[:, :, :L + 1].transpose(-1, -2)
        y3 = nat.y.view(Hk, rep, D)
    x = nat.x
    nat.embed_row(model, tok)
    if native_attn:
        need = max(nt, ceiling) * (cache.max_len + 1 + W)
        if nat.sc.numel() < need:
            nat.sc = torch.empty(need)
        half = D // 2
        cosp = model.rope.cos.data_ptr() + L * half * 4
        sinp = model.rope.sin.data_ptr() + L * half * 4
        lkp, lvp, gkp, gvp = (t.data_ptr() for t in (cache.lk, cache.lv, cache.gk, cache.gv))
        lposp, scp = cache.lpos.data_ptr(), nat.sc.data_ptr()
        for a, b in nat.segments:                            # one tc_layers call per run of layers
            blk = model.blocks[a]
            if blk.engram is not None:
                en = nat.engram_native[a]
                if en is None:
                    x.add_(blk.engram(x[None, None], addrs[a])[0, 0])
                else:
                    table, vq, vs, kq, ks = en
                    ad = addrs[a]
                    lib.tc_engram(P["x"], table.data_ptr(), ad.data_ptr(), ad.size(-1), table.size(1), vq, vs, kq,
                                  ks, d, nat.e.data_ptr(), nat.exq.data_ptr(), nat.ek.data_ptr(),
                                  nat.ev.data_ptr(), nt)
            qp, sp, nq = nat.qkv[a]
            lib.tc_norm_gemv(P["x"], P["h"], P["xq"], inv, qp, sp, P["qkvbuf"], nq, d, nt)
            lib.tc_layers(nat.tab.data_ptr(), a, b, P["x"], P["h"], P["xq"], inv, P["qkvbuf"], P["y"], P["u"], hid, d,
                          H, Hk, D, cosp, sinp, lkp, lvp, W, gkp, gvp, cache.max_len + 1, lposp, L, scp, nt)
    group = -1
    n_layers = len(model.blocks)
    have_qkv = False
    for li, blk in enumerate(() if native_attn else model.blocks):     # other caches: PyTorch attention
        if not have_qkv:                                     # the first layer, or one after an Engram block
            if blk.engram is not None:
                x.add_(blk.engram(x[None, None], addrs[li])[0, 0])
            qp, sp, nq = nat.qkv[li]
            lib.tc_norm_gemv(P["x"], P["h"], P["xq"], inv, qp, sp, P["qkvbuf"], nq, d, nt)
        full = blk.attn.mode == "full"
        if full:
            group += 1
        heads = nat.qkvbuf[:nat.qkv[li][2]].view(-1, D)
        nqk = fs.nqk[li]
        qk = heads[:nqk]
        qk = (qk / vnorm(qk, dim=-1, keepdim=True).mul_(fs.ndiv[li])) @ R
        q = qk[:H].view(Hk, rep, D)
        lk_new[li].copy_(qk[H:H + Hk])
        lv_new[li].copy_(heads[nqk:nqk + Hk])
        if full:
            gk_new[group].copy_(qk[H + Hk:nqk])
            gv_new[group].copy_(heads[nqk + Hk:])
            KgT, Vg = KgT_all[group], Vg_all[group]
        if q.dtype != kdt:
            q = q.to(kdt)
        sl = torch.bmm(q, KlT[li])
        if lbias is not None:
            sl.add_(lbias)
        p = torch.softmax(torch.cat([torch.bmm(q, KgT), sl], dim=-1), dim=-1, dtype=torch.float32)
        if kdt == torch.float32:
            torch.bmm(p[..., :L + 1], Vg, out=y3).baddbmm_(p[..., L + 1:], Vl[li])
        else:
            p = p.to(kdt)
            y3.copy_(torch.bmm(p[..., :L + 1], Vg).baddbmm_(p[..., L + 1:], Vl[li]))
        nxt = li + 1
        have_qkv = nxt < n_layers and not nat.has_engram[nxt]
        wq, sq, nq = nat.qkv[nxt] if have_qkv else (None, None, 0)
        (op, os_, _), (up, us, _), (dp, ds, _) = nat.wo[li], nat.up[li], nat.down[li]
        lib.tc_tail(P["x"], P["h"], P["xq"], inv, P["y"], H * D, op, os_, up, us, dp, ds, P["u"], hid, d,
                    wq, sq, P["qkvbuf"], nq, nt)
    lens_h[0] += 1
    lens_cpu_h[0] += 1
    hp, hs, V = nat.head
    lib.tc_norm_gemv(P["x"], P["h"], P["xq"], inv, hp, hs, P["logits"], V, d, nt)
    lib.tc_softcap(P["logits"], V, c.logit_softcap)     # one thread: torch.tanh would start a parallel region
    nat.tuner.record(time.perf_counter() - t0, ceiling)
    return nat.logits.clone()                           # callers keep logits across steps; the buffer is reused


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
