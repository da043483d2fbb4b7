/* tinychat's attention of one q head (or one K/V group's heads) against its keys, the kernels native.c's decode
   (tc_attn) and prefill (tc_prefill_attn) attention share; included by native.c.

   attend_one: one q head against keys 0..L of K/V and the W ring slots of Kl/Vl that hold one of the last W
   positions, by the level native_simd.h decides: 16 lanes (TC_AVX512: attend_head16, and attend_grp16 for the 2-4
   heads of a group in one pass over its keys), 8 lanes (TC_AVX2, laptops: attend_grp8, 1-3 heads of a group in one
   pass, scores 4 keys at a time), or plain C (attend_head, any D). Scores, softmax (tc_exp16 / tc_exp8: the Cephes
   expf polynomial), then o = p @ [V | Vl] with the 1/sum applied once. Each level's order of products and sums is fixed,
   so a level gives the same bits whatever the threads.

   The kernels that read K/V are native_attn_kv.h's, built twice: for an fp32 cache (attend_all, attend_one, ...)
   and for an fp16 one (attend_all_h, ...: each row converted as loaded, then the same arithmetic). */
#ifndef TC_NATIVE_ATTN_H
#define TC_NATIVE_ATTN_H
#include <math.h>
#include <stdint.h>
#include "native_simd.h"
#include "native_f16.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(TC_AVX512)
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

/* The group sizes with a specialized pass (D = 64: nv = 4); 1 elsewhere. */
static int64_t grp16_size(int64_t rep, int64_t D) {
    if (D != 64) return 1;
    return rep % 4 == 0 ? 4 : rep % 3 == 0 ? 3 : rep % 2 == 0 ? 2 : 1;
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

/* The heads of a K/V group that share one pass (attend_grp8): up to 3. */
static int64_t grp8_size(int64_t rep) { return rep % 3 == 0 ? 3 : rep % 2 == 0 ? 2 : 1; }

#endif

#define TC_KV_F16 0
#include "native_attn_kv.h"
#undef TC_KV_F16
#define TC_KV_F16 1
#include "native_attn_kv.h"
#undef TC_KV_F16

#endif /* TC_NATIVE_ATTN_H */
