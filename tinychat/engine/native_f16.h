/* IEEE fp16 <-> fp32 for the fp16 K/V cache (native_attn_kv.h, native_llama.h) and the int4 scales (native_q4.h), by
   the level native_simd.h decides: F16C / AVX-512 (vcvtph2ps, vcvtps2ph), NEON (vcvt_f32_f16, vcvt_f16_f32), else
   plain C. fp16 -> fp32 is exact everywhere; fp32 -> fp16 rounds to nearest, ties to even, subnormals kept, on every
   path (tc_f2h_ref is the plain C one the others must equal: tests/native/kv16_harness.c), as torch's .half(). */
#ifndef TC_NATIVE_F16_H
#define TC_NATIVE_F16_H
#include <stdint.h>
#include <string.h>
#include "native_simd.h"

/* fp16 bits to float, exact (subnormals, inf and NaN included): the plain C conversion every path can use */
static inline float tc_h2f_ref(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, b;
    float f;
    if (e == 0) {
        f = (float)m * 5.9604644775390625e-8f;     /* m * 2^-24: exact */
        memcpy(&b, &f, 4);
        b |= s;
    } else if (e == 31) {
        b = s | 0x7f800000u | (m << 13);
    } else {
        b = s | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &b, 4);
    return f;
}

/* float to fp16 bits, round to nearest even (F. Giesen's float_to_half_fast3_rtne): at or above 2^16 inf (NaN stays
   a quiet NaN), below 2^-14 the subnormal grid by one float addition (the FPU's own tie to even), else the
   exponent rebiased and the 13 dropped bits rounded with the carry into the exponent (65520 -> inf). */
static inline uint16_t tc_f2h_ref(float f) {
    uint32_t x, a;
    memcpy(&x, &f, 4);
    uint16_t s = (uint16_t)((x >> 16) & 0x8000);
    a = x & 0x7fffffffu;
    if (a >= 0x47800000u)
        return (uint16_t)(s | (a > 0x7f800000u ? 0x7e00 | ((a >> 13) & 0x3ff) : 0x7c00));
    if (a < 0x38800000u) {
        float t;
        memcpy(&t, &a, 4);
        t += 0.5f;                                  /* 2^-1: its ulp is 2^-24, fp16's subnormal step */
        memcpy(&a, &t, 4);
        return (uint16_t)(s | (a - 0x3f000000u));
    }
    a += 0xc8000fffu + ((a >> 13) & 1);             /* (15 - 127) << 23, then round half to even */
    return (uint16_t)(s | (a >> 13));
}

#if defined(TC_F16C)
static inline float tc_h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t tc_f2h(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
#else
static inline float tc_h2f(uint16_t h) { return tc_h2f_ref(h); }
static inline uint16_t tc_f2h(float f) { return tc_f2h_ref(f); }
#endif

#if defined(TC_AVX512)
/* 16 fp16 values (32 bytes at p) as floats */
static inline __m512 tc_ld16h(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
#endif
#if defined(TC_AVX2)
/* 8 fp16 values (16 bytes at p) as floats */
static inline __m256 tc_ld8h(const uint16_t *p) {
#if defined(TC_F16C)
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = tc_h2f_ref(p[i]);
    return _mm256_loadu_ps(t);
#endif
}
#endif

/* dst[i] = src[i] as floats (exact) */
static inline void tc_h2f_row(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
#if defined(TC_AVX512)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, tc_ld16h(src + i));
#endif
#if defined(TC_AVX2)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, tc_ld8h(src + i));
#endif
#if defined(TC_NEON)
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(src + i))));
#endif
    for (; i < n; i++) dst[i] = tc_h2f(src[i]);
}

/* dst[i] = src[i] rounded to fp16 (to nearest, ties to even) */
static inline void tc_f2h_row(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
#if defined(TC_AVX512)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
#if defined(TC_F16C)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
#if defined(TC_NEON)
    for (; i + 4 <= n; i += 4) vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
#endif
    for (; i < n; i++) dst[i] = tc_f2h(src[i]);
}

#endif /* TC_NATIVE_F16_H */
