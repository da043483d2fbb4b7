"""CPU speed modes (`--quant int8|int4|bf16`): weight-only quantized Linears and quantize_cpu (the lean batch-1 step
that runs them is engine/cpu_step.py).

Batch-1 decode on a CPU is memory-bound: every token streams all Linear weights once. Storing them in bf16 halves
the bytes, int8 quarters them, int4 (Int4Linear: groups of 32 with an fp16 scale, ~4.5 bits a weight) takes an eighth. The kernels take bf16 activations (fp32 accumulation inside); the residual stream,
norms, attention, softmax and the KV cache stay fp32. Every quant Linear has mm(xb): bf16 (rows, in) -> bf16
(rows, out), the call the lean CPU step makes. These modes change the logits slightly. Which Linears --quant int4
makes int4 is engine/int4_rules.py's rule."""
from __future__ import annotations

import functools
import threading
import warnings

import torch

from ..mapped import MappedWeights
from ..options import EngineOptions
from .fused import fuse_qkv
from .int4_rules import Q4S, Q4W, head4_eligible, int4_keeps_int8, linear_gain

QUANT_GEMV_ROWS = 8    # BF16Linear: up to this many rows use the bf16 kernel (on AVX2 bf16 GEMM is ~3x slower than fp32)
INT8_GEMV_ROWS = 128   # Int8Linear: up to this many rows use the int8 kernel; beyond, dequantize + fp32 GEMM (the
                       # kernel costs per row, the GEMM per weight byte)
INT8_GEMV_ROWS_BF16 = 12   # the same where prefill runs bf16 GEMMs: they win from ~12 rows on (full-config shapes)
INT8_GEMM_ROWS = 4     # Int8Linear with the native kernels: more rows than this run the native int8 GEMM
                       # (native_gemm.h) instead of everything above, unless bf16 GEMMs are asked for
INT8_GEMM_CHUNK = 512  # tokens per native GEMM call (bounds the scratch: tc_gemm_act_bytes)
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


def _grown(name: str, n: int, dtype) -> torch.Tensor:
    """The first n elements of this thread's buffer `name`, grown (never shrunk) to the largest n asked for."""
    t = getattr(_tls, name, None)
    if t is None or t.numel() < n:
        t = torch.empty(n, dtype=dtype)
        setattr(_tls, name, t)
    return t[:n]


def _quant_buffer(rows: int, cols: int) -> torch.Tensor:
    """Int8Linear's fp32 buffer for a block of weight rows being quantized: one per thread, grown as needed, dropped
    by quantize_cpu once done (free_quant_buffer)."""
    return _grown("qbuf", rows * cols, torch.float32).view(rows, cols)


def free_quant_buffer() -> None:
    _tls.qbuf = None


def _act_scratch(nbytes: int) -> torch.Tensor:
    """The native GEMM's activation scratch: one uint8 buffer per thread, grown to the largest call's size (at most
    3 bytes per column per token of an INT8_GEMM_CHUNK)."""
    return _grown("act", nbytes, torch.uint8)


@functools.cache
def cpu_has_bf16_dot() -> bool:
    """Does this CPU have native bf16 dot products (AVX512-BF16 or AMX tiles)? There oneDNN's bf16 GEMM beats fp32
    (fp32 accumulation inside); on AVX2 it is slower. Asked once."""
    try:
        cpu = torch.cpu
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    except Exception:  # noqa: BLE001  older torch: no probes
        return False


@functools.cache
def cpu_has_amx() -> bool:
    """Does this CPU have AMX tiles (Intel Sapphire Rapids on)? There oneDNN's bf16 GEMM runs on tile
    multiplies, a league above any AVX-512 int8 GEMM: int8 models keep bf16 prefill GEMMs. Asked once."""
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except Exception:  # noqa: BLE001  older torch: no probe
        return False


def resolve_prefill_bf16(option: bool | None) -> bool:
    """Do quant Linears prefill through bf16 GEMMs? The option (EngineOptions.prefill_bf16), or (None) whether this
    CPU has native bf16 dot products."""
    return cpu_has_bf16_dot() if option is None else bool(option)


def bf16_over_native(option: bool | None, rows: int) -> bool:
    """Do quant Linears prefill `rows` tokens through bf16 GEMMs rather than their native GEMM? Where asked for
    (option True), or by default (None) on AMX machines, for more than INT8_GEMV_ROWS_BF16 rows."""
    return (resolve_prefill_bf16(option) and rows > INT8_GEMV_ROWS_BF16
            and (option is True or (option is None and cpu_has_amx())))


def _rows_bias(pieces) -> torch.nn.Parameter | None:
    """from_rows' bias: the pieces' bias rows concatenated, or None when no piece has a bias."""
    if all(lin.bias is None for lin, _, _ in pieces):
        return None
    if any(lin.bias is None for lin, _, _ in pieces):
        raise ValueError("from_rows: some pieces have a bias and some do not")
    return torch.nn.Parameter(torch.cat([lin.bias.detach()[a:b] for lin, a, b in pieces]), requires_grad=False)


def _divide_gain(w: torch.Tensor, g: torch.Tensor | None) -> torch.Tensor:
    """w (rows, K) with its columns divided by the input gain g (K,) in place (a zero gain: the column zeroed), the
    weights an in_gain Linear quantizes: W' = W diag(g) -> W."""
    if g is not None:
        w.div_(torch.where(g != 0, g, 1.0)[None, :]).mul_((g != 0)[None, :])
    return w


def _set_gain(mod, in_gain) -> None:
    """mod.in_gain: the (K,) fp32 input gain, or None (a None buffer: not in the state dict)."""
    g = None if in_gain is None else in_gain.detach().float().contiguous()
    if g is not None and g.shape != (mod.in_features,):
        raise ValueError(f"in_gain of shape {tuple(g.shape)} for a Linear of {mod.in_features} inputs")
    mod.register_buffer("in_gain", g)


def _gained(mod, x: torch.Tensor) -> torch.Tensor:
    """x times the Linear's input gain (a new tensor), in x's dtype; x itself without one."""
    g = getattr(mod, "in_gain", None)
    if g is None:
        return x
    return (x.float() * g).to(x.dtype)


def _from_rows(cls, pieces):
    """An Int8Linear / Int4Linear of the rows (lin, start, end) of pieces of that class: qweight and scale rows (one
    row of either per output row) and bias rows concatenated, in order."""
    first = pieces[0][0]
    out = cls.__new__(cls)
    torch.nn.Module.__init__(out)
    q = torch.cat([lin.qweight[a:b] for lin, a, b in pieces]).contiguous()
    out.in_features, out.out_features, out.prefill_bf16 = first.in_features, q.size(0), first.prefill_bf16
    out.native = getattr(first, "native", True)
    out.register_buffer("qweight", q)
    out.register_buffer("scale", torch.cat([lin.scale[a:b] for lin, a, b in pieces]).contiguous())
    out.bias = _rows_bias(pieces)
    gains = [getattr(lin, "in_gain", None) for lin, _, _ in pieces]
    if any((g is None) != (gains[0] is None) or (g is not None and not torch.equal(g, gains[0])) for g in gains):
        raise ValueError("from_rows: the pieces have different input gains")
    _set_gain(out, gains[0])
    return out


def _from_packed(cls, qweight, scale, bias, in_features: int, prefill_bf16=None, native: bool = True, in_gain=None):
    """An Int8Linear / Int4Linear holding these packed tensors as they are (a stored-quantized file's mapped
    tensors: quant_files.py), no quantization: the same module as quantizing the weights they were made from."""
    out = cls.__new__(cls)
    torch.nn.Module.__init__(out)
    out.in_features, out.out_features = int(in_features), qweight.size(0)
    out.register_buffer("qweight", qweight)
    out.register_buffer("scale", scale)
    out.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
    out.prefill_bf16, out.native = prefill_bf16, bool(native)
    _set_gain(out, in_gain)
    return out


def _drop_read_pages(lin) -> None:
    """After a quant Linear's forward: hand its mapped weight pages back (its page_drop, a page_drop.PageRanges set
    where EngineOptions.drop_pages is on for a stored model; None or absent: nothing)."""
    pd = lin.__dict__.get("page_drop")
    if pd is not None:
        pd.drop()


class BF16Linear(torch.nn.Module):
    """A Linear whose weight is stored in bf16: half the bytes to stream per token. The matmul runs on bf16 inputs
    (fp32 accumulation inside oneDNN), the output is returned in the input dtype."""

    def __init__(self, lin: torch.nn.Linear, prefill_bf16: bool | None = None, mapped: MappedWeights | None = None):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        w = lin.weight.detach()
        if w.dtype != torch.bfloat16:      # a copy (block by block where the file is mapped); bf16 stays as it lies
            w = mapped.copy_out(w, torch.bfloat16) if mapped is not None else w.to(torch.bfloat16)
        self.weight = torch.nn.Parameter(w, requires_grad=False)
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().to(torch.bfloat16),
                                                                      requires_grad=False)
        self.prefill_bf16 = resolve_prefill_bf16(prefill_bf16)    # resolved once: bf16 GEMMs for prefill

    @classmethod
    def from_rows(cls, pieces) -> "BF16Linear":
        """One BF16Linear of the rows (lin, start, end) of BF16Linears, in order (exact: rows are kept). The pieces
        have biases all (the llama family's q/k/v biases: their rows concatenated too) or none."""
        first = pieces[0][0]
        out = cls.__new__(cls)
        torch.nn.Module.__init__(out)
        w = torch.cat([lin.weight.detach()[a:b] for lin, a, b in pieces]).contiguous()
        out.in_features, out.out_features, out.prefill_bf16 = first.in_features, w.size(0), first.prefill_bf16
        out.weight = torch.nn.Parameter(w, requires_grad=False)
        out.bias = _rows_bias(pieces)
        return out

    def mm(self, xb):
        return torch.nn.functional.linear(xb, self.weight, self.bias)

    def forward(self, x):
        if x.numel() // x.size(-1) > QUANT_GEMV_ROWS and not self.prefill_bf16:   # prefill: fp32 GEMM, upcast weight
            b = None if self.bias is None else self.bias.to(x.dtype)
            w = self.weight
            return torch.nn.functional.linear(x, _scratch(w.shape, x.dtype).copy_(w), b)
        return torch.nn.functional.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)


QUANT_ROWS = 1024     # rows quantized at a time (int8 from fp32/bf16 weights)


class Int8Linear(torch.nn.Module):
    """Weight-only int8 Linear: int8 weights with one scale per output channel (symmetric, max-abs; the scale is
    stored in bf16, the kernel's dtype, and the weights are rounded against that stored value), bf16 activations into
    aten._weight_int8pack_mm (dequantizes on the fly, fp32 accumulation). A quarter of the fp32 bytes per token.
    Activations are not quantized there (dynamic activation quantization is lossy for the ReLU^2 MLP).
    Prefill (more than INT8_GEMM_ROWS rows) with the native kernels: their int8 GEMM (activations rounded to int8 in
    blocks of 32 with one fp32 scale each, as the native decode step rounds them), unless bf16 GEMMs are asked for
    (prefill_bf16 True; the default, None, takes the int8 GEMM: since its super-block kernels it beats oneDNN's bf16
    GEMM on AVX512-BF16 CPUs (Zen 4), though not AMX tiles, where bf16 GEMMs stay). Without the kernels: bf16 GEMMs
    where prefill_bf16 resolves so (resolve_prefill_bf16), else, more than INT8_GEMV_ROWS rows, dequantize into a
    scratch buffer + fp32 GEMM. native: whether this layer may use the native kernels (EngineOptions.native)."""

    def __init__(self, lin: torch.nn.Linear, prefill_bf16: bool | None = None, native: bool = True,
                 mapped: MappedWeights | None = None, in_gain: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        _set_gain(self, in_gain)
        src = lin.weight.detach()
        q = torch.empty(src.shape, dtype=torch.int8)
        scale = torch.empty(src.size(0), dtype=torch.bfloat16)
        r = 0
        for block in mapped.blocks(src) if mapped is not None else (src,):   # a mapped file's pages go back per
            for w in block.split(QUANT_ROWS):          # block; row blocks through one reused fp32 buffer: no
                e = r + w.size(0)                      # temporaries for the heap to keep (malloc_trim runs last)
                buf = _divide_gain(_quant_buffer(*w.shape).copy_(w), self.in_gain)
                scale[r:e] = (torch.linalg.vector_norm(buf, float("inf"), dim=1) / 127.0).clamp_min(1e-12)
                q[r:e] = buf.div_(scale[r:e].float()[:, None]).round_().clamp_(-127, 127)
                r = e
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().float(), requires_grad=False)
        self.prefill_bf16 = prefill_bf16    # None / True / False, as asked (prefill_kernel resolves it)
        self.native = bool(native)

    @classmethod
    def from_packed(cls, qweight, scale, bias, in_features: int, prefill_bf16=None, native: bool = True,
                    in_gain=None) -> "Int8Linear":
        """The Int8Linear of packed tensors as __init__ makes them (qweight, scale, bias or None, in_gain or None),
        kept as given."""
        return _from_packed(cls, qweight, scale, bias, in_features, prefill_bf16, native, in_gain)

    @classmethod
    def from_rows(cls, pieces) -> "Int8Linear":
        """One Int8Linear of the rows (lin, start, end) of Int8Linears, in order: the int8 rows and their per-row
        scales concatenated (exact: the same as quantizing the concatenated fp32 rows). The pieces have biases all
        (the llama family's q/k/v biases: their rows concatenated too) or none."""
        return _from_rows(cls, pieces)

    @property
    def weight(self):   # dequantized copy, for code that reads .weight (the fused device step; not used on CPU),
        w = self.qweight.float() * self.scale.float()[:, None]      # the input gain folded back in
        return w if self.in_gain is None else w * self.in_gain[None, :]

    def mm(self, xb):
        """xb (rows, in) bf16 -> (rows, out): the input gain applied to xb (fp32 product, rounded to bf16)."""
        return self._mm(_gained(self, xb))

    def _mm(self, xb):
        y = torch.ops.aten._weight_int8pack_mm(xb, self.qweight, self.scale)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def gemm_lib(self):
        """The native kernels this layer's prefill GEMM runs on, or None (native off, no kernels here, or only their
        scalar path: native.gemm_lib)."""
        if not getattr(self, "native", True):
            return None
        from . import native
        return native.gemm_lib()

    def prefill_kernel(self, rows: int, cpu: bool = True) -> str:
        """Which kernel forward() runs for `rows` rows (of a CPU tensor, unless cpu is False): "native-gemm",
        "bf16-gemm", "fp32-gemm" or "int8-gemv"."""
        bf16 = resolve_prefill_bf16(self.prefill_bf16) and rows > INT8_GEMV_ROWS_BF16
        if cpu and rows > INT8_GEMM_ROWS and not bf16_over_native(self.prefill_bf16, rows) \
                and self.gemm_lib() is not None:
            return "native-gemm"
        if bf16:
            return "bf16-gemm"
        return "fp32-gemm" if rows > INT8_GEMV_ROWS else "int8-gemv"

    def _native_gemm(self, lib, x):
        """x (..., in) through the native int8 GEMM (native_gemm.h), in chunks of INT8_GEMM_CHUNK tokens."""
        from . import native
        x2 = x.reshape(-1, x.size(-1)).float().contiguous()
        sb = self.__dict__.get("_gemm_sb")       # the fp32 scales and bias the kernel takes, made once
        if sb is None or sb[0] is not self.scale:
            sb = self._gemm_sb = (self.scale, self.scale.float(),
                                  None if self.bias is None else self.bias.float().contiguous())
        _, s, b = sb
        nt = torch.get_num_threads()
        scratch = _act_scratch(int(lib.tc_gemm_act_bytes(min(x2.size(0), INT8_GEMM_CHUNK), x2.size(1), nt)))
        y = torch.empty(x2.size(0), self.out_features)
        for i in range(0, x2.size(0), INT8_GEMM_CHUNK):
            native.gemm(lib, x2[i:i + INT8_GEMM_CHUNK], self.qweight, s, b, nt, scratch, out=y[i:i + INT8_GEMM_CHUNK])
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)

    def forward(self, x):
        y = self._forward(x)
        _drop_read_pages(self)
        return y

    def _forward(self, x):
        shape = x.shape
        rows = x.numel() // shape[-1]
        x = _gained(self, x)
        kernel = self.prefill_kernel(rows, x.device.type == "cpu")
        if kernel == "native-gemm":
            return self._native_gemm(self.gemm_lib(), x)
        if kernel == "bf16-gemm":
            # bf16 GEMM on the int8 values (exact in bf16), the per-channel scale applied to the output columns
            wq = _scratch(self.qweight.shape, torch.bfloat16).copy_(self.qweight)
            y = torch.nn.functional.linear(x.to(torch.bfloat16), wq).to(x.dtype).mul_(self.scale.to(x.dtype))
            return y if self.bias is None else y.add_(self.bias.to(x.dtype))
        if kernel == "fp32-gemm":
            w = torch.mul(self.qweight, self.scale.float()[:, None],
                          out=_scratch(self.qweight.shape, torch.float32)).to(x.dtype)
            return torch.nn.functional.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))
        y = self._mm(x.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous())
        return y.view(*shape[:-1], self.out_features).to(x.dtype)


INT4_CANDIDATES = (-8.0, -8.5, -7.75, -7.5, -7.25, -7.0, -6.5, -6.0)   # d = (largest-magnitude value) / c


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) -> (packed (N, Kp / 2) uint8, scales (N, Kp / 32) fp16), native_q4.h's layout (Kp: K rounded up to
    64, zero columns past K). Per group of 32: Q4_0's form, q = clamp(round(w / d), -8, 7) with d = m / c for m the
    group's value of largest magnitude (the first such), d stored in fp16 and q rounded against the stored value;
    c is the first of INT4_CANDIDATES (-8: Q4_0's own) with the least squared error (a search llama.cpp's Q4_K does
    too; here it costs a few % of the loading time). Deterministic: the same bytes on every machine."""
    from .native import pad64
    N, K = w.shape
    Kp = pad64(K)
    g = torch.nn.functional.pad(w.float(), (0, Kp - K)).view(N, Kp // 32, 32)
    m = g.gather(-1, g.abs().argmax(dim=-1, keepdim=True))
    best_q = best_d = best_e = None
    for c in INT4_CANDIDATES:
        d = (m / c).clamp_(-65504.0, 65504.0).to(torch.float16)
        df = d.float()
        q = torch.where(df != 0, g / torch.where(df != 0, df, 1.0), 0.0).round_().clamp_(-8, 7)
        e = (q * df - g).square_().sum(-1, keepdim=True)
        if best_e is None:
            best_q, best_d, best_e = q, d, e
        else:
            better = e < best_e
            best_q = torch.where(better, q, best_q)
            best_d = torch.where(better, d, best_d)
            best_e = torch.minimum(e, best_e)
    u = (best_q + 8).to(torch.uint8).view(N, Kp // 64, 2, 32)
    packed = (u[:, :, 0] | (u[:, :, 1] << 4)).reshape(N, Kp // 2)
    return packed.contiguous(), best_d.view(N, Kp // 32).contiguous()


class Int4Linear(torch.nn.Module):
    """Weight-only int4 Linear (`--quant int4`): rows quantized in groups of 32 columns with one fp16 scale each
    (quantize_int4; native_q4.h's packed layout: ~4.5 bits a weight, half of int8's bytes a token). Runs on the
    native kernels: decode in the native steps (native_q4.h's GEMV on the int8 step's activation rounding), prefill on
    the int4 GEMM (tc_gemm4: the same rounding per token), or, as Int8Linear's (prefill_bf16 True, or None on AMX
    machines: tile multiplies beat any AVX-512 int4 GEMM), on oneDNN's bf16 GEMM, the rows dequantized to bf16
    block by block (tc_dequant4_bf16) for more than INT8_GEMV_ROWS_BF16 tokens. Without the kernels (or native off):
    the dequantized weights through fp32 GEMMs (prefill) and bf16 ones (mm, the lean PyTorch step): slow, a
    fallback."""

    def __init__(self, lin: torch.nn.Linear, prefill_bf16: bool | None = None, native: bool = True,
                 mapped: MappedWeights | None = None, in_gain: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        _set_gain(self, in_gain)
        src = lin.weight.detach()
        parts, ss = [], []
        for block in mapped.blocks(src) if mapped is not None else (src,):
            for w in block.split(QUANT_ROWS):
                p, s = quantize_int4(_divide_gain(_quant_buffer(*w.shape).copy_(w), self.in_gain))
                parts.append(p)
                ss.append(s)
        self.register_buffer("qweight", torch.cat(parts).contiguous())
        self.register_buffer("scale", torch.cat(ss).contiguous())
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().float(), requires_grad=False)
        self.prefill_bf16 = prefill_bf16
        self.native = bool(native)

    @classmethod
    def from_packed(cls, qweight, scale, bias, in_features: int, prefill_bf16=None, native: bool = True,
                    in_gain=None) -> "Int4Linear":
        """The Int4Linear of packed tensors as __init__ makes them (qweight, scale, bias or None, in_gain or None),
        kept as given."""
        return _from_packed(cls, qweight, scale, bias, in_features, prefill_bf16, native, in_gain)

    @classmethod
    def from_rows(cls, pieces) -> "Int4Linear":
        """One Int4Linear of the rows (lin, start, end) of Int4Linears, in order (exact: rows are kept)."""
        return _from_rows(cls, pieces)

    @property
    def weight(self):   # dequantized fp32 copy (N, K), the input gain folded back in
        from .native import unpack4
        q = unpack4(self.qweight, self.in_features).float()
        w = q * self.scale.float().repeat_interleave(32, dim=1)[:, :self.in_features]
        return w if self.in_gain is None else w * self.in_gain[None, :]

    def mm(self, xb):
        y = torch.nn.functional.linear(xb, self.weight.to(xb.dtype))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def gemm_lib(self):
        """The native kernels this layer runs on, or None (native off, or no kernels here)."""
        if not getattr(self, "native", True):
            return None
        from . import native
        return native.load()

    def prefill_kernel(self, rows: int, cpu: bool = True) -> str:
        """Where the kernels run, "bf16-gemm" for more than INT8_GEMV_ROWS_BF16 rows where asked for (prefill_bf16
        True, or None on an AMX machine), else "native-gemm" (tc_gemm4); without them "fp32-gemm" (the dequantized
        weights)."""
        if not cpu or self.gemm_lib() is None:
            return "fp32-gemm"
        return "bf16-gemm" if bf16_over_native(self.prefill_bf16, rows) else "native-gemm"

    def forward(self, x):
        y = self._forward(x)
        _drop_read_pages(self)
        return y

    def _forward(self, x):
        shape = x.shape
        kernel = self.prefill_kernel(x.numel() // shape[-1], x.device.type == "cpu")
        if kernel == "fp32-gemm":
            b = None if self.bias is None else self.bias.to(x.dtype)
            return torch.nn.functional.linear(x, self.weight.to(x.dtype), b)
        from . import native
        lib = self.gemm_lib()
        x2 = _gained(self, x.reshape(-1, shape[-1]).float()).contiguous()
        nt = torch.get_num_threads()
        if kernel == "bf16-gemm":
            return self._bf16_gemm(lib, x2, nt).view(*shape[:-1], self.out_features).to(x.dtype)
        scratch = _act_scratch(int(lib.tc_gemm4_act_bytes(min(x2.size(0), INT8_GEMM_CHUNK), x2.size(1), nt)))
        b = None if self.bias is None else self.bias.float().contiguous()
        y = torch.empty(x2.size(0), self.out_features)
        for i in range(0, x2.size(0), INT8_GEMM_CHUNK):
            native.gemm4(lib, x2[i:i + INT8_GEMM_CHUNK], self.qweight, self.scale, b, nt, scratch,
                         out=y[i:i + INT8_GEMM_CHUNK])
        return y.view(*shape[:-1], self.out_features).to(x.dtype)

    def _bf16_gemm(self, lib, x2, nt):
        """x2 (rows, in) fp32, gained, through oneDNN's bf16 GEMM: the rows dequantized to bf16 a block of at most
        BF16_BLOCK bytes at a time (one reused buffer), each block's outputs rounded to bf16 as Int8Linear's are,
        then the bias added in fp32: (rows, out) fp32."""
        from . import native
        K, N = self.in_features, self.out_features
        xb = x2.to(torch.bfloat16)
        y = torch.empty(x2.size(0), N)
        rb = max(1, BF16_BLOCK // (2 * K))
        for r0 in range(0, N, rb):
            r1 = min(N, r0 + rb)
            w = native.dequant4_bf16(lib, self.qweight[r0:r1], self.scale[r0:r1], K, nt, out=_bf16_rows(r1 - r0, K))
            y[:, r0:r1] = torch.nn.functional.linear(xb, w)
        return y if self.bias is None else y.add_(self.bias.float())


BF16_BLOCK = 8 << 20    # bytes of bf16 weights dequantized at a time for Int4Linear's bf16 GEMMs


def _bf16_rows(rows: int, cols: int) -> torch.Tensor:
    """Int4Linear's bf16 block buffer (rows, cols): one flat buffer per thread, grown to the largest block (at most
    BF16_BLOCK bytes, or one row), so a model's many shapes share it."""
    return _grown("bf16", rows * cols, torch.bfloat16).view(rows, cols)


def _bulk_linear(model):
    """The Linear whose prefill a session records: the first Int4Linear (an int4 model's head is int8), else the first
    Int8Linear, else None."""
    first8 = None
    for m in model.modules():
        if type(m) is Int4Linear:
            return m
        if first8 is None and type(m) is Int8Linear:
            first8 = m
    return first8


def bulk_prefill_kernel(model, rows: int = 64) -> str | None:
    """Which kernel the model's quantized Linears prefill `rows` tokens on (Int8Linear / Int4Linear.prefill_kernel),
    None without any: what a session records beside the decode step (a bf16 GEMM and the native int8 GEMM round
    differently)."""
    m = _bulk_linear(model)
    return None if m is None else m.prefill_kernel(rows)


def native_prefill(model) -> bool:
    """Does the model's int8 / int4 prefill run on the native GEMM (its Linears may, and the kernels load)?"""
    m = _bulk_linear(model)
    return m is not None and m.gemm_lib() is not None


QUANT_CLASSES = {"int8": Int8Linear, "int4": Int4Linear, "bf16": BF16Linear}   # every QUANT_MODES name but "none"


@functools.cache
def int8_kernel_ok() -> bool:
    """Does this torch build run aten._weight_int8pack_mm on bf16 inputs (and get it right)? Checked once."""
    try:
        g = torch.Generator().manual_seed(0)
        w = torch.randint(-127, 128, (64, 64), dtype=torch.int8, generator=g)
        s = torch.rand(64, generator=g).add_(0.5).to(torch.bfloat16)
        x = torch.randn(2, 64, generator=g).to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(x, w, s).float()
        ref = x.float() @ (w.float() * s.float()[:, None]).t()
        return bool(torch.allclose(y, ref, rtol=0.02, atol=0.02 * float(ref.abs().max())))
    except Exception:  # noqa: BLE001  op missing / unsupported dtype on this build
        return False


def effective_mode(mode: str | None) -> str:
    """The mode quantize_cpu(mode) gives here: "none" for none / "" / fp32, bf16 for int8 on a torch build without
    the int8 kernel. ValueError for an unknown mode."""
    if mode in (None, "", "none", "fp32"):
        return "none"
    if mode not in QUANT_CLASSES:
        raise ValueError(f"unknown quant mode {mode!r} (none, {', '.join(QUANT_CLASSES)})")
    return "bf16" if mode == "int8" and not int8_kernel_ok() else mode


def quant_mode(model) -> str:
    """What a model's Linears are: "int4" (its head and Engram projections int8), "int8", "bf16" (quantize_cpu ran on
    it) or "none"."""
    if any(type(m) is Int4Linear for m in model.modules()):
        return "int4"
    for m in model.modules():
        for mode, cls in QUANT_CLASSES.items():
            if type(m) is cls:
                return mode
    return "none"


def quantize_cpu(model, mode: str, head: bool = True, options: EngineOptions | None = None):
    """In place. mode "int8": weight-only int8 Linear layers (Int8Linear, per-channel scales, bf16 activations).
    "int4": Int4Linear layers (groups of 32, fp16 scales), those int4_keeps_int8 names Int8Linear (engine/int4_rules.py:
    with norm gains, q/k/v on llama.cpp's use_more_bits layers too, the per-layer mix); a llama-family head also gets
    its int4 copy (the two-level head, engine/two_level_head.py; head4_eligible) unless options.head4 is off.
    A model with norm gains kept apart (model.in_gains: a llama-family import) gets them as the int8 / int4 Linears'
    in_gain (linear_gain; the weights quantized with the gain divided out, the activations multiplied by it).
    "bf16": Linear weights stored in bf16 (BF16Linear). Embeddings, Engram tables, norms, RoPE and the KV cache stay
    as they are. head=False keeps the output head in full precision. Use an fp32 KV cache with these.
    options: EngineOptions (its prefill_bf16 is fixed into every layer; default: EngineOptions.from_env()).
    The model then owns its fused q/k/v projections (model.fused_qkv, engine/fused.py's fuse_qkv).
    A Decoder on the model then steps through the lean CPU step (engine/cpu_step.py)."""
    want = effective_mode(mode)
    if want == "none":
        return model
    if want != mode:
        warnings.warn("this PyTorch build has no CPU int8 kernel for bf16 inputs (aten._weight_int8pack_mm); "
                      "using --quant bf16 instead")
    have = quant_mode(model)
    if have == want:
        return model
    if have != "none":
        raise ValueError(f"the model is already quantized ({have}); quantize a fresh copy for {want}")
    cls = QUANT_CLASSES[want]
    opts = options or EngineOptions.from_env()
    pbf = opts.prefill_bf16
    mapped = MappedWeights()            # weights used where the file lies: its pages go back once quantized
    kw = {"native": opts.native, "mapped": mapped} if cls in (Int8Linear, Int4Linear) else {"mapped": mapped}
    targets = [(name, mod) for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)
               and (head or name != "head")]
    gained = bool(getattr(model, "in_gains", None)) and cls is not BF16Linear
    n_layers = len(model.blocks) if hasattr(model, "blocks") else None
    for name, mod in targets:
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        c = Int8Linear if cls is Int4Linear and int4_keeps_int8(name, gained, n_layers) else cls
        g = {"in_gain": linear_gain(model, name)} if gained else {}
        q = c(mod, pbf, **kw, **g)
        if (name == "head" and cls is Int4Linear and opts.head4 and type(q) is Int8Linear
                and head4_eligible(model, q)):
            q4 = Int4Linear(mod, mapped=mapped)     # the two-level head's int4 copy (two_level_head.py)
            q.register_buffer(Q4W, q4.qweight)
            q.register_buffer(Q4S, q4.scale)
        setattr(parent, name.rsplit(".", 1)[-1], q)
        mapped.drop(mod.weight)
    del targets, mod, q
    if hasattr(model, "blocks"):
        fuse_qkv(model)                 # the fused q/k/v rows, the pieces' rows views of them (engine/fused.py)
    free_quant_buffer()
    release_freed_memory()
    return model


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc malloc_trim): the weights just replaced were freed,
    but glibc keeps freed heap memory for reuse, and resident memory would stay at its peak (~70 MB for `demo`).
    A no-op where there is no glibc."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
