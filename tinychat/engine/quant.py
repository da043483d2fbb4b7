"""CPU speed modes (`--quant int8|int4|bf16`): weight-only quantized Linears and quantize_cpu (the lean batch-1 step
that runs them is engine/cpu_step.py).

Batch-1 decode on a CPU is memory-bound: every token streams all Linear weights once. Storing them in bf16 halves
the bytes, int8 quarters them, int4 (Int4Linear: groups of 32 with an fp16 scale, ~4.5 bits a weight) takes an eighth. The kernels take bf16 activations (fp32 accumulation inside); the residual stream,
norms, attention, softmax and the KV cache stay fp32. Every quant Linear has mm(xb): bf16 (rows, in) -> bf16
(rows, out), the call the lean CPU step makes. These modes change the logits slightly. Which Linears --quant int4
makes int4 is engine/int4_rules.py's rule.
Here: BF16Linear, Int8Linear, quantize_cpu and what a model's quant mode and prefill kernel are. Int4Linear is
engine/quant_int4.py, what it shares with Int8Linear engine/packed_linear.py, the prefill rule (row thresholds, CPU
probes) and the per-thread buffers engine/prefill_policy.py; their public names are re-exported here."""
from __future__ import annotations

import functools
import warnings

import torch

from ..mapped import MappedWeights
from ..options import EngineOptions
from .fused import fuse_qkv
from .int4_rules import Q4S, Q4W, head4_eligible, int4_keeps_int8, linear_gain
from .packed_linear import (PackedLinear, _gained, _rows_bias, _weight_blocks,
                            _set_gain)
from .prefill_policy import (INT8_GEMM_CHUNK, INT8_GEMM_ROWS, INT8_GEMV_ROWS, INT8_GEMV_ROWS_BF16, QUANT_GEMV_ROWS,
                             _act_scratch, _scratch, bf16_over_native, free_quant_buffer,
                             resolve_prefill_bf16)
from .prefill_policy import cpu_has_amx, cpu_has_bf16_dot  # noqa: F401 (re-exported; prefill_policy's rule calls them)
from .quant_int4 import BF16_BLOCK, INT4_CANDIDATES, Int4Linear, quantize_int4  # noqa: F401 (re-exported)


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


class Int8Linear(PackedLinear):
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
        q = torch.empty(lin.weight.shape, dtype=torch.int8)
        scale = torch.empty(lin.weight.size(0), dtype=torch.bfloat16)
        r = 0
        for buf in _weight_blocks(self, lin, mapped):
            e = r + buf.size(0)
            # max |w| per row, as max(amax, -amin): the same values as vector_norm(inf), ~5x faster on the CPU
            top = torch.maximum(buf.amax(dim=1), buf.amin(dim=1).neg_())
            scale[r:e] = (top / 127.0).clamp_min(1e-12)
            q[r:e] = buf.div_(scale[r:e].float()[:, None]).round_().clamp_(-127, 127)
            r = e
        self.register_buffer("qweight", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.detach().float(), requires_grad=False)
        self.prefill_bf16 = prefill_bf16    # None / True / False, as asked (prefill_kernel resolves it)
        self.native = bool(native)

    @property
    def weight(self):   # dequantized copy, for code that reads .weight (the fused device step; not used on CPU),
        w = self.qweight.float() * self.scale.float()[:, None]      # the input gain folded back in
        return w if self.in_gain is None else w * self.in_gain[None, :]

    def mm(self, xb):
        """xb (rows, in) bf16 -> (rows, out): the input gain applied to xb (fp32 product, rounded to bf16)."""
        return self._mm(_gained(self, xb))

    def _mm(self, xb):
        y = torch.ops.aten._weight_int8pack_mm(xb, self._aligned_qweight(), self.scale)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def _qweight_aligned(self) -> bool:
        """Whether qweight's first byte is 64-byte aligned, as torch's int8 kernel needs it."""
        return self.qweight.data_ptr() % 64 == 0

    def _aligned_qweight(self) -> torch.Tensor:
        """qweight where its first byte is 64-byte aligned, else an aligned copy made once: torch's int8 kernel
        faults on a misaligned weight of many rows (a stored file's mapped tensor can lie at any offset; a (2048,
        2048) weight 8 bytes off crashed the process)."""
        q = self.qweight
        if self._qweight_aligned():
            return q
        cached = self.__dict__.get("_aligned")
        if cached is None or cached[0] is not q:
            cached = self._aligned = (q, q.contiguous().clone())
        return cached[1]

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
        few = rows <= INT8_GEMM_ROWS and self._qweight_aligned()    # torch's kernel (on aligned weights only)
        if cpu and not few and not bf16_over_native(self.prefill_bf16, rows) and self.gemm_lib() is not None:
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


def quantize_cpu(model, mode: str, head: bool = True, options: EngineOptions | None = None,
                 int8_head4: bool = False):
    """In place. mode "int8": weight-only int8 Linear layers (Int8Linear, per-channel scales, bf16 activations).
    "int4": Int4Linear layers (groups of 32, fp16 scales), those int4_keeps_int8 names Int8Linear (engine/int4_rules.py:
    with norm gains, q/k/v on llama.cpp's use_more_bits layers too, the per-layer mix); a llama-family head also gets
    its int4 copy (the two-level head, engine/two_level_head.py; head4_eligible) unless options.head4 is off; in "int8"
    only with int8_head4 (what a stored int8 file is made with, once, at import: quant_files.save_quantized), since
    the copy's scale search costs a start more than the rest of the quantization (SmolLM2-135M's head: ~5 s on 2
    loaded Zen 4 vCPUs, against ~1.6 s for all its int8 rows).
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
        if (name == "head" and (cls is Int4Linear or (cls is Int8Linear and int8_head4)) and opts.head4
                and type(q) is Int8Linear and head4_eligible(model, q)):
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
