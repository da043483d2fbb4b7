/* A prototype int4 GEMV layout for issue #34 (AVX-512 VNNI only; not part of the package): super-blocks of 512
   columns whose nibbles land in int32 lanes by group, the 4 rows of a row group interleaved into one stream, against
   native_q4.h's gemv4_rows on the Llama-3.2-1B shape's 16 layers (each distinct: nothing stays in cache).
   Kept as the record of that measurement: the package now stores int4 this way (native_q4_layout.h, the scales in
   their own array), so this file builds against the tree before it (git worktree add /tmp/t 697fe14).

       gcc -O3 -march=native -ffp-contract=off -fopenmp -Itinychat/engine -o /tmp/sb tests/perf/int4_superblock.c -lm
       /tmp/sb check                                  # against tc4_dot_ref on a 64 x 2048 matrix (max relative error)
       OMP_NUM_THREADS=1 /tmp/sb time current         # ms a pass and GB/s (best of 6); alternate with:
       OMP_NUM_THREADS=1 /tmp/sb time superblock
       OMP_NUM_THREADS=1 /tmp/sb time rows1           # the same order inside whole rows (and rows2: 2 at a time)

   Layout, per row group of 4 rows and per super-block b (512 columns = 16 groups of 32), 1,152 bytes:
     step s (0..7) of row r: 32 bytes at s * 128 + r * 32; byte m's low nibble u (= q + 8) of column
       (16b + m/4) * 32 + 4s + m%4, its high nibble column (16b + 8 + m/4) * 32 + 4s + m%4: broadcast to both halves
       of a zmm and split (tc4_u64), int32 lane l of a step's vpdpbusd adds 4 columns of group 16b + l;
     then the 4 rows' 16 fp16 group scales: row r's at 1024 + r * 32.
   Activations re-laid once per GEMV (every row shares them): xr[512b + 64s + 4l + j] = xq[(16b + l) * 32 + 4s + j],
   corr[g] = -8 * sum(xq of group g) (the accumulator's start: u - 8 = q), sx[g] the group's activation scale.
   Per super-block and row: 8 vpdpbusd into one register of 16 exact group dots, then one conversion and one
   multiply-add by the 16 products ws * sx. docs/benchmarks.md, "int4 on Zen 4", has the figures. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "native.c"

#define SB 288                                     /* bytes of one row's super-block: 256 of nibbles, 32 of scales */

static uint64_t rng = 88172645463325252ull;
static uint64_t nx(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* Four rows (one group, p its first byte), K a multiple of 512. */
static inline void sb_dot4(const int8_t *xr, const int32_t *corr, const float *sx, const uint8_t *p, int64_t K,
                           float *out) {
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    for (int64_t b = 0; b < K / 512; b++) {
        const uint8_t *w = p + b * 4 * SB;
        __m512i c = _mm512_load_si512((const void *)(corr + 16 * b));
        __m512i a0 = c, a1 = c, a2 = c, a3 = c;      /* (16,) int32: the groups' dots, exact */
        for (int s = 0; s < 8; s++) {
            __m512i xv = _mm512_load_si512((const void *)(xr + 512 * b + 64 * s));
            a0 = _mm512_dpbusd_epi32(a0, tc4_u64(w + 128 * s), xv);
            a1 = _mm512_dpbusd_epi32(a1, tc4_u64(w + 128 * s + 32), xv);
            a2 = _mm512_dpbusd_epi32(a2, tc4_u64(w + 128 * s + 64), xv);
            a3 = _mm512_dpbusd_epi32(a3, tc4_u64(w + 128 * s + 96), xv);
        }
        __m512 sc = _mm512_load_ps(sx + 16 * b);
#define SB_SC(R) _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 1024 + (R) * 32))), sc)
        f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), SB_SC(0), f0);
        f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), SB_SC(1), f1);
        f2 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a2), SB_SC(2), f2);
        f3 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a3), SB_SC(3), f3);
#undef SB_SC
    }
    out[0] = tc_hsum16(f0), out[1] = tc_hsum16(f1), out[2] = tc_hsum16(f2), out[3] = tc_hsum16(f3);
}

/* The activations' re-layout (scalar here) and the rows; N a multiple of 4. */
static void sb_gemv(const tc_act8 *a, int8_t *xr, int32_t *corr, float *sx, const uint8_t *q, float *y, int64_t N,
                    int64_t K) {
    for (int64_t g = 0; g < K / 32; g++) {
        int32_t t = 0;
        for (int j = 0; j < 32; j++) t += a->q[g * 32 + j];
        corr[g] = -8 * t, sx[g] = a->s[g * 8];
        for (int s = 0; s < 8; s++) memcpy(xr + 512 * (g / 16) + 64 * s + 4 * (g % 16), a->q + g * 32 + 4 * s, 4);
    }
    for (int64_t n = 0; n < N; n += 4) sb_dot4(xr, corr, sx, q + n * (K / 512 * SB), K, y + n);
}

/* Variant "rows": the same super-block order inside each row, but rows kept whole (row n: K / 2 bytes) and the
   scales in their own (N, K / 32) array as native_q4.h has them; one row at a time (one weight stream and its
   scales), two accumulators so the vpdpbusd chain is half as long. */
static inline float sbr_dot1(const int8_t *xr, const int32_t *corr, const float *sx, const uint8_t *p,
                             const uint16_t *ws, int64_t K) {
    __m512 f = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / 512; b++) {
        const uint8_t *w = p + b * 256;
        __m512i a0 = _mm512_load_si512((const void *)(corr + 16 * b)), a1 = _mm512_setzero_si512(), a2 = a1, a3 = a1;
        const int8_t *x = xr + 512 * b;
        a0 = _mm512_dpbusd_epi32(a0, tc4_u64(w), _mm512_load_si512((const void *)x));
        a1 = _mm512_dpbusd_epi32(a1, tc4_u64(w + 32), _mm512_load_si512((const void *)(x + 64)));
        a2 = _mm512_dpbusd_epi32(a2, tc4_u64(w + 64), _mm512_load_si512((const void *)(x + 128)));
        a3 = _mm512_dpbusd_epi32(a3, tc4_u64(w + 96), _mm512_load_si512((const void *)(x + 192)));
        a0 = _mm512_dpbusd_epi32(a0, tc4_u64(w + 128), _mm512_load_si512((const void *)(x + 256)));
        a1 = _mm512_dpbusd_epi32(a1, tc4_u64(w + 160), _mm512_load_si512((const void *)(x + 320)));
        a2 = _mm512_dpbusd_epi32(a2, tc4_u64(w + 192), _mm512_load_si512((const void *)(x + 384)));
        a3 = _mm512_dpbusd_epi32(a3, tc4_u64(w + 224), _mm512_load_si512((const void *)(x + 448)));
        a0 = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
        a1 = _mm512_setzero_si512();
        __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws + 16 * b))),
                                  _mm512_load_ps(sx + 16 * b));
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0, a1)), sc, f);
    }
    return tc_hsum16(f);
}

/* the same, 2 rows at a time (two streams): shares the activation loads */
static inline void sbr_dot2(const int8_t *xr, const int32_t *corr, const float *sx, const uint8_t *p,
                            const uint16_t *ws, int64_t K, float *out) {
    __m512 f0 = _mm512_setzero_ps(), f1 = f0;
    const uint8_t *p1 = p + K / 2;
    const uint16_t *ws1 = ws + K / 32;
    for (int64_t b = 0; b < K / 512; b++) {
        __m512i c = _mm512_load_si512((const void *)(corr + 16 * b));
        __m512i a0 = c, a1 = c;
        for (int s = 0; s < 8; s++) {
            __m512i xv = _mm512_load_si512((const void *)(xr + 512 * b + 64 * s));
            a0 = _mm512_dpbusd_epi32(a0, tc4_u64(p + b * 256 + 32 * s), xv);
            a1 = _mm512_dpbusd_epi32(a1, tc4_u64(p1 + b * 256 + 32 * s), xv);
        }
        __m512 sc = _mm512_load_ps(sx + 16 * b);
        f0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0),
                             _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws + 16 * b))), sc), f0);
        f1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1),
                             _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ws1 + 16 * b))), sc), f1);
    }
    out[0] = tc_hsum16(f0), out[1] = tc_hsum16(f1);
}

static void sb_relayout(const tc_act8 *a, int8_t *xr, int32_t *corr, float *sx, int64_t K) {
    for (int64_t g = 0; g < K / 32; g++) {
        int32_t t = 0;
        for (int j = 0; j < 32; j++) t += a->q[g * 32 + j];
        corr[g] = -8 * t, sx[g] = a->s[g * 8];
        for (int s = 0; s < 8; s++) memcpy(xr + 512 * (g / 16) + 64 * s + 4 * (g % 16), a->q + g * 32 + 4 * s, 4);
    }
}

static void sbr_gemv(const tc_act8 *a, int8_t *xr, int32_t *corr, float *sx, const uint8_t *q, const uint16_t *ws,
                     float *y, int64_t N, int64_t K, int two) {
    sb_relayout(a, xr, corr, sx, K);
    if (two)
        for (int64_t n = 0; n < N; n += 2) sbr_dot2(xr, corr, sx, q + n * (K / 2), ws + n * (K / 32), K, y + n);
    else
        for (int64_t n = 0; n < N; n++) y[n] = sbr_dot1(xr, corr, sx, q + n * (K / 2), ws + n * (K / 32), K);
}

/* u (0..15) of column col of row n in native_q4.h's layout */
static int u_of(const uint8_t *q, int64_t K, int64_t n, int64_t col) {
    uint8_t b = q[n * (K / 2) + (col / 64) * 32 + (col % 32)];
    return col % 64 < 32 ? b & 15 : b >> 4;
}

/* native_q4.h's rows and scales into the super-block layout */
static void sb_pack(const uint8_t *q, const uint16_t *ws, uint8_t *p, int64_t N, int64_t K) {
    int64_t rb = K / 512 * SB;
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < K / 512; b++) {
            uint8_t *w = p + (n - n % 4) * rb + b * 4 * SB;
            int r = (int)(n % 4);
            for (int s = 0; s < 8; s++)
                for (int m = 0; m < 32; m++) {
                    int64_t lo = (16 * b + m / 4) * 32 + 4 * s + m % 4, hi = (16 * b + 8 + m / 4) * 32 + 4 * s + m % 4;
                    w[128 * s + 32 * r + m] = (uint8_t)(u_of(q, K, n, lo) | u_of(q, K, n, hi) << 4);
                }
            memcpy(w + 1024 + 32 * r, ws + n * (K / 32) + 16 * b, 32);
        }
}

/* native_q4.h's rows into the "rows" variant (the nibbles reordered in place of each row; scales unchanged) */
static void sbr_pack(const uint8_t *q, uint8_t *p, int64_t N, int64_t K) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < K / 512; b++)
            for (int s = 0; s < 8; s++)
                for (int m = 0; m < 32; m++) {
                    int64_t lo = (16 * b + m / 4) * 32 + 4 * s + m % 4, hi = (16 * b + 8 + m / 4) * 32 + 4 * s + m % 4;
                    p[n * (K / 2) + b * 256 + 32 * s + m] = (uint8_t)(u_of(q, K, n, lo) | u_of(q, K, n, hi) << 4);
                }
}

static uint16_t rand_scale(void) { return (uint16_t)(0x2000 | (nx() & 0x7ff) | (nx() & 0x8000)); }

static int check(void) {
    int64_t N = 64, K = 2048;
    uint8_t *q = aligned_alloc(64, N * K / 2), *p = aligned_alloc(64, N * K / 512 * SB);
    uint16_t *ws = aligned_alloc(64, N * K / 32 * 2);
    for (int64_t i = 0; i < N * K / 2; i++) q[i] = (uint8_t)nx();
    for (int64_t i = 0; i < N * K / 32; i++) ws[i] = rand_scale();
    sb_pack(q, ws, p, N, K);
    float *x = malloc(K * sizeof(float)), y[64];
    for (int64_t i = 0; i < K; i++) x[i] = (float)((int64_t)(nx() % 2001) - 1000) / 997.f;
    void *buf = aligned_alloc(64, tc_act_bytes(K));
    int8_t *xr = aligned_alloc(64, K);
    int32_t *corr = aligned_alloc(64, K / 32 * 4);
    float *sx = aligned_alloc(64, K / 32 * 4);
    tc_act8 a = tc_quant8(x, buf, K);
    sb_gemv(&a, xr, corr, sx, p, y, N, K);
    double mx = 0, err = 0;
    for (int64_t n = 0; n < N; n++) {
        double r = tc4_dot_ref(&a, q + n * (K / 2), ws + n * (K / 32), K);
        mx = fabs(r) > mx ? fabs(r) : mx;
        err = fabs(y[n] - r) > err ? fabs(y[n] - r) : err;
    }
    printf("check: max |y - reference| %.3g of max |reference| %.3g (relative %.3g)\n", err, mx, err / mx);
    int bad = !(err <= 1e-5 * mx);
    uint8_t *pr = aligned_alloc(64, N * K / 2);
    sbr_pack(q, pr, N, K);
    for (int two = 0; two < 2; two++) {
        float yr[64];
        sbr_gemv(&a, xr, corr, sx, pr, ws, yr, N, K, two);
        double e2 = 0;
        for (int64_t n = 0; n < N; n++) {
            double r = tc4_dot_ref(&a, q + n * (K / 2), ws + n * (K / 32), K);
            e2 = fabs(yr[n] - r) > e2 ? fabs(yr[n] - r) : e2;
        }
        printf("check rows%s: relative %.3g\n", two ? "2" : "1", e2 / mx);
        bad |= !(e2 <= 1e-5 * mx);
    }
    return bad;
}

static int timing(int superblock) {
    enum { L = 16 };
    int64_t shapes[4][2] = {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}};   /* qkv, o, gate+up, down */
    uint8_t *q[L][4];
    uint16_t *ws[L][4];
    float *y = malloc(16384 * sizeof(float)), *x = malloc(8192 * sizeof(float));
    size_t bytes = 0;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < 4; s++) {
            int64_t N = shapes[s][0], K = shapes[s][1], nb = N * K / 2 + N * K / 16;
            q[l][s] = aligned_alloc(64, nb);              /* either layout's nibbles and scales, random */
            ws[l][s] = aligned_alloc(64, N * K / 16);
            for (int64_t i = 0; i < nb; i += 8) { uint64_t v = nx(); memcpy(q[l][s] + i, &v, 8); }
            for (int64_t i = 0; i < N * K / 32; i++) ws[l][s][i] = rand_scale();
            bytes += nb;
        }
    for (int i = 0; i < 8192; i++) x[i] = (float)((int64_t)(nx() % 2001) - 1000) / 997.f;
    void *buf = aligned_alloc(64, tc_act_bytes(8192));
    int8_t *xr = aligned_alloc(64, 8192);
    int32_t *corr = aligned_alloc(64, 8192 / 32 * 4);
    float *sx = aligned_alloc(64, 8192 / 32 * 4);
    double best = 1e9;
    for (int it = 0; it < 6; it++) {
        double t0 = now();
        for (int l = 0; l < L; l++)
            for (int s = 0; s < 4; s++) {
                int64_t N = shapes[s][0], K = shapes[s][1];
                tc_act8 a = tc_quant8(x, buf, K);
                if (superblock == 1) sb_gemv(&a, xr, corr, sx, q[l][s], y, N, K);
                else if (superblock >= 2) sbr_gemv(&a, xr, corr, sx, q[l][s], ws[l][s], y, N, K, superblock == 3);
                else gemv4_rows(&a, q[l][s], ws[l][s], y, N, K, 0);
            }
        double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    const char *names[] = {"current", "superblock", "rows1", "rows2"};
    printf("%s: %.2f ms a pass (%.1f GB/s)\n", names[superblock], best * 1e3, bytes / best / 1e9);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "check")) return check();
    if (argc > 2 && !strcmp(argv[1], "time"))
        return timing(!strcmp(argv[2], "superblock") ? 1 : !strcmp(argv[2], "rows1") ? 2 : !strcmp(argv[2], "rows2") ? 3 : 0);
    fprintf(stderr, "usage: %s check | time current|superblock|rows1|rows2\n", argv[0]);
    return 2;
}
