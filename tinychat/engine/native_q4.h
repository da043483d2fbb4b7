/* tinychat int4 GEMV and GEMM kernels (included by native.c after native_gemm.h; tests/native/q8_harness.c tests
   them alone, also built for aarch64 and run under qemu).

   Weights (`--quant int4`, quant_int4.py's Int4Linear): per group of 32 columns one fp16 scale (Q4_0's rounding: d =
   the group's value of largest magnitude / -8 or a searched divisor, q = clamp(round(w / d), -8, 7)), stored as u =
   q + 8 (0..15) two to a byte, rows by groups of four in super-blocks of 512 columns: native_q4_layout.h.

   y[n] (+)= sum_G ws[n, G] * sx[G] * dot(q[n, G], xq[G])       (G: the groups of 32; xq, sx: native_q8.h's tc_act8)
   The activations are the int8 path's (tc_quant8), so the same dot-product instructions run: u is unsigned, so
   dot(q, xq) = dot(u, xq) - 8 * sum(xq), and an accumulator starts at -8 * its columns' sum (exact). Per row group
   and super-block, 8 steps of 64 columns leave the 16 groups' exact dots in int32 lanes (tc_act_sb's activation
   copy has the steps' column order), then one conversion and one multiply-add by the 16 products ws * sx:
     TC_512    vpdpbusd zmm, 64 columns an instruction (the step's low nibbles: groups 0-7, high: 8-15);
     TC_256    two ymm a step (low and high nibbles): vpdpbusd ymm (TC_256_VNNI) or vpmaddubsw (|u * xq pair| <=
               2 * 15 * 127: no saturation) + vpmaddwd;
     TC_NEON   four 16-byte sdots a step (or vmull + pairwise adds) on q = u - 8 signed, no correction;
     none      the reference: per group an exact int32 dot times (ws * sx), summed in fp32.
   The tail chunks (K past the last whole super-block) and the last N % 4 rows run the chunk form: 64 columns, two
   groups, a register. A lane's int32 dot is exact on every path; it is scaled by ws * sx (one fp32 product) and
   summed in fp32, so the paths differ only by summation order (the tests bound it against a float64 reference of
   the same rounding). The row groups' one stream is what makes the GEMV read at the plain-read rate on Zen 4
   (docs/benchmarks.md, "The grouped int4 layout"; no software prefetch: it slowed the stream there).

   Prefill (tc_gemm4_jobs): a row tile's int4 rows are unpacked to int8 (q, in -8..7) and packed into the int8 GEMM's
   super-block layout (native_gemm.h's tc_gemm_pack), their group scales spread over the same lanes; the int8 GEMM's
   tile kernel runs them, its block scales times those lanes (tc_tile's wl): the int8 GEMM's speed, but for that one
   multiply a block. Per token the same rounding as the GEMV, so a token prefilled gives what decoding it gives, up to
   fp32 summation order. */
#ifndef TC_NATIVE_Q4_H
#define TC_NATIVE_Q4_H
#include "native_gemm.h"
#include "native_f16.h"     /* tc_h2f: the fp16 group scales */
#include "native_q4_layout.h"

#define TC_Q4G 32                                  /* columns per weight scale */

/* The reference dot of row n of an int4 matrix (N x K at q, its scales at ws) with the activations a: per group an
   exact int32 dot, times ws * sx, summed in fp32 in column order. */
#if defined(__GNUC__) && !defined(__clang__)
/* GCC 12 vectorizes such loops for AVX512-VNNI into vpdpbusd of u by xq, dropping the - 8 (a wrong result at
   -O2 and -O3, right at -O1): the reference stays scalar */
#define TC_NO_VEC __attribute__((optimize("no-tree-vectorize")))
#else
#define TC_NO_VEC
#endif
/* tmp: tc4_ref_bytes(K) of scratch for the row's values and scales */
static inline int64_t tc4_ref_bytes(int64_t K) { return tc_pad64(K) + tc_pad64(K) / 16; }
static TC_NO_VEC float tc4_dot_vals(const tc_act8 *a, const int8_t *v, const uint16_t *sc, int64_t Kp) {
    float f = 0.f;
    for (int64_t G = 0; G < Kp / TC_Q4G; G++) {
        int32_t d = 0;
        for (int j = 0; j < TC_Q4G; j++) d += (int32_t)v[G * TC_Q4G + j] * (int32_t)a->q[G * TC_Q4G + j];
        f += (float)d * (tc_h2f(sc[G]) * a->s[G * (TC_Q4G / 4)]);
    }
    return f;
}
static float tc4_dot_ref(const tc_act8 *a, const uint8_t *q, const uint16_t *ws, int64_t N, int64_t K, int64_t n,
                         int8_t *tmp) {
    int64_t Kp = tc_pad64(K);
    tc4_row(q, ws, N, K, n, tmp, (uint16_t *)(tmp + Kp));
    return tc4_dot_vals(a, tmp, (const uint16_t *)(tmp + Kp), Kp);
}

#if defined(TC_512)
/* 64 columns' u (0..15) from 32 bytes: the low nibbles in the low 256 bits, the high ones in the high 256 */
static inline __m512i tc4_u64(const uint8_t *p) {
    __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    z = _mm512_mask_srli_epi16(z, (__mmask32)0xFFFF0000u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

/* a chunk's two group scales: lanes 0-7 the first, 8-15 the second */
static inline __m512 tc4_ws16(const uint16_t *ws) {
    int32_t two;
    memcpy(&two, ws, 4);
    __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(two));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(v));
}

/* one 64-column chunk (k: its first column) of a row (32 bytes at pk, two scales at wk) into f */
static inline __m512 tc4_chunk16(const tc_act8 *a, int64_t k, const uint8_t *pk, const uint16_t *wk, __m512 f) {
    __m512i c8 = _mm512_srai_epi32(_mm512_load_si512((const void *)(a->c + k / 4)), 4);
    __m512i i = _mm512_dpbusd_epi32(c8, tc4_u64(pk), _mm512_load_si512((const void *)(a->q + k)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(_mm512_load_ps(a->s + k / 4), tc4_ws16(wk)), f);
}

/* A row group (p, ws: its bytes and scales, native_q4_layout.h) into out[0..3]. */
static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    tc4_geo g = tc4_geometry(K);
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t b = 0; b < g.nsb; b++) {
        const uint8_t *w = p + 1024 * b;
        const int8_t *x = a->r + TC_SB * b;
        __m512i a0 = _mm512_load_si512((const void *)(a->gc + 16 * b)), a1 = a0, a2 = a0, a3 = a0;
        for (int s = 0; s < 8; s++) {              /* (16,) int32 per row: the groups' exact dots */
            __m512i xv = _mm512_load_si512((const void *)(x + 64 * s));
            a0 = _mm512_dpbusd_epi32(a0, tc4_u64(w + 128 * s), xv);
            a1 = _mm512_dpbusd_epi32(a1, tc4_u64(w + 128 * s + 32), xv);
            a2 = _mm512_dpbusd_epi32(a2, tc4_u64(w + 128 * s + 64), xv);
            a3 = _mm512_dpbusd_epi32(a3, tc4_u64(w + 128 * s + 96), xv);
        }
        __m512 sx = _mm512_load_ps(a->gs + 16 * b);
        const uint16_t *wb = ws + 64 * b;
#define TC4_SC(R) _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wb + 16 * (R)))), sx)
        f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), TC4_SC(0), f0);
        f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), TC4_SC(1), f1);
        f2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a2), TC4_SC(2), f2);
        f3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a3), TC4_SC(3), f3);
#undef TC4_SC
    }
    const uint8_t *t = p + 1024 * g.nsb;
    const uint16_t *wt = ws + 64 * g.nsb;
    for (int64_t c = 0, k = TC_SB * g.nsb; k < g.Kp; c++, k += 64) {
        f0 = tc4_chunk16(a, k, t + 128 * c, wt + 2 * c, f0);
        f1 = tc4_chunk16(a, k, t + 128 * c + 32, wt + g.tg + 2 * c, f1);
        f2 = tc4_chunk16(a, k, t + 128 * c + 64, wt + 2 * g.tg + 2 * c, f2);
        f3 = tc4_chunk16(a, k, t + 128 * c + 96, wt + 3 * g.tg + 2 * c, f3);
    }
    out[0] = tc_hsum16(f0), out[1] = tc_hsum16(f1), out[2] = tc_hsum16(f2), out[3] = tc_hsum16(f3);
}

/* A plain row (p, ws: its bytes and scales). */
static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    __m512 f = _mm512_setzero_ps();
    for (int64_t k = 0; k < tc_pad64(K); k += 64) f = tc4_chunk16(a, k, p + k / 2, ws + k / TC_Q4G, f);
    return tc_hsum16(f);
}

#elif defined(TC_256)
#if defined(TC_256_VNNI)
#define TC4_BLK(C, U, XV) TC_DP256(C, U, XV)
#else
#define TC4_BLK(C, U, XV) _mm256_add_epi32(C, _mm256_madd_epi16(_mm256_maddubs_epi16(U, XV), _mm256_set1_epi16(1)))
#endif

/* 8 fp16 scales as fp32 */
static inline __m256 tc4_ws8(const uint16_t *ws) {
#if defined(TC_F16C)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)ws));
#else
    return _mm256_setr_ps(tc_h2f(ws[0]), tc_h2f(ws[1]), tc_h2f(ws[2]), tc_h2f(ws[3]), tc_h2f(ws[4]), tc_h2f(ws[5]),
                          tc_h2f(ws[6]), tc_h2f(ws[7]));
#endif
}

/* one 64-column chunk (k: its first column) of a row (32 bytes at pk, two scales at wk) into f: two blocks of 32
   (the low nibbles, then the high ones) */
static inline __m256 tc4_chunk8(const tc_act8 *a, int64_t k, const uint8_t *pk, const uint16_t *wk, __m256 f) {
    const __m256i m = _mm256_set1_epi8(15);
    __m256i b = _mm256_loadu_si256((const __m256i *)pk);
    __m256i u0 = _mm256_and_si256(b, m), u1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
    __m256i c0 = _mm256_srai_epi32(_mm256_load_si256((const __m256i *)(a->c + k / 4)), 4);
    __m256i c1 = _mm256_srai_epi32(_mm256_load_si256((const __m256i *)(a->c + k / 4 + 8)), 4);
    __m256i i0 = TC4_BLK(c0, u0, _mm256_load_si256((const __m256i *)(a->q + k)));
    __m256i i1 = TC4_BLK(c1, u1, _mm256_load_si256((const __m256i *)(a->q + k + 32)));
    __m256 s0 = _mm256_mul_ps(_mm256_load_ps(a->s + k / 4), _mm256_set1_ps(tc_h2f(wk[0])));
    __m256 s1 = _mm256_mul_ps(_mm256_load_ps(a->s + k / 4 + 8), _mm256_set1_ps(tc_h2f(wk[1])));
    f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), s0, f);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), s1, f);
}

/* A row group (p, ws: its bytes and scales, native_q4_layout.h) into out[0..3]: per row two accumulators of 8
   groups (a step's low nibbles: groups 0-7, high: 8-15). */
static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    tc4_geo g = tc4_geometry(K);
    const __m256i m = _mm256_set1_epi8(15);
    __m256 f[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < g.nsb; b++) {
        const uint8_t *w = p + 1024 * b;
        const int8_t *x = a->r + TC_SB * b;
        __m256i cl = _mm256_load_si256((const __m256i *)(a->gc + 16 * b));
        __m256i ch = _mm256_load_si256((const __m256i *)(a->gc + 16 * b + 8));
        __m256i lo[4] = {cl, cl, cl, cl}, hi[4] = {ch, ch, ch, ch};
        for (int s = 0; s < 8; s++) {
            __m256i xl = _mm256_load_si256((const __m256i *)(x + 64 * s));
            __m256i xh = _mm256_load_si256((const __m256i *)(x + 64 * s + 32));
            for (int r = 0; r < 4; r++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(w + 128 * s + 32 * r));
                lo[r] = TC4_BLK(lo[r], _mm256_and_si256(v, m), xl);
                hi[r] = TC4_BLK(hi[r], _mm256_and_si256(_mm256_srli_epi16(v, 4), m), xh);
            }
        }
        __m256 sl = _mm256_load_ps(a->gs + 16 * b), sh = _mm256_load_ps(a->gs + 16 * b + 8);
        const uint16_t *wb = ws + 64 * b;
        for (int r = 0; r < 4; r++) {
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[r]), _mm256_mul_ps(tc4_ws8(wb + 16 * r), sl), f[r]);
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[r]), _mm256_mul_ps(tc4_ws8(wb + 16 * r + 8), sh), f[r]);
        }
    }
    const uint8_t *t = p + 1024 * g.nsb;
    const uint16_t *wt = ws + 64 * g.nsb;
    for (int64_t c = 0, k = TC_SB * g.nsb; k < g.Kp; c++, k += 64)
        for (int r = 0; r < 4; r++) f[r] = tc4_chunk8(a, k, t + 128 * c + 32 * r, wt + r * g.tg + 2 * c, f[r]);
    for (int r = 0; r < 4; r++) out[r] = tc_hsum8(f[r]);
}

/* A plain row (p, ws: its bytes and scales). */
static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    __m256 f = _mm256_setzero_ps();
    for (int64_t k = 0; k < tc_pad64(K); k += 64) f = tc4_chunk8(a, k, p + k / 2, ws + k / TC_Q4G, f);
    return tc_hsum8(f);
}

#elif defined(TC_NEON)
/* 4 int32 lanes, each the dot of 4 bytes of w and x (sdot; without it vmull and two pairwise adds) */
static inline int32x4_t tc4_sdot(int32x4_t c, int8x16_t w, int8x16_t x) {
#if defined(TC_NEON_DOT)
    return vdotq_s32(c, w, x);
#else
    int32x4_t l = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    int32x4_t h = vpaddlq_s16(vmull_high_s8(w, x));
    return vaddq_s32(c, vpaddq_s32(l, h));
#endif
}

/* one 64-column chunk (k: its first column) of a row into f: q = u - 8 signed; lanes 0-3: the low nibbles' group,
   then the high ones' (tc_act8's s per 4 columns) */
static inline float32x4_t tc4_chunk_neon(const tc_act8 *a, int64_t k, const uint8_t *pk, const uint16_t *wk,
                                         float32x4_t f) {
    const uint8x16_t m = vdupq_n_u8(15);
    const int8x16_t eight = vdupq_n_s8(8);
    uint8x16_t b0 = vld1q_u8(pk), b1 = vld1q_u8(pk + 16);
    int8x16_t l0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b0, m)), eight);
    int8x16_t l1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b1, m)), eight);
    int8x16_t h0 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), eight);
    int8x16_t h1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), eight);
    int32x4_t dl = tc4_sdot(tc4_sdot(vdupq_n_s32(0), l0, vld1q_s8(a->q + k)), l1, vld1q_s8(a->q + k + 16));
    int32x4_t dh = tc4_sdot(tc4_sdot(vdupq_n_s32(0), h0, vld1q_s8(a->q + k + 32)), h1, vld1q_s8(a->q + k + 48));
    f = vfmaq_n_f32(f, vcvtq_f32_s32(dl), tc_h2f(wk[0]) * a->s[k / 4]);
    return vfmaq_n_f32(f, vcvtq_f32_s32(dh), tc_h2f(wk[1]) * a->s[k / 4 + 8]);
}

/* 4 fp16 scales as fp32 */
static inline float32x4_t tc4_ws4(const uint16_t *ws) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(ws)));
}

/* A row group (p, ws: its bytes and scales, native_q4_layout.h) into out[0..3]: per row four accumulators of 4
   groups (a step's bytes 0-15: groups 0-3 low, 8-11 high; bytes 16-31: 4-7, 12-15). */
static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    tc4_geo g = tc4_geometry(K);
    const uint8x16_t m = vdupq_n_u8(15);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t f[4];
    for (int r = 0; r < 4; r++) f[r] = vdupq_n_f32(0.f);
    for (int64_t b = 0; b < g.nsb; b++) {
        const uint8_t *w = p + 1024 * b;
        const int8_t *x = a->r + TC_SB * b;
        const uint16_t *wb = ws + 64 * b;
        for (int r = 0; r < 4; r++) {
            int32x4_t d0 = vdupq_n_s32(0), d1 = d0, d2 = d0, d3 = d0;     /* groups 0-3, 4-7, 8-11, 12-15 */
            for (int s = 0; s < 8; s++) {
                uint8x16_t b0 = vld1q_u8(w + 128 * s + 32 * r), b1 = vld1q_u8(w + 128 * s + 32 * r + 16);
                const int8_t *xs = x + 64 * s;
                d0 = tc4_sdot(d0, vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b0, m)), eight), vld1q_s8(xs));
                d1 = tc4_sdot(d1, vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b1, m)), eight), vld1q_s8(xs + 16));
                d2 = tc4_sdot(d2, vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), eight), vld1q_s8(xs + 32));
                d3 = tc4_sdot(d3, vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), eight), vld1q_s8(xs + 48));
            }
            const float *sx = a->gs + 16 * b;
            const uint16_t *wr = wb + 16 * r;
            f[r] = vfmaq_f32(f[r], vcvtq_f32_s32(d0), vmulq_f32(tc4_ws4(wr), vld1q_f32(sx)));
            f[r] = vfmaq_f32(f[r], vcvtq_f32_s32(d1), vmulq_f32(tc4_ws4(wr + 4), vld1q_f32(sx + 4)));
            f[r] = vfmaq_f32(f[r], vcvtq_f32_s32(d2), vmulq_f32(tc4_ws4(wr + 8), vld1q_f32(sx + 8)));
            f[r] = vfmaq_f32(f[r], vcvtq_f32_s32(d3), vmulq_f32(tc4_ws4(wr + 12), vld1q_f32(sx + 12)));
        }
    }
    const uint8_t *t = p + 1024 * g.nsb;
    const uint16_t *wt = ws + 64 * g.nsb;
    for (int64_t c = 0, k = TC_SB * g.nsb; k < g.Kp; c++, k += 64)
        for (int r = 0; r < 4; r++) f[r] = tc4_chunk_neon(a, k, t + 128 * c + 32 * r, wt + r * g.tg + 2 * c, f[r]);
    for (int r = 0; r < 4; r++) out[r] = vaddvq_f32(f[r]);
}

/* A plain row (p, ws: its bytes and scales). */
static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    float32x4_t f = vdupq_n_f32(0.f);
    for (int64_t k = 0; k < tc_pad64(K); k += 64) f = tc4_chunk_neon(a, k, p + k / 2, ws + k / TC_Q4G, f);
    return vaddvq_f32(f);
}
#endif

/* Rows [0, N) of y (+)= W4 x (a: tc_quant8's activations with tc_act_sb's copies), split over the threads of the
   enclosing parallel region (no barrier), as gemv_rows: row groups of four, then the plain rows. */
static void gemv4_rows(const tc_act8 *a, const uint8_t *q, const uint16_t *ws, float *y, int64_t N, int64_t K,
                       int acc) {
    int64_t nb = N / 4, rb = tc_pad64(K) / 2, rs = tc_pad64(K) / TC_Q4G;
#if defined(TC_512) || defined(TC_256) || defined(TC_NEON)
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
    for (int64_t b = 0; b < nb; b++) {
        float d[4];
        int64_t n = 4 * b;
        tc4_dot4(a, q + n * rb, ws + n * rs, K, d);
        for (int r = 0; r < 4; r++) y[n + r] = acc ? y[n + r] + d[r] : d[r];
    }
#ifdef _OPENMP
#pragma omp single nowait
#endif
    for (int64_t n = 4 * nb; n < N; n++) {
        float v = tc4_dot1(a, q + n * rb, ws + n * rs, K);
        y[n] = acc ? y[n] + v : v;
    }
#else
    int8_t *tmp = (int8_t *)malloc((size_t)tc4_ref_bytes(K));
    (void)nb, (void)rb, (void)rs;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
    for (int64_t n = 0; n < N; n++) {
        float v = tmp ? tc4_dot_ref(a, q, ws, N, K, n, tmp) : NAN;
        y[n] = acc ? y[n] + v : v;
    }
    free(tmp);
#endif
}

/* A weight matrix of either format, as the steps pass them: fmt 0 int8 rows and fp32 row scales (native_q8.h),
   fmt 1 int4 rows and fp16 group scales (above). A layer's formats travel as one mask (the steps' wfmt): bit
   TC_F_QKV its fused QKV, TC_F_WO w_o, TC_F_UP up, TC_F_DN down set where that matrix is int4 (quant.py keeps some
   of them int8 at --quant int4). The int4 GEMV reads tc_act_sb's copies: the callers make them (tc_quant4) where a
   mask has an int4 matrix. */
#define TC_F_QKV 1
#define TC_F_WO 2
#define TC_F_UP 4
#define TC_F_DN 8
#define TC_FMT(mask, bit) (((mask) & (bit)) ? 1 : 0)
static inline void gemv_fmt(int fmt, const tc_act8 *a, const void *q, const void *s, float *y, int64_t N, int64_t K,
                            int acc) {
    if (fmt == 1)
        gemv4_rows(a, (const uint8_t *)q, (const uint16_t *)s, y, N, K, acc);
    else
        gemv_rows(a, (const int8_t *)q, (const float *)s, y, N, K, acc);
}

/* tc_quant8, with the int4 GEMV's copies where int4 (nonzero: a format or a TC_F_* mask with an int4 matrix) */
static inline tc_act8 tc_quant4(const float *x, void *buf, int64_t K, int int4) {
    tc_act8 a = tc_quant8(x, buf, K);
    if (int4) tc_act_sb(&a, K);
    return a;
}

/* The reference int4 GEMV (one thread, tc4_dot_ref), for the tests and the harness. */
void tc_gemv4_ref(const float *x, void *xq, const uint8_t *q, const uint16_t *ws, float *y, int64_t N, int64_t K,
                  int acc) {
    tc_act8 a = tc_quant8(x, xq, K);
    int8_t *tmp = (int8_t *)malloc((size_t)tc4_ref_bytes(K));
    for (int64_t n = 0; n < N; n++) {
        float v = tmp ? tc4_dot_ref(&a, q, ws, N, K, n, tmp) : NAN;
        y[n] = acc ? y[n] + v : v;
    }
    free(tmp);
}

/* ---- prefill: the int8 GEMM's tiles on unpacked int4 rows ---- */

/* Per thread, after the int8 GEMM's scratch: TC_GR unpacked rows (Kp bytes each), then their lane scales
   (tc4_wl_floats(K) each, 64-byte aligned), then tc4_ref_bytes(K) for one row's values and scales. */
static inline int64_t tc4_wl_floats(int64_t K) {
#if TC_PACKED
    tc_geo g = tc_gemm_geo(K);
    return (g.nsb * TC_L + g.hsb * 8 + g.rp / 4 + 15) & ~(int64_t)15;
#else
    (void)K;
    return 0;
#endif
}
static inline int64_t tc4_extra_bytes(int64_t K) {
    return TC_GR * (tc_pad64(K) + 4 * tc4_wl_floats(K)) + tc4_ref_bytes(K);
}

int64_t tc_gemm4_act_bytes(int64_t M, int64_t K, int nt) {
    return tc_gemm_act_bytes(M, K, nt) + (nt > 0 ? nt : 1) * tc4_extra_bytes(K);
}

/* Row n's int4 values as int8 (q, -8..7; Kp of them, the padding's q = 0 as quantize_int4 stores it) into o (tc4_row),
   and (packed builds) its group scales spread over the lanes of the GEMM's layout into wl: per super-block TC_L
   (lane l: block l), the half super-block's 8, then the rest's lanes (4 columns each). sc: room for Kp / 32 fp16. */
static void tc4_unpack(const uint8_t *q, const uint16_t *ws, int64_t N, int64_t n, int64_t K, int8_t *o, float *wl,
                       uint16_t *sc) {
    int64_t Kp = tc_pad64(K);
    tc4_row(q, ws, N, K, n, o, sc);
#if TC_PACKED
    tc_geo g = tc_gemm_geo(K);
    int64_t nb = g.nsb * TC_L + g.hsb * 8, i = 0;
    for (; i < nb; i++) wl[i] = i < Kp / TC_Q4G ? tc_h2f(sc[i]) : 0.f;     /* past Kp: the GEMM's zero padding */
    for (int64_t j = 0; j < g.rp / 4; j++) {
        int64_t b = (g.r0 + 4 * j) / TC_Q4G;
        wl[i + j] = b < Kp / TC_Q4G ? tc_h2f(sc[b]) : 0.f;
    }
#else
    (void)wl, (void)Kp;
#endif
}

/* The int4 GEMM's jobs [j0, j1), as tc_gemm_jobs: each row tile unpacked (ex: this thread's tc4_extra_bytes) and
   packed once, then run against its chunks' tokens; y = out (+ bias): the scales are in the lanes. */
static void tc_gemm4_jobs(void *buf, int8_t *pk, int8_t *ex, const uint8_t *q, const uint16_t *ws, const float *bias,
                          float *y, int64_t M, int64_t N, int64_t K, int64_t gm, int nt, int by_rows, int64_t j0,
                          int64_t j1) {
    int64_t nrt = (N + TC_GR - 1) / TC_GR, nc = (M + gm - 1) / gm, Kp = tc_pad64(K), nwl = tc4_wl_floats(K);
    if (j0 >= j1) return;
    const int8_t *slot0 = tc_gemm_slot(buf, K, 0, nt);
    int64_t stride = tc_gemm_slot_bytes(K);
    float *wl = (float *)(ex + TC_GR * Kp);
    int8_t *tmp = (int8_t *)(wl + TC_GR * nwl);           /* tc4_ref_bytes(K): a row's values and scales */
    (void)pk, (void)wl, (void)nwl;
    for (int64_t rt = 0; rt < nrt; rt++) {
        int64_t cs, ce;
        tc_job_chunks(j0, j1, rt, nrt, nc, by_rows, &cs, &ce);
        if (cs > ce) continue;
        int64_t n0 = rt * TC_GR;
        const int8_t *rows[TC_GR];
        for (int r = 0; r < TC_GR; r++) {
            tc4_unpack(q, ws, N, n0 + r < N ? n0 + r : N - 1, K, ex + r * Kp, wl + r * nwl, (uint16_t *)(tmp + Kp));
            rows[r] = ex + r * Kp;
        }
#if TC_PACKED
        tc_gemm_pack(rows, K, pk);
        for (int64_t c = cs; c <= ce && c * gm < M; c++)
            tc_chunk_run(pk, slot0, stride, K, c * gm, (c + 1) * gm < M ? (c + 1) * gm : M, wl, nwl, NULL, bias, y, N,
                         n0);
#else
        (void)rows;
        for (int64_t m = cs * gm; m < M && m < (ce + 1) * gm; m += TC_GT) {
            int64_t m1 = (m / gm + 1) * gm < M ? (m / gm + 1) * gm : M;
            const int8_t *a[TC_GT];
            for (int t = 0; t < TC_GT; t++) a[t] = slot0 + stride * (m + t < m1 ? m + t : m1 - 1);
            float out[TC_GR][TC_GT];
            for (int t = 0; t < TC_GT; t++) {
                tc_act8 v = tc_act_view((void *)a[t], K);
                for (int r = 0; r < TC_GR; r++) {
                    int64_t n = n0 + r < N ? n0 + r : N - 1;
                    out[r][t] = tc4_dot_ref(&v, q, ws, N, K, n, tmp);
                }
            }
            tc_tile_store(out, NULL, bias, y, N, n0, m, m1);
            if (m + TC_GT >= m1) m = m1 - TC_GT;
        }
#endif
    }
}

/* The whole int4 GEMM on one thread (the harness); buf: tc_gemm4_act_bytes(M, K, 1). */
void tc_gemm4_1(const float *x, void *buf, const uint8_t *q, const uint16_t *ws, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++) tc_gemm_quant(x, buf, m, K, 1);
    int64_t gm = tc_gemm_chunk(M, 1);
    int8_t *ex = tc_gemm_slot(buf, K, M > 0 ? M : 1, 1);
    tc_gemm4_jobs(buf, tc_gemm_base(buf), ex, q, ws, bias, y, M, N, K, gm, 1, 0, 0, tc_gemm_njobs(M, N, gm));
}

/* ---- prefill on bf16 GEMMs (AMX machines): the rows dequantized to bf16 ---- */

/* f as bf16 bits, rounded to nearest, ties to even (finite f: the products below; torch's .to(bfloat16) rounding) */
static inline uint16_t tc_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Row n's K weights q * d (exact in fp32: |q| <= 8 times an fp16 scale) rounded to bf16, into o (K of them, no
   padding): what quant_int4.py's Int4Linear hands oneDNN's bf16 GEMM where tile multiplies run it. tmp:
   tc4_ref_bytes(K) of scratch. */
static void tc4_dequant_bf16_row(const uint8_t *q, const uint16_t *ws, int64_t N, int64_t n, int64_t K, uint16_t *o,
                                 int8_t *tmp) {
    int64_t Kp = tc_pad64(K), c = 0;
    const uint16_t *sc = (const uint16_t *)(tmp + Kp);
    tc4_row(q, ws, N, K, n, tmp, (uint16_t *)(tmp + Kp));
#if defined(TC_AVX512)
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    for (; c + 16 <= K; c += 16) {                /* 16 columns of one group */
        __m512 d = _mm512_set1_ps(tc_h2f(sc[c / TC_Q4G]));
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(tmp + c)))),
                                 d);
        __m512i b = _mm512_castps_si512(f);
        __m512i r = _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(b, 16), one));
        b = _mm512_srli_epi32(_mm512_add_epi32(b, r), 16);
        _mm256_storeu_si256((__m256i *)(o + c), _mm512_cvtepi32_epi16(b));
    }
#endif
    for (; c < K; c++) o[c] = tc_f2bf((float)tmp[c] * tc_h2f(sc[c / TC_Q4G]));
}
#endif /* TC_NATIVE_Q4_H */
