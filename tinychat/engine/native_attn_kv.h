/* The attention kernels that read K/V (native_attn.h's description), written once for both cache formats: included
   twice by native_attn.h, with TC_KV_F16 0 (fp32 K/V: the names as they are) and 1 (fp16 K/V, IEEE bits: the names
   with _h). A row of K or V is converted to floats as it is loaded (native_f16.h: exact), so the fp16 kernels run the
   fp32 kernels' products, sums and order on the rounded values: fp32 accumulation, the same bits as the fp32 kernel
   given K/V already rounded to fp16. */
#if TC_KV_F16
#define TC_KVT uint16_t
#define TC_N(f) f##_h
#define TC_LD16(p) tc_ld16h(p)
#define TC_LD8(p) tc_ld8h(p)
#define TC_ROW(buf, p, n) (tc_h2f_row(buf, p, n), (const float *)(buf))
#else
#define TC_KVT float
#define TC_N(f) f
#define TC_LD16(p) _mm512_loadu_ps(p)
#define TC_LD8(p) _mm256_loadu_ps(p)
#define TC_ROW(buf, p, n) ((void)(buf), (const float *)(p))
#endif

#if defined(TC_AVX512)
/* <q, k> for q held in nv 16-lane registers and a key row of 16 * nv: native_simd.h's tc_dot16 (a mul-fmadd chain,
   then tc_hsum16) on the loaded row. */
static inline float TC_N(kdot16)(const __m512 *qv, int64_t nv, const TC_KVT *k) {
    __m512 a = _mm512_mul_ps(qv[0], TC_LD16(k));
    for (int64_t v = 1; v < nv; v++) a = _mm512_fmadd_ps(qv[v], TC_LD16(k + 16 * v), a);
    return tc_hsum16(a);
}
/* The scores of 16 keys (rows of D = 16 * nv floats, D apart) against q (nv registers): lane j is TC_N(kdot16)(qv, nv,
   K + j * D) to the bit: the same products and fmadd chain per key, then one reduction tree for all 16 that adds
   the same pairs as _mm512_reduce_add_ps (GCC's: lanes l + l+8, then l + l+4, l + l+2, l + l+1; IEEE addition
   commutes), ~3 instructions a key instead of ~8. */
static inline __m512 TC_N(dots16x16)(const __m512 *qv, int nv, const TC_KVT *K, int64_t D) {
    __m512 a[16], t[8], u[4], w[2];
    for (int k = 0; k < 16; k++) {
        const TC_KVT *kr = K + k * D;
        a[k] = _mm512_mul_ps(qv[0], TC_LD16(kr));
        for (int v = 1; v < nv; v++) a[k] = _mm512_fmadd_ps(qv[v], TC_LD16(kr + 16 * v), a[k]);
    }
    for (int i = 0; i < 8; i++)          /* 256-bit halves: key 2i's l + l+8 in lanes 0-7, key 2i+1's in 8-15 */
        t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)          /* 128-bit halves: keys 4i .. 4i+3, l + l+4, one per 128-bit block */
        u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)          /* l + l+2: block b holds key 8i+b's two, then key 8i+4+b's */
        w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 z = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),     /* l + l+1: lane 4b + c */
                             _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));    /* is key b + 4c */
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
}

/* acc += p * v for v of 16 * nv floats. */
static inline void TC_N(axpy16)(__m512 *acc, int64_t nv, float p, const TC_KVT *v) {
    __m512 pv = _mm512_set1_ps(p);
    for (int64_t i = 0; i < nv; i++) acc[i] = _mm512_fmadd_ps(pv, TC_LD16(v + 16 * i), acc[i]);
}

/* One q head (D a multiple of 16, at most 256) against keys 0..L of K/V and the W ring slots of Kl/Vl that hold
   one of the last W positions: scores into s (L + 1 + W), softmax, o = p @ [V | Vl]. q stays in registers; the
   exponentials and their sum run 16 at a time; the 1/sum is applied once to o. */
static void TC_N(attend_head16)(const float *q, const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl, const TC_KVT *Vl,
                          const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o) {
    int64_t nv = D / 16, n = L + 1 + W;
    __m512 qv[16], acc[16];
    for (int64_t v = 0; v < nv; v++) qv[v] = _mm512_loadu_ps(q + 16 * v);
    float m = -INFINITY;
    for (int64_t j = 0; j <= L; j++) {
        float x = TC_N(kdot16)(qv, nv, K + j * D);
        s[j] = x;
        m = x > m ? x : m;
    }
    for (int64_t j = 0; j < W; j++) {
        int64_t p = lpos[j];
        float x = (p >= 0 && L - p < W) ? TC_N(kdot16)(qv, nv, Kl + j * D) : -INFINITY;
        s[L + 1 + j] = x;
        m = x > m ? x : m;
    }
    float rz = softmax16(s, n, m);
    for (int64_t v = 0; v < nv; v++) acc[v] = _mm512_setzero_ps();
    for (int64_t i = 0; i <= L; i++) TC_N(axpy16)(acc, nv, s[i], V + i * D);
    for (int64_t i = 0; i < W; i++)
        if (s[L + 1 + i] != 0.f) TC_N(axpy16)(acc, nv, s[L + 1 + i], Vl + i * D);
    __m512 rv = _mm512_set1_ps(rz);
    for (int64_t v = 0; v < nv; v++) _mm512_storeu_ps(o + 16 * v, _mm512_mul_ps(acc[v], rv));
}

/* attend_head16 for the nh heads of one K/V group at once (head h's query at q + h * qs, output at o + h * os,
   scores at s + h * (L + 1 + W)): each key and value row is loaded once for the nh heads, and every head's
   arithmetic is attend_head16's (the same products, sums and order: the same bits). Inlined with constant nh and
   nv, so the heads' queries and accumulators stay in registers (nh * nv <= 16). */
static inline __attribute__((always_inline)) void TC_N(attend_grp16)(const int nh, const int nv, const float *q, int64_t qs,
                                                               const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl,
                                                               const TC_KVT *Vl, const int64_t *lpos, int64_t L,
                                                               int64_t W, float *s, float *o, int64_t os) {
    const int64_t D = 16 * nv, n = L + 1 + W;
    __m512 qv[16], acc[16];
    float m[4], rz[4];
    for (int h = 0; h < nh; h++) {
        for (int v = 0; v < nv; v++) qv[h * nv + v] = _mm512_loadu_ps(q + h * qs + 16 * v);
        m[h] = -INFINITY;
    }
    int64_t j = 0;
    for (; j + 16 <= L + 1; j += 16)                  /* 16 keys at a time: dot16's bits, one reduction tree */
        for (int h = 0; h < nh; h++) {
            __m512 x = TC_N(dots16x16)(qv + h * nv, nv, K + j * D, D);
            _mm512_storeu_ps(s + h * n + j, x);
            float mx = _mm512_reduce_max_ps(x);
            m[h] = mx > m[h] ? mx : m[h];
        }
    for (; j <= L; j++)
        for (int h = 0; h < nh; h++) {
            float x = TC_N(kdot16)(qv + h * nv, nv, K + j * D);
            s[h * n + j] = x;
            m[h] = x > m[h] ? x : m[h];
        }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i zero = _mm512_setzero_si512(), lw = _mm512_set1_epi64(L - W);
    for (j = 0; j + 16 <= W; j += 16) {               /* the band's slots, 16 at a time; no key: -inf */
        __m512i p0 = _mm512_loadu_si512((const void *)(lpos + j)), p1 = _mm512_loadu_si512((const void *)(lpos + j + 8));
        __mmask8 k0 = _mm512_cmpge_epi64_mask(p0, zero) & _mm512_cmpgt_epi64_mask(p0, lw);     /* L - p < W */
        __mmask8 k1 = _mm512_cmpge_epi64_mask(p1, zero) & _mm512_cmpgt_epi64_mask(p1, lw);
        __mmask16 ok = (__mmask16)(k0 | (k1 << 8));
        for (int h = 0; h < nh; h++) {
            __m512 x = ok ? _mm512_mask_blend_ps(ok, ninf, TC_N(dots16x16)(qv + h * nv, nv, Kl + j * D, D)) : ninf;
            _mm512_storeu_ps(s + h * n + L + 1 + j, x);
            float mx = _mm512_reduce_max_ps(x);
            m[h] = mx > m[h] ? mx : m[h];
        }
    }
    for (; j < W; j++) {
        int64_t p = lpos[j];
        int ok = p >= 0 && L - p < W;
        for (int h = 0; h < nh; h++) {
            float x = ok ? TC_N(kdot16)(qv + h * nv, nv, Kl + j * D) : -INFINITY;
            s[h * n + L + 1 + j] = x;
            m[h] = x > m[h] ? x : m[h];
        }
    }
    for (int h = 0; h < nh; h++) rz[h] = softmax16(s + h * n, n, m[h]);
    for (int v = 0; v < nh * nv; v++) acc[v] = _mm512_setzero_ps();
    for (int64_t i = 0; i <= L; i++)
        for (int h = 0; h < nh; h++) TC_N(axpy16)(acc + h * nv, nv, s[h * n + i], V + i * D);
    for (int64_t i = 0; i < W; i++)
        for (int h = 0; h < nh; h++)
            if (s[h * n + L + 1 + i] != 0.f) TC_N(axpy16)(acc + h * nv, nv, s[h * n + L + 1 + i], Vl + i * D);
    for (int h = 0; h < nh; h++) {
        __m512 rv = _mm512_set1_ps(rz[h]);
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(o + h * os + 16 * v, _mm512_mul_ps(acc[h * nv + v], rv));
    }
}

static void TC_N(attend_heads16)(int64_t nh, const float *q, int64_t qs, const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl,
                           const TC_KVT *Vl, const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o,
                           int64_t os) {
    if (nh == 4) TC_N(attend_grp16)(4, 4, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    else if (nh == 3) TC_N(attend_grp16)(3, 4, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    else if (nh == 2) TC_N(attend_grp16)(2, 4, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    else
        for (int64_t h = 0; h < nh; h++)
            TC_N(attend_head16)(q + h * qs, K, V, Kl, Vl, lpos, L, W, D, s + h * (L + 1 + W), o + h * os);
}
#endif

#if defined(TC_AVX2) && !defined(TC_AVX512)
/* out[h]: the scores of keys kr[0..3] (rows of D = 8 * nv floats) against the nh queries q + h * qs: per head and
   key one mul-fmadd chain over D in 8 lanes, then tree4. Each key row is loaded once for the nh heads (the queries
   are read from L1 by the fmadds). */
static inline __attribute__((always_inline)) void TC_N(dots8x4)(const int nh, const int nv, const float *q, int64_t qs,
                                                          const TC_KVT *const kr[4], __m128 *out) {
    __m256 a[3][4];
    for (int k = 0; k < 4; k++) {
        __m256 kv = TC_LD8(kr[k]);
        for (int h = 0; h < nh; h++) a[h][k] = _mm256_mul_ps(_mm256_loadu_ps(q + h * qs), kv);
    }
    for (int v = 1; v < nv; v++)
        for (int k = 0; k < 4; k++) {
            __m256 kv = TC_LD8(kr[k] + 8 * v);
            for (int h = 0; h < nh; h++)
                a[h][k] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * qs + 8 * v), kv, a[h][k]);
        }
    for (int h = 0; h < nh; h++) out[h] = tree4(a[h][0], a[h][1], a[h][2], a[h][3]);
}

/* The attention at AVX2 level, decode's and prefill's: the nh (1-3) q heads of one K/V group for one query, in one
   pass over the keys the query sees (keys 0..L of K/V, the W ring entries of Kl/Vl holding one of the last W
   positions); head h's query at q + h * qs, output at o + h * os, scores at s + h * (L + 1 + W). Scores 4 keys at a
   time (dots8x4); a run's last 1-3 keys go through the same code with the last key repeated, so a score's bits
   depend only on its query and key, never on the chunk (a prefill split differently gives the same cache). Softmax
   8 lanes at a time (softmax8); o = p @ [V | Vl] in chunks of 4 registers of D, each value row loaded once for the
   heads, the 1 / sum applied once. Inlined with constant nh (and nv for D = 64) so the accumulators stay in
   registers. */
static inline __attribute__((always_inline)) void TC_N(attend_grp8)(const int nh, const int nv, const float *q, int64_t qs,
                                                              const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl,
                                                              const TC_KVT *Vl, const int64_t *lpos, int64_t L,
                                                              int64_t W, float *s, float *o, int64_t os) {
    const int64_t D = 8 * nv, n = L + 1 + W;
    const __m128 ninf = _mm_set1_ps(-INFINITY);
    __m128 mx[3], x[3];
    float rz[3];
    for (int h = 0; h < nh; h++) mx[h] = ninf;
    for (int64_t j = 0; j <= L; j += 4) {
        int64_t c = L + 1 - j < 4 ? L + 1 - j : 4;
        const TC_KVT *kr[4];
        for (int k = 0; k < 4; k++) kr[k] = K + (j + (k < c ? k : c - 1)) * D;
        TC_N(dots8x4)(nh, nv, q, qs, kr, x);
        for (int h = 0; h < nh; h++) {
            if (c == 4) _mm_storeu_ps(s + h * n + j, x[h]);
            else {
                float t[4];
                _mm_storeu_ps(t, x[h]);
                for (int64_t k = 0; k < c; k++) s[h * n + j + k] = t[k];
            }
            mx[h] = _mm_max_ps(x[h], mx[h]);           /* a repeated key changes no max; NaN scores are skipped */
        }
    }
    for (int64_t j = 0; j < W; j += 4) {               /* the band; a slot without a key of it: -inf */
        int64_t c = W - j < 4 ? W - j : 4;
        const TC_KVT *kr[4];
        int32_t ok[4], any = 0;
        for (int k = 0; k < 4; k++) {
            int64_t e = j + (k < c ? k : c - 1), p = lpos[e];
            kr[k] = Kl + e * D;
            ok[k] = -(int32_t)(p >= 0 && L - p < W);
            any |= ok[k];
        }
        if (any) TC_N(dots8x4)(nh, nv, q, qs, kr, x);
        const __m128 okm = _mm_castsi128_ps(_mm_setr_epi32(ok[0], ok[1], ok[2], ok[3]));
        for (int h = 0; h < nh; h++) {
            __m128 y = any ? _mm_blendv_ps(ninf, x[h], okm) : ninf;
            float t[4];
            _mm_storeu_ps(t, y);
            for (int64_t k = 0; k < c; k++) s[h * n + L + 1 + j + k] = t[k];
            mx[h] = _mm_max_ps(y, mx[h]);
        }
    }
    for (int h = 0; h < nh; h++) {
        __m128 m = _mm_max_ps(mx[h], _mm_movehl_ps(mx[h], mx[h]));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        rz[h] = softmax8(s + h * n, n, _mm_cvtss_f32(m));
    }
    /* p @ values by blocks of kb keys (16 KiB of value rows): each block's rows are read from memory once and stay
       in L1 for the other chunks of D; the chunks' sums wait in o between blocks (the same additions in the same
       order as one pass per chunk: the same bits) */
    const int64_t kb = 16384 / (4 * D);
    for (int64_t i0 = 0; i0 < n; i0 += kb) {
        const int64_t i1 = i0 + kb < n ? i0 + kb : n;
        for (int v0 = 0; v0 < nv; v0 += 4) {
            const int cv = nv - v0 < 4 ? nv - v0 : 4;
            __m256 acc[3][4];
            for (int h = 0; h < nh; h++)
                for (int v = 0; v < cv; v++)
                    acc[h][v] = i0 ? _mm256_loadu_ps(o + h * os + 8 * (v0 + v)) : _mm256_setzero_ps();
            for (int64_t i = i0; i < i1; i++) {
                const TC_KVT *vr = i <= L ? V + i * D : Vl + (i - L - 1) * D;
                if (i > L) {                             /* a band slot no head sees (masked): skipped */
                    int any = 0;
                    for (int h = 0; h < nh; h++) any |= s[h * n + i] != 0.f;
                    if (!any) continue;
                }
                __m256 p[3];
                for (int h = 0; h < nh; h++) p[h] = _mm256_broadcast_ss(s + h * n + i);
                for (int v = 0; v < cv; v++) {
                    __m256 vv = TC_LD8(vr + 8 * (v0 + v));
                    for (int h = 0; h < nh; h++) acc[h][v] = _mm256_fmadd_ps(p[h], vv, acc[h][v]);
                }
            }
            for (int h = 0; h < nh; h++)
                for (int v = 0; v < cv; v++) _mm256_storeu_ps(o + h * os + 8 * (v0 + v), acc[h][v]);
        }
    }
    for (int h = 0; h < nh; h++) {
        __m256 rv = _mm256_set1_ps(rz[h]);
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(o + h * os + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(o + h * os + 8 * v), rv));
    }
}

/* attend_grp8 for nh (1-3) heads, D a multiple of 8 up to 256 (D = 64 specialized). */
static void TC_N(attend_heads8)(int64_t nh, const float *q, int64_t qs, const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl,
                          const TC_KVT *Vl, const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o,
                          int64_t os) {
    if (D == 64) {
        if (nh == 3) TC_N(attend_grp8)(3, 8, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else if (nh == 2) TC_N(attend_grp8)(2, 8, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else TC_N(attend_grp8)(1, 8, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    } else {
        const int nv = (int)(D / 8);
        if (nh == 3) TC_N(attend_grp8)(3, nv, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else if (nh == 2) TC_N(attend_grp8)(2, nv, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
        else TC_N(attend_grp8)(1, nv, q, qs, K, V, Kl, Vl, lpos, L, W, s, o, os);
    }
}
#endif

/* attend_head16 for any D, in plain C (the compiler's vectors): one q head against keys 0..L of K/V and the W ring
   slots of Kl/Vl holding one of the last W positions; scores into s (L + 1 + W), o = softmax @ [V | Vl]. */
static void TC_N(attend_head)(const float *q, const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl, const TC_KVT *Vl,
                        const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o) {
    int64_t n = L + 1 + W;
    float m = -INFINITY, kb[TC_KV_F16 ? D : 1];       /* fp16: each row as floats (exact) before the same math */
    for (int64_t j = 0; j <= L; j++) {
        const float *kr = TC_ROW(kb, K + j * D, D);
        float a = 0.f;
#pragma omp simd reduction(+ : a)
        for (int64_t t = 0; t < D; t++) a += q[t] * kr[t];
        s[j] = a;
        m = a > m ? a : m;
    }
    for (int64_t j = 0; j < W; j++) {
        int64_t p = lpos[j];
        float a = -INFINITY;
        if (p >= 0 && L - p < W) {
            const float *kr = TC_ROW(kb, Kl + j * D, D);
            a = 0.f;
#pragma omp simd reduction(+ : a)
            for (int64_t t = 0; t < D; t++) a += q[t] * kr[t];
        }
        s[L + 1 + j] = a;
        m = a > m ? a : m;
    }
    double z = 0.0;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(s[j] - m);
        s[j] = e;
        z += e;
    }
    float rz = (float)(1.0 / z);
    for (int64_t t = 0; t < D; t++) o[t] = 0.f;
    for (int64_t j = 0; j <= L; j++) {
        float p = s[j] * rz;
        const float *vr = TC_ROW(kb, V + j * D, D);
        for (int64_t t = 0; t < D; t++) o[t] += p * vr[t];
    }
    for (int64_t j = 0; j < W; j++) {
        float p = s[L + 1 + j] * rz;
        if (p != 0.f) {
            const float *vr = TC_ROW(kb, Vl + j * D, D);
            for (int64_t t = 0; t < D; t++) o[t] += p * vr[t];
        }
    }
}

/* One q head h (D a multiple of 8 or not: each level's kernel) against its K/V group; s: L + 1 + W floats. */
static void TC_N(attend_one)(const float *q, const TC_KVT *K, const TC_KVT *V, const TC_KVT *Kl, const TC_KVT *Vl,
                       const int64_t *lpos, int64_t L, int64_t W, int64_t D, float *s, float *o) {
#if defined(TC_AVX512)
    if ((D & 15) == 0 && D <= 256) {
        TC_N(attend_head16)(q, K, V, Kl, Vl, lpos, L, W, D, s, o);
        return;
    }
#elif defined(TC_AVX2)
    if ((D & 7) == 0 && D <= 256) {
        TC_N(attend_heads8)(1, q, D, K, V, Kl, Vl, lpos, L, W, D, s, o, D);
        return;
    }
#endif
    TC_N(attend_head)(q, K, V, Kl, Vl, lpos, L, W, D, s, o);
}


/* The H q heads at heads (H*D) against their K/V group (q head h reads group h / (H / Hk)): keys 0..L of gk/gv
   ((Hk, gstride, D)) and the W ring slots of lk/lv ((Hk, W + 1, D); W = 0: none). y: (H*D). sc: nt * (H / Hk) *
   (L + 1 + W) floats of scores. Each thread takes a contiguous range of heads (as a static schedule would); on
   AVX-512 with D = 64 the heads of its range that share a K/V group run in one pass (attend_grp16, up to 4 at a
   time: the same bits as one by one; on AVX2 attend_grp8, up to 3, prefill's kernel), so a group split between two
   threads (SmolLM2's 9 heads in 3 groups over 2 threads) is read once by each instead of once per head. */
static void TC_N(attend_all)(const float *heads, int64_t H, int64_t Hk, int64_t D, const TC_KVT *gk, const TC_KVT *gv,
                       int64_t gstride, const TC_KVT *lk, const TC_KVT *lv, int64_t W, const int64_t *lpos, int64_t L,
                       float *y, float *sc, int nt) {
    int64_t rep = H / Hk, n = L + 1 + W;
/* heads over the threads from short contexts on: a head's attention is little work a layer there, but the step's
   workers are still spinning from the GEMV before, so splitting costs no wake-up (docs/benchmarks.md, "Kernel
   figures moved out of the sources") */
    int par = (L + 1) * H * D > (1 << 14) ? nt : 1;
    (void)par;                                        /* without OpenMP: unused */
#pragma omp parallel num_threads(par)
    {
        int64_t me = 0, all = 1;
#ifdef _OPENMP
        me = omp_get_thread_num(), all = omp_get_num_threads();
#endif
        float *s = sc + me * rep * n;
        int64_t h = H * me / all, h1 = H * (me + 1) / all;
        while (h < h1) {
            int64_t g = h / rep;
            const TC_KVT *K = gk + g * gstride * D, *V = gv + g * gstride * D;
            const TC_KVT *Kl = lk + g * (W + 1) * D, *Vl = lv + g * (W + 1) * D;
#if defined(TC_AVX2)
            int64_t run = ((g + 1) * rep < h1 ? (g + 1) * rep : h1) - h;   /* the range's heads of group g */
#endif
#if defined(TC_AVX512)
            if (D == 64) {                  /* 5 -> 3 + 2, 6 -> 4 + 2, ... */
                int64_t c = run <= 4 ? run : run == 5 ? 3 : 4;
                TC_N(attend_heads16)(c, heads + h * D, D, K, V, Kl, Vl, lpos, L, W, D, s, y + h * D, D);
                h += c;
                continue;
            }
#elif defined(TC_AVX2)
            if ((D & 7) == 0 && D <= 256) {   /* 4 -> 2 + 2, 5 -> 3 + 2, ... */
                int64_t c = run <= 3 ? run : run == 4 ? 2 : 3;
                TC_N(attend_heads8)(c, heads + h * D, D, K, V, Kl, Vl, lpos, L, W, D, s, y + h * D, D);
                h += c;
                continue;
            }
#endif
            TC_N(attend_one)(heads + h * D, K, V, Kl, Vl, lpos, L, W, D, s, y + h * D);
            h++;
        }
    }
}


/* Prefill attention of one layer, batch 1 (native.c's tc_prefill_attn, and tc_prefill_attn_h on an fp16 cache): C
   queries at positions L0 .. L0 + C - 1, each against the global keys 0..its position of gk/gv ((Hk, gstride, D),
   the chunk's own keys already written) and its local band: seq_k/seq_v ((Hk, W + C, D): the ring's last W entries
   in position order, then the chunk's keys) entries i + 1 .. i + W, whose positions spos (W + C; -1: not a key)
   says. q: (H, C, D), rotated and already scaled by 1/sqrt(D); y: (H, C, D). Every (head, query) pair runs over only
   the keys it sees; on AVX-512 with D = 64 the heads of a K/V group share one pass over its keys and values
   (attend_grp16: the same bits); on AVX2 up to 3 heads do (attend_grp8: scores 4 keys at a time, its own bits).
   sc: nt * (H / Hk) * (L0 + C + W) floats. */
static void TC_N(prefill_attn)(const float *q, int64_t H, int64_t Hk, int64_t D, int64_t C, int64_t L0,
                               const TC_KVT *gk, const TC_KVT *gv, int64_t gstride, const TC_KVT *seq_k,
                               const TC_KVT *seq_v, const int64_t *spos, int64_t W, float *y, float *sc, int nt) {
    int64_t rep = H / Hk, n = L0 + C + W, G = 1;
    (void)n;                                          /* without OpenMP: one thread's scores at sc */
#if defined(TC_AVX512)
    G = grp16_size(rep, D);                 /* heads of a group that share one pass over its keys and values */
#elif defined(TC_AVX2)
    if ((D & 7) == 0 && D <= 256) G = grp8_size(rep);
#endif
    int64_t ng = rep / G;
#pragma omp parallel for schedule(dynamic, 4) num_threads(nt)
    for (int64_t t = 0; t < Hk * ng * C; t++) {
        int64_t hq = (t / C) * G, i = t % C, g = hq / rep;
#ifdef _OPENMP
        float *s = sc + (int64_t)omp_get_thread_num() * G * n;
#else
        float *s = sc;
#endif
        const float *qi = q + (hq * C + i) * D;
        const TC_KVT *K = gk + g * gstride * D, *V = gv + g * gstride * D;
        const TC_KVT *Kl = W ? seq_k + (g * (W + C) + i + 1) * D : K, *Vl = W ? seq_v + (g * (W + C) + i + 1) * D : V;
        const int64_t *lp = W ? spos + i + 1 : NULL;
        float *o = y + (hq * C + i) * D;
#if defined(TC_AVX512)
        if ((D & 15) == 0 && D <= 256) {
            TC_N(attend_heads16)(G, qi, C * D, K, V, Kl, Vl, lp, L0 + i, W, D, s, o, C * D);
            continue;
        }
#elif defined(TC_AVX2)
        if ((D & 7) == 0 && D <= 256) {
            TC_N(attend_heads8)(G, qi, C * D, K, V, Kl, Vl, lp, L0 + i, W, D, s, o, C * D);
            continue;
        }
#endif
        TC_N(attend_one)(qi, K, V, Kl, Vl, lp, L0 + i, W, D, s, o);
    }
}

#undef TC_KVT
#undef TC_N
#undef TC_LD16
#undef TC_LD8
#undef TC_ROW
