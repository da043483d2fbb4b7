"""Ragged causal attention over a bf16 KV cache, as a tiny C kernel compiled on first use.

Why: in batched decoding every row attends to its own keys 0..len-1, but PyTorch ops must pad to the
longest row and run 3x64 @ 64xS batched GEMMs that oneDNN handles badly (copies + per-matrix
overhead): ~8 ms per layer for 64 rows x 512 keys, i.e. 250 ms per step. Memory bandwidth is the
real limit on this 2-core VM (~10 GB/s), so the kernel reads each row's keys/values exactly once, up
to that row's own length, converting bf16 -> fp32 on the fly (exact: bf16 is the top half of fp32).
It takes "segments" (several consecutive query tokens of one row), so prompt tokens ride along in
the same step as the one-token decode rows and share the key reads of their row.

It is plain C99 + OpenMP, built with the system C compiler into the user cache dir and loaded with
ctypes (no torch headers, no ninja). The library links libgomp.so.1, which resolves to the copy
torch already loaded, so both share one OpenMP thread pool. If there is no compiler, ``available()``
is False and the caller falls back to the PyTorch path (same maths, slower).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_D64 1
/* 16 bf16 -> 16 fp32 (exact: a bf16 is the top half of an fp32) */
static inline __m512 bf16x16(const uint16_t *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One (segment, kv head) task for head_dim 64, AVX-512. Same maths as the generic loop below. */
static void task_d64(const float *q, const uint16_t *kb, const uint16_t *vb, int64_t start,
                     int64_t off, int64_t cnt, int h, int Hkv, int G, float scale, float *out,
                     float *s)
{
    const int64_t n = start + cnt;
    for (int64_t j = 0; j < n; ++j) {
        const uint16_t *kr = kb + (size_t)j * 64;
        __m512 k0 = bf16x16(kr), k1 = bf16x16(kr + 16), k2 = bf16x16(kr + 32), k3 = bf16x16(kr + 48);
        for (int64_t t = (j > start ? j - start : 0); t < cnt; ++t) {
            for (int g = 0; g < G; ++g) {
                const float *qg = q + (((size_t)(off + t) * Hkv + h) * G + g) * 64;
                __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qg), k0);
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 16), k1, acc);
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 32), k2, acc);
                acc = _mm512_fmadd_ps(_mm512_loadu_ps(qg + 48), k3, acc);
                s[(size_t)(t * G + g) * n + j] = _mm512_reduce_add_ps(acc) * scale;
            }
        }
    }
    for (int64_t t = 0; t < cnt; ++t) {
        int64_t m_ = start + t + 1;
        for (int g = 0; g < G; ++g) {
            float *sg = s + (size_t)(t * G + g) * n, mx = -INFINITY, sum = 0.f;
            for (int64_t j = 0; j < m_; ++j) mx = sg[j] > mx ? sg[j] : mx;
            for (int64_t j = 0; j < m_; ++j) { sg[j] = expf(sg[j] - mx); sum += sg[j]; }
            float inv = 1.f / sum;
            for (int64_t j = 0; j < m_; ++j) sg[j] *= inv;
            memset(out + (((size_t)(off + t) * Hkv + h) * G + g) * 64, 0, sizeof(float) * 64);
        }
    }
    for (int64_t j = 0; j < n; ++j) {
        const uint16_t *vr = vb + (size_t)j * 64;
        __m512 v0 = bf16x16(vr), v1 = bf16x16(vr + 16), v2 = bf16x16(vr + 32), v3 = bf16x16(vr + 48);
        for (int64_t t = (j > start ? j - start : 0); t < cnt; ++t) {
            for (int g = 0; g < G; ++g) {
                __m512 p = _mm512_set1_ps(s[(size_t)(t * G + g) * n + j]);
                float *og = out + (((size_t)(off + t) * Hkv + h) * G + g) * 64;
                _mm512_storeu_ps(og, _mm512_fmadd_ps(p, v0, _mm512_loadu_ps(og)));
                _mm512_storeu_ps(og + 16, _mm512_fmadd_ps(p, v1, _mm512_loadu_ps(og + 16)));
                _mm512_storeu_ps(og + 32, _mm512_fmadd_ps(p, v2, _mm512_loadu_ps(og + 32)));
                _mm512_storeu_ps(og + 48, _mm512_fmadd_ps(p, v3, _mm512_loadu_ps(og + 48)));
            }
        }
    }
}
#endif

/* Causal attention for "segments": runs of consecutive query tokens of one cache row.
   q     [N, Hkv, G, D] fp32, RoPE'd (G query heads share one kv head)
   k, v  [Bc, Hkv, L, D] bf16: one layer of the static cache, already holding the new tokens
   segs  [S, 4] int64: (cache row, position of the first query, offset in q, number of queries)
   out   [N, Hkv, G, D] fp32
   Query t of a segment sits at position start + t and attends keys 0 .. start + t of its row.
   One (segment, kv head) per task: each key row is read once for all its G x cnt queries. */
void seg_attention(const float *q, const uint16_t *k, const uint16_t *v, const int64_t *segs,
                   int S, float *out, int Hkv, int G, int D, int L, float scale)
{
    #pragma omp parallel
    {
        float *row = (float *)malloc(sizeof(float) * (size_t)D);
        #pragma omp for schedule(dynamic, 2)
        for (int task = 0; task < S * Hkv; ++task) {
            int sidx = task / Hkv, h = task % Hkv;
            int64_t r = segs[4 * sidx], start = segs[4 * sidx + 1];
            int64_t off = segs[4 * sidx + 2], cnt = segs[4 * sidx + 3];
            int64_t n = start + cnt;                         /* keys 0 .. n-1 */
            const uint16_t *kb = k + ((size_t)r * Hkv + h) * L * D;
            const uint16_t *vb = v + ((size_t)r * Hkv + h) * L * D;
            float *s = (float *)malloc(sizeof(float) * (size_t)(cnt * G) * n);
#ifdef HAVE_D64
            if (D == 64) {
                task_d64(q, kb, vb, start, off, cnt, h, Hkv, G, scale, out, s);
                free(s);
                continue;
            }
#endif
            for (int64_t j = 0; j < n; ++j) {
                const uint16_t *kr = kb + (size_t)j * D;
                for (int d = 0; d < D; ++d) row[d] = bf16_to_f32(kr[d]);
                for (int64_t t = (j > start ? j - start : 0); t < cnt; ++t) {
                    for (int g = 0; g < G; ++g) {
                        const float *qg = q + (((size_t)(off + t) * Hkv + h) * G + g) * D;
                        float acc = 0.f;
                        for (int d = 0; d < D; ++d) acc += qg[d] * row[d];
                        s[(size_t)(t * G + g) * n + j] = acc * scale;
                    }
                }
            }
            for (int64_t t = 0; t < cnt; ++t) {
                int64_t m_ = start + t + 1;                  /* visible keys for this query */
                for (int g = 0; g < G; ++g) {
                    float *sg = s + (size_t)(t * G + g) * n, mx = -INFINITY, sum = 0.f;
                    for (int64_t j = 0; j < m_; ++j) mx = sg[j] > mx ? sg[j] : mx;
                    for (int64_t j = 0; j < m_; ++j) { sg[j] = expf(sg[j] - mx); sum += sg[j]; }
                    float inv = 1.f / sum;
                    for (int64_t j = 0; j < m_; ++j) sg[j] *= inv;
                    memset(out + (((size_t)(off + t) * Hkv + h) * G + g) * D, 0, sizeof(float) * D);
                }
            }
            for (int64_t j = 0; j < n; ++j) {
                const uint16_t *vr = vb + (size_t)j * D;
                for (int d = 0; d < D; ++d) row[d] = bf16_to_f32(vr[d]);
                for (int64_t t = (j > start ? j - start : 0); t < cnt; ++t) {
                    for (int g = 0; g < G; ++g) {
                        float p = s[(size_t)(t * G + g) * n + j];
                        float *og = out + (((size_t)(off + t) * Hkv + h) * G + g) * D;
                        for (int d = 0; d < D; ++d) og[d] += p * row[d];
                    }
                }
            }
            free(s);
        }
        free(row);
    }
}
"""

_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC"]
_lib = None
_tried = False


def _cache_dir() -> Path:
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("tinychat"))
    except Exception:  # pragma: no cover - platformdirs is a runtime dependency
        return Path(tempfile.gettempdir()) / "tinychat-cache"


def _machine_key() -> str:
    """-march=native code must not be reused on another CPU: key the build by its flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        flags = platform.processor()
    return hashlib.sha256((_SOURCE + " ".join(_FLAGS) + flags).encode()).hexdigest()[:16]


def _load():
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("TINYCHAT_NO_FASTATTN"):
        return None
    out = _cache_dir() / f"fastattn-{_machine_key()}.so"
    try:
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out.parent) as tmp:  # same fs: atomic rename
                src, so = Path(tmp) / "fastattn.c", Path(tmp) / "fastattn.so"
                src.write_text(_SOURCE)
                cc = os.environ.get("CC", "cc")
                subprocess.run([cc, *_FLAGS, str(src), "-o", str(so), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(so, out)
        lib = ctypes.CDLL(str(out))
        lib.seg_attention.restype = None
        lib.seg_attention.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_void_p]
                                      + [ctypes.c_int] * 4 + [ctypes.c_float])
        _lib = lib
    except (OSError, subprocess.SubprocessError):
        _lib = None
    return _lib


def available() -> bool:
    return _load() is not None


def seg_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segs: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """q [N, Hkv, G, D] fp32; k, v [Bc, Hkv, L, D] bf16 contiguous (one cache layer, new keys
    already written); segs [S, 4] int64 rows (cache row, start position, offset in q, count),
    covering q. Returns [N, Hkv, G, D] fp32."""
    lib = _load()
    if lib is None:
        raise RuntimeError("fast attention kernel unavailable (no C compiler?)")
    N, Hkv, G, D = q.shape
    Bc, _, L, _ = k.shape
    assert k.dtype == v.dtype == torch.bfloat16 and k.is_contiguous() and v.is_contiguous()
    assert k.shape == v.shape and k.shape[1] == Hkv and k.shape[3] == D
    assert segs.dtype == torch.int64 and segs.is_contiguous() and segs.shape[1] == 4
    q = q.float().contiguous()
    out = torch.empty_like(q)
    lib.seg_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), segs.data_ptr(), segs.shape[0],
                      out.data_ptr(), Hkv, G, D, L, float(scale))
    return out


def check_segments(segs: torch.Tensor, n_queries: int, cache_rows: int, cache_len: int) -> None:
    """Validate a segment table once per step (the kernel trusts it: no bounds checks in C)."""
    row, start, off, cnt = segs.unbind(1)
    if len(segs) and (int(row.min()) < 0 or int(row.max()) >= cache_rows or int(cnt.min()) < 1
                      or int(start.min()) < 0 or int((start + cnt).max()) > cache_len
                      or int(off.min()) < 0 or int((off + cnt).max()) > n_queries):
        raise ValueError("segment table out of range")
