/* tinychat int8 GEMM for prefill (included by native.c after native_q8.h; tests/native/q8_harness.c tests it alone,
   also built for aarch64 and run under qemu).

   Y[m, n] = s[n] * sum_b sx[m, b] * dot(xq[m, b], q[n, b]) (+ bias[n])      X: (M, K) fp32 tokens, q: (N, K) int8
   Every token's activations are rounded as the GEMV rounds one vector (native_q8.h's tc_quant8: int8 in blocks of 32,
   one fp32 scale each), into a scratch of tc_gemm_act_bytes(M, K): token m's tc_act8 at 3 * pad64(K) * m. So a
   token prefilled here gives what decoding it through the GEMV gives, up to fp32 summation order.

   Blocking: a register tile of TC_GR weight rows x TC_GT tokens (each weight vector loaded once per step serves
   TC_GT tokens, each activation vector TC_GR rows), run for every tile of a cache chunk of <= TC_GM tokens (their
   activations stay in L2 while the row tiles stream past; a row tile's K bytes stay in L1 across the chunk's
   tokens). Jobs are (chunk, row tile) pairs, split over threads in contiguous runs: whole chunks per thread when
   there are several, row tiles of one chunk otherwise. Chunks are of equal size (tc_gemm_chunk), their count a
   multiple of the threads: 200 tokens on 2 threads are 4 chunks of 50, not 64, 64, 64, 8 (128 tokens to one
   thread, 72 to the other). Each output is the same whatever the chunking: a tile's tokens never mix. Row and
   token remainders run the full tile on a repeated row / token and store only the real ones; the last partial
   column step reads the rows' tails from a zero-padded copy (the activations are zero past K). */
#include "native_q8.h"

#ifndef TC_GM
#define TC_GM 64                                   /* tokens per cache chunk */
#endif
#if defined(TC_512)
#define TC_GW 64                                   /* columns per step */
#else
#define TC_GW 32
#endif
#ifndef TC_GR
#define TC_GR 4                                    /* weight rows per register tile */
#endif
#ifndef TC_GT
#if defined(TC_512)
#define TC_GT 4                                    /* tokens per register tile */
#else
#define TC_GT 2
#endif
#endif

/* bytes of activation scratch for M tokens of K columns (64 spare for alignment) */
int64_t tc_gemm_act_bytes(int64_t M, int64_t K) { return 3 * tc_pad64(K) * (M > 0 ? M : 1) + 64; }

static inline tc_act8 tc_gemm_act(void *buf, int64_t K, int64_t m) {
    int64_t Kp = tc_pad64(K);
    int8_t *b = (int8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63) + 3 * Kp * m;
    tc_act8 a = {b, (float *)(b + Kp), (int32_t *)(b + 2 * Kp)};
    return a;
}

/* Token m's activations into its slot of buf (tc_quant8 aligns to 64: the slot already is). */
static inline void tc_gemm_quant(const float *x, void *buf, int64_t m, int64_t K) {
    tc_quant8(x + m * K, tc_gemm_act(buf, K, m).q, K);
}

#if defined(TC_512) || defined(TC_256)
#if defined(TC_512)
typedef __m512 tc_vf;
typedef __m512i tc_vi;
#define TC_VZERO() _mm512_setzero_ps()
#define TC_LDW(p) _mm512_xor_si512(_mm512_loadu_si512((const void *)(p)), _mm512_set1_epi8((char)0x80))
#define TC_LDX(p) _mm512_load_si512((const void *)(p))
#define TC_LDS(p) _mm512_load_ps(p)
#define TC_DOT(C, W, X, AX) _mm512_dpbusd_epi32(C, W, X)
#define TC_FMA(I, S, F) _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), S, F)
#define TC_HSUM(F) _mm512_reduce_add_ps(F)
#define TC_ABS(X) (X)
#else
typedef __m256 tc_vf;
typedef __m256i tc_vi;
#define TC_VZERO() _mm256_setzero_ps()
#if defined(TC_256_VNNI)
#define TC_LDW(p) _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p)), _mm256_set1_epi8((char)0x80))
#define TC_ABS(X) (X)
#define TC_DOT(C, W, X, AX) TC_DP256(C, W, X)             /* W already q ^ 0x80 */
#else
#define TC_LDW(p) _mm256_loadu_si256((const __m256i *)(p))
#define TC_ABS(X) _mm256_abs_epi8(X)
#define TC_DOT(C, W, X, AX) TC_BLK256(W, X, C, AX)
#endif
#define TC_LDX(p) _mm256_load_si256((const __m256i *)(p))
#define TC_LDS(p) _mm256_load_ps(p)
#define TC_FMA(I, S, F) _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), S, F)
#define TC_HSUM(F) tc_hsum8(F)
#endif

/* One column step of a tile: TC_GR weight vectors (row r's at w[r]) against TC_GT tokens at column k. */
static inline __attribute__((always_inline)) void tc_tile_step(tc_vf f[TC_GR][TC_GT], const int8_t *const w[TC_GR],
                                                               const tc_act8 *const a[TC_GT], int64_t k) {
    tc_vi wv[TC_GR];
    for (int r = 0; r < TC_GR; r++) wv[r] = TC_LDW(w[r]);
    for (int t = 0; t < TC_GT; t++) {
        tc_vi xv = TC_LDX(a[t]->q + k), cv = TC_LDX(a[t]->c + k / 4), ax = TC_ABS(xv);
        tc_vf sv = TC_LDS(a[t]->s + k / 4);
        (void)cv, (void)ax;
        for (int r = 0; r < TC_GR; r++) f[r][t] = TC_FMA(TC_DOT(cv, wv[r], xv, ax), sv, f[r][t]);
    }
}

#if defined(TC_256_VNNI) && TC_GT % 2 == 0
/* AVX-VNNI: tokens in pairs, the two tokens' int32 block lanes folded into one vector (vphaddd: lanes 0, 1, 4, 5
   token t, 2, 3, 6, 7 token t + 1), one conversion and one multiply-add for both, against their scales side by
   side (on the AVX2 build without VNNI that loses: its dots already cost more shuffles). */
static inline __attribute__((always_inline)) void tc_tile_step2(tc_vf f[TC_GR][TC_GT / 2],
                                                                const int8_t *const w[TC_GR],
                                                                const tc_act8 *const a[TC_GT], int64_t k) {
    tc_vi wv[TC_GR];
    for (int r = 0; r < TC_GR; r++) wv[r] = TC_LDW(w[r]);
    for (int t = 0; t < TC_GT; t += 2) {
        tc_vi x0 = TC_LDX(a[t]->q + k), c0 = TC_LDX(a[t]->c + k / 4), a0 = TC_ABS(x0);
        tc_vi x1 = TC_LDX(a[t + 1]->q + k), c1 = TC_LDX(a[t + 1]->c + k / 4), a1 = TC_ABS(x1);
        tc_vf sv = _mm256_blend_ps(TC_LDS(a[t]->s + k / 4), TC_LDS(a[t + 1]->s + k / 4), 0xCC);
        (void)c0, (void)c1, (void)a0, (void)a1;
        for (int r = 0; r < TC_GR; r++) {
            tc_vi h = _mm256_hadd_epi32(TC_DOT(c0, wv[r], x0, a0), TC_DOT(c1, wv[r], x1, a1));
            f[r][t / 2] = TC_FMA(h, sv, f[r][t / 2]);
        }
    }
}

static inline void tc_tile(const int8_t *const rows[TC_GR], const int8_t *const tails[TC_GR],
                           const tc_act8 *const a[TC_GT], int64_t K, float out[TC_GR][TC_GT]) {
    tc_vf f[TC_GR][TC_GT / 2];
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT / 2; t++) f[r][t] = TC_VZERO();
    const int8_t *w[TC_GR];
    int64_t k = 0;
    for (; k + TC_GW <= K; k += TC_GW) {
        for (int r = 0; r < TC_GR; r++) w[r] = rows[r] + k;
        tc_tile_step2(f, w, a, k);
    }
    if (k < K) tc_tile_step2(f, tails, a, k);
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT / 2; t++) {
            float v[8];
            _mm256_storeu_ps(v, f[r][t]);
            out[r][2 * t] = (v[0] + v[1]) + (v[4] + v[5]);
            out[r][2 * t + 1] = (v[2] + v[3]) + (v[6] + v[7]);
        }
}
#else
/* out[r][t] = sum_b sx[t, b] * dot(xq[t, b], q[r, b]) for the tile's rows (rows[r], K bytes each; tails[r]: the
   row's columns past the last full step, zero-padded to TC_GW) and tokens. */
static inline void tc_tile(const int8_t *const rows[TC_GR], const int8_t *const tails[TC_GR],
                           const tc_act8 *const a[TC_GT], int64_t K, float out[TC_GR][TC_GT]) {
    tc_vf f[TC_GR][TC_GT];
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT; t++) f[r][t] = TC_VZERO();
    const int8_t *w[TC_GR];
    int64_t k = 0;
    for (; k + TC_GW <= K; k += TC_GW) {
        for (int r = 0; r < TC_GR; r++) w[r] = rows[r] + k;
        tc_tile_step(f, w, a, k);
    }
    if (k < K) tc_tile_step(f, tails, a, k);
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT; t++) out[r][t] = TC_HSUM(f[r][t]);
}
#endif
#define TC_TILE_TAILS 1
#else
/* NEON / scalar: each (row, token) pair through the GEMV's one-row dot (sdot where the target has it). */
static inline void tc_tile(const int8_t *const rows[TC_GR], const int8_t *const tails[TC_GR],
                           const tc_act8 *const a[TC_GT], int64_t K, float out[TC_GR][TC_GT]) {
    (void)tails;
    for (int r = 0; r < TC_GR; r++)
        for (int t = 0; t < TC_GT; t++) out[r][t] = tc_dot1(a[t], rows[r], K);
}
#define TC_TILE_TAILS 0
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

/* Jobs [j0, j1) of the (chunk of gm tokens, row tile) grid: Y rows of those chunks' tokens, columns of those row
   tiles. */
static void tc_gemm_jobs(void *buf, const int8_t *q, const float *s, const float *bias, float *y, int64_t M,
                         int64_t N, int64_t K, int64_t gm, int64_t j0, int64_t j1) {
    int64_t nrt = (N + TC_GR - 1) / TC_GR;
    int8_t tail[TC_GR][TC_GW] __attribute__((aligned(64)));
    for (int64_t j = j0; j < j1; j++) {
        int64_t m0 = (j / nrt) * gm, m1 = m0 + gm < M ? m0 + gm : M, n0 = (j % nrt) * TC_GR;
        const int8_t *rows[TC_GR], *tails[TC_GR];
        int64_t kt = K - K % TC_GW;
        for (int r = 0; r < TC_GR; r++) {
            int64_t n = n0 + r < N ? n0 + r : N - 1;           /* past the last row: the last row again */
            rows[r] = q + n * K;
            tails[r] = tail[r];
            if (TC_TILE_TAILS && kt < K) {
                memset(tail[r], 0, TC_GW);
                memcpy(tail[r], rows[r] + kt, (size_t)(K - kt));
            }
        }
        for (int64_t m = m0; m < m1; m += TC_GT) {
            tc_act8 act[TC_GT];
            const tc_act8 *a[TC_GT];
            for (int t = 0; t < TC_GT; t++) {
                act[t] = tc_gemm_act(buf, K, m + t < m1 ? m + t : m1 - 1);   /* past the chunk: its last token */
                a[t] = &act[t];
            }
            float out[TC_GR][TC_GT];
            tc_tile(rows, tails, a, K, out);
            for (int t = 0; t < TC_GT && m + t < m1; t++)
                for (int r = 0; r < TC_GR && n0 + r < N; r++) {
                    int64_t n = n0 + r;
                    float v = s[n] * out[r][t];
                    y[(m + t) * N + n] = bias ? v + bias[n] : v;
                }
        }
    }
}

static inline int64_t tc_gemm_njobs(int64_t M, int64_t N, int64_t gm) {
    return ((M + gm - 1) / gm) * ((N + TC_GR - 1) / TC_GR);
}

/* The whole GEMM on one thread (the harness; native.c's tc_gemm splits the same jobs over threads). */
void tc_gemm1(const float *x, void *buf, const int8_t *q, const float *s, const float *bias, float *y, int64_t M,
              int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++) tc_gemm_quant(x, buf, m, K);
    int64_t gm = tc_gemm_chunk(M, 1);
    tc_gemm_jobs(buf, q, s, bias, y, M, N, K, gm, 0, tc_gemm_njobs(M, N, gm));
}

/* The reference GEMM (one thread, per token tc_quant8 and per row tc_dot_ref), for the tests. */
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
