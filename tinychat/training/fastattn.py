"""Ragged causal attention over an int8 KV cache, as a small C kernel compiled on first use.

Why: in batched decoding every row attends to its own keys 0..len-1, but PyTorch ops must pad to the
longest row and run 3x64 @ 64xS batched GEMMs that oneDNN handles badly (copies + per-matrix
overhead): ~8 ms per layer for 64 rows x 512 keys, i.e. 250 ms per step. The kernel reads each row's
keys and values once, up to that row's own length. On this 2-core VM attention is bound by memory
bandwidth (~10 GB/s) as much as by arithmetic, so the cache is int8 with one fp32 scale per
(row, head, position) vector (absmax / 127: half the bytes of bf16, error < 0.4 % of the vector's
largest entry), and keys are stored in blocks of 16 positions transposed to [dim, 16] so that one
AVX-512 FMA scores 16 keys without horizontal sums. Measured, 96 rows x 256 keys, one thread:
bf16 row-major 26.6 ns per (position, kv head), int8 blocked 19.5 ns (16 ns in cache).

It takes "segments" (several consecutive query tokens of one row), so prompt tokens ride along in
the same step as the one-token decode rows and share their row's key reads.

It is plain C + OpenMP (AVX-512 intrinsics where the compiler targets them), built with the system C
compiler into the user cache dir (tinychat/nativebuild.py) and loaded with ctypes (no torch headers, no ninja). The library
links libgomp.so.1, which resolves to the copy torch already loaded, so both share one OpenMP
thread pool. Without a compiler ``available()`` is False and the model uses its PyTorch path.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

from ..nativebuild import BuildError, build_shared

import torch

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define BLK 16
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* Causal attention over an int8 KV cache, for "segments" of consecutive query tokens of one row.
   q     [N, Hkv, G, D] fp32, RoPE'd; G query heads share one kv head
   k     [Bc, Hkv, L/16, D, 16] int8: keys in blocks of 16 positions, transposed so that one
         vector op covers 16 keys (no horizontal sums); ks [Bc, Hkv, L] fp32 scales
   v     [Bc, Hkv, L, D] int8 (row-major); vs [Bc, Hkv, L] fp32 scales
   segs  [S, 4] int64: (cache row, position of the first query, offset in q, number of queries)
   out   [N, Hkv, G, D] fp32
   Query t of a segment sits at position start + t and attends keys 0 .. start + t of its row. */
void seg_attention_i8(const float *restrict q, const int8_t *restrict k, const float *restrict ks,
                      const int8_t *restrict v, const float *restrict vs, const int64_t *restrict segs,
                      int S, float *restrict out, int Hkv, int G, int D, int L, float scale)
{
    #pragma omp parallel
    {
        float *kf = (float *)malloc(sizeof(float) * (size_t)D * BLK);
        float *vf = (float *)malloc(sizeof(float) * (size_t)D);
        size_t cap = 0;
        float *s = NULL;
        #pragma omp for schedule(dynamic, 2)
        for (int task = 0; task < S * Hkv; ++task) {
            const int sidx = task / Hkv, h = task % Hkv;
            const int64_t r = segs[4 * sidx], start = segs[4 * sidx + 1];
            const int64_t off = segs[4 * sidx + 2], cnt = segs[4 * sidx + 3];
            const int64_t n = start + cnt, nb = (n + BLK - 1) / BLK, np = nb * BLK;
            const size_t head = (size_t)r * Hkv + h;
            const int8_t *kb = k + head * (size_t)L * D;
            const int8_t *vb = v + head * (size_t)L * D;
            const float *ksb = ks + head * (size_t)L, *vsb = vs + head * (size_t)L;
            size_t need = (size_t)cnt * G * np;
            if (need > cap) { free(s); cap = need; s = (float *)malloc(sizeof(float) * cap); }
            /* scores s[(t*G+g)*np + j] */
            for (int64_t b = 0; b < nb; ++b) {
                const int8_t *blk = kb + (size_t)b * D * BLK;
                const int64_t j0 = b * BLK;
#if defined(__AVX512F__)
                for (int d = 0; d < D; ++d)      /* 16 int8 -> 16 fp32, one key dim for 16 keys */
                    _mm512_storeu_ps(kf + d * BLK, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                        _mm_loadu_si128((const __m128i *)(blk + d * BLK)))));
                const __m512 sc = _mm512_mul_ps(_mm512_loadu_ps(ksb + j0), _mm512_set1_ps(scale));
                for (int64_t t = (j0 > start ? j0 - start : 0); t < cnt; ++t) {
                    const float *qt = q + ((size_t)(off + t) * Hkv + h) * G * D;
                    float *st = s + (size_t)t * G * np + j0;
                    int g = 0;
                    for (; g + 3 <= G; g += 3) {   /* 3 query heads per pass: 3 accumulators */
                        const float *q0 = qt + g * D, *q1 = q0 + D, *q2 = q1 + D;
                        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0;
                        for (int d = 0; d < D; ++d) {
                            const __m512 kd = _mm512_loadu_ps(kf + d * BLK);
                            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), kd, a0);
                            a1 = _mm512_fmadd_ps(_mm512_set1_ps(q1[d]), kd, a1);
                            a2 = _mm512_fmadd_ps(_mm512_set1_ps(q2[d]), kd, a2);
                        }
                        _mm512_storeu_ps(st + (size_t)g * np, _mm512_mul_ps(a0, sc));
                        _mm512_storeu_ps(st + (size_t)(g + 1) * np, _mm512_mul_ps(a1, sc));
                        _mm512_storeu_ps(st + (size_t)(g + 2) * np, _mm512_mul_ps(a2, sc));
                    }
                    for (; g < G; ++g) {
                        const float *q0 = qt + g * D;
                        __m512 a0 = _mm512_setzero_ps();
                        for (int d = 0; d < D; ++d)
                            a0 = _mm512_fmadd_ps(_mm512_set1_ps(q0[d]), _mm512_loadu_ps(kf + d * BLK), a0);
                        _mm512_storeu_ps(st + (size_t)g * np, _mm512_mul_ps(a0, sc));
                    }
                }
#else
                for (int i = 0; i < D * BLK; ++i) kf[i] = (float)blk[i];
                float sc[BLK];
                for (int l = 0; l < BLK; ++l) sc[l] = ksb[j0 + l] * scale;
                for (int64_t t = (j0 > start ? j0 - start : 0); t < cnt; ++t) {
                    for (int g = 0; g < G; ++g) {
                        const float *qg = q + (((size_t)(off + t) * Hkv + h) * G + g) * D;
                        float acc[BLK] = {0};
                        for (int d = 0; d < D; ++d)
                            for (int l = 0; l < BLK; ++l) acc[l] += qg[d] * kf[(size_t)d * BLK + l];
                        float *sr = s + (size_t)(t * G + g) * np + j0;
                        for (int l = 0; l < BLK; ++l) sr[l] = acc[l] * sc[l];
                    }
                }
#endif
            }
            for (int64_t t = 0; t < cnt; ++t) {
                const int64_t m_ = start + t + 1;          /* visible keys */
                for (int g = 0; g < G; ++g) {
                    float *sg = s + (size_t)(t * G + g) * np, mx = sg[0], sum = 0.f;
                    for (int64_t j = 0; j < m_; ++j) mx = sg[j] > mx ? sg[j] : mx;
                    for (int64_t j = 0; j < m_; ++j) { sg[j] = expf(sg[j] - mx); sum += sg[j]; }
                    const float inv = 1.f / sum;
                    for (int64_t j = 0; j < m_; ++j) sg[j] *= inv;
                    memset(out + (((size_t)(off + t) * Hkv + h) * G + g) * D, 0, sizeof(float) * D);
                }
            }
#if defined(__AVX512F__)
            if (cnt == 1 && D == 64 && G == 3) {   /* decode, SmolLM2 shape: 12 accumulators */
                const float *p0 = s, *p1 = s + np, *p2 = s + 2 * np;
                __m512 o[12];
                for (int i = 0; i < 12; ++i) o[i] = _mm512_setzero_ps();
                for (int64_t j = 0; j < n; ++j) {
                    const int8_t *vr = vb + (size_t)j * 64;
                    const float sv = vsb[j];
                    const __m512 w0 = _mm512_set1_ps(p0[j] * sv), w1 = _mm512_set1_ps(p1[j] * sv),
                                 w2 = _mm512_set1_ps(p2[j] * sv);
                    for (int c = 0; c < 4; ++c) {
                        const __m512 vv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                            _mm_loadu_si128((const __m128i *)(vr + 16 * c))));
                        o[c] = _mm512_fmadd_ps(w0, vv, o[c]);
                        o[4 + c] = _mm512_fmadd_ps(w1, vv, o[4 + c]);
                        o[8 + c] = _mm512_fmadd_ps(w2, vv, o[8 + c]);
                    }
                }
                float *og = out + ((size_t)off * Hkv + h) * 3 * 64;
                for (int i = 0; i < 12; ++i) _mm512_storeu_ps(og + 16 * i, o[i]);
                continue;
            }
#endif
            for (int64_t j = 0; j < n; ++j) {
                const int8_t *vr = vb + (size_t)j * D;
                const float sv = vsb[j];
#if defined(__AVX512F__)
                if (D % 16 == 0) {
                    const __m512 svv = _mm512_set1_ps(sv);
                    for (int d = 0; d < D; d += 16)
                        _mm512_storeu_ps(vf + d, _mm512_mul_ps(svv, _mm512_cvtepi32_ps(
                            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(vr + d))))));
                    for (int64_t t = (j > start ? j - start : 0); t < cnt; ++t) {
                        for (int g = 0; g < G; ++g) {
                            const __m512 p = _mm512_set1_ps(s[(size_t)(t * G + g) * np + j]);
                            float *og = out + (((size_t)(off + t) * Hkv + h) * G + g) * D;
                            for (int d = 0; d < D; d += 16)
                                _mm512_storeu_ps(og + d, _mm512_fmadd_ps(p, _mm512_loadu_ps(vf + d),
                                                                         _mm512_loadu_ps(og + d)));
                        }
                    }
                    continue;
                }
#endif
                for (int d = 0; d < D; ++d) vf[d] = (float)vr[d] * sv;
                for (int64_t t = (j > start ? j - start : 0); t < cnt; ++t) {
                    for (int g = 0; g < G; ++g) {
                        const float p = s[(size_t)(t * G + g) * np + j];
                        float *og = out + (((size_t)(off + t) * Hkv + h) * G + g) * D;
                        for (int d = 0; d < D; ++d) og[d] += p * vf[d];
                    }
                }
            }
        }
        free(s);
        free(kf);
        free(vf);
    }
}

/* Quantize and store new keys/values (one layer). k, v [N, Hkv, D] fp32; rows, pos [N];
   blocked keys kc [Bc, Hkv, L/16, D, 16], vc [Bc, Hkv, L, D] int8; scales [Bc, Hkv, L] fp32.
   Symmetric per-vector int8: scale = absmax / 127, q = round-half-even(x / scale). */
void kv_write_i8(const float *restrict k, const float *restrict v, const int64_t *restrict rows,
                 const int64_t *restrict pos, int N, int Hkv, int D, int L, int8_t *restrict kc,
                 float *restrict ksc, int8_t *restrict vc, float *restrict vsc)
{
    for (int i = 0; i < N * Hkv; ++i) {
        const int64_t p = pos[i / Hkv];
        const size_t head = (size_t)rows[i / Hkv] * Hkv + i % Hkv;
        for (int which = 0; which < 2; ++which) {
            const float *x = (which ? v : k) + (size_t)i * D;
            float amax = 0.f;
            for (int d = 0; d < D; ++d) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
            float scale = amax / 127.f;
            if (scale < 1e-12f) scale = 1e-12f;
            if (which) {
                int8_t *dst = vc + (head * L + p) * D;
                for (int d = 0; d < D; ++d) dst[d] = (int8_t)nearbyintf(x[d] / scale);
                vsc[head * L + p] = scale;
            } else {
                int8_t *dst = kc + ((head * (L / BLK) + p / BLK) * D) * BLK + p % BLK;
                for (int d = 0; d < D; ++d) dst[(size_t)d * BLK] = (int8_t)nearbyintf(x[d] / scale);
                ksc[head * L + p] = scale;
            }
        }
    }
}
"""

# -ffast-math's parts, not the flag itself: with -ffast-math GCC links crtfastmath.o even into a shared object,
# which turns on flush-to-zero / denormals-are-zero for the WHOLE process when the library loads.
_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
          "-freciprocal-math", "-ffinite-math-only", "-fopenmp"]
_lib = None
_tried = False


def _load():
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if os.environ.get("TINYCHAT_NO_FASTATTN"):
        return None
    try:
        out = build_shared(_SOURCE, "fastattn", [_FLAGS], key_extra=(" ".join(_FLAGS),), timeout=120)
        lib = ctypes.CDLL(str(out))
        lib.kv_write_i8.restype = None
        lib.kv_write_i8.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 4
        lib.seg_attention_i8.restype = None
        lib.seg_attention_i8.argtypes = ([ctypes.c_void_p] * 6 + [ctypes.c_int, ctypes.c_void_p]
                                         + [ctypes.c_int] * 4 + [ctypes.c_float])
        _lib = lib
    except (OSError, BuildError, subprocess.SubprocessError):
        _lib = None
    return _lib


def available() -> bool:
    return _load() is not None


BLOCK = 16   # positions per transposed key block (the kernel's BLK)


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row. x [M, D] float -> (int8 [M, D], fp32 scale [M]); x ~ q * scale."""
    x = x.float()
    scale = x.abs().amax(-1).clamp_min(1e-12) / 127.0
    return (x / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8), scale


def seg_attention(q: torch.Tensor, k: torch.Tensor, ks: torch.Tensor, v: torch.Tensor,
                  vs: torch.Tensor, segs: torch.Tensor, scale: float) -> torch.Tensor:
    """q [N, Hkv, G, D] fp32; one cache layer: k [Bc, Hkv, L/16, D, 16] int8 (blocked keys),
    ks [Bc, Hkv, L] fp32, v [Bc, Hkv, L, D] int8, vs [Bc, Hkv, L] fp32, new keys already written;
    segs [S, 4] int64 (cache row, start position, offset in q, count), covering q.
    Returns [N, Hkv, G, D] fp32."""
    lib = _load()
    if lib is None:
        raise RuntimeError("fast attention kernel unavailable (no C compiler?)")
    N, Hkv, G, D = q.shape
    Bc, _, L, _ = v.shape
    assert k.dtype == v.dtype == torch.int8 and ks.dtype == vs.dtype == torch.float32
    assert k.shape == (Bc, Hkv, L // BLOCK, D, BLOCK) and L % BLOCK == 0
    assert ks.shape == vs.shape == (Bc, Hkv, L)
    assert all(t.is_contiguous() for t in (k, ks, v, vs))
    assert segs.dtype == torch.int64 and segs.is_contiguous() and segs.shape[1] == 4
    q = q.float().contiguous()
    out = torch.empty_like(q)
    lib.seg_attention_i8(q.data_ptr(), k.data_ptr(), ks.data_ptr(), v.data_ptr(), vs.data_ptr(),
                         segs.data_ptr(), segs.shape[0], out.data_ptr(), Hkv, G, D, L, float(scale))
    return out


def kv_write(k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor,
             kc: torch.Tensor, ks: torch.Tensor, vc: torch.Tensor, vs: torch.Tensor) -> None:
    """Quantize and store k, v [N, Hkv, D] at (rows[n], pos[n]) of one cache layer (the layout of
    ``seg_attention``). Same numbers as ``quantize`` + indexed copies, in one pass."""
    lib = _load()
    N, Hkv, D = k.shape
    L = vc.shape[2]
    k, v = k.float().contiguous(), v.float().contiguous()
    rows, pos = rows.contiguous(), pos.contiguous()
    assert rows.dtype == pos.dtype == torch.int64 and rows.shape == pos.shape == (N,)
    assert all(t.is_contiguous() for t in (kc, ks, vc, vs))
    assert int(rows.max()) < vc.shape[0] and int(pos.max()) < L and int(pos.min()) >= 0
    lib.kv_write_i8(k.data_ptr(), v.data_ptr(), rows.data_ptr(), pos.data_ptr(), N, Hkv, D, L,
                    kc.data_ptr(), ks.data_ptr(), vc.data_ptr(), vs.data_ptr())


def check_segments(segs: torch.Tensor, n_queries: int, cache_rows: int, cache_len: int) -> None:
    """Validate a segment table once per step (the kernel trusts it: no bounds checks in C)."""
    row, start, off, cnt = segs.unbind(1)
    if len(segs) and (int(row.min()) < 0 or int(row.max()) >= cache_rows or int(cnt.min()) < 1
                      or int(start.min()) < 0 or int((start + cnt).max()) > cache_len
                      or int(off.min()) < 0 or int((off + cnt).max()) > n_queries):
        raise ValueError("segment table out of range")
