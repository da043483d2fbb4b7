/* tinychat's SIMD level, decided here once for every kernel (native_q8.h, native_gemm.h, native_attn.h, native.c,
   native_llama.h), the kernel path it is named by, and the primitives the kernels share (horizontal sums, exp, the
   16-lane dot), as ggml-cpu's simd-mappings.h does for ggml. Nothing else reads the compiler's feature macros.

   Levels (the target flags: -march=native, or TINYCHAT_NATIVE_ARCH):
     TC_AVX512   x86-64-v4's AVX-512 (F, BW, VL): the 16-lane float kernels (attention, softmax, softcap, SwiGLU)
     TC_AVX2     AVX2 + FMA (x86-64-v3); also set under TC_AVX512 (the activation quantizer, 256-bit pieces)
     TC_NEON     aarch64 NEON
     none        plain C (TC_FORCE_SCALAR forces it)
   An AVX-512 CPU without BW / VL (Xeon Phi) runs the AVX2 level.

   The int8 dot products of a level (native_q8.h's GEMV, native_gemm.h's GEMM) and the path name (TC_PATH, what
   sessions record; native.py's KERNEL_PATHS gives each its step version):
     TC_512        vpdpbusd zmm: AVX512-VNNI at the AVX-512 level                           "avx512-vnni"
     TC_256        256-bit dots: the AVX-512 level without AVX512-VNNI                      "avx512"
                                 the AVX2 level with AVX-VNNI (or AVX512-VNNI + VL)          "avx2-vnni"
                                 the AVX2 level                                             "avx2"
       TC_256_VNNI   vpdpbusd ymm where the target has it, else vpmaddubsw + vpmaddwd: exact int32 dots either way,
                     so the same bits
     TC_NEON       sdot (the dot-product extension: "neon-dotprod"), else vmull + vpadal ("neon")
     none          the scalar reference                                                     "scalar"
   A path's bits come from its dots and its level's float kernels together: "avx512" has the 256-bit dots of
   "avx2" and the 16-lane attention of "avx512-vnni", so it is a path of its own. */
#ifndef TC_NATIVE_SIMD_H
#define TC_NATIVE_SIMD_H
#include <math.h>
#include <stdint.h>

#if !defined(TC_FORCE_SCALAR) && defined(__AVX2__) && defined(__FMA__)
#define TC_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TC_AVX512 1
#endif
#elif !defined(TC_FORCE_SCALAR) && (defined(__ARM_FEATURE_DOTPROD) || (defined(__ARM_NEON) && defined(__aarch64__)))
#define TC_NEON 1
#endif

#if defined(TC_AVX2) && defined(__F16C__)
#define TC_F16C 1                /* vcvtph2ps / vcvtps2ph (every AVX2 CPU has them; x86-64-v3 includes F16C) */
#endif

#if defined(TC_AVX2)
#include <immintrin.h>
#endif
#if defined(TC_NEON)
#include <arm_neon.h>
#endif

#if defined(TC_AVX512) && defined(__AVX512VNNI__)
#define TC_PATH "avx512-vnni"
#define TC_512 1
#elif defined(TC_AVX512)
#define TC_PATH "avx512"
#define TC_256 1
#if defined(__AVXVNNI__)
#define TC_256_VNNI 1
#endif
#elif defined(TC_AVX2) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
#define TC_PATH "avx2-vnni"
#define TC_256 1
#define TC_256_VNNI 1
#elif defined(TC_AVX2)
#define TC_PATH "avx2"
#define TC_256 1
#elif defined(TC_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define TC_PATH "neon-dotprod"
#define TC_NEON_DOT 1
#elif defined(TC_NEON)
#define TC_PATH "neon"
#else
#define TC_PATH "scalar"
#endif

const char *tc_kernel_path(void) { return TC_PATH; }

#if defined(TC_256_VNNI)
#if defined(__AVXVNNI__)
#define TC_DP256(c, w, x) _mm256_dpbusd_avx_epi32(c, w, x)
#else
#define TC_DP256(c, w, x) _mm256_dpbusd_epi32(c, w, x)
#endif
#endif

#if defined(TC_AVX2)
/* The sum of 8 lanes: (l0 + l4) + (l2 + l6) + ..., the same tree in every kernel. */
static inline float tc_hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* exp16 in 8 lanes for AVX2 laptops (no scalef): the same reduction and polynomial, 2^n built in the exponent bits
   (n >= -126 after the clamp at -87, and n <= 0 for scores minus their max); below -87 it is 0, NaN stays NaN. */
static inline __m256 tc_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_NLT_UQ);
    x = _mm256_max_ps(lo, x);                                 /* NaN lanes keep their NaN (the second operand) */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}
#endif

#if defined(TC_AVX512)
/* The sum of 16 lanes (GCC's tree: lanes l + l+8, then l + l+4, l + l+2, l + l+1; dots16x16 relies on it). */
static inline float tc_hsum16(__m512 v) { return _mm512_reduce_add_ps(v); }

/* exp(x) for x <= 0 (scores minus their max), 16 lanes: Cody-Waite reduction by ln 2 and the Cephes expf
   polynomial (~1 ulp), 2^n applied with scalef; below -87 (and -inf: masked slots) it is 0, NaN stays NaN. The
   softcap and SwiGLU call it with x > 0 too (up to 88). */
static inline __m512 tc_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);
    x = _mm512_max_ps(lo, x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

/* <q, k> for q held in nv 16-lane registers and k of 16 * nv floats: a mul-fmadd chain, then tc_hsum16. */
static inline float tc_dot16(const __m512 *qv, int64_t nv, const float *k) {
    __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
    for (int64_t v = 1; v < nv; v++) a = _mm512_fmadd_ps(qv[v], _mm512_loadu_ps(k + 16 * v), a);
    return tc_hsum16(a);
}
#endif

#endif /* TC_NATIVE_SIMD_H */
