/* The int8 GEMV and GEMM kernels (tinychat/engine/native_q8.h, native_gemm.h) and the int4 ones (native_q4.h)
   against a float64 reference, built
   for whatever target the compiler is told (x86-64 levels natively, aarch64 under qemu-user:
   tests/unit/test_native_q8_targets.py). Prints the kernel path, then "ok", or what differed (exit 1). No OpenMP:
   one thread. */
#include "native_q4.h"
#include "harness.h"

/* FNV-1a over the bits of every GEMM output, printed before "ok": builds that must agree bit for bit (K slabs or
   one pass: tests/unit/test_native_q8_targets.py) print the same. */
static uint64_t gemm_bits = 1469598103934665603ULL;
static void hash_out(const float *y, int64_t n) {
    const unsigned char *p = (const unsigned char *)y;
    for (int64_t i = 0; i < n * 4; i++) gemm_bits = (gemm_bits ^ p[i]) * 1099511628211ULL;
}

static int check(int64_t N, int64_t K, int spiky) {
    int8_t *q = malloc(N * K);
    float *s = malloc(N * sizeof(float)), *x = malloc(K * sizeof(float)), *y = malloc(N * sizeof(float));
    void *buf = malloc(tc_act_bytes(K));
    for (int64_t i = 0; i < N * K; i++) q[i] = (int8_t)((int)(next() % 255) - 127);
    for (int64_t n = 0; n < N; n++) s[n] = 0.5f + (unif() + 1.0f) * 0.25f, y[n] = 1.0f;
    for (int64_t k = 0; k < K; k++) x[k] = unif() * (spiky && k % 97 == 3 ? 60.0f : 1.0f);
    if (spiky && K > 40) for (int64_t k = 32; k < 40; k++) x[k] = 0.f;   /* part of a block zero */
    tc_act8 a = tc_quant8(x, buf, K);
    int bad = 0;
    for (int64_t b = 0; b < K; b += TC_QB) {             /* bit for bit the plain C rounding (every path) */
        float m = 0.f;
        for (int64_t k = b; k < b + TC_QB && k < K; k++) m = fabsf(x[k]) > m ? fabsf(x[k]) : m;
        float r = 127.f / m;
        int32_t g = 0;
        for (int64_t k = b; k < b + TC_QB && k < K; k++) {
            float t = x[k] * r;
            int8_t v = m > 0.f ? (int8_t)(int32_t)((t + 12582912.0f) - 12582912.0f) : 0;
            g += v;
            if (a.q[k] != v) bad = 1;
            if ((k & 3) == 3) {
                if (a.c[k / 4] != -128 * g) bad = 1;
                g = 0;
            }
        }
        if (a.s[b / 4] != (m > 0.f ? m / 127.f : 0.f)) bad = 1;
    }
    if (bad) {
        printf("N=%ld K=%ld: activation bytes differ from the plain C rounding\n", (long)N, (long)K);
        return 1;
    }
    for (int64_t b = 0; b < K; b += TC_QB) {             /* the rounding: xq = round(x / sx), |xq| <= 127 */
        float m = 0.f;
        for (int64_t k = b; k < b + TC_QB && k < K; k++) m = fabsf(x[k]) > m ? fabsf(x[k]) : m;
        double sx = a.s[b / 4];
        if (fabs(sx - m / 127.0) > 1e-6 * m) bad = 1;
        for (int64_t k = b; k < b + TC_QB && k < K; k++)
            if (a.q[k] < -127 || fabs(x[k] - a.q[k] * sx) > 0.5001 * sx) bad = 1;
    }
    if (bad) {
        printf("N=%ld K=%ld: activation rounding off\n", (long)N, (long)K);
        return 1;
    }
    gemv_rows(&a, q, s, y, N, K, 1);                      /* y += s * (q @ x) on this target's path */
    double mx = 0.0, err = 0.0;
    for (int64_t n = 0; n < N; n++) {
        double r = 0.0;
        for (int64_t k = 0; k < K; k++) r += (double)q[n * K + k] * a.q[k] * a.s[(k / TC_QB) * (TC_QB / 4)];
        r = r * s[n] + 1.0;
        mx = fabs(r) > mx ? fabs(r) : mx;
        err = fabs(y[n] - r) > err ? fabs(y[n] - r) : err;
    }
    free(q), free(s), free(x), free(y), free(buf);
    if (!(err <= 1e-5 * mx)) {
        printf("N=%ld K=%ld: max error %g of %g\n", (long)N, (long)K, err, mx);
        return 1;
    }
    return 0;
}

/* The GEMM (M tokens, N rows, K columns; remainders in every dimension) against float64 math on each token's
   rounded activations, with and without a bias; and each token's row equal to the GEMV of that token. */
static int check_gemm(int64_t M, int64_t N, int64_t K) {
    int8_t *q = malloc(N * K);
    float *s = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)), *x = malloc(M * K * sizeof(float));
    float *y = malloc(M * N * sizeof(float)), *yv = malloc(N * sizeof(float));
    void *buf = malloc(tc_gemm_act_bytes(M, K, 1)), *one = malloc(tc_act_bytes(K));
    for (int64_t i = 0; i < N * K; i++) q[i] = (int8_t)((int)(next() % 255) - 127);
    for (int64_t n = 0; n < N; n++) s[n] = 0.5f + (unif() + 1.0f) * 0.25f, b[n] = unif();
    for (int64_t i = 0; i < M * K; i++) x[i] = unif() * (i % 89 == 5 ? 40.0f : 1.0f);
    int fails = 0;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        tc_gemm1(x, buf, q, s, with_bias ? b : NULL, y, M, N, K);
        hash_out(y, M * N);
        double mx = 0.0, err = 0.0, verr = 0.0;
        for (int64_t m = 0; m < M; m++) {
            tc_act8 a = tc_quant8(x + m * K, one, K);
            gemv_rows(&a, q, s, yv, N, K, 0);
            for (int64_t n = 0; n < N; n++) {
                double r = 0.0;
                for (int64_t k = 0; k < K; k++) r += (double)q[n * K + k] * a.q[k] * a.s[(k / TC_QB) * (TC_QB / 4)];
                r = r * s[n] + (with_bias ? b[n] : 0.0);
                double g = y[m * N + n], v = yv[n] + (with_bias ? b[n] : 0.f);
                mx = fabs(r) > mx ? fabs(r) : mx;
                err = fabs(g - r) > err ? fabs(g - r) : err;
                verr = fabs(g - v) > verr ? fabs(g - v) : verr;
            }
        }
        if (!(err <= 1e-5 * mx) || !(verr <= 1e-5 * mx)) {
            printf("GEMM M=%ld N=%ld K=%ld bias=%d: max error %g, vs the GEMV %g, of %g\n", (long)M, (long)N, (long)K,
                   with_bias, err, verr, mx);
            fails++;
        }
    }
    free(q), free(s), free(b), free(x), free(y), free(yv), free(buf), free(one);
    return fails;
}

/* int4 weights (native_q4.h's layout: random nibbles, random fp16 group scales of both signs, subnormal ones
   included) against float64 math on the rounded activations: the GEMV (4-row groups and remainder rows) and the GEMM
   (remainders in every dimension, with and without a bias), and the GEMM's rows equal to the GEMV's. */
/* Weight (n, k) and its group's scale in native_q4_layout.h's grouped layout, written here from its description
   (apart from tc4_row): rows 4g..4g+3 interleaved by super-blocks of 512 columns, then 64-column tail chunks; the
   last N % 4 rows plain. */
static double w4(const uint8_t *q, int64_t N, int64_t Kp, int64_t n, int64_t k) {
    int64_t nsb = Kp / 512, r = n % 4, base = (n - r) * (Kp / 2), byte;
    int high;
    if (n >= N / 4 * 4) {
        byte = n * (Kp / 2) + (k / 64) * 32 + k % 32, high = k % 64 >= 32;
    } else if (k < 512 * nsb) {
        int64_t l = (k % 512) / 32, s = (k % 32) / 4;
        byte = base + 1024 * (k / 512) + 128 * s + 32 * r + 4 * (l % 8) + k % 4, high = l >= 8;
    } else {
        int64_t c = (k - 512 * nsb) / 64, j = (k - 512 * nsb) % 64;
        byte = base + 1024 * nsb + 128 * c + 32 * r + j % 32, high = j >= 32;
    }
    return (double)((high ? q[byte] >> 4 : q[byte] & 15) - 8);
}

static uint16_t s4(const uint16_t *ws, int64_t N, int64_t Kp, int64_t n, int64_t k) {
    int64_t nsb = Kp / 512, r = n % 4, base = (n - r) * (Kp / 32), tg = (Kp - 512 * nsb) / 32, G = k / 32;
    if (n >= N / 4 * 4) return ws[n * (Kp / 32) + G];
    if (G < 16 * nsb) return ws[base + 64 * (G / 16) + 16 * r + G % 16];
    return ws[base + 64 * nsb + r * tg + G - 16 * nsb];
}

/* The nearest bf16 to f by comparing its two neighbours (ties: the even one), apart from the kernel's rounding. */
static uint16_t bf16_ref(float f) {
    uint32_t u, a, b;
    float fl, fh;
    memcpy(&u, &f, 4);
    uint32_t lo = u >> 16, hi = lo + 1;
    a = lo << 16, b = hi << 16;
    memcpy(&fl, &a, 4), memcpy(&fh, &b, 4);
    double dl = fabs((double)f - fl), dh = fabs((double)fh - f);
    return (uint16_t)(dl < dh ? lo : dh < dl ? hi : (lo & 1 ? hi : lo));
}

static int check4(int64_t M, int64_t N, int64_t K) {
    int64_t Kp = tc_pad64(K);
    uint8_t *q = malloc(N * Kp / 2);
    uint16_t *ws = malloc(N * (Kp / 32) * 2);
    float *b = malloc(N * sizeof(float)), *x = malloc(M * K * sizeof(float)), *y = malloc(M * N * sizeof(float));
    float *yv = malloc(N * sizeof(float));
    void *buf = malloc(tc_gemm4_act_bytes(M, K, 1)), *one = malloc(tc_act_bytes(K));
    int8_t *tmp = malloc(tc4_ref_bytes(K));
    for (int64_t i = 0; i < N * Kp / 2; i++) q[i] = (uint8_t)next();
    for (int64_t i = 0; i < N * (Kp / 32); i++)
        ws[i] = (uint16_t)((next() & 0x8000) | (i % 13 == 7 ? (next() & 0x3ff) : 0x3000 | (next() & 0x7ff)));
    for (int64_t n = 0; n < N; n++) b[n] = unif();
    for (int64_t i = 0; i < M * K; i++) x[i] = unif() * (i % 89 == 5 ? 40.0f : 1.0f);
    int fails = 0;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        tc_gemm4_1(x, buf, q, ws, with_bias ? b : NULL, y, M, N, K);
        hash_out(y, M * N);
        double mx = 0.0, err = 0.0, verr = 0.0, rerr = 0.0;
        for (int64_t m = 0; m < M; m++) {
            tc_act8 a = tc_quant4(x + m * K, one, K, 1);
            for (int64_t n = 0; n < N; n++) yv[n] = 2.0f;
            gemv4_rows(&a, q, ws, yv, N, K, 1);
            for (int64_t n = 0; n < N; n++) {
                double r = 0.0;
                for (int64_t k = 0; k < K; k++)
                    r += w4(q, N, Kp, n, k) * tc_h2f_ref(s4(ws, N, Kp, n, k)) * a.q[k] * a.s[(k / TC_QB) * (TC_QB / 4)];
                double rb = r + (with_bias ? b[n] : 0.0), g = y[m * N + n], v = yv[n] - 2.0f + (with_bias ? b[n] : 0.f);
                float rf = tc4_dot_ref(&a, q, ws, N, K, n, tmp);
                mx = fabs(rb) > mx ? fabs(rb) : mx;
                err = fabs(g - rb) > err ? fabs(g - rb) : err;
                verr = fabs(g - v) > verr ? fabs(g - v) : verr;
                rerr = fabs(rf - r) > rerr ? fabs(rf - r) : rerr;
            }
        }
        if (!(err <= 1e-5 * mx) || !(verr <= 1e-5 * mx) || !(rerr <= 1e-5 * mx)) {
            printf("int4 M=%ld N=%ld K=%ld bias=%d: GEMM error %g, vs the GEMV %g, reference %g, of %g\n", (long)M,
                   (long)N, (long)K, with_bias, err, verr, rerr, mx);
            fails++;
        }
    }
    uint16_t *wb = malloc(K * 2);                       /* the rows as bf16 (prefill's bf16 GEMMs): bit for bit */
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++) {
        tc4_dequant_bf16_row(q, ws, N, n, K, wb, tmp);
        for (int64_t k = 0; k < K; k++)
            bad += wb[k] != bf16_ref((float)(w4(q, N, Kp, n, k) * tc_h2f_ref(s4(ws, N, Kp, n, k))));
    }
    if (bad) printf("int4 N=%ld K=%ld: %ld bf16 weights off\n", (long)N, (long)K, (long)bad), fails++;
    free(q), free(ws), free(b), free(x), free(y), free(yv), free(buf), free(one), free(wb), free(tmp);
    return fails;
}

int main(void) {
    static const int64_t shapes[][2] = {{37, 80}, {64, 768}, {5, 19}, {8, 9000}, {9, 100}, {4, 64}, {7, 33},
                                        {12, 3328}, {1, 1}};
    int fails = 0;
    printf("%s\n", tc_kernel_path());
    for (unsigned i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int spiky = 0; spiky < 2; spiky++) fails += check(shapes[i][0], shapes[i][1], spiky);
    float z[40] = {0}, nan_x[40] = {0};                  /* an all-zero block: scale 0; a NaN: NaN out */
    nan_x[35] = NAN;
    int8_t w[80];
    for (int i = 0; i < 80; i++) w[i] = (int8_t)(i - 40);
    float s1[2] = {1.f, 1.f}, y[2];
    void *buf = malloc(tc_act_bytes(40));
    tc_act8 a = tc_quant8(z, buf, 40);
    gemv_rows(&a, w, s1, y, 2, 40, 0);
    if (y[0] != 0.f || y[1] != 0.f) printf("zero input: %g %g\n", y[0], y[1]), fails++;
    a = tc_quant8(nan_x, buf, 40);
    gemv_rows(&a, w, s1, y, 2, 40, 0);
    if (!isnan(y[0]) || !isnan(y[1])) printf("NaN input: %g %g\n", y[0], y[1]), fails++;
    free(buf);
    static const int64_t gshapes[][3] = {{1, 1, 1}, {5, 7, 19}, {67, 37, 80}, {130, 9, 768}, {3, 5, 3328},
                                         {200, 12, 33}, {64, 4, 64}, {9, 13, 100}, {11, 7, 576}, {6, 9, 300},
                                         {13, 5, 1100}, {7, 6, 520}, {5, 8, 256}, {3, 3, 255}, {9, 7, 1536},
                                         {70, 9, 4864}, {5, 4, 5000},    /* K slabs on every path */
                                         {9, 5, 384}, {7, 9, 896}, {5, 6, 960}};  /* rests padded */
    for (unsigned i = 0; i < sizeof gshapes / sizeof gshapes[0]; i++)
        fails += check_gemm(gshapes[i][0], gshapes[i][1], gshapes[i][2]);
    for (unsigned i = 0; i < sizeof gshapes / sizeof gshapes[0]; i++)
        fails += check4(gshapes[i][0], gshapes[i][1], gshapes[i][2]);
    printf("gemm bits %016llx\n", (unsigned long long)gemm_bits);
    printf(fails ? "FAILED %d\n" : "ok\n", fails);
    return fails != 0;
}
