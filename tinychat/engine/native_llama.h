/* The llama family's batch-1 int8 decode step in one call (included by native.c; engine/native_llama_step.py builds
   its plan): every layer global (no local ring), no QK-norm, RMSNorm with an epsilon (the learned gains already
   folded into the next Linear by the importer, or kept apart: the fused matrices' input gains), optional q/k/v biases, a SwiGLU MLP (up = [gate; up] rows), an
   optional logit softcap, after the head's best candidates are rescored in fp32 (as append.rescore_top).

   Per layer: h = rms(x); qkv = w_qkv(h) (+ b); q / k heads rotated (half-split RoPE), q scaled by 1/sqrt(D); the
   token's K/V written at position L of the layer's cache (an fp16 cache, kv16: rounded to fp16 there, and attention
   reads the rounded rows, native_attn_kv.h's _h kernels, fp32 accumulation); one softmax per q head over keys 0..L; x += w_o(y);
   h = rms(x); u = w_up(h); x += w_down(silu(gate) * up). The int8 products are native_q8.h's (activations in
   blocks of 32 with an fp32 scale). */

/* h = x / sqrt(mean(x^2) + eps): F.rms_norm without a weight; then, with a gain g (the next Linear's in_gain,
   engine/quant.py; NULL: none), h *= g (two fp32 roundings, as the PyTorch steps' rms_norm(x) * g). */
static void rms_eps(const float *x, float *h, int64_t d, float eps, const float *g) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (int64_t i = 0; i < d; i++) h[i] = x[i] * r;
    if (g)
        for (int64_t i = 0; i < d; i++) h[i] *= g[i];
}

/* o[i] = silu(g[i]) * v[i] = g / (1 + e^-g) * v (o may be g). e^-g by tc_exp16 / tc_exp8 (0 below g = -87...; -g
   clamped at 88 first on AVX2, whose 2^n is built in the exponent bits: silu there is -0 or a tiny negative, as
   near as fp32 gets), the rest by expf. */
static void swiglu_to(const float *g, const float *v, float *o, int64_t n) {
    int64_t i = 0;
#if defined(TC_AVX512)
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 e = tc_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), _mm512_loadu_ps(v + i)));
    }
#elif defined(TC_AVX2)
    const __m256 one = _mm256_set1_ps(1.0f), hi = _mm256_set1_ps(88.0f);
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = tc_exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), hi));   /* NaN g: x / .. stays NaN */
        _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(v + i)));
    }
#endif
    for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * v[i];
}

/* u[i] = silu(g[i]) * v[i] for u = [g (n) | v (n)], written over the first n. */
static void swiglu(float *u, int64_t n) { swiglu_to(u, u + n, u, n); }

/* The k largest logits (k <= TC_MAXK; ties: the lower id first) recomputed as s[id] * <q[id], h> in double from the
   fp32 hidden state h, instead of the int8-activation GEMV's value: greedy and the sampler see the int8 weights'
   exact logits for the candidates that matter (a large vocabulary's top two can be 0.08 apart). */
#define TC_MAXK 128                              /* the two-level int4 head rescores 128 (engine/two_level_head.py) */
static void rescore(float *logits, int64_t V, int64_t k, const int8_t *q, const float *s, const float *h,
                    int64_t d) {
    if (k > TC_MAXK) k = TC_MAXK;
    if (k > V) k = V;
    int64_t ids[TC_MAXK];
    float val[TC_MAXK];
    int64_t n = 0;
    for (int64_t i = 0; i < V; i++) {            /* insertion into a sorted (descending) list of at most k */
        float x = logits[i];
        if (n == k && !(x > val[k - 1])) continue;
        int64_t j = n < k ? n++ : k - 1;
        while (j > 0 && x > val[j - 1]) {
            val[j] = val[j - 1];
            ids[j] = ids[j - 1];
            j--;
        }
        val[j] = x;
        ids[j] = i;
    }
    for (int64_t j = 0; j < n; j++) {
        const int8_t *r = q + ids[j] * d;
        double a = 0.0;
        for (int64_t t = 0; t < d; t++) a += (double)r[t] * h[t];
        logits[ids[j]] = (float)(a * s[ids[j]]);
    }
}

/* tc_llama_step's view of a model and its fp32 (or fp16: kv16) cache; all int64 (pointers as integers; native_llama_step.py builds
   the same layout). tab: per layer LTAB_COLS: QKV weights, scales, rows, bias (0: none), then w_o, up, down weights
   and scales, then the (d) fp32 input gains of the QKV and of up (0: none; the norm gains kept apart, issue #34), then
   the layer's weight formats (a TC_F_* mask, native_q4.h: per layer, --quant int4's per-layer mix). gk/gv: (n_layers, 1, Hk, gstride, D). embed: (V, d) by embed_fmt: TC_EMB_F32, TC_EMB_BF16, or
   TC_EMB_Q8 (a tied embedding read from the int8 head rows, engine/head_embed.py: embed the int8 rows, embed_s their
   fp32 row scales, embed_g the (d) inverse final-norm gain; row = (q * s) * g, the bits HeadRowsEmbedding gives). */
#define LTAB_COLS 13
#define LTAB_FMT 12                                    /* the column of the layer's TC_F_* mask */
typedef struct {
    int64_t d, hidden, H, Hk, D, gstride, V, n_layers, rescore_k, embed_fmt;
    int64_t tab, x, h, xq, qkv, y, u, logits, sc, embed, cos_, sin_, gk, gv, tokens, lens, lens_cpu, head_q, head_s;
    int64_t embed_s, embed_g;                      /* TC_EMB_Q8: the rows' fp32 scales, the (d) column factors */
    int64_t drop;                                  /* 0, or the drop table (native.c's tc_drop): n_layers + 1 rows */
    int64_t kv16;                                  /* 1: gk / gv hold fp16 bits (uint16), else fp32 */
    int64_t head4_q, head4_s;                      /* the two-level head (engine/two_level_head.py): the head's
                                                      int4 copy (native_q4_layout.h) scanned for every logit, then
                                                      the rescore_k best recomputed from the int8 rows; 0: int8 */
} tc_lplan;
enum { TC_EMB_F32 = 0, TC_EMB_BF16 = 1, TC_EMB_Q8 = 2 };

/* x += w_o(y); h = rms(x); u = up(h); x += down(silu(gate) * up); then, if nq > 0: h = rms(x); qkv = wq(h) + b
   (the next layer's, in its own format). */
static void llama_tail(const int64_t *t, const int64_t *next, float *x, float *h, void *xq, float eps, const float *y,
                       int64_t dv, float *u, int64_t hidden, int64_t d, float *qkv, int nt) {
    const int fmt = (int)t[LTAB_FMT], nfmt = next ? (int)next[LTAB_FMT] : 0;
    const void *wo_q = (const void *)t[4], *up_q = (const void *)t[6], *dn_q = (const void *)t[8];
    const void *wo_s = (const void *)t[5], *up_s = (const void *)t[7], *dn_s = (const void *)t[9];
    int64_t nq = next ? next[2] : 0;
    tc_act8 a = tc_quant4(y, xq, dv, fmt);
#pragma omp parallel num_threads(threads_for(2 * hidden * d, nt))
    {
        gemv_fmt(TC_FMT(fmt, TC_F_WO), &a, wo_q, wo_s, x, d, dv, 1);
#pragma omp barrier
#pragma omp single
        {
            rms_eps(x, h, d, eps, (const float *)t[11]);
            a = tc_quant4(h, xq, d, fmt);
        }
        gemv_fmt(TC_FMT(fmt, TC_F_UP), &a, up_q, up_s, u, 2 * hidden, d, 0);
#pragma omp barrier
#pragma omp single
        {
            swiglu(u, hidden);
            a = tc_quant4(u, xq, hidden, fmt);
        }
        gemv_fmt(TC_FMT(fmt, TC_F_DN), &a, dn_q, dn_s, x, d, hidden, 1);
        if (nq > 0) {
#pragma omp barrier
#pragma omp single
            {
                rms_eps(x, h, d, eps, (const float *)next[10]);
                a = tc_quant4(h, xq, d, nfmt);
            }
            gemv_fmt(TC_FMT(nfmt, TC_F_QKV), &a, (const void *)next[0], (const void *)next[1], qkv, nq, d, 0);
        }
    }
    if (nq > 0 && next[3])
        for (int64_t i = 0; i < nq; i++) qkv[i] += ((const float *)next[3])[i];
}

/* h = rms(x) (* g); qkv = wq(h) + b (the first layer's; the head's without gain or bias). */
static void llama_norm_gemv(const float *x, float *h, void *xq, float eps, const float *g, const void *q,
                            const void *s, const float *b, float *y, int64_t N, int64_t d, int fmt, int nt) {
    rms_eps(x, h, d, eps, g);
    tc_act8 a = tc_quant4(h, xq, d, fmt);
#pragma omp parallel num_threads(threads_for(N * d, nt))
    gemv_fmt(fmt, &a, q, s, y, N, d, 0);
    if (b)
        for (int64_t i = 0; i < N; i++) y[i] += b[i];
}

void tc_llama_step(const tc_lplan *p, int64_t tok, int64_t L, float eps, float cap, int nt) {
    int64_t d = p->d, H = p->H, Hk = p->Hk, D = p->D, half = D / 2, gs = p->gstride;
    const int64_t *tab = (const int64_t *)p->tab;
    float *x = (float *)p->x, *h = (float *)p->h, *qkv = (float *)p->qkv, *y = (float *)p->y;
    float *gk = (float *)p->gk, *gv = (float *)p->gv;
    const float *cs = (const float *)p->cos_ + L * half, *sn = (const float *)p->sin_ + L * half;
    void *xq = (void *)p->xq;
    ((int64_t *)p->tokens)[L] = tok;
    if (p->embed_fmt == TC_EMB_Q8) {                 /* (q * s) exact in fp32, one rounding for * g */
        const int8_t *e = (const int8_t *)p->embed + tok * d;
        const float s = ((const float *)p->embed_s)[tok], *g = (const float *)p->embed_g;
        for (int64_t i = 0; i < d; i++) x[i] = ((float)e[i] * s) * g[i];
    } else if (p->embed_fmt == TC_EMB_BF16) {
        const uint16_t *e = (const uint16_t *)p->embed + tok * d;
        for (int64_t i = 0; i < d; i++) {
            uint32_t b = (uint32_t)e[i] << 16;
            memcpy(x + i, &b, 4);
        }
    } else {
        memcpy(x, (const float *)p->embed + tok * d, d * sizeof(float));
    }
    llama_norm_gemv(x, h, xq, eps, (const float *)tab[10], (const void *)tab[0], (const void *)tab[1], (const float *)tab[3], qkv, tab[2],
                    d, TC_FMT(tab[LTAB_FMT], TC_F_QKV), nt);
    float qs = (float)(1.0 / sqrt((double)D));
    for (int64_t li = 0; li < p->n_layers; li++) {
        const int64_t *t = tab + li * LTAB_COLS;
        for (int64_t i = 0; i < H + Hk; i++) {               /* RoPE of the q and k heads in place, q / sqrt(D) */
            float *v = qkv + i * D, r = i < H ? qs : 1.0f;
            for (int64_t j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = (a * cs[j] - b * sn[j]) * r;
                v[j + half] = (b * cs[j] + a * sn[j]) * r;
            }
        }
        if (p->kv16) {                                       /* the new K/V rounded to fp16 once */
            uint16_t *K16 = (uint16_t *)p->gk + li * Hk * gs * D, *V16 = (uint16_t *)p->gv + li * Hk * gs * D;
            for (int64_t g = 0; g < Hk; g++) {
                tc_f2h_row(K16 + (g * gs + L) * D, qkv + (H + g) * D, D);
                tc_f2h_row(V16 + (g * gs + L) * D, qkv + (H + Hk + g) * D, D);
            }
            attend_all_h(qkv, H, Hk, D, K16, V16, gs, K16, V16, 0, NULL, L, y, (float *)p->sc, nt);
        } else {
            float *K = gk + li * Hk * gs * D, *Vc = gv + li * Hk * gs * D;
            for (int64_t g = 0; g < Hk; g++) {
                memcpy(K + (g * gs + L) * D, qkv + (H + g) * D, D * sizeof(float));
                memcpy(Vc + (g * gs + L) * D, qkv + (H + Hk + g) * D, D * sizeof(float));
            }
            attend_all(qkv, H, Hk, D, K, Vc, gs, K, Vc, 0, NULL, L, y, (float *)p->sc, nt);
        }
        llama_tail(t, li + 1 < p->n_layers ? t + LTAB_COLS : NULL, x, h, xq, eps, y, H * D, (float *)p->u, p->hidden,
                   d, qkv, nt);
        if (p->drop) tc_drop((const int64_t *)p->drop + li * 2 * TC_DROP_RANGES, TC_DROP_RANGES);   /* all read */
    }
    ((int64_t *)p->lens)[0] += 1;
    ((int64_t *)p->lens_cpu)[0] += 1;
    float *logits = (float *)p->logits;
    if (p->head4_q)                                  /* int4 scan: half the int8 head's bytes */
        llama_norm_gemv(x, h, xq, eps, NULL, (const void *)p->head4_q, (const void *)p->head4_s, NULL, logits, p->V,
                        d, 1, nt);
    else
        llama_norm_gemv(x, h, xq, eps, NULL, (const void *)p->head_q, (const void *)p->head_s, NULL, logits, p->V, d,
                        0, nt);
    if (p->rescore_k > 0)
        rescore(logits, p->V, p->rescore_k, (const int8_t *)p->head_q, (const float *)p->head_s, h, d);
    if (cap > 0.f) tc_softcap(logits, p->V, cap);
    if (p->drop) tc_drop((const int64_t *)p->drop + p->n_layers * 2 * TC_DROP_RANGES, TC_DROP_RANGES);   /* the head */
}
