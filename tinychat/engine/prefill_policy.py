"""How the quant Linears (engine/quant.py, engine/quant_int4.py) prefill: the row thresholds that pick a kernel, the
CPU probes (bf16 dot products, AMX tiles) and the rule on them (resolve_prefill_bf16, bf16_over_native), and the
per-thread buffers their GEMMs and quantization reuse (no large malloc + page faults per call). No Linear is made
here: both quant modules import it."""
from __future__ import annotations

import functools
import threading

import torch

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
