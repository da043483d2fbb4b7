/* tinychat's attention of one q head (or one K/V group's heads) against its keys, the kernels native.c's decode
   (tc_attn) and prefill (tc_prefill_attn) attention share; included by native.c.

   attend_one: one q head against keys 0..L of K/V and the W ring slots of Kl/Vl that hold one of the last W
   positions, by the level native_simd.h decides: 16 lanes (TC_AVX512: attend_head16, and attend_grp16 for the 2-4
   heads of a group in one pass over its keys), 8 lanes (TC_AVX2, laptops: attend_grp8, 1-3 heads of a group in one
   pass, scores 4 keys at a time), or plain C (attend_head, any D). Scores, softmax (tc_exp16 / tc_exp8: the Cephes
   expf polynomial), then o = p @ [V | Vl] with the 1/sum applied once. Each level's order of products and sums is fixed,
   so a level gives the same bits whatever the threads. */
#ifndef TC_NATIVE_ATTN_H
#define TC_NATIVE_ATTN_H
#include <math.h>
#include <stdint.h>
#include "native_simd.h"

#if defined(TC_AVX512)
/* The scores of 16 keys (rows of D = 16 * nv floats, D apart) against q (nv registers): lane j is tc_dot16(qv, nv,
   K + j * D) to the bit: the same products and fmadd chain per key, then one reduction tree for all 16 that adds
   the same pairs as _mm512_reduce_add_ps (GCC's: lanes l + l+8, then l + l+4, l + l+2, l + l+1; IEEE addition
   commutes), ~3 instructions a key instead of ~8. */
static inline __m512 dots16x16(const __m512 *qv, int nv, const float *K, int64_t D) {
    __m512 a[16], t[8], u[4], w[2];
    for (int k = 0; k < 16; k++) {
        const float *kr = K + k * D;
        a[k] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
        for (int v = 1; v < nv; v++) a[k] = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(kr + 16 * v), a[k]);
    }
    for (int i = 0; i < 8; i++)          /* 256-bit halves: key 2i's l + l+8 in lanes 0-7, key 2i+1's in 8-15 */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)          /* 128-bit halves: keys 4i .. 4i+3, l + l+4, one per 128-bit block */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)          /* l + l+2: block b holds key 8i+b's two, then key 8i+4+b's */
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),     /* l + l+1: lane 4b + c */
                             _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));    /* is key b + 4c */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

/* s[j] = exp(s[j] - m) for the n scores (16 at a time, the rest masked); returns 1 / their sum. */
static inline float softmax16(float *s, int64_t n, float m) {
    __m512 mv = _mm512_set1_ps(m), zv = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = tc_exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv));
        _mm512_storeu_ps(s + j, e);
        zv = _mm512_add_ps(zv, e);
    }
    if (j < n) {
        __mmask16 t = (__mmask16)((1u << (n - j)) - 1u);
        __m512 e = tc_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(t, s + j), mv));
        e = _mm512_maskz_mov_ps(t, e);
        _mm512_mask_storeu_ps(s + j, t, e);
        zv = _mm512_add_ps(zv, e);
    }
    return 1.0f / tc_hsum16(zv);
}

/* acc += p * v for v of 16 * nv floats. */
static inline void axpy16(__m512 *acc, int64_t nv, float p, const float *v) {
    __m512 pv = _mm512_set1_ps(p);
    for (int64_t i = 0; i < nv; i++) acc[i] = _mm512_fmadd_ps(pv, _mm512_loadu_ps(v + 16 * i), acc[i]);
}

/* One q head (D a multiple of 16, at most 256) against keys 0..L of K/V and the W ring slots of Kl/Vl that hold
   one of the last W positions: scores into s (L + 1 + W), softmax, o = p @ [V | Vl]. q stays in registers; the
   exponentials and their sum run 16 at a time; the 1/sum is applied once to o. */
static void attend_head16(const float *q, const float *K, const float *V, const float *Kl, const float *Vl,
                          const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o) {
    int64_t nv = D / 16, n = L + 1 + W;
    __m512 qv[16], acc[16];
    for (int64_t v = 0; v < nv; v++) qv[v] = _mm512_loadu_ps(q + 16 * v);
    float m = -INFINITY;
    for (int64_t j = 0; j <= L; j++) {
        float x = tc_dot16(qv, nv, K + j * D);
        s[j] = x;
        m = x > m ? x : m;
    }
    for (int64_t j = 0; j < W; j++) {
        int64_t p = lpos[j];
        float x = (p >= 0 && L - p < W) ? tc_dot16(qv, nv, Kl + j * D) : -INFINITY;
        s[L + 1 + j] = x;
        m = x > m ? x : m;
    }
    float rz = softmax16(s, n, m);
    for (int64_t v = 0; v < nv; v++) acc[v] = _mm512_setzero_ps();
    for (int64_t i = 0; i <= L; i++) axpy16(acc, nv, s[i], V + i * D);
    for (int64_t i = 0; i < W; i++)
        if (s[L + 1 + i] != 0.f) axpy16(acc, nv, s[L + 1 + i], Vl + i * D);
    __m512 rv = _mm512_set1_ps(rz);
    for (int64_t v = 0; v < nv; v++) _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(acc[v], rv));
}

/* attend_head16 for the nh heads of one K/V group at once (head h's query at q + h * qs, output at o + h * os,
   scores at s + h * (L + 1 + W)): each key and value row is loaded once for the nh heads, and every head's
   arithmetic is attend_head16's (the same products, sums and order: the same bits). Inlined with constant nh and
   nv, so the heads' queries and accumulators stay in registers (nh * nv <= 16). */
static inline __attribute__((always_inline)) void attend_grp16(const int nh, const int nv, const float *q, int64_t qs,
                                                               const float *K, const float *V, const float *Kl,
                                                               const float *Vl, const int64_t *lpos, int64_t L,
                                                               int64_t W, float *s, float *o, int64_t os) {
    const int64_t D = 16 * nv, n = L + 1 + W;
    __m512 qv[16], acc[16];
    float m[4], rz[4];
    for (int h = 0; h < nh; h++) {
        for (int v = 0; v < nv; v++) qv[h * nv + v] = _mm512_loadu_ps(q + h * qs + 16 * v);
        m[h] = -INFINITY;
    }
    int64_t j = 0;
    for (; j + 16 <= L + 1; j += 16)                  /* 16 keys at a time: dot16's bits, one reduction tree */
        for (int h = 0; h < nh; h++) {
            __m512 x = dots16x16(qv + h * nv, nv, K + j * D, D);
            _mm512_storeu_ps(s + h * n + j, x);
            float mx = _mm512_reduce_max_ps(x);
            m[h] = mx > m[h] ? mx : m[h];
        }
    for (; j <= L; j++)
        for (int h = 0; h < nh; h++) {
            float x = tc_dot16(qv + h * nv, nv, K + j * D);
            s[h * n + j] = x;
            m[h] = x > m[h] ? x : m[h];
        }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i zero = _mm512_setzero_si512(), lw = _mm512_set1_epi64(L - W);
    for (j = 0; j + 16 <= W; j += 16) {               /* the band's slots, 16 at a time; no key: -inf */
        __m512i p0 = _mm512_loadu_si512((const void *)(lpos + j)), p1 = _mm512_loadu_si512((const void *)(lpos + j + 8));
        __mmask8 k0 = _mm512_cmpge_epi64_mask(p0, zero) & _mm512_cmpgt_epi64_mask(p0, lw);     /* L - p < W */
        __mmask8 k1 = _mm512_cmpge_epi64_mask(p1, zero) & _mm512_cmpgt_epi64_mask(p1, lw);
        __mmask16 ok = (__mmask16)(k0 | (k1 << 8));
        for (int h = 0; h < nh; h++) {
            __m512 x = ok ? _mm512_mask_blend_ps(ok, ninf, dots16x16(qv + h * nv, nv, Kl + j * D, D)) : ninf;
            _mm512_storeu_ps(s + h * n + L + 1 + j, x);
            float mx = _mm512_reduce_max_ps(x);
            m[h] = mx > m[h] ? mx : m[h];
        }
    }
    for (; j < W; j++) {
        int64_t p = lpos[j];
        int ok = p >= 0 && L - p < W;
        for (int h = 0; h < nh; h++) {
            float x = ok ? tc_dot16(qv + h * nv, nv, Kl + j * D) : -INFINITY;
            s[h * n + L + 1 + j] = x;
            m[h] = x > m[h] ? x : m[h];
        }
    }
    for (int h = 0; h < nh; h++) rz[h] = softmax16(s + h * n, n, m[h]);
    for (int v = 0; v < nh * nv; v++) acc[v] = _mm512_setzero_ps();
    for (int64_t i = 0; i <= L; i++)
        for (int h = 0; h < nh; h++) axpy16(acc + h * nv, nv, s[h * n + i], V + i * D);
    for (int64_t i = 0; i < W; i++)
        for (int h = 0; h < nh; h++)
            if (s[h * n + L + 1 + i] != 0.f) axpy16(acc + h * nv, nv, s[h * n + L + 1 + i], Vl + i * D);
    for (int h = 0; h < nh; h++) {
        __m512 rv = _mm512_set1_ps(rz[h]);
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(o + h * os + 16 * v, _mm512_mul_ps(acc[h * nv + v], rv));
    }
}

/* The group sizes with a specialized pass (D = 64: nv = 4); 1 elsewhere. */
static int64_t grp16_size(int64_t rep, int64_t D) {
    if (D != 64) return 1;
    return rep % 4 == 0 ? 4 : rep % 3 == 0 ? 3 : rep % 2 == 0 ? 2 : 1;
}

static void attend_heads16(int64_t nh, const float *q, int64_t qs, const float *K, const float *V, const float *Kl,
                           const float *Vl, const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o,
                           int64_t os) {
    if (nh == 4) attend_grp16(4, 4, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    else if (nh == 3) attend_grp16(3, 4, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    else if (nh == 2) attend_grp16(2, 4, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    else
        for (int64_t h = 0; h < nh; h++)
            attend_head16(q + h * qs, K, V, Kl, Vl, lpos, L, W, D, s + h * (L + 1 + W), o + h * os);
}
#endif

#if defined(TC_AVX2) && !defined(TC_AVX512)
/* s[j] = exp(s[j] - m) for the n scores (8 at a time, the rest by expf); returns 1 / their sum. */
static inline float softmax8(float *s, int64_t n, float m) {
    __m256 mv = _mm256_set1_ps(m), zv = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = tc_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        zv = _mm256_add_ps(zv, e);
    }
    float z = tc_hsum8(zv);
    for (; j < n; j++) {
        float e = expf(s[j] - m);
        s[j] = e;
        z += e;
    }
    return 1.0f / z;
}

/* The sums of four 8-lane registers, one a lane: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) each. */
static inline __m128 tree4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* out[h]: the scores of keys kr[0..3] (rows of D = 8 * nv floats) against the nh queries q + h * qs: per head and
   key one mul-fmadd chain over D in 8 lanes, then tree4. Each key row is loaded once for the nh heads (the queries
   are read from L1 by the fmadds). */
static inline __attribute__((always_inline)) void dots8x4(const int nh, const int nv, const float *q, int64_t qs,
                                                          const float *const kr[4], __m128 *out) {
    __m256 a[3][4];
    for (int k = 0; k < 4; k++) {
        __m256 kv = _mm256_loadu_ps(kr[k]);
        for (int h = 0; h < nh; h++) a[h][k] = _mm256_mul_ps(_mm256_loadu_ps(q + h * qs), kv);
    }
    for (int v = 1; v < nv; v++)
        for (int k = 0; k < 4; k++) {
            __m256 kv = _mm256_loadu_ps(kr[k] + 8 * v);
            for (int h = 0; h < nh; h++)
                a[h][k] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * qs + 8 * v), kv, a[h][k]);
        }
    for (int h = 0; h < nh; h++) out[h] = tree4(a[h][0], a[h][1], a[h][2], a[h][3]);
}

/* The attention at AVX2 level, decode's and prefill's: the nh (1-3) q heads of one K/V group for one query, in one
   pass over the keys the query sees (keys 0..L of K/V, the W ring entries of Kl/Vl holding one of the last W
   positions); head h's query at q + h * qs, output at o + h * os, scores at s + h * (L + 1 + W). Scores 4 keys at a
   time (dots8x4); a run's last 1-3 keys go through the same code with the last key repeated, so a score's bits
   depend only on its query and key, never on the chunk (a prefill split differently gives the same cache). Softmax
   8 lanes at a time (softmax8); o = p @ [V | Vl] in chunks of 4 registers of D, each value row loaded once for the
   heads, the 1 / sum applied once. Inlined with constant nh (and nv for D = 64) so the accumulators stay in
   registers. */
static inline __attribute__((always_inline)) void attend_grp8(const int nh, const int nv, const float *q, int64_t qs,
                                                              const float *K, const float *V, const float *Kl,
                                                              const float *Vl, const int64_t *lpos, int64_t L,
                                                              int64_t W, float *s, float *o, int64_t os) {
    const int64_t D = 8 * nv, n = L + 1 + W;
    const __m128 ninf = _mm_set1_ps(-INFINITY);
    __m128 mx[3], x[3];
    float rz[3];
    for (int h = 0; h < nh; h++) mx[h] = ninf;
    for (int64_t j = 0; j <= L; j += 4) {
        int64_t c = L + 1 - j < 4 ? L + 1 - j : 4;
        const float *kr[4];
        for (int k = 0; k < 4; k++) kr[k] = K + (j + (k < c ? k : c - 1)) * D;
        dots8x4(nh, nv, q, qs, kr, x);
        for (int h = 0; h < nh; h++) {
            if (c == 4) _mm_storeu_ps(s + h * n + j, x[h]);
            else {
                float t[4];
                _mm_storeu_ps(t, x[h]);
                for (int64_t k = 0; k < c; k++) s[h * n + j + k] = t[k];
            }
            mx[h] = _mm_max_ps(x[h], mx[h]);           /* a repeated key changes no max; NaN scores are skipped */
        }
    }
    for (int64_t j = 0; j < W; j += 4) {               /* the band; a slot without a key of it: -inf */
        int64_t c = W - j < 4 ? W - j : 4;
        const float *kr[4];
        int32_t ok[4], any = 0;
        for (int k = 0; k < 4; k++) {
            int64_t e = j + (k < c ? k : c - 1), p = lpos[e];
            kr[k] = Kl + e * D;
            ok[k] = -(int32_t)(p >= 0 && L - p < W);
            any |= ok[k];
        }
        if (any) dots8x4(nh, nv, q, qs, kr, x);
        const __m128 okm = _mm_castsi128_ps(_mm_setr_epi32(ok[0], ok[1], ok[2], ok[3]));
        for (int h = 0; h < nh; h++) {
            __m128 y = any ? _mm_blendv_ps(ninf, x[h], okm) : ninf;
            float t[4];
            _mm_storeu_ps(t, y);
            for (int64_t k = 0; k < c; k++) s[h * n + L + 1 + j + k] = t[k];
            mx[h] = _mm_max_ps(y, mx[h]);
        }
    }
    for (int h = 0; h < nh; h++) {
        __m128 m = _mm_max_ps(mx[h], _mm_movehl_ps(mx[h], mx[h]));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        rz[h] = softmax8(s + h * n, n, _mm_cvtss_f32(m));
    }
    /* p @ values by blocks of kb keys (16 KiB of value rows): each block's rows are read from memory once and stay
       in L1 for the other chunks of D; the chunks' sums wait in o between blocks (the same additions in the same
       order as one pass per chunk: the same bits) */
    const int64_t kb = 16384 / (4 * D);
    for (int64_t i0 = 0; i0 < n; i0 += kb) {
        const int64_t i1 = i0 + kb < n ? i0 + kb : n;
        for (int v0 = 0; v0 < nv; v0 += 4) {
            const int cv = nv - v0 < 4 ? nv - v0 : 4;
            __m256 acc[3][4];
            for (int h = 0; h < nh; h++)
                for (int v = 0; v < cv; v++)
                    acc[h][v] = i0 ? _mm256_loadu_ps(o + h * os + 8 * (v0 + v)) : _mm256_setzero_ps();
            for (int64_t i = i0; i < i1; i++) {
                const float *vr = i <= L ? V + i * D : Vl + (i - L - 1) * D;
                if (i > L) {                             /* a band slot no head sees (masked): skipped */
                    int any = 0;
                    for (int h = 0; h < nh; h++) any |= s[h * n + i] != 0.f;
                    if (!any) continue;
                }
                __m256 p[3];
                for (int h = 0; h < nh; h++) p[h] = _mm256_broadcast_ss(s + h * n + i);
                for (int v = 0; v < cv; v++) {
                    __m256 vv = _mm256_loadu_ps(vr + 8 * (v0 + v));
                    for (int h = 0; h < nh; h++) acc[h][v] = _mm256_fmadd_ps(p[h], vv, acc[h][v]);
                }
            }
            for (int h = 0; h < nh; h++)
                for (int v = 0; v < cv; v++) _mm256_storeu_ps(o + h * os + 8 * (v0 + v), acc[h][v]);
        }
    }
    for (int h = 0; h < nh; h++) {
        __m256 rv = _mm256_set1_ps(rz[h]);
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(o + h * os + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(o + h * os + 8 * v), rv));
    }
}

/* The heads of a K/V group that share one pass (attend_grp8): up to 3. */
static int64_t grp8_size(int64_t rep) { return rep % 3 == 0 ? 3 : rep % 2 == 0 ? 2 : 1; }

/* attend_grp8 for nh (1-3) heads, D a multiple of 8 up to 256 (D = 64 specialized). */
static void attend_heads8(int64_t nh, const float *q, int64_t qs, const float *K, const float *V, const float *Kl,
                          const float *Vl, const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o,
                          int64_t os) {
    if (D == 64) {
        if (nh == 3) attend_grp8(3, 8, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else if (nh == 2) attend_grp8(2, 8, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else attend_grp8(1, 8, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    } else {
        const int nv = (int)(D / 8);
        if (nh == 3) attend_grp8(3, nv, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else if (nh == 2) attend_grp8(2, nv, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else attend_grp8(1, nv, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    }
}
#endif

/* attend_head16 for any D, in plain C (the compiler's vectors): one q head against keys 0..L of K/V and the W ring
   slots of Kl/Vl holding one of the last W positions; scores into s (L + 1 + W), o = softmax @ [V | Vl]. */
static void attend_head(const float *q, const float *K, const float *V, const float *Kl, const float *Vl,
                        const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o) {
    int64_t n = L + 1 + W;
    float m = -INFINITY;
    for (int64_t j = 0; j <= L; j++) {
        float a = 0.f;
#pragma omp simd reduction(+ : a)
        for (int64_t t = 0; t < D; t++) a += q[t] * K[j * D + t];
        s[j] = a;
        m = a > m ? a : m;
    }
    for (int64_t j = 0; j < W; j++) {
        int64_t p = lpos[j];
        float a = -INFINITY;
        if (p >= 0 && L - p < W) {
            a = 0.f;
#pragma omp simd reduction(+ : a)
            for (int64_t t = 0; t < D; t++) a += q[t] * Kl[j * D + t];
        }
        s[L + 1 + j] = a;
        m = a > m ? a : m;
    }
    double z = 0.0;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(s[j] - m);
        s[j] = e;
        z += e;
    }
    float rz = (float)(1.0 / z);
    for (int64_t t = 0; t < D; t++) o[t] = 0.f;
    for (int64_t j = 0; j <= L; j++) {
        float p = s[j] * rz;
        for (int64_t t = 0; t < D; t++) o[t] += p * V[j * D + t];
    }
    for (int64_t j = 0; j < W; j++) {
        float p = s[L + 1 + j] * rz;
        if (p != 0.f)
            for (int64_t t = 0; t < D; t++) o[t] += p * Vl[j * D + t];
    }
}

/* One q head h (D a multiple of 8 or not: each level's kernel) against its K/V group; s: L + 1 + W floats. */
static void attend_one(const float *q, const float *K, const float *V, const float *Kl, const float *Vl,
                       const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o) {
#if defined(TC_AVX512)
    if ((D & 15) == 0 && D <= 256) {
        attend_head16(q, K, V, Kl, Vl, lpos, L, W, D, s, o);
        return;
    }
#elif defined(TC_AVX2)
    if ((D & 7) == 0 && D <= 256) {
        attend_heads8(1, q, D, K, V, Kl, Vl, lpos, L, W, D, s, o, D);
        return;
    }
#endif
    attend_head(q, K, V, Kl, Vl, lpos, L, W, D, s, o);
}

#endif /* TC_NATIVE_ATTN_H */
