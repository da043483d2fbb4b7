/* tinychat int4 GEMV and GEMM kernels (included by native.c after native_gemm.h; tests/native/q8_harness.c tests
   them alone, also built for aarch64 and run under qemu).

   Weights (`--quant int4`, quant.py's Int4Linear): a row of K columns padded with zeros to Kp = tc_pad64(K), in
   groups of 32 columns with one fp16 scale each (Q4_0's rounding: d = the group's value of largest magnitude / -8,
   q = clamp(round(w / d), -8, 7)), stored as u = q + 8 (0..15) two to a byte: per 64-column chunk 32 bytes, byte j
   holding column j in its low nibble and column j + 32 in its high one (one 256-bit load and a shift give a
   register of 64 columns, or two of 32). Row n: q4 + n * Kp / 2 bytes; its scales ws + n * Kp / 32 (fp16 bits).

   y[n] (+)= sum_g ws[n, g] * sx[g] * dot(q[n, g], xq[g])       (g: the groups of 32; xq, sx: native_q8.h's tc_act8)
   The activations are the int8 path's (tc_quant8), so the same dot-product instructions run: u is unsigned, so
   dot(q, xq) = dot(u, xq) - 8 * sum(xq), and the accumulator starts at -8 * the sum of each lane's 4 columns
   (tc_act8's c / 16, exact):
     TC_512    vpdpbusd zmm (u . xq): 64 columns an instruction, the two groups' scales in lanes 0-7 / 8-15;
     TC_256    vpdpbusd ymm (TC_256_VNNI) or vpmaddubsw (|u * xq pair| <= 2 * 15 * 127: no saturation) + vpmaddwd;
     TC_NEON   sdot (or vmull + vpadal) on q = u - 8 signed, no correction;
     none      the reference: per group an exact int32 dot times (ws * sx), summed in fp32.
   A lane's int32 dot is exact on every path; it is scaled by ws * sx (one fp32 product) and summed in fp32, so the
   paths differ only by summation order (the tests bound it against a float64 reference of the same rounding).

   Prefill (tc_gemm4_jobs): a row tile's int4 rows are unpacked to int8 (q, in -8..7) and packed into the int8 GEMM's
   super-block layout (native_gemm.h's tc_gemm_pack), their group scales spread over the same lanes; the int8 GEMM's
   tile kernel runs them, its block scales times those lanes (tc_tile's wl): the int8 GEMM's speed, but for that one
   multiply a block. Per token the same rounding as the GEMV, so a token prefilled gives what decoding it gives, up to
   fp32 summation order. */
#ifndef TC_NATIVE_Q4_H
#define TC_NATIVE_Q4_H
#include "native_gemm.h"
#include "native_f16.h"     /* tc_h2f: the fp16 group scales */

#define TC_Q4G 32                                  /* columns per weight scale */

/* The reference dot of one int4 row (Kp / 2 bytes at p, Kp / 32 scales at ws) with the activations a: per group an
   exact int32 dot, times ws * sx, summed in fp32. */
#if defined(__GNUC__) && !defined(__clang__)
/* GCC 12 vectorizes the loop below for AVX512-VNNI into vpdpbusd of u by xq, dropping the - 8 (a wrong result at
   -O2 and -O3, right at -O1): the reference stays scalar */
#define TC_NO_VEC __attribute__((optimize("no-tree-vectorize")))
#else
#define TC_NO_VEC
#endif
static TC_NO_VEC float tc4_dot_ref(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    int64_t Kp = tc_pad64(K);
    float f = 0.f;
    for (int64_t c = 0; c < Kp; c += 64) {
        const uint8_t *b = p + c / 2;
        int32_t d0 = 0, d1 = 0;                    /* the low nibbles' group, the high ones' */
        for (int j = 0; j < TC_Q4G; j++) {
            d0 += ((int32_t)(b[j] & 15) - 8) * (int32_t)a->q[c + j];
            d1 += ((int32_t)(b[j] >> 4) - 8) * (int32_t)a->q[c + 32 + j];
        }
        int64_t g = c / TC_Q4G;
        f += (float)d0 * (tc_h2f(ws[g]) * a->s[g * (TC_Q4G / 4)]);
        f += (float)d1 * (tc_h2f(ws[g + 1]) * a->s[(g + 1) * (TC_Q4G / 4)]);
    }
    return f;
}

#if defined(TC_512)
/* 64 columns' u (0..15) from 32 bytes: the low nibbles in the low 256 bits, the high ones in the high 256 */
static inline __m512i tc4_u64(const uint8_t *p) {
    __m512i z = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    z = _mm512_mask_srli_epi16(z, (__mmask32)0xFFFF0000u, z, 4);
    return _mm512_and_si512(z, _mm512_set1_epi8(15));
}

/* the two groups' scales of a chunk: lanes 0-7 the first, 8-15 the second */
static inline __m512 tc4_ws16(const uint16_t *ws) {
    int32_t two;
    memcpy(&two, ws, 4);
    __m128 v = _mm_cvtph_ps(_mm_cvtsi32_si128(two));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(v));
}

static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    int64_t Kp = tc_pad64(K), rb = Kp / 2, rs = Kp / TC_Q4G;
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t k = 0; k < Kp; k += 64) {
        if (!(k & 64)) tc_prefetch4((const int8_t *)p + 2 * k);
        __m512i xv = _mm512_load_si512((const void *)(a->q + k));
        __m512 sv = _mm512_load_ps(a->s + k / 4);
        __m512i c8 = _mm512_srai_epi32(_mm512_load_si512((const void *)(a->c + k / 4)), 4);
        const uint8_t *pk = p + k / 2;
        const uint16_t *wk = ws + k / TC_Q4G;
#define TC4_ROW(F, R)                                                                                    \
    F = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c8, tc4_u64(pk + (R) * rb), xv)),         \
                        _mm512_mul_ps(sv, tc4_ws16(wk + (R) * rs)), F)
        TC4_ROW(f0, 0);
        TC4_ROW(f1, 1);
        TC4_ROW(f2, 2);
        TC4_ROW(f3, 3);
#undef TC4_ROW
    }
    out[0] = tc_hsum16(f0), out[1] = tc_hsum16(f1), out[2] = tc_hsum16(f2), out[3] = tc_hsum16(f3);
}

static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    int64_t Kp = tc_pad64(K);
    __m512 f = _mm512_setzero_ps();
    for (int64_t k = 0; k < Kp; k += 64) {
        __m512i c8 = _mm512_srai_epi32(_mm512_load_si512((const void *)(a->c + k / 4)), 4);
        __m512i i = _mm512_dpbusd_epi32(c8, tc4_u64(p + k / 2), _mm512_load_si512((const void *)(a->q + k)));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(_mm512_load_ps(a->s + k / 4), tc4_ws16(ws + k / 32)),
                            f);
    }
    return tc_hsum16(f);
}

#elif defined(TC_256)
#if defined(TC_256_VNNI)
#define TC4_BLK(C, U, XV) TC_DP256(C, U, XV)
#else
#define TC4_BLK(C, U, XV) _mm256_add_epi32(C, _mm256_madd_epi16(_mm256_maddubs_epi16(U, XV), _mm256_set1_epi16(1)))
#endif

/* one row's 64-column chunk at column k into f: two blocks of 32 (the low nibbles, then the high ones) */
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

static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    int64_t Kp = tc_pad64(K), rb = Kp / 2, rs = Kp / TC_Q4G;
    __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t k = 0; k < Kp; k += 64) {
        if (!(k & 64)) tc_prefetch4((const int8_t *)p + 2 * k);
        const uint8_t *pk = p + k / 2;
        const uint16_t *wk = ws + k / TC_Q4G;
        f0 = tc4_chunk8(a, k, pk, wk, f0);
        f1 = tc4_chunk8(a, k, pk + rb, wk + rs, f1);
        f2 = tc4_chunk8(a, k, pk + 2 * rb, wk + 2 * rs, f2);
        f3 = tc4_chunk8(a, k, pk + 3 * rb, wk + 3 * rs, f3);
    }
    out[0] = tc_hsum8(f0), out[1] = tc_hsum8(f1), out[2] = tc_hsum8(f2), out[3] = tc_hsum8(f3);
}

static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    int64_t Kp = tc_pad64(K);
    __m256 f = _mm256_setzero_ps();
    for (int64_t k = 0; k < Kp; k += 64) f = tc4_chunk8(a, k, p + k / 2, ws + k / TC_Q4G, f);
    return tc_hsum8(f);
}

#elif defined(TC_NEON)
/* one row's 64-column chunk at column k into f: q = u - 8 signed, by tc_blk_neon's dots (16 columns a register) */
static inline int32x4_t tc4_blk_neon(int8x16_t w0, int8x16_t w1, const int8_t *x) {
    int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
#if defined(TC_NEON_DOT)
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
#else
    int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);
    int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
    return vpadalq_s16(vpaddlq_s16(p0), p1);
#endif
}

static inline float32x4_t tc4_chunk_neon(const tc_act8 *a, int64_t k, const uint8_t *pk, const uint16_t *wk,
                                         float32x4_t f) {
    const uint8x16_t m = vdupq_n_u8(15);
    const int8x16_t eight = vdupq_n_s8(8);
    uint8x16_t b0 = vld1q_u8(pk), b1 = vld1q_u8(pk + 16);
    int8x16_t l0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b0, m)), eight);
    int8x16_t l1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(b1, m)), eight);
    int8x16_t h0 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b0, 4)), eight);
    int8x16_t h1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(b1, 4)), eight);
    f = vfmaq_n_f32(f, vcvtq_f32_s32(tc4_blk_neon(l0, l1, a->q + k)), tc_h2f(wk[0]) * a->s[k / 4]);
    return vfmaq_n_f32(f, vcvtq_f32_s32(tc4_blk_neon(h0, h1, a->q + k + 32)), tc_h2f(wk[1]) * a->s[k / 4 + 8]);
}

static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    int64_t Kp = tc_pad64(K), rb = Kp / 2, rs = Kp / TC_Q4G;
    float32x4_t f0 = vdupq_n_f32(0.f), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t k = 0; k < Kp; k += 64) {
        if (!(k & 64)) tc_prefetch4((const int8_t *)p + 2 * k);
        const uint8_t *pk = p + k / 2;
        const uint16_t *wk = ws + k / TC_Q4G;
        f0 = tc4_chunk_neon(a, k, pk, wk, f0);
        f1 = tc4_chunk_neon(a, k, pk + rb, wk + rs, f1);
        f2 = tc4_chunk_neon(a, k, pk + 2 * rb, wk + 2 * rs, f2);
        f3 = tc4_chunk_neon(a, k, pk + 3 * rb, wk + 3 * rs, f3);
    }
    out[0] = vaddvq_f32(f0), out[1] = vaddvq_f32(f1), out[2] = vaddvq_f32(f2), out[3] = vaddvq_f32(f3);
}

static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    int64_t Kp = tc_pad64(K);
    float32x4_t f = vdupq_n_f32(0.f);
    for (int64_t k = 0; k < Kp; k += 64) f = tc4_chunk_neon(a, k, p + k / 2, ws + k / TC_Q4G, f);
    return vaddvq_f32(f);
}

#else
static inline float tc4_dot1(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K) {
    return tc4_dot_ref(a, p, ws, K);
}

static inline void tc4_dot4(const tc_act8 *a, const uint8_t *p, const uint16_t *ws, int64_t K, float *out) {
    int64_t Kp = tc_pad64(K);
    for (int r = 0; r < 4; r++) out[r] = tc4_dot_ref(a, p + r * (Kp / 2), ws + r * (Kp / TC_Q4G), K);
}
#endif

/* Rows [0, N) of y (+)= W4 x, split over the threads of the enclosing parallel region (no barrier), as gemv_rows. */
static void gemv4_rows(const tc_act8 *a, const uint8_t *q, const uint16_t *ws, float *y, int64_t N, int64_t K,
                       int acc) {
    int64_t nb = N / 4, rb = tc_pad64(K) / 2, rs = tc_pad64(K) / TC_Q4G;
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
}

/* A weight matrix of either format, as the steps pass them: fmt 0 int8 rows and fp32 row scales (native_q8.h),
   fmt 1 int4 rows and fp16 group scales (above). A layer's formats travel as one mask (the steps' wfmt): bit
   TC_F_QKV its fused QKV, TC_F_WO w_o, TC_F_UP up, TC_F_DN down set where that matrix is int4 (quant.py keeps some
   of them int8 at --quant int4). */
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

/* The reference int4 GEMV (one thread, tc4_dot_ref), for the tests and the harness. */
void tc_gemv4_ref(const float *x, void *xq, const uint8_t *q, const uint16_t *ws, float *y, int64_t N, int64_t K,
                  int acc) {
    tc_act8 a = tc_quant8(x, xq, K);
    int64_t rb = tc_pad64(K) / 2, rs = tc_pad64(K) / TC_Q4G;
    for (int64_t n = 0; n < N; n++) {
        float v = tc4_dot_ref(&a, q + n * rb, ws + n * rs, K);
        y[n] = acc ? y[n] + v : v;
    }
}

/* ---- prefill: the int8 GEMM's tiles on unpacked int4 rows ---- */

/* Per thread, after the int8 GEMM's scratch: TC_GR unpacked rows (Kp bytes each), then their lane scales
   (tc4_wl_floats(K) each, 64-byte aligned). */
static inline int64_t tc4_wl_floats(int64_t K) {
#if TC_PACKED
    tc_geo g = tc_gemm_geo(K);
    return (g.nsb * TC_L + g.hsb * 8 + g.rp / 4 + 15) & ~(int64_t)15;
#else
    (void)K;
    return 0;
#endif
}
static inline int64_t tc4_extra_bytes(int64_t K) { return TC_GR * (tc_pad64(K) + 4 * tc4_wl_floats(K)); }

int64_t tc_gemm4_act_bytes(int64_t M, int64_t K, int nt) {
    return tc_gemm_act_bytes(M, K, nt) + (nt > 0 ? nt : 1) * tc4_extra_bytes(K);
}

/* Row n's int4 values as int8 (q, -8..7; Kp of them, the padding's q = 0 as quantize_int4 stores it) into o, and (packed builds) its group scales spread over the
   lanes of the GEMM's layout into wl: per super-block TC_L (lane l: block l), the half super-block's 8, then the
   rest's lanes (4 columns each). */
static void tc4_unpack(const uint8_t *q, const uint16_t *ws, int64_t n, int64_t K, int8_t *o, float *wl) {
    int64_t Kp = tc_pad64(K);
    const uint8_t *p = q + n * (Kp / 2);
    const uint16_t *s = ws + n * (Kp / TC_Q4G);
    for (int64_t c = 0; c < Kp; c += 64) {         /* all Kp columns (o has room): a loop the compiler vectorizes */
        const uint8_t *b = p + c / 2;
        for (int j = 0; j < 32; j++) {
            o[c + j] = (int8_t)((b[j] & 15) - 8);
            o[c + 32 + j] = (int8_t)((b[j] >> 4) - 8);
        }
    }
#if TC_PACKED
    tc_geo g = tc_gemm_geo(K);
    int64_t nb = g.nsb * TC_L + g.hsb * 8, i = 0;
    for (; i < nb; i++) wl[i] = tc_h2f(s[i]);
    for (int64_t j = 0; j < g.rp / 4; j++) {
        int64_t b = (g.r0 + 4 * j) / TC_Q4G;
        wl[i + j] = b < Kp / TC_Q4G ? tc_h2f(s[b]) : 0.f;
    }
#else
    (void)s, (void)wl;
#endif
}

/* The int4 GEMM's jobs [j0, j1), as tc_gemm_jobs: each row tile unpacked (ex: this thread's tc4_extra_bytes) and
   packed once, then run against its chunks' tokens; y = out (+ bias): the scales are in the lanes. */
static void tc_gemm4_jobs(void *buf, int8_t *pk, int8_t *ex, const uint8_t *q, const uint16_t *ws, const float *bias,
                          float *y, int64_t M, int64_t N, int64_t K, int64_t gm, int nt, int64_t j0, int64_t j1) {
    int64_t nrt = (N + TC_GR - 1) / TC_GR, Kp = tc_pad64(K), nwl = tc4_wl_floats(K);
    if (j0 >= j1) return;
    int64_t c0 = j0 / nrt, c1 = (j1 - 1) / nrt;
    const int8_t *slot0 = tc_gemm_slot(buf, K, 0, nt);
    int64_t stride = tc_gemm_slot_bytes(K);
    float *wl = (float *)(ex + TC_GR * Kp);
    (void)pk, (void)wl, (void)nwl;
    for (int64_t rt = 0; rt < nrt; rt++) {
        int64_t cs = c0 * nrt + rt >= j0 ? c0 : c0 + 1, ce = c1 * nrt + rt < j1 ? c1 : c1 - 1;
        if (cs > ce) continue;
        int64_t n0 = rt * TC_GR;
        const int8_t *rows[TC_GR];
        for (int r = 0; r < TC_GR; r++) {
            tc4_unpack(q, ws, n0 + r < N ? n0 + r : N - 1, K, ex + r * Kp, wl + r * nwl);
            rows[r] = ex + r * Kp;
        }
#if TC_PACKED
        tc_gemm_pack(rows, K, pk);
#else
        (void)rows;
#endif
        for (int64_t m = cs * gm; m < M && m < (ce + 1) * gm; m += TC_GT) {
            int64_t m1 = (m / gm + 1) * gm < M ? (m / gm + 1) * gm : M;
            const int8_t *a[TC_GT];
            for (int t = 0; t < TC_GT; t++) a[t] = slot0 + stride * (m + t < m1 ? m + t : m1 - 1);
            float out[TC_GR][TC_GT];
#if TC_PACKED
            tc_tile_w(pk, a, K, out, wl, nwl);
#else
            for (int t = 0; t < TC_GT; t++) {
                tc_act8 v = tc_act_view((void *)a[t], K);
                for (int r = 0; r < TC_GR; r++) {
                    int64_t n = n0 + r < N ? n0 + r : N - 1;
                    out[r][t] = tc4_dot_ref(&v, q + n * (Kp / 2), ws + n * (Kp / TC_Q4G), K);
                }
            }
#endif
            for (int t = 0; t < TC_GT && m + t < m1; t++)
                for (int r = 0; r < TC_GR && n0 + r < N; r++) {
                    int64_t n = n0 + r;
                    y[(m + t) * N + n] = bias ? out[r][t] + bias[n] : out[r][t];
                }
            if (m + TC_GT >= m1) m = m1 - TC_GT;
        }
    }
}

/* The whole int4 GEMM on one thread (the harness); buf: tc_gemm4_act_bytes(M, K, 1). */
void tc_gemm4_1(const float *x, void *buf, const uint8_t *q, const uint16_t *ws, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++) tc_gemm_quant(x, buf, m, K, 1);
    int64_t gm = tc_gemm_chunk(M, 1);
    int8_t *ex = tc_gemm_slot(buf, K, M > 0 ? M : 1, 1);
    tc_gemm4_jobs(buf, tc_gemm_base(buf), ex, q, ws, bias, y, M, N, K, gm, 1, 0, tc_gemm_njobs(M, N, gm));
}

/* ---- prefill on bf16 GEMMs (AMX machines): the rows dequantized to bf16 ---- */

/* f as bf16 bits, rounded to nearest, ties to even (finite f: the products below; torch's .to(bfloat16) rounding) */
static inline uint16_t tc_f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/* Row n's K weights q * d (exact in fp32: |q| <= 8 times an fp16 scale) rounded to bf16, into o (K of them, no
   padding): what quant.py's Int4Linear hands oneDNN's bf16 GEMM where tile multiplies run it. */
static void tc4_dequant_bf16_row(const uint8_t *q, const uint16_t *ws, int64_t n, int64_t K, uint16_t *o) {
    int64_t Kp = tc_pad64(K), c = 0;
    const uint8_t *p = q + n * (Kp / 2);
    const uint16_t *s = ws + n * (Kp / TC_Q4G);
#if defined(TC_AVX512)
    const __m128i lo4 = _mm_set1_epi8(15);
    const __m512i eight = _mm512_set1_epi32(8), half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    for (; c + 64 <= K; c += 64) {                  /* a chunk's 32 bytes: columns j (low nibble), j + 32 (high) */
        __m128i b0 = _mm_loadu_si128((const __m128i *)(p + c / 2)),
                b1 = _mm_loadu_si128((const __m128i *)(p + c / 2 + 16));
        __m128i u[4] = {_mm_and_si128(b0, lo4), _mm_and_si128(b1, lo4), _mm_and_si128(_mm_srli_epi16(b0, 4), lo4),
                        _mm_and_si128(_mm_srli_epi16(b1, 4), lo4)};      /* columns c + 16 i .. c + 16 i + 15 */
        for (int i = 0; i < 4; i++) {
            __m512 d = _mm512_set1_ps(tc_h2f(s[c / TC_Q4G + i / 2]));
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(u[i]), eight)), d);
            __m512i b = _mm512_castps_si512(f);
            __m512i r = _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(b, 16), one));
            b = _mm512_srli_epi32(_mm512_add_epi32(b, r), 16);
            _mm256_storeu_si256((__m256i *)(o + c + 16 * i), _mm512_cvtepi32_epi16(b));
        }
    }
#endif
    for (; c < K; c++) {
        int64_t j = c % 64;
        uint8_t b = p[c / 64 * 32 + (j & 31)];
        o[c] = tc_f2bf((float)((j < 32 ? b & 15 : b >> 4) - 8) * tc_h2f(s[c / TC_Q4G]));
    }
}
#endif /* TC_NATIVE_Q4_H */
