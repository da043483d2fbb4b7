/* The fp16 K/V cache's kernels (tinychat/engine/native_f16.h, native_attn_kv.h's _h attention) against plain C and
   float64 references, built for whatever target the compiler is told (x86-64 levels natively, aarch64 under
   qemu-user: tests/unit/test_native_kv16.py). Prints the kernel path, then "ok", or what differed (exit 1). No OpenMP:
   one thread. */
#include "native_attn.h"
#include "harness.h"

/* fp32 -> fp16 on this path (rows of every length: vector bodies and tails) equal to tc_f2h_ref, which rounds to
   nearest even (checked against the halfway points of fp16 neighbours), and fp16 -> fp32 exact both ways. */
static int check_convert(void) {
    enum { N = 4099 };
    static float x[N], back[N];
    static uint16_t h[N];
    int fails = 0;
    for (int i = 0; i < N; i++) {
        uint32_t b = next() | (next() << 21);
        memcpy(&x[i], &b, 4);
        if ((b & 0x7f800000u) == 0x7f800000u) x[i] = 1.0f;            /* no inf / NaN in the random part */
        if (i % 7 == 3) x[i] = unif() * 1e-5f;                         /* fp16 subnormals */
        if (i % 11 == 5) x[i] = unif() * 70000.f;                      /* overflow to inf */
    }
    x[0] = 65504.f, x[1] = 65519.996f, x[2] = 65520.f, x[3] = -0.f, x[4] = 5.9604644775390625e-8f;
    x[5] = 2.98023223876953125e-8f, x[6] = 8.940696716308594e-8f;      /* ties on the subnormal grid: 0, 2^-23 */
    for (int i = 7; i < 64; i++) {                                    /* exact ties between fp16 neighbours */
        uint16_t a = (uint16_t)(0x3c00 + (next() & 0x7ff));
        x[i] = (tc_h2f_ref(a) + tc_h2f_ref((uint16_t)(a + 1))) * 0.5f;
    }
    for (int64_t n = 1; n <= N; n += n < 40 ? 1 : 997) {
        tc_f2h_row(h, x, n);
        tc_h2f_row(back, h, n);
        for (int64_t i = 0; i < n; i++) {
            if (h[i] != tc_f2h_ref(x[i]) || back[i] != tc_h2f_ref(h[i])) {
                printf("convert n=%ld i=%ld: %a -> %04x (ref %04x) -> %a\n", (long)n, (long)i, x[i], h[i],
                       tc_f2h_ref(x[i]), back[i]);
                return 1;
            }
        }
    }
    for (int i = 0; i < N; i++) {                                     /* the reference: nearest, ties to even */
        uint16_t r = tc_f2h_ref(x[i]);
        double v = x[i], got = tc_h2f_ref(r);
        if (fabs(v) >= 65520.0) {
            if ((r & 0x7fff) != 0x7c00) fails++;
            continue;
        }
        double lo = tc_h2f_ref((uint16_t)(r - ((r & 0x7fff) ? 1 : 0))), hi = tc_h2f_ref((uint16_t)(r + 1));
        double e = fabs(got - v);
        if (e > fabs(lo - v) || ((r & 0x7fff) != 0x7bff && e > fabs(hi - v))) fails++;
        if ((e == fabs(lo - v) && lo != got) || (e == fabs(hi - v) && hi != got)) fails += (r & 1) != 0;   /* tie: even */
    }
    if (tc_f2h_ref(x[1]) != 0x7bff || tc_f2h_ref(x[2]) != 0x7c00 || tc_f2h_ref(x[5]) != 0 || tc_f2h_ref(x[6]) != 2)
        fails++;
    if (fails) printf("tc_f2h_ref: %d values not rounded to nearest even\n", fails);
    return fails;
}

/* attend_all_h: H q heads against keys 0..L of fp16 K/V, against float64 math on the same fp16 values, and equal to
   the fp32 kernel (attend_all) on the rows widened to fp32: the same bits. */
static int check_attend(int64_t H, int64_t Hk, int64_t D, int64_t L) {
    int64_t gs = L + 5, n = Hk * gs * D, rep = H / Hk;
    uint16_t *k16 = malloc(n * 2), *v16 = malloc(n * 2);
    float *k32 = malloc(n * 4), *v32 = malloc(n * 4), *q = malloc(H * D * 4), *y = malloc(H * D * 4);
    float *y32 = malloc(H * D * 4), *sc = malloc(rep * (L + 1) * 4);
    double *s = malloc((L + 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) k32[i] = unif() * 3.f, v32[i] = unif() * 2.f;
    for (int64_t i = 0; i < H * D; i++) q[i] = unif() * 0.5f;
    tc_f2h_row(k16, k32, n);
    tc_f2h_row(v16, v32, n);
    tc_h2f_row(k32, k16, n);
    tc_h2f_row(v32, v16, n);
    attend_all_h(q, H, Hk, D, k16, v16, gs, k16, v16, 0, NULL, L, y, sc, 1);
    attend_all(q, H, Hk, D, k32, v32, gs, k32, v32, 0, NULL, L, y32, sc, 1);
    double err = 0.0, mx = 0.0;
    int same = 1;
    for (int64_t h = 0; h < H; h++) {
        const uint16_t *K = k16 + (h / rep) * gs * D, *V = v16 + (h / rep) * gs * D;
        double m = -INFINITY, z = 0.0;
        for (int64_t j = 0; j <= L; j++) {
            double a = 0.0;
            for (int64_t t = 0; t < D; t++) a += (double)q[h * D + t] * tc_h2f_ref(K[j * D + t]);
            s[j] = a;
            m = a > m ? a : m;
        }
        for (int64_t j = 0; j <= L; j++) z += (s[j] = exp(s[j] - m));
        for (int64_t t = 0; t < D; t++) {
            double o = 0.0;
            for (int64_t j = 0; j <= L; j++) o += s[j] / z * tc_h2f_ref(V[j * D + t]);
            double g = y[h * D + t];
            err = fabs(g - o) > err ? fabs(g - o) : err;
            mx = fabs(o) > mx ? fabs(o) : mx;
            if (memcmp(&y[h * D + t], &y32[h * D + t], 4)) same = 0;
        }
    }
    free(k16), free(v16), free(k32), free(v32), free(q), free(y), free(y32), free(sc), free(s);
    if (!(err <= 2e-5 * (mx > 1.0 ? mx : 1.0)) || !same) {
        printf("attend H=%ld Hk=%ld D=%ld L=%ld: max error %g of %g, %s the fp32 kernel's bits\n", (long)H, (long)Hk,
               (long)D, (long)L, err, mx, same ? "with" : "NOT");
        return 1;
    }
    return 0;
}

int main(void) {
    static const int64_t shapes[][4] = {{9, 3, 64, 0}, {9, 3, 64, 300}, {8, 2, 64, 40}, {6, 2, 64, 17},
                                        {10, 2, 64, 33}, {12, 2, 64, 70}, {4, 4, 16, 50}, {8, 2, 24, 40},
                                        {14, 2, 64, 200}, {4, 1, 128, 90}, {2, 1, 32, 5}};
    int fails = 0;
    printf("%s\n", tc_kernel_path());
    fails += check_convert();
    for (unsigned i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        fails += check_attend(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
    printf(fails ? "FAILED %d\n" : "ok\n", fails);
    return fails != 0;
}
