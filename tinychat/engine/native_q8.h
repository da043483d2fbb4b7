/* tinychat int8 GEMV kernels (included by native.c; tests/native/q8_harness.c tests them alone, also built for
   aarch64 and run under qemu).

   y[n] (+)= s[n] * sum_b sx[b] * dot(xq[b], q[n, b])      int8 weights with one scale per row (s), activations
   rounded to int8 in blocks of 32 with one fp32 scale per block (sx[b] = max|x[b]| / 127, as llama.cpp's Q8_0
   activations), the 32-wide dots exact in int32, scaled and summed in fp32.

   The activation vector is quantized once per call into a scratch of tc_act_bytes(K) (tc_act8):
     q: int8, K rounded up to 64, zero past K;
     s: fp32 per 4 columns (lane j = sx[j / 8]: the layout of a dot-product register's int32 lanes);
     c: int32 per 4 columns, -128 * (xq[4j] + ... + xq[4j + 3]) (the GEMM's correction, native_gemm.h);
     r, gc, gs: the int4 GEMV's super-block copies (native_q4_layout.h's tc_act_sb; set only where it runs).
   The dot products, by the level native_simd.h decides (TC_512, TC_256, TC_NEON or none):
     TC_512       vpdpbusd zmm, 64 multiply-adds an instruction. vpdpbusd multiplies unsigned by signed bytes, so
                  the GEMV feeds it |xq| against q with xq's sign (a masked negate; both within +-127, so exact);
     TC_256       32 columns a step: vpdpbusd ymm (TC_256_VNNI; vpsignb applies the sign), or vpmaddubsw(|xq|,
                  sign(q, xq)) + vpmaddwd (|xq| <= 127: the int16 pair sums do not saturate): the same int32 dots;
     TC_NEON      sdot (vdotq_s32), signed by signed, or vmull_s8 + vpadal without the dot-product extension;
     none         the reference: per block an int32 dot, times the block scale, summed in fp32. */
#ifndef TC_NATIVE_Q8_H
#define TC_NATIVE_Q8_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "native_simd.h"

#define TC_QB 32                                   /* activation block (columns per scale) */

typedef struct {
    int8_t *q;
    float *s;
    int32_t *c;
    int8_t *r;
    int32_t *gc;
    float *gs;
} tc_act8;

static inline int64_t tc_pad64(int64_t K) { return (K + 63) & ~(int64_t)63; }

/* bytes of one of tc_act_sb's per-group arrays (Kp / 32 int32 or fp32), rounded up to 64 */
static inline int64_t tc_act_group_bytes(int64_t Kp) { return (Kp / 8 + 63) & ~(int64_t)63; }

/* bytes of activation scratch for K columns (64 of them spare for alignment): q, s, c, then tc_act_sb's copies (r:
   Kp bytes, gc and gs) */
int64_t tc_act_bytes(int64_t K) { return 4 * tc_pad64(K) + 2 * tc_act_group_bytes(tc_pad64(K)) + 64; }

static inline tc_act8 tc_act_view(void *buf, int64_t K) {
    int64_t Kp = tc_pad64(K);
    int8_t *b = (int8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    tc_act8 a = {b, (float *)(b + Kp), (int32_t *)(b + 2 * Kp), NULL, NULL, NULL};
    return a;
}

#if defined(TC_AVX2)
/* One full block of 32 on AVX2 (also the AVX-512 builds' quantizer): the scalar loop's exact operations (the max,
   r = 127 / max, x * r rounded by the 1.5 * 2^23 trick), 8 lanes at a time; the -128 * group sums by vpmaddubsw.
   Returns 0 when the block holds inf / NaN or is all zero (the scalar loop handles those). */
static inline int tc_quant_block_avx2(const float *xb, int8_t *qb, float *s, int32_t *c) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
           v3 = _mm256_loadu_ps(xb + 24);
    __m256 un = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(v0, v0, _CMP_UNORD_Q), _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q)),
                             _mm256_or_ps(_mm256_cmp_ps(v2, v2, _CMP_UNORD_Q), _mm256_cmp_ps(v3, v3, _CMP_UNORD_Q)));
    __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float m = _mm_cvtss_f32(h);
    if (_mm256_movemask_ps(un) || !(m > 0.f) || !(m <= 3.4028234663852886e38f)) return 0;
    const __m256 rv = _mm256_set1_ps(127.f / m), magic = _mm256_set1_ps(12582912.0f);
#define TC_RND(v) _mm256_cvtps_epi32(_mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, rv), magic), magic))
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(TC_RND(v0), TC_RND(v1)), _mm256_packs_epi32(TC_RND(v2), TC_RND(v3)));
#undef TC_RND
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)qb, p);
    __m256i g = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
    _mm256_storeu_si256((__m256i *)c, _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(g, 7)));
    _mm256_storeu_ps(s, _mm256_set1_ps(m / 127.f));
    return 1;
}
#endif

/* Quantizes x (K floats) into buf: per block of 32, sx = max|x| / 127 and xq = round-half-even(x * (127 / max))
   (the same bits on every path: the rounding is the 1.5 * 2^23 trick, no library call). An all-zero block gets
   scale 0; a block holding inf or NaN gets scale NaN (the products it feeds come out NaN, as fp32 math would). */
static tc_act8 tc_quant8(const float *x, void *buf, int64_t K) {
    tc_act8 a = tc_act_view(buf, K);
    int64_t Kp = tc_pad64(K);
    const float magic = 12582912.0f;               /* 1.5 * 2^23: v + magic - magic rounds |v| < 2^22 to even */
    for (int64_t b0 = 0; b0 < Kp; b0 += TC_QB) {
        int64_t n = K - b0 < TC_QB ? (K - b0 > 0 ? K - b0 : 0) : TC_QB;
        const float *xb = x + b0;
#if defined(TC_AVX2)
        if (n == TC_QB && tc_quant_block_avx2(xb, a.q + b0, a.s + b0 / 4, a.c + b0 / 4)) continue;
#endif
        float m = 0.f;
        int bad = 0;
        for (int64_t k = 0; k < n; k++) {
            float v = fabsf(xb[k]);
            bad |= !(v <= 3.4028234663852886e38f);   /* inf or NaN */
            m = v > m ? v : m;
        }
        int8_t *qb = a.q + b0;
        float sx;
        if (bad || !(m > 0.f)) {
            memset(qb, 0, TC_QB);
            sx = bad ? NAN : 0.f;
        } else {
            float r = 127.f / m;
            for (int64_t k = 0; k < n; k++) {
                float t = xb[k] * r;          /* built with -ffp-contract=off: no fused multiply-add here */
                qb[k] = (int8_t)(int32_t)((t + magic) - magic);
            }
            for (int64_t k = n; k < TC_QB; k++) qb[k] = 0;
            sx = m / 127.f;
        }
        for (int64_t j = 0; j < TC_QB / 4; j++) {
            int32_t t = qb[4 * j] + qb[4 * j + 1] + qb[4 * j + 2] + qb[4 * j + 3];
            a.s[b0 / 4 + j] = sx;
            a.c[b0 / 4 + j] = -128 * t;
        }
    }
    return a;
}

/* The reference dot of one row: per block an exact int32 dot, times the block's scale, summed in fp32. */
static inline float tc_dot_ref(const tc_act8 *a, const int8_t *q, int64_t K) {
    float f = 0.f;
    for (int64_t b0 = 0; b0 < K; b0 += TC_QB) {
        int64_t e = b0 + TC_QB < K ? b0 + TC_QB : K;
        int32_t d = 0;
        for (int64_t k = b0; k < e; k++) d += (int32_t)a->q[k] * (int32_t)q[k];
        f += (float)d * a->s[b0 / 4];
    }
    return f;
}

/* Software prefetch of the weights TC_PF_AHEAD bytes ahead of a four-row group's read position (the group's rows
   are contiguous: at column k its reads are ~4k bytes in), 256 bytes a step. The hardware prefetchers lose track at
   every row group (four streams of K bytes, K apart); with this the 4-row GEMV streams faster from DRAM / L3
   (docs/benchmarks.md, "Kernel figures moved out of the sources"). Past the end of a matrix it touches the next
   one: prefetches never fault. */
#define TC_PF_AHEAD 16384
#if defined(TC_AVX2)
static inline void tc_prefetch4(const int8_t *p) {
    _mm_prefetch((const char *)(p + TC_PF_AHEAD), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + TC_PF_AHEAD + 64), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + TC_PF_AHEAD + 128), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + TC_PF_AHEAD + 192), _MM_HINT_T0);
}
#elif defined(__GNUC__)
static inline void tc_prefetch4(const int8_t *p) {
    for (int i = 0; i < 4; i++) __builtin_prefetch(p + TC_PF_AHEAD + 64 * i);
}
#else
static inline void tc_prefetch4(const int8_t *p) { (void)p; }
#endif

#if defined(TC_512)
/* int32 lanes of one 64-column chunk, |xq| . (q with xq's sign): vpdpbusd takes unsigned by signed bytes, and
   |xq| <= 127, |q| <= 127, so the dot is exact. ng: the lanes where xq < 0 (a row's q negated there). Against
   (q + 128) . xq - 128 * sum(xq) (the GEMM's form) it reads no correction terms: the same int32 dots, streamed
   faster (docs/benchmarks.md, "The GEMV without correction terms"). */
#define TC_DOTZ(W, AX, NG) _mm512_dpbusd_epi32(_mm512_setzero_si512(), AX, _mm512_mask_sub_epi8(W, NG, _mm512_setzero_si512(), W))

/* Four rows: four weight streams, each activation chunk (64 columns and their scales) loaded once. */
static inline void tc_dot4(const tc_act8 *a, const int8_t *q, int64_t K, float *out) {
    const int8_t *q0 = q, *q1 = q + K, *q2 = q + 2 * K, *q3 = q + 3 * K;
    __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps(), f2 = _mm512_setzero_ps(), f3 = _mm512_setzero_ps();
    int64_t k = 0;
#define TC_STEP4(L0, L1, L2, L3)                                                                \
    {                                                                                           \
        __m512i xv = _mm512_load_si512((const void *)(a->q + k));                               \
        __m512i ax = _mm512_abs_epi8(xv);                                                       \
        __mmask64 ng = _mm512_movepi8_mask(xv);                                                 \
        __m512 sv = _mm512_load_ps(a->s + k / 4);                                               \
        __m512i w0 = L0, w1 = L1, w2 = L2, w3 = L3;                                             \
        f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(TC_DOTZ(w0, ax, ng)), sv, f0);                  \
        f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(TC_DOTZ(w1, ax, ng)), sv, f1);                  \
        f2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(TC_DOTZ(w2, ax, ng)), sv, f2);                  \
        f3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(TC_DOTZ(w3, ax, ng)), sv, f3);                  \
    }
    for (; k + 64 <= K; k += 64) {
        tc_prefetch4(q0 + 4 * k);
        TC_STEP4(_mm512_loadu_si512((const void *)(q0 + k)), _mm512_loadu_si512((const void *)(q1 + k)),
                 _mm512_loadu_si512((const void *)(q2 + k)), _mm512_loadu_si512((const void *)(q3 + k)))
    }
    if (k < K) {                                   /* the last columns: masked loads (nothing read past a row) */
        __mmask64 t = (__mmask64)(~0ULL >> (64 - (K - k)));
        TC_STEP4(_mm512_maskz_loadu_epi8(t, q0 + k), _mm512_maskz_loadu_epi8(t, q1 + k),
                 _mm512_maskz_loadu_epi8(t, q2 + k), _mm512_maskz_loadu_epi8(t, q3 + k))
    }
#undef TC_STEP4
    out[0] = tc_hsum16(f0), out[1] = tc_hsum16(f1);
    out[2] = tc_hsum16(f2), out[3] = tc_hsum16(f3);
}

static inline float tc_dot1(const tc_act8 *a, const int8_t *q, int64_t K) {
    __m512 f = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 64) {
        __mmask64 t = K - k >= 64 ? ~0ULL : (__mmask64)(~0ULL >> (64 - (K - k)));
        __m512i xv = _mm512_load_si512((const void *)(a->q + k));
        __m512i i = TC_DOTZ(_mm512_maskz_loadu_epi8(t, q + k), _mm512_abs_epi8(xv), _mm512_movepi8_mask(xv));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_load_ps(a->s + k / 4), f);
    }
    return tc_hsum16(f);
}

#elif defined(TC_256)
#if defined(TC_256_VNNI)
/* int32 lanes of one 32-column block: |xq| . sign(q, xq), exact (the AVX-512 path's form) */
#define TC_BLK256(W, XV, AX) TC_DP256(_mm256_setzero_si256(), AX, _mm256_sign_epi8(W, XV))
#else
/* |xq| . sign(q, xq) in int16 pairs, then pairs of those into int32 */
#define TC_BLK256(W, XV, AX) \
    _mm256_madd_epi16(_mm256_maddubs_epi16(AX, _mm256_sign_epi8(W, XV)), _mm256_set1_epi16(1))
#endif

/* Four rows, 32 columns a step; the columns past the last full block: the reference's per-block sum. */
static inline void tc_dot4(const tc_act8 *a, const int8_t *q, int64_t K, float *out) {
    const int8_t *q0 = q, *q1 = q + K, *q2 = q + 2 * K, *q3 = q + 3 * K;
    __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps(), f2 = _mm256_setzero_ps(), f3 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (!(k & 32)) tc_prefetch4(q0 + 4 * k);
        __m256i xv = _mm256_load_si256((const __m256i *)(a->q + k));
        __m256i ax = _mm256_abs_epi8(xv);
        __m256 sv = _mm256_load_ps(a->s + k / 4);
        __m256i i0 = TC_BLK256(_mm256_loadu_si256((const __m256i *)(q0 + k)), xv, ax);
        __m256i i1 = TC_BLK256(_mm256_loadu_si256((const __m256i *)(q1 + k)), xv, ax);
        __m256i i2 = TC_BLK256(_mm256_loadu_si256((const __m256i *)(q2 + k)), xv, ax);
        __m256i i3 = TC_BLK256(_mm256_loadu_si256((const __m256i *)(q3 + k)), xv, ax);
        f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), sv, f0);
        f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), sv, f1);
        f2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i2), sv, f2);
        f3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i3), sv, f3);
    }
    out[0] = tc_hsum8(f0), out[1] = tc_hsum8(f1), out[2] = tc_hsum8(f2), out[3] = tc_hsum8(f3);
    if (k < K) {
        tc_act8 t = {a->q + k, a->s + k / 4, a->c + k / 4};
        for (int r = 0; r < 4; r++) out[r] += tc_dot_ref(&t, q + r * K + k, K - k);
    }
}

static inline float tc_dot1(const tc_act8 *a, const int8_t *q, int64_t K) {
    __m256 f = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m256i xv = _mm256_load_si256((const __m256i *)(a->q + k));
        __m256i ax = _mm256_abs_epi8(xv);
        __m256i i = TC_BLK256(_mm256_loadu_si256((const __m256i *)(q + k)), xv, ax);
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_load_ps(a->s + k / 4), f);
    }
    float r = tc_hsum8(f);
    if (k < K) {
        tc_act8 t = {a->q + k, a->s + k / 4, a->c + k / 4};
        r += tc_dot_ref(&t, q + k, K - k);
    }
    return r;
}

#elif defined(TC_NEON)
/* int32 lanes of one 32-column block (signed by signed) */
static inline int32x4_t tc_blk_neon(const int8_t *w, const int8_t *x) {
    int8x16_t w0 = vld1q_s8(w), w1 = vld1q_s8(w + 16), x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
#if defined(TC_NEON_DOT)
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, x0), w1, x1);
#else
    int16x8_t p0 = vmlal_high_s8(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)), w0, x0);   /* |.| <= 2 * 127^2 */
    int16x8_t p1 = vmlal_high_s8(vmull_s8(vget_low_s8(w1), vget_low_s8(x1)), w1, x1);
    return vpadalq_s16(vpaddlq_s16(p0), p1);
#endif
}

static inline float tc_dot1(const tc_act8 *a, const int8_t *q, int64_t K) {
    float32x4_t f = vdupq_n_f32(0.f);
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) f = vfmaq_n_f32(f, vcvtq_f32_s32(tc_blk_neon(q + k, a->q + k)), a->s[k / 4]);
    float r = vaddvq_f32(f);
    if (k < K) {
        tc_act8 t = {a->q + k, a->s + k / 4, a->c + k / 4};
        r += tc_dot_ref(&t, q + k, K - k);
    }
    return r;
}

static inline void tc_dot4(const tc_act8 *a, const int8_t *q, int64_t K, float *out) {
    float32x4_t f0 = vdupq_n_f32(0.f), f1 = f0, f2 = f0, f3 = f0;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        if (!(k & 32)) tc_prefetch4(q + 4 * k);
        float s = a->s[k / 4];
        f0 = vfmaq_n_f32(f0, vcvtq_f32_s32(tc_blk_neon(q + k, a->q + k)), s);
        f1 = vfmaq_n_f32(f1, vcvtq_f32_s32(tc_blk_neon(q + K + k, a->q + k)), s);
        f2 = vfmaq_n_f32(f2, vcvtq_f32_s32(tc_blk_neon(q + 2 * K + k, a->q + k)), s);
        f3 = vfmaq_n_f32(f3, vcvtq_f32_s32(tc_blk_neon(q + 3 * K + k, a->q + k)), s);
    }
    out[0] = vaddvq_f32(f0), out[1] = vaddvq_f32(f1), out[2] = vaddvq_f32(f2), out[3] = vaddvq_f32(f3);
    if (k < K) {
        tc_act8 t = {a->q + k, a->s + k / 4, a->c + k / 4};
        for (int r = 0; r < 4; r++) out[r] += tc_dot_ref(&t, q + r * K + k, K - k);
    }
}

#else
static inline float tc_dot1(const tc_act8 *a, const int8_t *q, int64_t K) { return tc_dot_ref(a, q, K); }

static inline void tc_dot4(const tc_act8 *a, const int8_t *q, int64_t K, float *out) {
    for (int r = 0; r < 4; r++) out[r] = tc_dot_ref(a, q + r * K, K);
}
#endif

/* Rows [0, N) of y (+)= s * (q @ x), split over the threads of the enclosing parallel region (no barrier). */
static void gemv_rows(const tc_act8 *a, const int8_t *q, const float *s, float *y, int64_t N, int64_t K, int acc) {
    int64_t nb = N / 4;
#ifdef _OPENMP
#pragma omp for schedule(static) nowait
#endif
    for (int64_t b = 0; b < nb; b++) {
        float d[4];
        int64_t n = 4 * b;
        tc_dot4(a, q + n * K, K, d);
        for (int r = 0; r < 4; r++) {
            float v = s[n + r] * d[r];
            y[n + r] = acc ? y[n + r] + v : v;
        }
    }
#ifdef _OPENMP
#pragma omp single nowait
#endif
    for (int64_t n = 4 * nb; n < N; n++) {
        float v = s[n] * tc_dot1(a, q + n * K, K);
        y[n] = acc ? y[n] + v : v;
    }
}

/* The reference GEMV (one thread, tc_dot_ref), for the tests and the harness. */
void tc_gemv_ref(const float *x, void *xq, const int8_t *q, const float *s, float *y, int64_t N, int64_t K, int acc) {
    tc_act8 a = tc_quant8(x, xq, K);
    for (int64_t n = 0; n < N; n++) {
        float v = s[n] * tc_dot_ref(&a, q + n * K, K);
        y[n] = acc ? y[n] + v : v;
    }
}

/* A plain read of n bytes (their byte sum, so nothing is optimized away): the memory system's rate for the bytes a
   GEMV streams, the yardstick of tests/perf/gemv_stream.py. */
int64_t tc_read_bytes(const int8_t *p, int64_t n) {
    int64_t k = 0, t = 0;
#if defined(TC_512)
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    const __m512i one = _mm512_set1_epi8(1);
    for (; k + 256 <= n; k += 256) {   /* vpdpbusd(1, p): the bytes summed into int32 lanes, one op per 64 bytes */
        a0 = _mm512_dpbusd_epi32(a0, one, _mm512_loadu_si512((const void *)(p + k)));
        a1 = _mm512_dpbusd_epi32(a1, one, _mm512_loadu_si512((const void *)(p + k + 64)));
        a2 = _mm512_dpbusd_epi32(a2, one, _mm512_loadu_si512((const void *)(p + k + 128)));
        a3 = _mm512_dpbusd_epi32(a3, one, _mm512_loadu_si512((const void *)(p + k + 192)));
    }
    t = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
#elif defined(TC_AVX2)
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (; k + 64 <= n; k += 64) {     /* vpsadbw: the bytes (as unsigned) summed into int64 lanes */
        a0 = _mm256_add_epi64(a0, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(p + k)), _mm256_setzero_si256()));
        a1 = _mm256_add_epi64(a1, _mm256_sad_epu8(_mm256_loadu_si256((const __m256i *)(p + k + 32)),
                                                  _mm256_setzero_si256()));
    }
    a0 = _mm256_add_epi64(a0, a1);
    t = _mm256_extract_epi64(a0, 0) + _mm256_extract_epi64(a0, 1) + _mm256_extract_epi64(a0, 2) +
        _mm256_extract_epi64(a0, 3);
#endif
    for (; k < n; k++) t += p[k];
    return t;
}
#endif /* TC_NATIVE_Q8_H */
