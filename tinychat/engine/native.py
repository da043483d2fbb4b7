"""Native CPU kernels for the lean int8 decode step (the C source is native.c beside this file), built on first use
with the system C compiler and loaded with ctypes; everything degrades to the pure-PyTorch path
(aten._weight_int8pack_mm) when there is no compiler, the build fails, or the kernels disagree with the reference on
a self-test.

Why: at batch 1 a decode step streams every weight once, and aten._weight_int8pack_mm reaches about half the memory
bandwidth a plain fp32 GEMV gets on the same core; each PyTorch op also costs a few microseconds of dispatch, and a
layer of _decode_fast is ~40 of them. The kernels read the int8 weights in four streams (`gemv`; activations rounded
to int8 in blocks of 32 with one fp32 scale each, as llama.cpp's Q8_0 activations, so the products run on integer
dot products: 64 weights an instruction with AVX512-VNNI; native_q8.h), and a token's whole step is a handful of calls: `layers` runs each run of layers between
Engram blocks (per layer `attn`: norms, RoPE, cache writes, one softmax; `tail`: w_o, residual, norm, MLP, residual,
next norm and next fused QKV), `engram` one Engram block, `norm_gemv` the head and `softcap` the logit cap.

The shared object is cached under the user cache folder ($TINYCHAT_HOME/cache when set), keyed by the source, the
compiler, the CPU's flags and the target flags (-march=native, or TINYCHAT_NATIVE_ARCH, e.g. "-march=x86-64-v3
-mavxvnni" to build and measure the AVX2 + AVX-VNNI path on an AVX-512 machine, "-march=x86-64-v4" the AVX-512 one
without VNNI). Without OpenMP (Apple clang) the kernels run on one thread. TINYCHAT_NATIVE=0 turns the kernels off.
native_simd.h decides the SIMD level for every kernel from the target flags; kernel_path() names the path built,
KERNEL_PATHS says what it records (the step version) and runs.

Rounding: the kernels round the activations to int8 in blocks of 32 (one fp32 scale each), the PyTorch lean step to
bf16; prefill's int8 Linears round theirs as the kernels do where the native GEMM runs (tc_gemm, native_gemm.h). The
tests bound the differences (tests/unit/test_quant.py); sessions name the rounding they were recorded with by the
step version and the kernel path."""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..nativebuild import build_shared
from ..nativebuild import compiler as _compiler

ENV = "TINYCHAT_NATIVE"
INT8_STEP_VERSION = 8   # the native step's rounding's version: bump it when the rounding changes on some kernel path,
                        # prefill's included (it fills the KV cache a later turn or a restore reads), and give those
                        # paths the new number in KERNEL_PATHS. What each version changed: docs/benchmarks.md,
                        # "Int8 step versions".
INT4_STEP_VERSION = 6   # the native int4 step's rounding (native_q4.h: Q4_0-style groups of 32 with fp16 scales, the
                        # int8 activations of the int8 step): sessions record "native-int4-v<N>@<path>". 2: the
                        # llama step multiplies the norm output by the fused matrices' input gains (issue #34). 3:
                        # a model with gains keeps q/k/v int8 on llama.cpp's use_more_bits layers (int4_rules.py's
                        # int4_more_bits: per-layer formats, native_llama.h's LTAB_FMT column). 4: rows by groups
                        # of four in super-blocks of 512 columns (native_q4_layout.h): the fp32 sums' order changed.
                        # 5: the x86 prefill GEMM pads a long rest of K into a super-block (native_gemm.h's
                        # TC_REST_MAX), and AVX2 builds run the SwiGLU in 8 lanes (int8 v7). 6: the x86 prefill GEMM
                        # runs a rest of <= 64 columns as a super-block of its own (native_gemm.h's TC_RESTSB; int8 v8)


@dataclass(frozen=True)
class KernelPath:
    """What a kernel path (native_simd.h's TC_PATH) records and runs."""
    step_version: int       # sessions record "native-int8-v<N>@<path>": the last INT8_STEP_VERSION that changed this
                            # path's rounding, so a session replays as exact where its bits did not move
    prefill_attn: bool      # prefill's attention in the kernels (tc_prefill_attn: the x86 levels' grouped kernels
                            # beat SDPA); False: SDPA (NEON and plain C)


KERNEL_PATHS = {            # every TC_PATH native_simd.h can name (a test reads them from the header)
    "avx512-vnni": KernelPath(8, True),
    "avx512": KernelPath(8, True),      # x86-64-v4 without VNNI: was named "avx2" before v6's table; v6 moved its
                                        # prefill attention from SDPA to the 16-lane kernels
    "avx2-vnni": KernelPath(8, True),
    "avx2": KernelPath(8, True),
    "neon-dotprod": KernelPath(5, False),
    "neon": KernelPath(5, False),
    "scalar": KernelPath(5, False),
}
_lock = threading.Lock()
_lib = None
_tried = False
why_not: str | None = None     # why the kernels are off (None while on or not tried yet)

SOURCES = {n: Path(__file__).with_name(n).read_text(encoding="utf-8")
           for n in ("native.c", "native_simd.h", "native_q8.h", "native_gemm.h", "native_q4.h", "native_q4_layout.h",
                     "native_attn.h", "native_attn_kv.h", "native_f16.h", "native_llama.h")}
SOURCE = SOURCES["native.c"]    # the kernels (C), beside this file; included: native_simd.h (the SIMD level and
                                # kernel path, decided once), native_q8.h (the int8 GEMV), native_gemm.h (prefill's
                                # int8 GEMM), native_attn.h (per-head attention; native_attn_kv.h its K/V readers, for
                                # fp32 and fp16 caches; native_f16.h the fp16 conversions), native_llama.h (the llama
                                # step)
ARCH_ENV = "TINYCHAT_NATIVE_ARCH"   # the build's target flags instead of the host's own (-march=native), e.g.
                                    # "-march=x86-64-v3 -mavxvnni" (AVX2 + AVX-VNNI), "-march=x86-64-v3" (AVX2)


def arch_flags() -> list[str]:
    """The target flags of the build: TINYCHAT_NATIVE_ARCH when set, else the host's own features (-march=native;
    -mcpu=native on ARM64, where clang takes no -march=native)."""
    env = os.environ.get(ARCH_ENV, "").strip()
    if env:
        return env.split()
    import platform
    return ["-mcpu=native"] if platform.machine().lower() in ("arm64", "aarch64") else ["-march=native"]


def build_cmd(cc: str, src: Path, out: Path, arch: list[str], openmp: bool) -> list[str]:
    """The compile command for the shared library (-ffp-contract=off: no fused multiply-adds the source does not
    spell out, so every build rounds the activations the same way)."""
    return [cc, *(["-fopenmp"] if openmp else []), "-O3", *arch, "-ffp-contract=off", "-shared", "-fPIC", "-o",
            str(out), str(src), "-lm"]


def _build(cc: str) -> Path:
    """The kernels' shared object (tinychat/nativebuild.py: cached, keyed by sources, compiler, CPU, target flags and
    torch)."""
    arch = arch_flags()
    common = ["-O3", *arch, "-ffp-contract=off"]
    return build_shared(SOURCE, "tc_native", (["-fopenmp", *common], common), cc=cc,   # without OpenMP (Apple
                        key_extra=(torch.__version__, *arch),                            # clang): one thread
                        headers={n: t for n, t in SOURCES.items() if n != "native.c"})


_F, _I8, _I64, _INT = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
ABI = 22                # tc_abi_version() of the source this module binds
TC_MAXN = 8             # native.c's highest Engram order for tc_step's hashing


class TcPlan(ctypes.Structure):
    """native.c's tc_plan: tc_step's view of an int8 model and its fp32 cache (pointers as integers)."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "d", "hidden", "H", "Hk", "D", "W", "gstride", "V", "n_seg", "n1",
        "tab", "x", "h", "xq", "qkv", "y", "u", "logits", "sc", "embed", "cos_", "sin_", "lk", "lv", "gk", "gv", "lpos",
        "tokens", "lens", "lens_cpu", "head_q", "head_s", "cid", "segs", "wfmt", "drop")]


class TcLlamaPlan(ctypes.Structure):
    """native_llama.h's tc_lplan: tc_llama_step's view of a llama-family int8 model and its fp32 cache."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "d", "hidden", "H", "Hk", "D", "gstride", "V", "n_layers", "rescore_k", "embed_fmt",
        "tab", "x", "h", "xq", "qkv", "y", "u", "logits", "sc", "embed", "cos_", "sin_", "gk", "gv", "tokens", "lens",
        "lens_cpu", "head_q", "head_s", "embed_s", "embed_g", "drop", "kv16", "head4_q", "head4_s")]
EMB_F32, EMB_BF16, EMB_Q8 = 0, 1, 2     # tc_lplan.embed_fmt (native_llama.h's TC_EMB_*)


LTAB_COLS = 13          # native_llama.h's table columns per layer (the last: the layer's TC_F_* formats)
DROP_RANGES = 8         # native.c's TC_DROP_RANGES: (address, bytes) pairs per row of a step's drop table


class TcSeg(ctypes.Structure):
    """native.c's tc_seg: layers [a, b) after an optional Engram block."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "a", "b", "qkv_q", "qkv_s", "qkv_n", "engram", "table", "edim", "vq", "vs", "kq", "ks", "n_tab", "size", "hash",
        "e", "exq", "ek", "ev", "addrs")]


def _bind(lib):
    lib.tc_gemv.argtypes = [_F, _F, _I8, _F, _F, _I64, _I64, _INT, _INT]
    lib.tc_norm_gemv.argtypes = [_F, _F, _F, ctypes.c_float, _I8, _F, _F, _I64, _I64, _INT, _INT]
    lib.tc_tail.argtypes = [_F, _F, _F, ctypes.c_float, _F, _I64, _I8, _F, _I8, _F, _I8, _F, _F, _I64, _I64,
                            _I8, _F, _F, _I64, _INT, _INT]
    lib.tc_attn.argtypes = [_F, _I64, _I64, _I64, _INT, _F, _F, _F, _F, _I64, _F, _F, _I64, _F, _I64, _F, _F, _INT]
    lib.tc_layers.argtypes = [_F, _I64, _I64, _F, _F, _F, ctypes.c_float, _F, _F, _F, _I64, _I64, _I64, _I64, _I64,
                              _F, _F, _F, _F, _I64, _F, _F, _I64, _F, _I64, _F, _F, _INT, _INT]
    lib.tc_drop.argtypes = [_F, _I64]
    lib.tc_engram.argtypes = [_F, _F, _F, _I64, _I64, _I8, _F, _I8, _F, _I64, _F, _F, _F, _F, _INT]
    lib.tc_softcap.argtypes = [_F, _I64, ctypes.c_float]
    lib.tc_step.argtypes = [_F, _I64, _I64, ctypes.c_float, ctypes.c_float, _INT]
    lib.tc_llama_step.argtypes = [_F, _I64, _I64, ctypes.c_float, ctypes.c_float, _INT]
    lib.tc_prefill_attn.argtypes = [_F, _I64, _I64, _I64, _I64, _I64, _F, _F, _I64, _F, _F, _F, _I64, _F, _F, _INT]
    lib.tc_prefill_attn.restype = None
    lib.tc_rope_heads.argtypes = [_F, _I64, _I64, _I64, _I64, _I64, _F, _F, ctypes.c_float, _F, _I64, _INT]
    lib.tc_rope_heads.restype = None
    lib.tc_prefill_attn_h.argtypes = [_F, _I64, _I64, _I64, _I64, _I64, _F, _F, _I64, _F, _F, _INT]
    lib.tc_prefill_attn_h.restype = None
    lib.tc_attend_h.argtypes = [_F, _I64, _I64, _I64, _F, _F, _I64, _I64, _F, _F, _INT]
    lib.tc_f2h_rows.argtypes = [_F, _F, _I64]
    lib.tc_h2f_rows.argtypes = [_F, _F, _I64]
    lib.tc_attend_h.restype = lib.tc_f2h_rows.restype = lib.tc_h2f_rows.restype = None
    for f in (lib.tc_gemv, lib.tc_norm_gemv, lib.tc_tail, lib.tc_attn, lib.tc_layers, lib.tc_engram, lib.tc_softcap,
              lib.tc_step, lib.tc_llama_step, lib.tc_drop):
        f.restype = None
    lib.tc_abi_version.restype = ctypes.c_int
    lib.tc_kernel_path.restype = ctypes.c_char_p
    lib.tc_act_bytes.argtypes = [_I64]
    lib.tc_act_bytes.restype = ctypes.c_int64
    lib.tc_gemv_ref.argtypes = [_F, _F, _I8, _F, _F, _I64, _I64, _INT]
    lib.tc_gemv_ref.restype = None
    lib.tc_gemm.argtypes = [_F, _F, _I8, _F, _F, _F, _I64, _I64, _I64, _INT]
    lib.tc_gemm_ref.argtypes = [_F, _F, _I8, _F, _F, _F, _I64, _I64, _I64]
    lib.tc_gemm.restype = lib.tc_gemm_ref.restype = None
    lib.tc_gemm_act_bytes.argtypes = [_I64, _I64, _INT]
    lib.tc_gemm_act_bytes.restype = ctypes.c_int64
    lib.tc_gemv4.argtypes = [_F, _F, _F, _F, _F, _I64, _I64, _INT, _INT]
    lib.tc_gemv4_ref.argtypes = [_F, _F, _F, _F, _F, _I64, _I64, _INT]
    lib.tc_gemm4.argtypes = [_F, _F, _F, _F, _F, _F, _I64, _I64, _I64, _INT]
    lib.tc_gemv4.restype = lib.tc_gemv4_ref.restype = lib.tc_gemm4.restype = None
    lib.tc_dequant4_bf16.argtypes = [_F, _F, _F, _I64, _I64, _INT]
    lib.tc_dequant4_bf16.restype = None
    lib.tc_gemm4_act_bytes.argtypes = [_I64, _I64, _INT]
    lib.tc_gemm4_act_bytes.restype = ctypes.c_int64
    lib.tc_read_bytes.argtypes = [_I8, _I64]
    lib.tc_read_bytes.restype = ctypes.c_int64
    return lib


QB = 32                 # native_q8.h's activation block: columns per int8 scale


def quant8_ref(x: torch.Tensor) -> torch.Tensor:
    """The activations as the kernels see them: x (K,) rounded to int8 in blocks of QB with one fp32 scale per block
    (max|x| / 127; round half to even of x * (127 / max)), returned dequantized in float64 (exact: xq * scale).
    An all-zero block stays zero; a block with inf / NaN gives NaN (native_q8.h's tc_quant8 in PyTorch)."""
    K = x.numel()
    xb = torch.nn.functional.pad(x.float().reshape(-1), (0, -K % QB)).view(-1, QB)
    m = xb.abs().amax(dim=1, keepdim=True)
    bad = ~torch.isfinite(xb).all(dim=1, keepdim=True)
    r = torch.where(m > 0, torch.tensor(127.0) / m, torch.zeros(()))
    xq = torch.round(torch.where(bad, 0.0, xb * r))
    sx = torch.where(bad, float("nan"), m / 127.0)
    return (xq.double() * sx.double()).view(-1)[:K]


def act_scratch(lib, k: int) -> torch.Tensor:
    """An activation scratch for inputs of up to k columns (native_q8.h's tc_act8 layout)."""
    return torch.empty(int(lib.tc_act_bytes(max(k, 64))), dtype=torch.uint8)


def gemm_ref(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """tc_gemm's result in float64: every token (row of x, (M, K)) rounded as quant8_ref rounds it, times the int8
    rows q (N, K), times the per-row scales s (N,), plus the bias: (M, N)."""
    xr = torch.stack([quant8_ref(r) for r in x.reshape(-1, x.size(-1))]) if x.numel() else x.double()
    y = (xr @ q.double().t()) * s.double()
    return y if bias is None else y + bias.double()


def gemm(lib, x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None, nt: int,
         scratch: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y (M, N) fp32 = tc_gemm of x (M, K) fp32 contiguous, q (N, K) int8 contiguous, s (N,) fp32, bias (N,) fp32 or
    None, on nt threads. scratch: a uint8 buffer of at least tc_gemm_act_bytes(M, K, nt) (else one is allocated); out: a
    contiguous fp32 (M, N) to write into."""
    M, K = x.shape
    N = q.size(0)
    if not (x.dtype == torch.float32 and x.is_contiguous() and q.dtype == torch.int8 and q.is_contiguous()
            and q.size(1) == K and s.dtype == torch.float32 and s.numel() == N
            and (bias is None or (bias.dtype == torch.float32 and bias.numel() == N and bias.is_contiguous()))):
        raise ValueError("gemm: x (M, K) fp32, q (N, K) int8, s (N,) fp32, bias (N,) fp32, all contiguous")
    need = int(lib.tc_gemm_act_bytes(M, K, nt))
    if scratch is None or scratch.numel() < need:
        scratch = torch.empty(need, dtype=torch.uint8)
    y = torch.empty(M, N) if out is None else out
    if not (y.shape == (M, N) and y.dtype == torch.float32 and y.is_contiguous()):
        raise ValueError("gemm: out must be a contiguous fp32 (M, N)")
    lib.tc_gemm(x.data_ptr(), scratch.data_ptr(), q.data_ptr(), s.data_ptr(),
                None if bias is None else bias.data_ptr(), y.data_ptr(), M, N, K, nt)
    return y


Q4G = 32                # native_q4.h's weight group: columns per fp16 scale


def pad64(k: int) -> int:
    return (k + 63) // 64 * 64


def unpack4(packed: torch.Tensor, K: int) -> torch.Tensor:
    """An int4 matrix's packed rows (N, Kp / 2) uint8 (native_q4_layout.h's grouped layout) as int8 values q (N, K)
    in -8..7 (u - 8)."""
    from .int4_layout import plain, unpack_plain
    u = unpack_plain(plain(packed, None)[0])
    return (u[:, :K].to(torch.int16) - 8).to(torch.int8)


def dequant4(packed: torch.Tensor, scales: torch.Tensor, K: int, dtype=torch.float32) -> torch.Tensor:
    """An int4 matrix's weights (N, K) in dtype: q * the group's fp16 scale (exact in fp32 and wider: |q| <= 8)."""
    from .int4_layout import plain, unpack_plain
    pq, ps = plain(packed, scales)                       # one conversion for both
    q = unpack_plain(pq)[:, :K].to(dtype) - 8
    return q * ps.to(dtype).repeat_interleave(Q4G, dim=1)[:, :K]


def dequant4_ref(packed: torch.Tensor, scales: torch.Tensor, K: int) -> torch.Tensor:
    """The int4 weights (N, K) in float64 (dequant4's, exact)."""
    return dequant4(packed, scales, K, torch.float64)


def gemm4_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """tc_gemm4's (and tc_gemv4's, per token) result in float64: each token rounded as quant8_ref rounds it, times
    the dequantized int4 rows (N, K), plus the bias: (M, N)."""
    xr = torch.stack([quant8_ref(r) for r in x.reshape(-1, x.size(-1))]) if x.numel() else x.double()
    y = xr @ dequant4_ref(packed, scales, x.size(-1)).t()
    return y if bias is None else y + bias.double()


def _check4(x, packed, scales, N, K) -> None:
    Kp = pad64(K)
    if not (x.dtype == torch.float32 and x.is_contiguous() and x.size(-1) == K and packed.dtype == torch.uint8
            and packed.is_contiguous() and packed.shape == (N, Kp // 2) and scales.dtype == torch.float16
            and scales.is_contiguous() and scales.shape == (N, Kp // Q4G)):
        raise ValueError("int4: x (.., K) fp32, packed (N, pad64(K) / 2) uint8, scales (N, pad64(K) / 32) fp16, "
                         "all contiguous")


def gemv4(lib, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, nt: int = 1,
          scratch: torch.Tensor | None = None) -> torch.Tensor:
    """y (N,) = tc_gemv4 of x (K,) fp32 on the int4 rows (packed, scales)."""
    N, K = packed.size(0), x.numel()
    _check4(x, packed, scales, N, K)
    xq = act_scratch(lib, K) if scratch is None else scratch
    y = torch.empty(N)
    lib.tc_gemv4(x.data_ptr(), xq.data_ptr(), packed.data_ptr(), scales.data_ptr(), y.data_ptr(), N, K, 0, nt)
    return y


def gemm4(lib, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, nt: int,
          scratch: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y (M, N) fp32 = tc_gemm4 of x (M, K) fp32 on the int4 rows (packed (N, pad64(K) / 2) uint8, scales
    (N, pad64(K) / 32) fp16), plus bias (N,) fp32 or None, on nt threads. scratch: a uint8 buffer of at least
    tc_gemm4_act_bytes(M, K, nt); out: a contiguous fp32 (M, N) to write into."""
    M, K = x.shape
    N = packed.size(0)
    _check4(x, packed, scales, N, K)
    if bias is not None and not (bias.dtype == torch.float32 and bias.numel() == N and bias.is_contiguous()):
        raise ValueError("gemm4: bias (N,) fp32 contiguous")
    need = int(lib.tc_gemm4_act_bytes(M, K, nt))
    if scratch is None or scratch.numel() < need:
        scratch = torch.empty(need, dtype=torch.uint8)
    y = torch.empty(M, N) if out is None else out
    if not (y.shape == (M, N) and y.dtype == torch.float32 and y.is_contiguous()):
        raise ValueError("gemm4: out must be a contiguous fp32 (M, N)")
    lib.tc_gemm4(x.data_ptr(), scratch.data_ptr(), packed.data_ptr(), scales.data_ptr(),
                 None if bias is None else bias.data_ptr(), y.data_ptr(), M, N, K, nt)
    return y


def dequant4_bf16(lib, packed: torch.Tensor, scales: torch.Tensor, K: int, nt: int = 1,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """The int4 rows (packed (N, pad64(K) / 2) uint8, scales (N, pad64(K) / 32) fp16) as bf16 weights (N, K): each
    q * d rounded to nearest even (dequant4_ref(...).to(torch.bfloat16), bit for bit), on nt threads; out: a
    contiguous bf16 (N, K) to write into. Prefill's bf16 GEMMs take them (quant.py's Int4Linear)."""
    N = packed.size(0)
    _check4(torch.empty(0, K), packed, scales, N, K)
    y = torch.empty(N, K, dtype=torch.bfloat16) if out is None else out
    if not (y.shape == (N, K) and y.dtype == torch.bfloat16 and y.is_contiguous()):
        raise ValueError("dequant4_bf16: out must be a contiguous bf16 (N, K)")
    lib.tc_dequant4_bf16(packed.data_ptr(), scales.data_ptr(), y.data_ptr(), N, K, nt)
    return y


def random_int4(N: int, K: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random int4 rows (any nibbles, any layout; fp16 scales of both signs), for the tests."""
    Kp = pad64(K)
    packed = torch.randint(0, 256, (N, Kp // 2), dtype=torch.uint8, generator=g)
    scales = ((torch.rand(N, Kp // Q4G, generator=g) + 0.5) * (torch.randint(0, 2, (N, Kp // Q4G), generator=g) * 2
                                                                 - 1)).to(torch.float16)
    return packed, scales


def _close(y, ref, tol=1e-4) -> bool:
    return bool(torch.allclose(y.double(), ref, rtol=tol, atol=tol * float(ref.abs().max())))


def _self_tested(lib, so: Path) -> bool:
    """_self_test(lib), run once per build rather than once per process (it took ~70 ms of every start, more on a
    loaded host): a pass is recorded beside the object (<object>.selftest, in the same private folder) with what it
    depends on, the object's size and sha256 record (nativebuild checked it against the file) and this module's
    source (the test itself, the ABI); a missing or different record runs the test again."""
    mark = so.with_name(so.name + ".selftest")
    try:
        key = "\n".join([so.with_name(so.name + ".sha256").read_text(encoding="ascii").strip(),
                         hashlib.sha256(Path(__file__).read_bytes()).hexdigest(), str(ABI)])
    except (OSError, UnicodeDecodeError):
        return _self_test(lib)
    try:
        if mark.read_text(encoding="ascii") == key:
            return True
    except (OSError, UnicodeDecodeError):
        pass
    if not _self_test(lib):
        return False
    try:
        from ..fsutil import atomic_write
        atomic_write(mark, lambda tmp: tmp.write_text(key, encoding="ascii"))
    except OSError:
        pass                                # not recorded: the next process tests again
    return True


def _self_test(lib) -> bool:
    """The kernels (GEMV, prefill GEMM, a layer's tail) against the same int8 activation rounding in float64
    (quant8_ref) on odd shapes (remainder rows, columns and tokens), 1 and 2 threads: equal up to fp32 summation
    order."""
    g = torch.Generator().manual_seed(0)
    xq = act_scratch(lib, 9000)
    for N, K in ((37, 80), (64, 768), (5, 19), (8, 9000), (9, 100)):
        q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        s = torch.rand(N, generator=g) + 0.5
        x = torch.randn(K, generator=g)
        ref = (q.double() @ quant8_ref(x)) * s.double()
        for nt in (1, 2):
            y = torch.full((N,), 3.0)
            lib.tc_gemv(x.data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), N, K, 1, nt)
            if not _close(y - 3.0, ref):
                return False
    for N, K in ((37, 80), (8, 576), (5, 19)):          # the int4 GEMV and GEMM (native_q4.h)
        packed, scales = random_int4(N, K, g)
        x = torch.randn(3, K, generator=g)
        ref = gemm4_ref(x, packed, scales)
        for nt in (1, 2):
            if not (_close(gemm4(lib, x, packed, scales, None, nt), ref)
                    and _close(gemv4(lib, x[0].contiguous(), packed, scales, nt), ref[0])):
                return False
    for M, N, K in ((67, 37, 80), (5, 9, 19)):          # the prefill GEMM: remainder tokens, rows and columns
        q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        s, b, x = torch.rand(N, generator=g) + 0.5, torch.randn(N, generator=g), torch.randn(M, K, generator=g)
        ref = gemm_ref(x, q, s, b)
        if not all(_close(gemm(lib, x, q, s, b, nt), ref) for nt in (1, 2)):
            return False
    d, hid, nq = 48, 96, 40
    x0 = torch.randn(d, generator=g)
    ya = torch.randn(d, generator=g)
    w = [torch.randint(-127, 128, shape, dtype=torch.int8, generator=g) for shape in ((d, d), (hid, d), (d, hid),
                                                                                     (nq, d))]
    sc = [torch.rand(t.size(0), generator=g) * 0.01 for t in w]
    inv = d ** -0.5

    def lin(i, v):
        return (w[i].double() @ quant8_ref(v.float())) * sc[i].double()
    x = x0.double() + lin(0, ya)
    h = x / (x.norm() * inv)
    u = torch.relu(lin(1, h)) ** 2
    x = x + lin(2, u)
    h = x / (x.norm() * inv)
    qkv_ref = lin(3, h)
    for nt in (1, 2):
        xx, hh, uu, qkv = x0.clone(), torch.empty(d), torch.empty(hid), torch.empty(nq)
        lib.tc_tail(xx.data_ptr(), hh.data_ptr(), xq.data_ptr(), inv, ya.data_ptr(), d, w[0].data_ptr(), sc[0].data_ptr(),
                    w[1].data_ptr(), sc[1].data_ptr(), w[2].data_ptr(), sc[2].data_ptr(), uu.data_ptr(), hid, d,
                    w[3].data_ptr(), sc[3].data_ptr(), qkv.data_ptr(), nq, 0, nt)
        if not (_close(xx, x, 1e-3) and _close(qkv, qkv_ref, 1e-3)):
            return False
    return True


def kernel_path() -> str:
    """Which int8 kernel path this machine runs: native_simd.h's TC_PATH (a KERNEL_PATHS name: "avx512-vnni",
    "avx512", "avx2-vnni", "avx2", "neon-dotprod", "neon", "scalar"), or "pytorch" where the native kernels are
    off."""
    lib = load()
    return "pytorch" if lib is None else lib.tc_kernel_path().decode()


def kernel_info(path: str | None = None) -> KernelPath:
    """KERNEL_PATHS' entry for a kernel path (default: this machine's); ValueError for a name not in the table."""
    path = kernel_path() if path is None else path
    try:
        return KERNEL_PATHS[path]
    except KeyError:
        raise ValueError(f"unknown int8 kernel path {path!r}") from None


def step_version(path: str | None = None) -> int:
    """The int8 step version sessions record on a kernel path (default: this machine's): KERNEL_PATHS' entry."""
    return kernel_info(path).step_version


def gemm_lib():
    """The loaded kernels where their int8 GEMM beats the fp32 GEMM it replaces: every path with SIMD dot products;
    the "scalar" path (no AVX2 / NEON) is ~5x slower than an fp32 BLAS GEMM. None there or without the kernels."""
    lib = load()
    if lib is None:
        return None
    ok = lib.__dict__.get("gemm_ok")          # asked once per library: prefill asks it per Linear call
    if ok is None:
        ok = lib.gemm_ok = lib.tc_kernel_path() != b"scalar"
    return lib if ok else None


def prefill_attn(lib, q: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, seq: tuple | None, L0: int,
                 W: int) -> torch.Tensor:
    """tc_prefill_attn: q (H, C, D) fp32, already rotated and scaled by 1/sqrt(D); kg / vg (Hk, gstride, D) the
    layer's global keys with the chunk's written at L0 ..; seq: (seq_k, seq_v (Hk, W + C, D), spos (W + C) int64) the
    local band's keys in position order and their positions (-1: none), or None without local keys (W = 0).
    Returns y (H, C, D): each query's softmax over the keys it sees, times their values."""
    H, C, D = q.shape
    Hk = kg.size(0)
    q = q.contiguous()
    nt = torch.get_num_threads()
    y = torch.empty(H, C, D)
    sc = torch.empty(nt * (H // Hk) * (L0 + C + W))    # per thread the scores of a group's heads
    if seq is None:
        sk, sv, sp, W = kg, vg, torch.empty(1, dtype=torch.int64), 0
    else:
        sk, sv, sp = (t.contiguous() for t in seq)
    lib.tc_prefill_attn(q.data_ptr(), H, Hk, D, C, L0, kg.data_ptr(), vg.data_ptr(), kg.size(1), sk.data_ptr(),
                        sv.data_ptr(), sp.data_ptr(), W, y.data_ptr(), sc.data_ptr(), nt)
    return y


def prefill_attn_h(lib, q: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, L0: int) -> torch.Tensor:
    """prefill_attn on an fp16 cache without local keys: kg / vg (Hk, gstride, D) fp16, contiguous, the chunk's keys
    written at L0 ..; read as the decode step reads them (tc_prefill_attn_h: prefill_attn's bits on the rows widened
    to fp32). Returns y (H, C, D)."""
    H, C, D = q.shape
    Hk = kg.size(0)
    if kg.dtype != torch.float16 or not (kg.is_contiguous() and vg.is_contiguous()):
        raise ValueError("prefill_attn_h: contiguous fp16 keys and values")
    q = q.contiguous()
    nt = torch.get_num_threads()
    y = torch.empty(H, C, D)
    sc = torch.empty(nt * (H // Hk) * (L0 + C))
    lib.tc_prefill_attn_h(q.data_ptr(), H, Hk, D, C, L0, kg.data_ptr(), vg.data_ptr(), kg.size(1), y.data_ptr(),
                          sc.data_ptr(), nt)
    return y


def rope_heads(lib, x: torch.Tensor, cs: tuple | None, scale: float = 1.0, out: torch.Tensor | None = None):
    """tc_rope_heads: x (nh, C, D) fp32, any strides with unit stride in D (a projection's output viewed head-major);
    cs: (cos, sin) rows of the tokens' positions, each (C, D / 2) contiguous, or None for a copy. Returns out (nh, C,
    D; a new contiguous tensor by default): x rotated as append.py's _rope_cs rotates it, then times scale (!= 1), the
    same bits. out may be any (nh, C, D) view with unit stride in D and contiguous rows (the cache's K rows)."""
    nh, C, D = x.shape
    if x.stride(2) != 1 or x.dtype != torch.float32:
        raise ValueError("rope_heads: fp32 rows with unit stride")
    if out is None:
        out = torch.empty(nh, C, D)
    if out.stride(2) != 1 or out.stride(1) != D or out.dtype != torch.float32:
        raise ValueError("rope_heads: out needs contiguous fp32 rows of D")
    c, s = (cs[0].data_ptr(), cs[1].data_ptr()) if cs is not None else (None, None)
    lib.tc_rope_heads(x.data_ptr(), x.stride(1), x.stride(0), C, nh, D, c, s, scale, out.data_ptr(), out.stride(0),
                      torch.get_num_threads())
    return out


def load():
    """The loaded kernels (a ctypes library), or None (see why_not). Built and self-tested once per process."""
    global _lib, _tried, why_not
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        _tried = True
        if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
            why_not = f"{ENV}=0"
            return None
        cc = _compiler()
        if cc is None:
            why_not = "no C compiler (cc, gcc, clang) on PATH"
            return None
        try:
            so = _build(cc)
            lib = _bind(ctypes.CDLL(str(so)))
            if lib.tc_abi_version() != ABI or not _self_tested(lib, so):
                why_not = "the native kernels failed their self-test"
                warnings.warn(f"tinychat: {why_not}; using the PyTorch kernels")
                return None
        except Exception as e:  # noqa: BLE001  any build / load failure: the PyTorch path
            why_not = f"{type(e).__name__}: {e}"[:300]
            return None
        _lib = lib
        return lib


def reset():
    """Forget the loaded state (tests: load() tries again, e.g. under a changed TINYCHAT_NATIVE)."""
    global _lib, _tried, why_not
    with _lock:
        _lib, _tried, why_not = None, False, None
