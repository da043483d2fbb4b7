"""Native CPU kernels for the lean int8 decode step (the C source is native.c beside this file), built on first use
with the system C compiler and loaded with ctypes; everything degrades to the pure-PyTorch path
(aten._weight_int8pack_mm) when there is no compiler, the build fails, or the kernels disagree with the reference on
a self-test.

Why: at batch 1 a decode step streams every weight once, and aten._weight_int8pack_mm reaches about half the memory
bandwidth a plain fp32 GEMV gets on the same core; each PyTorch op also costs a few microseconds of dispatch, and a
layer of _decode_fast is ~40 of them. The kernels read the int8 weights in four streams (`gemv`; activations rounded
to int16 per vector, finer than the bf16 the aten kernel takes, so the products run on integer multiply-adds, 32
weights an instruction), and a token's whole step is a handful of calls: `layers` runs each run of layers between
Engram blocks (per layer `attn`: norms, RoPE, cache writes, one softmax; `tail`: w_o, residual, norm, MLP, residual,
next norm and next fused QKV), `engram` one Engram block, `norm_gemv` the head and `softcap` the logit cap.

The shared object is cached under the user cache folder ($TINYCHAT_HOME/cache when set), keyed by the source, the
compiler and the CPU's flags (it is built with -march=native). TINYCHAT_NATIVE=0 turns the kernels off."""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path

import torch

from ..nativebuild import build_shared
from ..nativebuild import compiler as _compiler

ENV = "TINYCHAT_NATIVE"
INT8_STEP_VERSION = 1   # sessions record "native-int8-v<this>": bump it when the native step's rounding changes
_lock = threading.Lock()
_lib = None
_tried = False
why_not: str | None = None     # why the kernels are off (None while on or not tried yet)

SOURCE = (Path(__file__).with_name("native.c")).read_text(encoding="utf-8")   # the kernels (C), beside this file


def _build(cc: str) -> Path:
    """The kernels' shared object (tinychat/nativebuild.py: cached, keyed by source, compiler, CPU and torch)."""
    return build_shared(SOURCE, "tc_native", (["-fopenmp", "-O3", "-march=native"], ["-O3", "-march=native"]),
                        cc=cc, key_extra=(torch.__version__,))   # without OpenMP: the pragmas are ignored, one thread


_F, _I8, _I64, _INT = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
ABI = 7                 # tc_abi_version() of the source this module binds
TC_MAXN = 8             # native.c's highest Engram order for tc_step's hashing


class TcPlan(ctypes.Structure):
    """native.c's tc_plan: tc_step's view of an int8 model and its fp32 cache (pointers as integers)."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "d", "hidden", "H", "Hk", "D", "W", "gstride", "V", "n_seg", "n1",
        "tab", "x", "h", "xq", "qkv", "y", "u", "logits", "sc", "embed", "cos_", "sin_", "lk", "lv", "gk", "gv", "lpos",
        "tokens", "lens", "lens_cpu", "head_q", "head_s", "cid", "segs")]


class TcSeg(ctypes.Structure):
    """native.c's tc_seg: layers [a, b) after an optional Engram block."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "a", "b", "qkv_q", "qkv_s", "qkv_n", "engram", "table", "edim", "vq", "vs", "kq", "ks", "n_tab", "size", "hash",
        "e", "exq", "ek", "ev", "addrs")]


def _bind(lib):
    lib.tc_gemv.argtypes = [_F, _F, _I8, _F, _F, _I64, _I64, _INT, _INT]
    lib.tc_norm_gemv.argtypes = [_F, _F, _F, ctypes.c_float, _I8, _F, _F, _I64, _I64, _INT]
    lib.tc_tail.argtypes = [_F, _F, _F, ctypes.c_float, _F, _I64, _I8, _F, _I8, _F, _I8, _F, _F, _I64, _I64,
                            _I8, _F, _F, _I64, _INT]
    lib.tc_attn.argtypes = [_F, _I64, _I64, _I64, _INT, _F, _F, _F, _F, _I64, _F, _F, _I64, _F, _I64, _F, _F, _INT]
    lib.tc_layers.argtypes = [_F, _I64, _I64, _F, _F, _F, ctypes.c_float, _F, _F, _F, _I64, _I64, _I64, _I64, _I64,
                              _F, _F, _F, _F, _I64, _F, _F, _I64, _F, _I64, _F, _INT]
    lib.tc_engram.argtypes = [_F, _F, _F, _I64, _I64, _I8, _F, _I8, _F, _I64, _F, _F, _F, _F, _INT]
    lib.tc_softcap.argtypes = [_F, _I64, ctypes.c_float]
    lib.tc_step.argtypes = [_F, _I64, _I64, ctypes.c_float, ctypes.c_float, _INT]
    for f in (lib.tc_gemv, lib.tc_norm_gemv, lib.tc_tail, lib.tc_attn, lib.tc_layers, lib.tc_engram, lib.tc_softcap,
              lib.tc_step):
        f.restype = None
    lib.tc_abi_version.restype = ctypes.c_int
    return lib


def _self_test(lib) -> bool:
    """The kernels against aten / plain fp32 math on odd shapes (remainder rows and columns), 1 and 2 threads."""
    g = torch.Generator().manual_seed(0)
    xq = torch.empty(16384, dtype=torch.int16)
    for N, K in ((37, 80), (64, 768), (5, 19), (8, 9000)):
        q = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
        s = torch.rand(N, generator=g) + 0.5
        x = torch.randn(K, generator=g)
        ref = (q.double() @ x.double()) * s.double()
        for nt in (1, 2):
            y = torch.full((N,), 3.0)
            lib.tc_gemv(x.data_ptr(), xq.data_ptr(), q.data_ptr(), s.data_ptr(), y.data_ptr(), N, K, 1, nt)
            if not torch.allclose(y.double(), ref + 3.0, rtol=1e-3, atol=1e-3 * float(ref.abs().max())):
                return False
    d, hid, nq = 48, 96, 40
    x0 = torch.randn(d, generator=g)
    ya = torch.randn(d, generator=g)
    w = [torch.randint(-127, 128, shape, dtype=torch.int8, generator=g) for shape in ((d, d), (hid, d), (d, hid),
                                                                                     (nq, d))]
    sc = [torch.rand(t.size(0), generator=g) * 0.01 for t in w]
    inv = d ** -0.5
    x = x0.double() + (w[0].double() @ ya.double()) * sc[0].double()
    h = x / (x.norm() * inv)
    u = torch.relu((w[1].double() @ h) * sc[1].double()) ** 2
    x = x + (w[2].double() @ u) * sc[2].double()
    h = x / (x.norm() * inv)
    qkv_ref = (w[3].double() @ h) * sc[3].double()
    for nt in (1, 2):
        xx, hh, uu, qkv = x0.clone(), torch.empty(d), torch.empty(hid), torch.empty(nq)
        lib.tc_tail(xx.data_ptr(), hh.data_ptr(), xq.data_ptr(), inv, ya.data_ptr(), d, w[0].data_ptr(), sc[0].data_ptr(),
                    w[1].data_ptr(), sc[1].data_ptr(), w[2].data_ptr(), sc[2].data_ptr(), uu.data_ptr(), hid, d,
                    w[3].data_ptr(), sc[3].data_ptr(), qkv.data_ptr(), nq, nt)
        if not (torch.allclose(xx.double(), x, rtol=1e-3, atol=1e-3 * float(x.abs().max()))
                and torch.allclose(qkv.double(), qkv_ref, rtol=1e-3, atol=1e-3 * float(qkv_ref.abs().max()))):
            return False
    return True


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
            lib = _bind(ctypes.CDLL(str(_build(cc))))
            if lib.tc_abi_version() != ABI or not _self_test(lib):
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
