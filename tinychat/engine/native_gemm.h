/* tinychat int8 GEMM for prefill (included by native.c after native_q8.h; tests/native/q8_harness.c tests it alone,
   also built for aarch64 and run under qemu).

   Y[m, n] = s[n] * sum_b sx[m, b] * dot(xq[m, b], q[n, b]) (+ bias[n])      X: (M, K) fp32 tokens, q: (N, K) int8
   Every token's activations are rounded as the GEMV rounds one vector (native_q8.h's tc_quant8: int8 in blocks of 32,
   one fp32 scale each). So a token prefilled here gives what decoding it through the GEMV gives, up to fp32
   summation order.

   x86 and NEON paths: super-blocks. The GEMV's layout puts 4 consecutive columns in each int32 lane of a dot-product
   register, so a register holds 2 (AVX-512), 1 (AVX2) or half a block (NEON) and every step pays an int -> float
   conversion and a multiply-add by the block scales beside its integer dot. Here a super-block of TC_L blocks (TC_L:
   a register's int32 lanes; 512 columns on AVX-512, 256 on AVX2, 128 on NEON) is stored transposed by 4-byte groups:
   step j's register holds columns 32 l + 4 j .. 32 l + 4 j + 3 in lane l, so after the 8 steps of a super-block lane
   l holds block l's exact int32 dot, and one conversion and one multiply-add by the TC_L block scales finish it: 8
   integer dots per float step instead of 1. On AVX-512 a rest of >= 256 columns is a half super-block on 256-bit
   registers; a rest of at most 64 columns past that is a super-block of its own, a tile's rows in its lanes
   (TC_RESTSB), a longer one is zero-padded (TC_REST_MAX) or keeps the GEMV's layout (a float step per register). The tokens are stored so once
   per call (tc_gemm_quant: a slot of tc_gemm_slot_bytes(K) each); the weights of a TC_GR-row tile are transposed so
   (tc_gemm_pack: shuffles, VNNI: as q ^ 0x80) into a per-thread buffer once per tile and run against all of the
   thread's tokens while that buffer stays in L1 (a longer K by slabs of TC_SLAB super-blocks: tc_chunk_run); a
   tile's TC_GR x TC_GT float registers are summed across lanes in one reduction tree (tc_hsum8x). On x86 that beats
   the GEMV's layout at every level, least on plain AVX2 (still two multiplies a block; docs/benchmarks.md, "The int8
   prefill GEMM by super-blocks").
   NEON (sdot, or vmull + pairwise adds without the dot-product extension) is checked under qemu only: its speed
   on ARM hardware is not measured yet. Scalar: each (row, token) pair through the GEMV's one-row dot.

   Work split: jobs are (chunk of <= TC_GM tokens, row tile) pairs, split over threads in contiguous runs; a thread
   runs its row tiles in order, each packed once and run against every chunk of its run. The int8 GEMM orders the
   jobs chunk-major (whole chunks per thread when there are several, row tiles of one chunk otherwise; chunks of
   equal size, their count a multiple of the threads: 200 tokens on 2 threads are 4 chunks of 50, not 64, 64, 64,
   8); the int4 one row-major (tc_job_chunks: whole row tiles per thread, so each tile is unpacked and packed by
   one thread, not by every thread for its own tokens). Each output is the same whatever the chunking, order and
   threads: a register tile's tokens never mix, and the summation order is fixed by K alone. Row and token
   remainders run the full tile on a repeated row / token and store only the real ones. */
#ifndef TC_NATIVE_GEMM_H
#define TC_NATIVE_GEMM_H
#include "native_q8.h"

#ifndef TC_GM
#define TC_GM 64                                   /* tokens per chunk */
#endif

#if defined(TC_512) || defined(TC_256) || defined(TC_NEON)
#if defined(TC_512)
#define TC_L 16                                    /* int32 lanes of a register = blocks per super-block */
#define TC_HALF 1                                  /* a half super-block (8 blocks) on 256-bit registers */
#elif defined(TC_256)
#define TC_L 8
#define TC_HALF 0
#else
#define TC_L 4                                     /* NEON: 128-bit registers, super-blocks of 128 columns */
#define TC_HALF 0
#endif
#ifndef TC_GR
#if defined(TC_512)
#define TC_GR 8                                    /* weight rows per register tile */
#else
#define TC_GR 4
#endif
#endif
#ifndef TC_GT
#if defined(TC_512)
#define TC_GT 1                                    /* tokens per register tile */
#else
#define TC_GT 2
#endif
#endif
#define TC_VB (4 * TC_L)                           /* bytes of a register */
#define TC_SBC (TC_QB * TC_L)                      /* columns of a super-block */

/* K's split (columns): nsb super-blocks, then (TC_HALF) hsb = 0 or 1 half super-block of 256 columns, then the
   rest (< 256 or < TC_SBC columns) in the GEMV's layout, rounded up to whole registers: rp bytes. Bytes: slot, a
   token's; pack, a row tile's. */
#ifndef TC_SLAB_BYTES
#define TC_SLAB_BYTES 16384                        /* a row tile's packed bytes a token tile runs at a time */
#endif
#define TC_SLAB (TC_SLAB_BYTES / (TC_GR * TC_SBC)) /* super-blocks of a K slab: 4 on AVX-512, 16 on AVX2 */
/* a chunk's token tiles' float accumulators between slabs (a chunk: at most TC_GM + TC_GT - 1 tokens) */
#define TC_FB_BYTES (((TC_GM + TC_GT - 1) / TC_GT + 1) * TC_GR * TC_GT * TC_VB)
/* The most columns left past the super-blocks in the GEMV's layout: a longer rest is zero-padded up to the next half or
   whole super-block instead. A rest register pays a float step per row and token where a super-block pays one per 8
   dots: on VNNI a super-block of zeros costs less than 128 such columns (200 tokens x 2,048 rows, 1 thread, Zen 4:
   K = 384 2.3 -> 1.7 ms padded to 512, 896 3.4 -> 3.25 ms, 960 3.9 -> 3.25 ms); without VNNI (two multiplies a
   step) only past 128 (896 padded: 6.8 -> 7.1 ms; 960: 7.4 -> 7.1 ms). NEON: not measured on hardware, not padded. */
#ifndef TC_REST_MAX
#if defined(TC_NEON)
#define TC_REST_MAX TC_SBC
#elif defined(TC_512) || defined(TC_256_VNNI)
#define TC_REST_MAX 64
#else
#define TC_REST_MAX 128
#endif
#endif
/* A rest of <= 64 columns (2 blocks) past the super-blocks runs as one super-block of its own where a tile's rows
   fill a register's lanes twice (AVX-512: 8 rows, 16 lanes; AVX2: 4 rows, 8 lanes): lane 2 r + b holds row r's
   block b, so 8 integer dots and one float step cover the tile's rows, where the GEMV's layout paid a float step per
   row and register (SmolLM2-135M's K = 576, 200 tokens x 3,072 rows, 1 thread, Zen 4 AVX-512: the 64-column rest
   took 27 % of the time). The token's slot holds the rest's 2 blocks placed in every row's lanes; tc_geo's rsb. */
#if (defined(TC_512) && TC_GR == 8 && TC_GT == 1) || (defined(TC_256) && TC_GR == 4 && TC_GT == 2)
#define TC_RESTSB 1
#else
#define TC_RESTSB 0
#endif
typedef struct {
    int64_t nsb, hsb, r0, rp, rsb, slot, tile, pack;    /* rsb: the rest (rp = 64) as a super-block (TC_RESTSB) */
} tc_geo;

static inline tc_geo tc_gemm_geo(int64_t K) {
    tc_geo g;
    g.nsb = K / TC_SBC;
    g.hsb = TC_HALF && K - g.nsb * TC_SBC >= 8 * TC_QB;
    if (K - g.nsb * TC_SBC - g.hsb * 8 * TC_QB > TC_REST_MAX) {   /* padded: r0 may pass K (zeros there) */
        if (TC_HALF && !g.hsb)
            g.hsb = 1;
        else
            g.nsb++, g.hsb = 0;
    }
    g.r0 = g.nsb * TC_SBC + g.hsb * 8 * TC_QB;
    g.rp = K > g.r0 ? (K - g.r0 + TC_VB - 1) / TC_VB * TC_VB : 0;
    g.rsb = TC_RESTSB && K > g.r0 && K - g.r0 <= 64;
    if (g.rsb) g.rp = 64;
    g.slot = (g.nsb * 40 * TC_L + g.hsb * 320 + (g.rsb ? 40 * TC_L : 3 * g.rp) + 63) & ~(int64_t)63;
    g.tile = (TC_GR * (g.r0 + g.rp) + 63) & ~(int64_t)63;
    g.pack = g.tile + (g.nsb > TC_SLAB ? TC_FB_BYTES : 0);
    return g;
}
/* A token's slot: per super-block of L lanes (L = TC_L; 8 for the half one) 8 step registers (lane l of step j:
   the block's columns 4 j .. 4 j + 3), L block scales (fp32), L corrections (int32, -128 * the block's sum); then
   the rest: rp bytes of int8, rp / 4 fp32 lane scales, rp / 4 int32 lane corrections (native_q8.h's tc_act8). */
static inline int64_t tc_gemm_slot_bytes(int64_t K) { return tc_gemm_geo(K).slot; }
/* A row tile's packed weights: per super-block, per step, per row one register of the slots' order; then per
   rest step, per row, one register of the row's columns (zero past K). VNNI builds store q ^ 0x80 (unsigned). Past
   more than TC_SLAB super-blocks, then the float accumulators of a chunk's token tiles (TC_FB_BYTES, tc_chunk_run). */
static inline int64_t tc_gemm_pack_bytes(int64_t K) { return tc_gemm_geo(K).pack; }
#else
#ifndef TC_GR
#define TC_GR 4
#endif
#ifndef TC_GT
#define TC_GT 2
#endif
static inline int64_t tc_gemm_slot_bytes(int64_t K) { return 3 * tc_pad64(K); }   /* a tc_act8 */
static inline int64_t tc_gemm_pack_bytes(int64_t K) { (void)K; return 0; }
#endif

/* Bytes of scratch for M tokens of K columns on up to nt threads: per thread a row tile's packed weights, then the
   tokens' slots (64 spare for alignment). */
int64_t tc_gemm_act_bytes(int64_t M, int64_t K, int nt) {
    return (nt > 0 ? nt : 1) * tc_gemm_pack_bytes(K) + tc_gemm_slot_bytes(K) * (M > 0 ? M : 1) + 64;
}

static inline int8_t *tc_gemm_base(void *buf) { return (int8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63); }
static inline int8_t *tc_gemm_slot(void *buf, int64_t K, int64_t m, int nt) {
    return tc_gemm_base(buf) + nt * tc_gemm_pack_bytes(K) + tc_gemm_slot_bytes(K) * m;
}

/* A tile's outputs, rows n0 .. and tokens m .. (those below N and m1), into y: times the row scales s (NULL: none),
   plus bias (NULL: none). */
static inline __attribute__((always_inline)) void tc_tile_store(float out[TC_GR][TC_GT], const float *s,
                                                                const float *bias, float *y, int64_t N, int64_t n0,
                                                                int64_t m, int64_t m1) {
#if defined(TC_512) && TC_GR == 8 && TC_GT == 1
    if (s && n0 + 8 <= N) {                            /* a whole tile: scale (+ bias) and store at once */
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + n0), _mm256_loadu_ps(&out[0][0]));
        if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n0));
        _mm256_storeu_ps(y + m * N + n0, v);
        return;
    }
#endif
    for (int t = 0; t < TC_GT && m + t < m1; t++)
        for (int r = 0; r < TC_GR && n0 + r < N; r++) {
            int64_t n = n0 + r;
            float v = s ? s[n] * out[r][t] : out[r][t];
            y[(m + t) * N + n] = bias ? v + bias[n] : v;
        }
}

#if defined(TC_512) || defined(TC_256) || defined(TC_NEON)
#if defined(TC_512)
typedef __m512 tc_vf;
typedef __m512i tc_vi;
#define TC_VZERO() _mm512_setzero_ps()
#define TC_IZERO() _mm512_setzero_si512()
#define TC_LDI(p) _mm512_load_si512((const void *)(p))
#define TC_LDS(p) _mm512_load_ps(p)
#define TC_LDSU(p) _mm512_loadu_ps(p)
#define TC_MUL(A, B) _mm512_mul_ps(A, B)
#define TC_FMA(I, S, F) _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), S, F)
#define TC_HSUM(F) _mm512_reduce_add_ps(F)
#define TC_ABS(X) (X)
#define TC_ACC(C, W, X, AX) _mm512_dpbusd_epi32(C, W, X)          /* W already q ^ 0x80; C starts at the correction */
#define TC_VNNI 1
#elif defined(TC_256)
typedef __m256 tc_vf;
typedef __m256i tc_vi;
#define TC_VZERO() _mm256_setzero_ps()
#define TC_IZERO() _mm256_setzero_si256()
#define TC_LDI(p) _mm256_load_si256((const __m256i *)(p))
#define TC_LDS(p) _mm256_load_ps(p)
#define TC_LDSU(p) _mm256_loadu_ps(p)
#define TC_MUL(A, B) _mm256_mul_ps(A, B)
#define TC_FMA(I, S, F) _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), S, F)
#define TC_HSUM(F) tc_hsum8(F)
#if defined(TC_256_VNNI)
#define TC_ABS(X) (X)
#define TC_ACC(C, W, X, AX) TC_DP256(C, W, X)
#define TC_VNNI 1
#else
#define TC_ABS(X) _mm256_abs_epi8(X)
#define TC_ACC(C, W, X, AX) \
    _mm256_add_epi32(C, _mm256_madd_epi16(_mm256_maddubs_epi16(AX, _mm256_sign_epi8(W, X)), _mm256_set1_epi16(1)))
#define TC_VNNI 0
#endif
#else
typedef float32x4_t tc_vf;
typedef int32x4_t tc_vi;                           /* 16 int8 or 4 int32, by use */
#define TC_VZERO() vdupq_n_f32(0.f)
#define TC_IZERO() vdupq_n_s32(0)
#define TC_LDI(p) vld1q_s32((const int32_t *)(const void *)(p))
#define TC_LDS(p) vld1q_f32(p)
#define TC_LDSU(p) vld1q_f32(p)
#define TC_MUL(A, B) vmulq_f32(A, B)
#define TC_FMA(I, S, F) vfmaq_f32(F, vcvtq_f32_s32(I), S)
#define TC_HSUM(F) vaddvq_f32(F)
#define TC_ABS(X) (X)
#define TC_VNNI 0                                  /* signed by signed: no correction */
#if defined(TC_NEON_DOT)
#define TC_ACC(C, W, X, AX) vdotq_s32(C, vreinterpretq_s8_s32(W), vreinterpretq_s8_s32(X))
#else
/* lane i += the 4 products of bytes 4i .. 4i + 3: pairs in int16 (|.| <= 2 * 127^2), then widened pairwise */
static inline int32x4_t tc_acc_neon(int32x4_t c, int32x4_t w, int32x4_t x) {
    int8x16_t wb = vreinterpretq_s8_s32(w), xb = vreinterpretq_s8_s32(x);
    int16x8_t lo = vmull_s8(vget_low_s8(wb), vget_low_s8(xb)), hi = vmull_high_s8(wb, xb);
    return vpadalq_s16(c, vpaddq_s16(lo, hi));
}
#define TC_ACC(C, W, X, AX) tc_acc_neon(C, W, X)
#endif
#endif
#if TC_VNNI
#define TC_FLIP 0x80                               /* packed weights: q ^ 0x80 = q + 128, unsigned */
#else
#define TC_FLIP 0
#endif

/* One block's rounded activations (32 int8 q, scale sx, correction c) into lane l of a super-block of L lanes. */
static inline void tc_place(int8_t *sb, int L, int l, const int8_t *q, float sx, int32_t c) {
    for (int j = 0; j < 8; j++) memcpy(sb + 4 * (j * L + l), q + 4 * j, 4);
    memcpy(sb + 4 * (8 * L + l), &sx, 4);
    memcpy(sb + 4 * (9 * L + l), &c, 4);
}

/* Token m's activations into its slot: rounded by tc_quant8 two blocks at a time (into t, 256 bytes), then placed. */
static void tc_gemm_quant(const float *x, void *buf, int64_t m, int64_t K, int nt) {
    tc_geo g = tc_gemm_geo(K);
    int8_t *d = tc_gemm_slot(buf, K, m, nt);
    int8_t t[3 * 64 + 64] __attribute__((aligned(64)));
    const float *xm = x + m * K;
    for (int64_t b0 = 0; b0 < g.r0; b0 += 64) {
        tc_act8 a = tc_act_view(t, 64);
        if (K - b0 > 0)
            a = tc_quant8(xm + b0, t, K - b0 < 64 ? K - b0 : 64);          /* zero past K */
        else
            memset(t, 0, sizeof t);                                         /* padding: q, scales, corrections 0 */
        for (int h = 0; h < 2; h++) {
            int64_t b = b0 / TC_QB + h;                   /* the block */
            int32_t c = 0;
            for (int j = 0; j < 8; j++) c += a.c[8 * h + j];
            if (b < g.nsb * TC_L)
                tc_place(d + (b / TC_L) * 40 * TC_L, TC_L, (int)(b % TC_L), a.q + 32 * h, a.s[8 * h], c);
            else
                tc_place(d + g.nsb * 40 * TC_L, 8, (int)(b - g.nsb * TC_L), a.q + 32 * h, a.s[8 * h], c);
        }
    }
    int8_t *rq = d + g.nsb * 40 * TC_L + g.hsb * 320;
    if (g.rsb) {                                        /* the rest's 2 blocks, in every row's lanes: 2 r + b */
        tc_act8 a = tc_quant8(xm + g.r0, t, K - g.r0);
        for (int b = 0; b < 2; b++) {
            int32_t c = 0;
            for (int j = 0; j < 8; j++) c += a.c[8 * b + j];
            for (int r = 0; r < TC_L / 2; r++) tc_place(rq, TC_L, 2 * r + b, a.q + 32 * b, a.s[8 * b], c);
        }
        return;
    }
    for (int64_t o = 0; o < g.rp; o += 64) {            /* the rest: the GEMV's layout, zero past K */
        int64_t n = K - g.r0 - o < 64 ? K - g.r0 - o : 64, w = g.rp - o < 64 ? g.rp - o : 64;
        tc_act8 a = tc_quant8(xm + g.r0 + o, t, n > 0 ? n : 0);
        memcpy(rq + o, a.q, w);
        memcpy(rq + g.rp + o, a.s, w);
        memcpy(rq + 2 * g.rp + o, a.c, w);
    }
}

#if defined(TC_NEON)
/* 4 blocks' 32 bytes at p transposed into o (o + 16 j: dword j of each block). */
static inline void tc_pack4(const int8_t *p, int8_t *o) {
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 4; l++) memcpy(o + 16 * j + 4 * l, p + 32 * l + 4 * j, 4);
}
#else
/* 8 blocks' 32 bytes (rows of an 8 x 8 dword matrix, at p + 32 i) transposed into o (o + 32 j: dword j of each
   block), each byte ^ TC_FLIP. */
static inline void tc_pack8(const int8_t *p, int8_t *o) {
    __m256i r[8], t[8], s[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_si256((const __m256i *)(p + 32 * i));
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int h = 0; h < 8; h += 4) {
        s[h] = _mm256_unpacklo_epi64(t[h], t[h + 2]);
        s[h + 1] = _mm256_unpackhi_epi64(t[h], t[h + 2]);
        s[h + 2] = _mm256_unpacklo_epi64(t[h + 1], t[h + 3]);
        s[h + 3] = _mm256_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    const __m256i flip = _mm256_set1_epi8((char)TC_FLIP);
    for (int j = 0; j < 4; j++) {
        _mm256_store_si256((__m256i *)(o + 32 * j),
                           _mm256_xor_si256(_mm256_permute2x128_si256(s[j], s[j + 4], 0x20), flip));
        _mm256_store_si256((__m256i *)(o + 32 * (j + 4)),
                           _mm256_xor_si256(_mm256_permute2x128_si256(s[j], s[j + 4], 0x31), flip));
    }
}

#if defined(TC_512)
/* 16 blocks' 32 bytes at p transposed into o (o + 64 j: dword j of each block), each byte ^ TC_FLIP: each register
   of two blocks to (block 2i, 2i + 1) dword pairs, then an 8 x 8 transpose of those qwords. */
static inline void tc_pack16(const int8_t *p, int8_t *o) {
    const __m512i pair = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
    __m512i r[8], t[8], v[8];
    for (int i = 0; i < 8; i++) r[i] = _mm512_permutexvar_epi32(pair, _mm512_loadu_si512((const void *)(p + 64 * i)));
    for (int i = 0; i < 8; i += 2) {                 /* 128-bit lane k: (row i, i + 1) qwords 2k, then 2k + 1 */
        t[i] = _mm512_unpacklo_epi64(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi64(r[i], r[i + 1]);
    }
    for (int e = 0; e < 2; e++) {                    /* lanes 2h, 2h + 1 of rows 0-3 / 4-7, odd / even qwords */
        v[4 * e + 0] = _mm512_shuffle_i64x2(t[e], t[2 + e], _MM_SHUFFLE(1, 0, 1, 0));
        v[4 * e + 1] = _mm512_shuffle_i64x2(t[4 + e], t[6 + e], _MM_SHUFFLE(1, 0, 1, 0));
        v[4 * e + 2] = _mm512_shuffle_i64x2(t[e], t[2 + e], _MM_SHUFFLE(3, 2, 3, 2));
        v[4 * e + 3] = _mm512_shuffle_i64x2(t[4 + e], t[6 + e], _MM_SHUFFLE(3, 2, 3, 2));
    }
    const __m512i flip = _mm512_set1_epi8((char)TC_FLIP);
    for (int j = 0; j < 8; j++) {                    /* qword j: lane j >> 1 of the (j & 1) rows */
        int e = j & 1, h = (j >> 1) >> 1, gsel = (j >> 1) & 1;
        __m512i a = v[4 * e + 2 * h], b = v[4 * e + 2 * h + 1];
        __m512i out = gsel ? _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1))
                           : _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        _mm512_store_si512((void *)(o + 64 * j), _mm512_xor_si512(out, flip));
    }
}
#endif
#endif

/* Row r's columns [k, k + n) at p, or (passing K) a copy zero-padded to n in z. */
static inline const int8_t *tc_cols(const int8_t *row, int64_t K, int64_t k, int64_t n, int8_t *z) {
    if (k + n <= K) return row + k;
    memset(z, 0, (size_t)n);
    if (K > k) memcpy(z, row + k, (size_t)(K - k));
    return z;
}

/* A row tile's weights (rows[r], K bytes each) into pk, in the slots' order (VNNI: q ^ 0x80, unsigned). */
static void tc_gemm_pack(const int8_t *const rows[TC_GR], int64_t K, int8_t *pk) {
    tc_geo g = tc_gemm_geo(K);
    int8_t tmp[8 * 64] __attribute__((aligned(64))), z[TC_SBC];
    for (int64_t sb = 0; sb < g.nsb; sb++)
        for (int r = 0; r < TC_GR; r++) {
            const int8_t *p = tc_cols(rows[r], K, sb * TC_SBC, TC_SBC, z);
#if defined(TC_512)
            tc_pack16(p, tmp);
#elif defined(TC_256)
            tc_pack8(p, tmp);
#else
            tc_pack4(p, tmp);
#endif
            for (int j = 0; j < 8; j++) memcpy(pk + ((sb * 8 + j) * TC_GR + r) * TC_VB, tmp + j * TC_VB, TC_VB);
        }
    int8_t *ph = pk + g.nsb * 8 * TC_GR * TC_VB;
#if TC_HALF
    if (g.hsb)
        for (int r = 0; r < TC_GR; r++) {
            tc_pack8(tc_cols(rows[r], K, g.nsb * TC_SBC, 8 * TC_QB, z), tmp);
            for (int j = 0; j < 8; j++) memcpy(ph + (j * TC_GR + r) * 32, tmp + 32 * j, 32);
        }
#endif
    int8_t *pr = ph + g.hsb * 8 * TC_GR * 32;
#if TC_RESTSB
    if (g.rsb) {                                        /* lane 2 r + b: row r's block b (8 registers) */
        int8_t blk[2 * TC_GR * 32] __attribute__((aligned(64)));
        for (int r = 0; r < TC_GR; r++) memcpy(blk + 64 * r, tc_cols(rows[r], K, g.r0, 64, z), 64);
#if defined(TC_512)
        tc_pack16(blk, pr);
#else
        tc_pack8(blk, pr);
#endif
        return;
    }
#endif
    for (int64_t i = 0; i < g.rp / TC_VB; i++)
        for (int r = 0; r < TC_GR; r++) {
            int8_t *o = pr + (i * TC_GR + r) * TC_VB;
            int64_t k = g.r0 + i * TC_VB, n = K - k < TC_VB ? K - k : TC_VB;
            for (int64_t c = 0; c < TC_VB; c++) o[c] = (int8_t)((c < n ? rows[r][k + c] : 0) ^ TC_FLIP);
        }
}

/* The lane sums of 8 registers (o[i]: v[i]'s), all in the same order, in one reduction tree: per output ~3
   instructions instead of a whole horizontal sum's ~8. */
#if !defined(TC_NEON)
static inline void tc_hsum8x(const tc_vf v[8], float o[8]) {
#if defined(TC_512)
    __m512 x[4], z[2];
    for (int i = 0; i < 4; i++)                      /* 128-bit lanes 0 + 2, 1 + 3 of v[2i], v[2i + 1] */
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++)                      /* then lanes 0 + 1: lane k holds v[4i + k]'s 4 partials */
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
    __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
    w = _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(1, 0, 3, 2)));
    /* lane 4k holds v[k]'s sum (from z[0]), lane 4k + 1 v[4 + k]'s (from z[1]): gathered in order, one store */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm256_storeu_ps(o, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, w)));
#else
    __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]), c = _mm256_hadd_ps(v[4], v[5]),
           d = _mm256_hadd_ps(v[6], v[7]);
    a = _mm256_hadd_ps(a, b), c = _mm256_hadd_ps(c, d);   /* half h of v[0..3] / v[4..7] in 128-bit lane h */
    __m256 lo = _mm256_permute2f128_ps(a, c, 0x20), hi = _mm256_permute2f128_ps(a, c, 0x31);
    _mm256_storeu_ps(o, _mm256_add_ps(lo, hi));
#endif
}
#endif

/* One super-block's exact int32 block dots of a row tile (w: its packed steps) against TC_GT tokens (their
   super-block at a[t] + o), into acc. Inlined into tc_tile: a call per super-block made its accumulators go
   through memory (every vector register is caller-saved); inlined, the same bits, faster at every x86 level
   (docs/benchmarks.md, "Kernel figures moved out of the sources"). */
static inline __attribute__((always_inline)) void tc_sb_dots(const int8_t *w, const int8_t *const a[TC_GT],
                                                             int64_t o, tc_vi acc[TC_GR][TC_GT]) {
    tc_vi c[TC_GR][TC_GT];
    for (int t = 0; t < TC_GT; t++) {
        tc_vi ct = TC_VNNI ? TC_LDI(a[t] + o + 9 * TC_VB) : TC_IZERO();
        for (int r = 0; r < TC_GR; r++) c[r][t] = ct;
    }
    for (int j = 0; j < 8; j++) {
        tc_vi wv[TC_GR];
        for (int r = 0; r < TC_GR; r++) wv[r] = TC_LDI(w + (j * TC_GR + r) * TC_VB);
        for (int t = 0; t < TC_GT; t++) {
            tc_vi xv = TC_LDI(a[t] + o + j * TC_VB), ax = TC_ABS(xv);
            (void)ax;
            for (int r = 0; r < TC_GR; r++) c[r][t] = TC_ACC(c[r][t], wv[r], xv, ax);
        }
    }
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT; t++) acc[r][t] = c[r][t];
}

/* A packed row tile (pk) against TC_GT token slots (a[t]): f[r][t]'s lanes gather sum_b sx[t, b] * dot(xq[t, b],
   q[r, b]) over the blocks of super-blocks [sb0, sb1), 8 integer steps, then one float step each. wl (NULL: none):
   per row (nwl floats apart) a weight scale per lane of the layout, multiplied into the block scales (native_q4.h's
   int4 rows: one scale per block). Inlined into each caller, so the int8 GEMM's copy has no trace of it. */
static inline __attribute__((always_inline)) void tc_tile_sbs(const int8_t *pk, const int8_t *const a[TC_GT],
                                                              int64_t sb0, int64_t sb1, tc_vf f[TC_GR][TC_GT],
                                                              const float *wl, int64_t nwl) {
    for (int64_t sb = sb0; sb < sb1; sb++) {
        tc_vi acc[TC_GR][TC_GT];
        tc_sb_dots(pk + sb * 8 * TC_GR * TC_VB, a, sb * 40 * TC_L, acc);
        for (int t = 0; t < TC_GT; t++) {
            tc_vf sv = TC_LDS((const float *)(a[t] + sb * 40 * TC_L + 8 * TC_VB));
            for (int r = 0; r < TC_GR; r++)
                f[r][t] = TC_FMA(acc[r][t], wl ? TC_MUL(sv, TC_LDSU(wl + r * nwl + sb * TC_L)) : sv, f[r][t]);
        }
    }
}

/* The columns past the whole super-blocks (the half super-block, then the GEMV layout's registers) onto f, then f's
   lane sums into out[r][t]; a rest super-block (g.rsb) added to those sums (out[r][t] + (lane 2 r + lane 2 r + 1)),
   wr: its lanes' weight scales (wl's, NULL without). */
static inline __attribute__((always_inline)) void tc_tile_end(const int8_t *pk, const int8_t *const a[TC_GT], int64_t K,
                                                              tc_vf f[TC_GR][TC_GT], float out[TC_GR][TC_GT],
                                                              const float *wl, int64_t nwl, const float *wr) {
    tc_geo g = tc_gemm_geo(K);
    const int8_t *w = pk + g.nsb * 8 * TC_GR * TC_VB;
#if TC_HALF
    if (g.hsb) {                                       /* the half super-block, on 256-bit registers */
        __m256i acc[TC_GR][TC_GT];
        int64_t o = g.nsb * 40 * TC_L;
        for (int t = 0; t < TC_GT; t++) {
            __m256i c = _mm256_load_si256((const __m256i *)(a[t] + o + 288));
            for (int r = 0; r < TC_GR; r++) acc[r][t] = c;
        }
        for (int j = 0; j < 8; j++) {
            __m256i wv[TC_GR];
            for (int r = 0; r < TC_GR; r++) wv[r] = _mm256_load_si256((const __m256i *)(w + (j * TC_GR + r) * 32));
            for (int t = 0; t < TC_GT; t++) {
                __m256i xv = _mm256_load_si256((const __m256i *)(a[t] + o + 32 * j));
                for (int r = 0; r < TC_GR; r++) acc[r][t] = _mm256_dpbusd_epi32(acc[r][t], wv[r], xv);
            }
        }
        for (int t = 0; t < TC_GT; t++) {
            __m256 sv = _mm256_load_ps((const float *)(a[t] + o + 256));
            for (int r = 0; r < TC_GR; r++) {
                __m256 svr = wl ? _mm256_mul_ps(sv, _mm256_loadu_ps(wl + r * nwl + g.nsb * TC_L)) : sv;
                f[r][t] = _mm512_add_ps(f[r][t], _mm512_zextps256_ps512(
                                                     _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][t]), svr)));
            }
        }
        w += 8 * TC_GR * 32;
    }
#endif
    int64_t ro = g.nsb * 40 * TC_L + g.hsb * 320;
#if TC_RESTSB
    if (g.rsb) {
        tc_vf v[TC_GT];
        for (int t = 0; t < TC_GT; t++) {
            const int8_t *rq = a[t] + ro;
            tc_vi c = TC_VNNI ? TC_LDI(rq + 9 * TC_VB) : TC_IZERO();
            for (int j = 0; j < 8; j++) {
                tc_vi xv = TC_LDI(rq + j * TC_VB), ax = TC_ABS(xv);
                (void)ax;
                c = TC_ACC(c, TC_LDI(w + j * TC_VB), xv, ax);
            }
            tc_vf sv = TC_LDS((const float *)(rq + 8 * TC_VB));
            v[t] = TC_FMA(c, wr ? TC_MUL(sv, TC_LDSU(wr)) : sv, TC_VZERO());
        }
        tc_hsum8x((const tc_vf *)f, (float *)out);
#if defined(TC_512)                                    /* a token: lane 2 r + 2 r + 1 is row r's rest */
        __m512 p = _mm512_add_ps(v[0], _mm512_permute_ps(v[0], _MM_SHUFFLE(2, 3, 0, 1)));
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0);
        __m256 rest = _mm512_castps512_ps256(_mm512_permutexvar_ps(even, p));
#else                                                  /* 2 tokens: out[r][t] at 2 r + t */
        __m256 h = _mm256_hadd_ps(v[0], v[1]);         /* (r0 t0, r1 t0, r0 t1, r1 t1 | r2 t0, r3 t0, r2 t1, r3 t1) */
        __m256 rest = _mm256_permute_ps(h, _MM_SHUFFLE(3, 1, 2, 0));
#endif
        _mm256_storeu_ps((float *)out, _mm256_add_ps(_mm256_loadu_ps((const float *)out), rest));
        return;
    }
#endif
    (void)wr;
    for (int64_t i = 0; i < g.rp / TC_VB; i++) {       /* the rest: a float step per register */
        tc_vi wv[TC_GR];
        for (int r = 0; r < TC_GR; r++) wv[r] = TC_LDI(w + (i * TC_GR + r) * TC_VB);
        for (int t = 0; t < TC_GT; t++) {
            const int8_t *rq = a[t] + ro;
            tc_vi xv = TC_LDI(rq + i * TC_VB), ax = TC_ABS(xv);
            tc_vf sv = TC_LDS((const float *)(rq + g.rp + i * TC_VB));
            tc_vi c = TC_VNNI ? TC_LDI(rq + 2 * g.rp + i * TC_VB) : TC_IZERO();
            (void)ax;
            for (int r = 0; r < TC_GR; r++)
                f[r][t] = TC_FMA(TC_ACC(c, wv[r], xv, ax),
                                 wl ? TC_MUL(sv, TC_LDSU(wl + r * nwl + g.nsb * TC_L + g.hsb * 8 + i * TC_L)) : sv,
                                 f[r][t]);
        }
    }
#if TC_GR * TC_GT % 8 == 0 && !defined(TC_NEON)
    for (int i = 0; i < TC_GR * TC_GT; i += 8) tc_hsum8x((const tc_vf *)f + i, (float *)out + i);
#else
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT; t++) out[r][t] = TC_HSUM(f[r][t]);
#endif
}

/* A packed row tile (pk, rows n0 ..) against one chunk's tokens [m0, m1) (slots slot0 + stride * m; the last tile
   repeats token m1 - 1), outputs stored as tc_tile_store. Past TC_SLAB super-blocks the tile's packed bytes outgrow
   L1 (8 rows of 4,864 columns: 39 KB), so K runs in slabs of TC_SLAB super-blocks, every token tile through one
   slab before the next, the float accumulators kept between slabs at pk + tile: the same operations in the same
   order as one pass (the same bits), the slab's weights read from L1. */
static inline __attribute__((always_inline)) void tc_chunk_run(const int8_t *pk, const int8_t *slot0, int64_t stride,
                                                               int64_t K, int64_t m0, int64_t m1, const float *wl,
                                                               int64_t nwl, const float *s, const float *bias,
                                                               float *y, int64_t N, int64_t n0) {
    tc_geo g = tc_gemm_geo(K);
    int64_t ns = g.nsb > TC_SLAB ? (g.nsb + TC_SLAB - 1) / TC_SLAB : 1;
    tc_vf *fb = (tc_vf *)(void *)(pk + g.tile);        /* (tiles, TC_GR, TC_GT) registers */
    float wr[TC_L] __attribute__((aligned(64)));        /* g.rsb: the rest's lane 2 r + b weight scale */
    const float *wrp = NULL;
    if (wl && g.rsb) {
        for (int l = 0; l < TC_L; l++) wr[l] = wl[(l >> 1) * nwl + g.nsb * TC_L + g.hsb * 8 + 8 * (l & 1)];
        wrp = wr;
    }
    for (int64_t i = 0; i < ns; i++) {
        int64_t s0 = i * TC_SLAB, s1 = i == ns - 1 ? g.nsb : s0 + TC_SLAB;
        for (int64_t m = m0, ti = 0; m < m1; m += TC_GT, ti++) {
            const int8_t *a[TC_GT];
            for (int t = 0; t < TC_GT; t++) a[t] = slot0 + stride * (m + t < m1 ? m + t : m1 - 1);
            tc_vf f[TC_GR][TC_GT], *fk = fb + ti * TC_GR * TC_GT;
            for (int r = 0; r < TC_GR; r++)
                for (int t = 0; t < TC_GT; t++) f[r][t] = i ? fk[r * TC_GT + t] : TC_VZERO();
            tc_tile_sbs(pk, a, s0, s1, f, wl, nwl);
            if (i < ns - 1) {
                for (int r = 0; r < TC_GR; r++)
                    for (int t = 0; t < TC_GT; t++) fk[r * TC_GT + t] = f[r][t];
                continue;
            }
            float out[TC_GR][TC_GT];
            tc_tile_end(pk, a, K, f, out, wl, nwl, wrp);
            tc_tile_store(out, s, bias, y, N, n0, m, m1);
        }
    }
}
#define TC_PACKED 1
#else
static void tc_gemm_quant(const float *x, void *buf, int64_t m, int64_t K, int nt) {
    tc_quant8(x + m * K, tc_gemm_slot(buf, K, m, nt), K);
}

/* scalar: each (row, token) pair through the GEMV's one-row dot; the rows are read in place (rows[r] is a row's K
   bytes). */
static inline void tc_tile(const int8_t *const rows[TC_GR], const int8_t *const a[TC_GT], int64_t K,
                           float out[TC_GR][TC_GT]) {
    for (int t = 0; t < TC_GT; t++) {
        tc_act8 v = tc_act_view((void *)a[t], K);
        for (int r = 0; r < TC_GR; r++) out[r][t] = tc_dot1(&v, rows[r], K);
    }
}
#define TC_PACKED 0
#endif

/* Tokens per chunk for M tokens on nth threads: ceil(M / TC_GM) chunks, rounded up to a multiple of nth when
   there are several, of equal size (rounded up to whole register tiles; the last chunk takes the remainder). */
static inline int64_t tc_gemm_chunk(int64_t M, int nth) {
    int64_t nc = (M + TC_GM - 1) / TC_GM;
    if (nc > 1 && nth > 1) nc = (nc + nth - 1) / nth * nth;
    if (nc < 1) nc = 1;
    int64_t gm = (M + nc - 1) / nc;
    return (gm + TC_GT - 1) / TC_GT * TC_GT;
}

static inline int64_t tc_gemm_njobs(int64_t M, int64_t N, int64_t gm) {
    return ((M + gm - 1) / gm) * ((N + TC_GR - 1) / TC_GR);
}

/* Row tile rt's chunks [*cs, *ce] among jobs [j0, j1) of nc chunks x nrt row tiles, in either order: chunk-major
   (job j: chunk j / nrt, row tile j % nrt; a thread's run is whole chunks, each row tile packed by every thread) or
   row-major (by_rows; job j: row tile j / nc, chunk j % nc; a thread's run is whole row tiles, each packed by one
   thread, every thread reading every token). Empty: *cs > *ce. */
static inline void tc_job_chunks(int64_t j0, int64_t j1, int64_t rt, int64_t nrt, int64_t nc, int by_rows,
                                 int64_t *cs, int64_t *ce) {
    if (by_rows) {
        int64_t a = rt * nc > j0 ? rt * nc : j0, b = (rt + 1) * nc < j1 ? (rt + 1) * nc : j1;
        *cs = a - rt * nc, *ce = b - 1 - rt * nc;
    } else {
        int64_t c0 = j0 / nrt, c1 = (j1 - 1) / nrt;
        *cs = c0 * nrt + rt >= j0 ? c0 : c0 + 1, *ce = c1 * nrt + rt < j1 ? c1 : c1 - 1;
    }
}

/* Jobs [j0, j1) of the (chunk of gm tokens, row tile) grid, in tc_job_chunks' order (by_rows: row-major), row tile
   by row tile: each tile's weights packed once (into pk, this thread's tc_gemm_pack_bytes(K)), then run against its
   jobs' chunks. */
static void tc_gemm_jobs(void *buf, int8_t *pk, const int8_t *q, const float *s, const float *bias, float *y,
                         int64_t M, int64_t N, int64_t K, int64_t gm, int nt, int by_rows, int64_t j0, int64_t j1) {
    int64_t nrt = (N + TC_GR - 1) / TC_GR, nc = (M + gm - 1) / gm;
    if (j0 >= j1) return;
    const int8_t *slot0 = tc_gemm_slot(buf, K, 0, nt);     /* token m's slot: slot0 + m * stride */
    int64_t stride = tc_gemm_slot_bytes(K);
    (void)pk;
    for (int64_t rt = 0; rt < nrt; rt++) {
        int64_t cs, ce;
        tc_job_chunks(j0, j1, rt, nrt, nc, by_rows, &cs, &ce);
        if (cs > ce) continue;
        int64_t n0 = rt * TC_GR;
        const int8_t *rows[TC_GR];
        for (int r = 0; r < TC_GR; r++) rows[r] = q + (n0 + r < N ? n0 + r : N - 1) * K;   /* past N: the last row */
#if TC_PACKED
        tc_gemm_pack(rows, K, pk);
        for (int64_t c = cs; c <= ce && c * gm < M; c++)
            tc_chunk_run(pk, slot0, stride, K, c * gm, (c + 1) * gm < M ? (c + 1) * gm : M, NULL, 0, s, bias, y, N, n0);
#else
        for (int64_t m = cs * gm; m < M && m < (ce + 1) * gm; m += TC_GT) {
            int64_t m1 = (m / gm + 1) * gm < M ? (m / gm + 1) * gm : M;    /* the end of m's chunk */
            const int8_t *a[TC_GT];
            for (int t = 0; t < TC_GT; t++) a[t] = slot0 + stride * (m + t < m1 ? m + t : m1 - 1);
            float out[TC_GR][TC_GT];
            tc_tile(rows, a, K, out);
            tc_tile_store(out, s, bias, y, N, n0, m, m1);
            if (m + TC_GT >= m1) m = m1 - TC_GT;              /* the next chunk starts at m1 */
        }
#endif
    }
}

/* The whole GEMM on one thread (the harness; native.c's tc_gemm splits the same jobs over threads); buf:
   tc_gemm_act_bytes(M, K, 1). */
void tc_gemm1(const float *x, void *buf, const int8_t *q, const float *s, const float *bias, float *y, int64_t M,
              int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++) tc_gemm_quant(x, buf, m, K, 1);
    int64_t gm = tc_gemm_chunk(M, 1);
    tc_gemm_jobs(buf, tc_gemm_base(buf), q, s, bias, y, M, N, K, gm, 1, 0, 0, tc_gemm_njobs(M, N, gm));
}

/* The reference GEMM (one thread, per token tc_quant8 and per row tc_dot_ref), for the tests; buf: tc_act_bytes(K). */
void tc_gemm_ref(const float *x, void *buf, const int8_t *q, const float *s, const float *bias, float *y, int64_t M,
                 int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++) {
        tc_act8 a = tc_quant8(x + m * K, buf, K);
        for (int64_t n = 0; n < N; n++) {
            float v = s[n] * tc_dot_ref(&a, q + n * K, K);
            y[m * N + n] = bias ? v + bias[n] : v;
        }
    }
}
#endif /* TC_NATIVE_GEMM_H */
