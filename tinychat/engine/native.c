/* tinychat native CPU kernels for the batch-1 int8 decode step (built and loaded by tinychat/engine/native.py).

   gemv:      y[n] (+)= s[n] * dot(x, q[n, :])      int8 weights, one scale per row
   norm_gemv: h = x / rms(x); y = w(h)              (the first layer's QKV, the head)
   tail:      the part of a layer after attention, in one call:
              x += w_o(y); h = x / rms(x); u = relu(up(h))^2; x += down(u); [h = x / rms(x); qkv = w_qkv(h)]
   attn:      one layer's attention for one token against an fp32 KVCache (norms, RoPE, cache writes, softmax)
   layers:    attn + tail for a run of layers, in one call
   engram:    one token's Engram block (table gather, int8 w_v / w_k, the gate)
   softcap:   the logit softcap, cap * tanh(y / cap)
   step:      a whole TinyAgentLM decode step; llama_step (native_llama.h) the llama family's
   prefill_attn: prefill's attention, batch 1, each query against only the keys it sees
   gemm:      prefill's Y (M, N) = X (M, K) @ (s * q)^T (+ bias), many tokens at once (native_gemm.h)
   drop:      a mapped weight file's pages handed back once read (EngineOptions.drop_pages; step, llama_step)

   The int8 products (gemv, and every Linear of norm_gemv, tail, engram) are native_q8.h's: activations rounded
   to int8 in blocks of 32 (one fp32 scale each, as llama.cpp's Q8_0), exact int32 block dots on the widest
   integer dot-product instruction the build targets. Threads: OpenMP from the runtime torch already loaded (when
   built with it), nt per call. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "native_simd.h"     /* the SIMD level and kernel path, decided once for every kernel */
#include "native_q8.h"
#include "native_gemm.h"
#include "native_q4.h"     /* int4 weights (--quant int4): GEMV and GEMM on the same dots */
#include "native_attn.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#ifndef TC_SPLIT_ROWS8
#define TC_SPLIT_ROWS8 0   /* the int8 GEMM's jobs by chunks: by row tiles measured the same (its pack is cheap) */
#endif
#ifndef TC_SPLIT_ROWS4
#define TC_SPLIT_ROWS4 1   /* the int4 GEMM's by row tiles */
#endif
#define MIN_PAR_WORK (1 << 16)   /* weights per call below which one thread does it all */

static inline int threads_for(int64_t work, int nt) { return work < MIN_PAR_WORK || nt < 1 ? 1 : nt; }

/* xq: activation scratch of tc_act_bytes(K) bytes. */
void tc_gemv(const float *x, void *xq, const int8_t *q, const float *s, float *y, int64_t N, int64_t K, int acc,
             int nt) {
    tc_act8 a = tc_quant8(x, xq, K);
#pragma omp parallel num_threads(threads_for(N * K, nt))
    gemv_rows(&a, q, s, y, N, K, acc);
}

/* Prefill's GEMM, both weight formats (fmt 0: int8 rows and row scales, native_gemm.h; 1: int4 rows and fp16 group
   scales, native_q4.h): y (M, N) = x (M, K) @ W^T (+ bias). The tokens are quantized in parallel, then the
   (chunk, row tile) jobs split in contiguous runs, by chunks (int8) or by row tiles (int4: each tile's unpack done
   once, not per thread; 200 tokens of the Qwen2.5-0.5B shape's int4 GEMMs on 2 threads, Zen 4: 172 -> 191 GMAC/s,
   the Llama-3.2-1B shape's 246 -> 257); int4 threads unpack their rows after the tokens' slots. */
static void gemm_fmt(int fmt, const float *x, void *buf, const void *q, const void *s, const float *bias, float *y,
                     int64_t M, int64_t N, int64_t K, int nt) {
    if (M <= 0 || N <= 0) return;
    if (nt < 1) nt = 1;
    int nth = threads_for(M * N * K, nt), by_rows = fmt ? TC_SPLIT_ROWS4 : TC_SPLIT_ROWS8;
    int64_t gm = tc_gemm_chunk(M, by_rows ? 1 : nth), nj = tc_gemm_njobs(M, N, gm);
    if (nth > nj) nth = (int)nj;
    int8_t *ex0 = fmt ? tc_gemm_slot(buf, K, M, nt) : NULL;
#pragma omp parallel num_threads(nth)
    {
        int me = 0, all = 1;
#ifdef _OPENMP
        me = omp_get_thread_num(), all = omp_get_num_threads();
#endif
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t m = 0; m < M; m++) tc_gemm_quant(x, buf, m, K, nt);
        int8_t *pack = tc_gemm_base(buf) + me * tc_gemm_pack_bytes(K);
        int64_t j0 = nj * me / all, j1 = nj * (me + 1) / all;
        if (fmt)
            tc_gemm4_jobs(buf, pack, ex0 + me * tc4_extra_bytes(K), (const uint8_t *)q, (const uint16_t *)s, bias, y,
                          M, N, K, gm, nt, by_rows, j0, j1);
        else
            tc_gemm_jobs(buf, pack, (const int8_t *)q, (const float *)s, bias, y, M, N, K, gm, nt, by_rows, j0, j1);
    }
}

/* Prefill's int8 GEMM; buf: tc_gemm_act_bytes(M, K, nt) of scratch. */
void tc_gemm(const float *x, void *buf, const int8_t *q, const float *s, const float *bias, float *y, int64_t M,
             int64_t N, int64_t K, int nt) {
    gemm_fmt(0, x, buf, q, s, bias, y, M, N, K, nt);
}

/* The int4 GEMV (native_q4.h): y (+)= W4 x; xq: tc_act_bytes(K) of scratch. */
void tc_gemv4(const float *x, void *xq, const uint8_t *q, const uint16_t *ws, float *y, int64_t N, int64_t K, int acc,
              int nt) {
    tc_act8 a = tc_quant4(x, xq, K, 1);
#pragma omp parallel num_threads(threads_for(N * K, nt))
    gemv4_rows(&a, q, ws, y, N, K, acc);
}

/* Prefill's int4 GEMM; buf: tc_gemm4_act_bytes(M, K, nt) of scratch. */
void tc_gemm4(const float *x, void *buf, const uint8_t *q, const uint16_t *ws, const float *bias, float *y, int64_t M,
              int64_t N, int64_t K, int nt) {
    gemm_fmt(1, x, buf, q, ws, bias, y, M, N, K, nt);
}

/* The int4 rows [0, N) as bf16 (o: N x K; native_q4.h's tc4_dequant_bf16_row), for prefill's bf16 GEMMs. */
void tc_dequant4_bf16(const uint8_t *q, const uint16_t *ws, uint16_t *o, int64_t N, int64_t K, int nt) {
#pragma omp parallel num_threads(threads_for(N * K, nt))
    {
        int8_t *tmp = (int8_t *)malloc((size_t)tc4_ref_bytes(K));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t n = 0; n < N; n++) tc4_dequant_bf16_row(q, ws, N, n, K, o + n * K, tmp);
        free(tmp);
    }
}

/* h = x / (|x| * inv) = x * sqrt(d) / |x| (rms_norm without epsilon, as _decode_fast computes it) */
static void rms(const float *x, float *h, int64_t d, float inv) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / ((float)sqrt(ss) * inv);
    for (int64_t i = 0; i < d; i++) h[i] = x[i] * r;
}

/* fmt: the weights' format (native_q4.h's gemv_fmt: 0 int8, 1 int4) */
void tc_norm_gemv(const float *x, float *h, void *xq, float inv, const void *q, const void *s, float *y,
                  int64_t N, int64_t d, int fmt, int nt) {
    rms(x, h, d, inv);
    tc_act8 a = tc_quant4(h, xq, d, fmt);
#pragma omp parallel num_threads(threads_for(N * d, nt))
    gemv_fmt(fmt, &a, q, s, y, N, d, 0);
}

/* x += wo(y_attn); h = rms(x); u = relu(up(h))^2; x += down(u); then, if nq > 0: h = rms(x); qkv = wq(h).
   x, h: (d,); y_attn: (dv,); u: (hidden,); xq: tc_act_bytes(max(dv, d, hidden)) of scratch; qkv: (nq,). fmt: the
   weights' formats, a TC_F_* mask (native_q4.h). */
void tc_tail(float *x, float *h, void *xq, float inv, const float *y_attn, int64_t dv,
             const void *wo_q, const void *wo_s, const void *up_q, const void *up_s,
             const void *dn_q, const void *dn_s, float *u, int64_t hidden, int64_t d,
             const void *wq_q, const void *wq_s, float *qkv, int64_t nq, int fmt, int nt) {
    tc_act8 a = tc_quant4(y_attn, xq, dv, fmt);
#pragma omp parallel num_threads(threads_for(hidden * d, nt))
    {
        gemv_fmt(TC_FMT(fmt, TC_F_WO), &a, wo_q, wo_s, x, d, dv, 1);
#pragma omp barrier
#pragma omp single
        {
            rms(x, h, d, inv);
            a = tc_quant4(h, xq, d, fmt);
        }
        gemv_fmt(TC_FMT(fmt, TC_F_UP), &a, up_q, up_s, u, hidden, d, 0);
#pragma omp barrier
#pragma omp single
        {
            for (int64_t i = 0; i < hidden; i++) {
                float v = u[i] > 0.f ? u[i] : 0.f;
                u[i] = v * v;
            }
            a = tc_quant4(u, xq, hidden, fmt);
        }
        gemv_fmt(TC_FMT(fmt, TC_F_DN), &a, dn_q, dn_s, x, d, hidden, 1);
        if (nq > 0) {
#pragma omp barrier
#pragma omp single
            {
                rms(x, h, d, inv);
                a = tc_quant4(h, xq, d, fmt);
            }
            gemv_fmt(TC_FMT(fmt, TC_F_QKV), &a, wq_q, wq_s, qkv, nq, d, 0);
        }
    }
}



/* Prefill's rotary embedding, bit for bit append.py's _rope_cs: x1 * c - x2 * s and x1 * s + x2 * c, each product
   rounded, then their difference and sum (the build has -ffp-contract=off), then times scale where it is not 1 (q's
   1 / sqrt(D): one more rounding, as `q * D ** -0.5`). Head h's token i is read at src + i * ss + h * sh (a
   projection's output, any layout) and written head-major to dst + h * ds + i * D (a q buffer, or the cache's
   rows). cos_ / sin_: (C, D / 2), the tokens' own rows; NULL: a plain copy (the values). */
void tc_rope_heads(const float *src, int64_t ss, int64_t sh, int64_t C, int64_t nh, int64_t D, const float *cos_,
                   const float *sin_, float scale, float *dst, int64_t ds, int nt) {
    int64_t h2 = D / 2;
#pragma omp parallel for schedule(static) num_threads(threads_for(C * nh * D * 4, nt))
    for (int64_t t = 0; t < nh * C; t++) {
        int64_t h = t / C, i = t % C;
        const float *x = src + i * ss + h * sh;
        float *o = dst + h * ds + i * D;
        if (!cos_) {
            memcpy(o, x, (size_t)D * sizeof(float));
            continue;
        }
        const float *c = cos_ + i * h2, *s = sin_ + i * h2;
        for (int64_t j = 0; j < h2; j++) {
            float a = x[j] * c[j], b = x[h2 + j] * s[j], e = x[j] * s[j], f = x[h2 + j] * c[j];
            o[j] = a - b;
            o[h2 + j] = e + f;
        }
        if (scale != 1.0f)
            for (int64_t j = 0; j < D; j++) o[j] *= scale;
    }
}

/* Prefill attention of one layer, batch 1 (native_attn_kv.h's prefill_attn says what it computes). */
void tc_prefill_attn(const float *q, int64_t H, int64_t Hk, int64_t D, int64_t C, int64_t L0, const float *gk,
                     const float *gv, int64_t gstride, const float *seq_k, const float *seq_v, const int64_t *spos,
                     int64_t W, float *y, float *sc, int nt) {
    prefill_attn(q, H, Hk, D, C, L0, gk, gv, gstride, seq_k, seq_v, spos, W, y, sc, nt);
}

/* tc_prefill_attn on an fp16 cache without local keys (the llama family's): gk / gv hold IEEE fp16 bits, read as
   the decode step reads them (native_attn_kv.h's _h kernels: the bits tc_prefill_attn gives on the rows widened). */
void tc_prefill_attn_h(const float *q, int64_t H, int64_t Hk, int64_t D, int64_t C, int64_t L0, const uint16_t *gk,
                       const uint16_t *gv, int64_t gstride, float *y, float *sc, int nt) {
    prefill_attn_h(q, H, Hk, D, C, L0, gk, gv, gstride, gk, gv, NULL, 0, y, sc, nt);
}

/* The attention of one layer for one token at position L, straight against an fp32 KVCache (row 0):
   heads: the fused QKV output [q (H*D) | k_local (Hk*D) | k_global (Hk*D, full layers) | v_local | v_global];
   q heads are scaled to unit length, k heads rms-normed (the 1/sqrt(D) of the scores folded in), both rotated
   (half-split RoPE, cos/sin rows of position L); the new local K/V go to ring slot L % W (lk/lv: this layer's
   (Hk, W + 1, D) ring), the global ones (full layers) to position L of gk/gv ((Hk, M + 1, D)); then one softmax
   per q head over [global keys 0..L | the ring slots holding one of the last W positions (lpos)], y = p @ [V].
   y: (H*D). sc: float scratch of (H / Hk) * (L + 1 + W) per thread. */
void tc_attn(float *heads, int64_t H, int64_t Hk, int64_t D, int full, const float *cos_, const float *sin_,
             float *lk, float *lv, int64_t W, float *gk, float *gv, int64_t gstride, const int64_t *lpos,
             int64_t L, float *y, float *sc, int nt) {
    int64_t nk = full ? 2 : 1, half = D / 2, nqk = H + Hk * nk;
    for (int64_t i = 0; i < nqk; i++) {                        /* norm + RoPE of the q and k heads, in place */
        float *v = heads + i * D;
        double ss = 0.0;
        for (int64_t j = 0; j < D; j++) ss += (double)v[j] * v[j];
        float r = (float)(1.0 / sqrt(ss));
        if (i >= H) r *= (float)sqrt((double)D);
        for (int64_t j = 0; j < half; j++) {
            float a = v[j] * r, b = v[j + half] * r;
            v[j] = a * cos_[j] - b * sin_[j];
            v[j + half] = b * cos_[j] + a * sin_[j];
        }
    }
    int64_t slot = L % W;
    const float *kl = heads + H * D, *kg = heads + (H + Hk) * D, *vl = heads + nqk * D, *vg = vl + Hk * D;
    for (int64_t g = 0; g < Hk; g++) {
        memcpy(lk + (g * (W + 1) + slot) * D, kl + g * D, D * sizeof(float));
        memcpy(lv + (g * (W + 1) + slot) * D, vl + g * D, D * sizeof(float));
        if (full) {
            memcpy(gk + (g * gstride + L) * D, kg + g * D, D * sizeof(float));
            memcpy(gv + (g * gstride + L) * D, vg + g * D, D * sizeof(float));
        }
    }
    attend_all(heads, H, Hk, D, gk, gv, gstride, lk, lv, W, lpos, L, y, sc, nt);
}

/* Hand n (address, bytes) ranges of whole pages of a mapped weight file back to the system (EngineOptions.drop_pages,
   engine/page_drop.py): madvise MADV_DONTNEED. The mapping is private and never written, so its pages are the
   file's own: the next read faults them back from the page cache, the same bytes. A range of 0 bytes is skipped.
   Elsewhere than Linux this does nothing. The steps' drop tables: per layer TC_DROP_RANGES pairs (its Linears'
   weights and scales), then one row for the head. */
#define TC_DROP_RANGES 8
void tc_drop(const int64_t *r, int64_t n) {
#if defined(__linux__)
    for (int64_t i = 0; i < n; i++)
        if (r[2 * i + 1] > 0) madvise((void *)r[2 * i], (size_t)r[2 * i + 1], MADV_DONTNEED);
#else
    (void)r;
    (void)n;
#endif
}

/* Layers [l0, l1) of one token against fp32 caches, in one call: per layer tc_attn then tc_tail, the tail computing
   the next layer's norm + fused QKV while li + 1 < l1 (the caller runs an Engram block and its QKV between
   segments). qkv holds layer l0's fused QKV on entry. tab: per layer TAB_COLS int64s: QKV weights, scales and rows,
   full (1: writes the group's global K/V), group, then w_o, up, down weights and scales. lk/lv: the (L, 1, Hk, W + 1,
   D) rings, gk/gv: the (G, 1, Hk, gstride, D) global caches. drop: NULL, or the drop table (tc_drop): each layer's
   pages handed back once its tail has read them. */
#define TAB_COLS 11
void tc_layers(const int64_t *tab, int64_t l0, int64_t l1, float *x, float *h, void *xq, float inv, float *qkv,
               float *y, float *u, int64_t hidden, int64_t d, int64_t H, int64_t Hk, int64_t D, const float *cos_,
               const float *sin_, float *lk, float *lv, int64_t W, float *gk, float *gv, int64_t gstride,
               const int64_t *lpos, int64_t L, float *sc, const int64_t *drop, int fmt, int nt) {
    int64_t lstep = Hk * (W + 1) * D, gstep = Hk * gstride * D;
    for (int64_t li = l0; li < l1; li++) {
        const int64_t *t = tab + li * TAB_COLS;
        const int64_t *n = li + 1 < l1 ? tab + (li + 1) * TAB_COLS : NULL;
        tc_attn(qkv, H, Hk, D, (int)t[3], cos_, sin_, lk + li * lstep, lv + li * lstep, W, gk + t[4] * gstep,
                gv + t[4] * gstep, gstride, lpos, L, y, sc, nt);
        tc_tail(x, h, xq, inv, y, H * D, (const void *)t[5], (const void *)t[6], (const void *)t[7],
                (const void *)t[8], (const void *)t[9], (const void *)t[10], u, hidden, d,
                n ? (const void *)n[0] : NULL, n ? (const void *)n[1] : NULL, qkv, n ? n[2] : 0, fmt, nt);
        if (drop) tc_drop(drop + li * 2 * TC_DROP_RANGES, TC_DROP_RANGES);
    }
}

/* One token's Engram block: e = the n_tab table rows at addrs (edim floats each) side by side, v = w_v(e),
   k = w_k(e), x += sigmoid(<rms_norm(x), rms_norm(k)> / sqrt(d)) * v (rms_norm with fp32 epsilon, as F.rms_norm).
   e: scratch of n_tab * edim floats, k and v of d, xq of tc_act_bytes(n_tab * edim). */
void tc_engram(float *x, const float *table, const int64_t *addrs, int64_t n_tab, int64_t edim,
               const int8_t *wv_q, const float *wv_s, const int8_t *wk_q, const float *wk_s, int64_t d,
               float *e, void *xq, float *k, float *v, int nt) {
    int64_t ne = n_tab * edim;
    for (int64_t t = 0; t < n_tab; t++) memcpy(e + t * edim, table + addrs[t] * edim, edim * sizeof(float));
    tc_act8 a = tc_quant8(e, xq, ne);
#pragma omp parallel num_threads(threads_for(2 * d * ne, nt))
    {
        gemv_rows(&a, wv_q, wv_s, v, d, ne, 0);
        gemv_rows(&a, wk_q, wk_s, k, d, ne, 0);
    }
    double xx = 0.0, kk = 0.0, xk = 0.0;
    for (int64_t i = 0; i < d; i++) {
        xx += (double)x[i] * x[i];
        kk += (double)k[i] * k[i];
        xk += (double)x[i] * k[i];
    }
    const double eps = 1.1920928955078125e-07;
    double g = xk / (sqrt(xx / d + eps) * sqrt(kk / d + eps)) / sqrt((double)d);
    float gate = (float)(1.0 / (1.0 + exp(-g)));
    for (int64_t i = 0; i < d; i++) x[i] += gate * v[i];
}

/* y = cap * tanh(y / cap) in place (the logit softcap), on one thread: torch.tanh of a vocabulary row runs a
   parallel region, which stalls the step whenever another process holds a core. tanh(t) = sign(t) (1 - 2 / (e^2|t| + 1)),
   below |t| = 2^-4 its odd Taylor series (the subtraction would lose precision there). */
void tc_softcap(float *y, int64_t n, float cap) {
    float r = 1.0f / cap;
    int64_t i = 0;
#if defined(TC_AVX512)
    const __m512 rv = _mm512_set1_ps(r), cv = _mm512_set1_ps(cap), one = _mm512_set1_ps(1.0f),
                 two = _mm512_set1_ps(2.0f), small = _mm512_set1_ps(0.0625f),
                 c3 = _mm512_set1_ps(-1.0f / 3), c5 = _mm512_set1_ps(2.0f / 15), c7 = _mm512_set1_ps(-17.0f / 315);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000);
    for (; i + 16 <= n; i += 16) {
        __m512 t = _mm512_mul_ps(_mm512_loadu_ps(y + i), rv);
        __m512 a = _mm512_abs_ps(t);
        /* e^(2|t|) for |t| <= 44 (tanh is 1 in float beyond 9); tc_exp16 also takes x > 0 */
        __m512 e = tc_exp16(_mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_add_ps(a, a)));   /* NaN stays NaN */
        __m512 big = _mm512_sub_ps(one, _mm512_div_ps(two, _mm512_add_ps(e, one)));
        __m512 a2 = _mm512_mul_ps(a, a);
        __m512 p = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_fmadd_ps(c7, a2, c5), a2, c3), a2, one);
        __m512 th = _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(a, small, _CMP_LT_OQ), _mm512_mul_ps(a, p));
        th = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(th),
                                                 _mm512_and_si512(_mm512_castps_si512(t), sign)));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(th, cv));
    }
#endif
    for (; i < n; i++) y[i] = cap * tanhf(y[i] * r);
}

/* One whole decode step of batch 1 in one call (the Python step's glue moved here: its Python and ctypes argument
   conversion per token were a measurable share of a small model's step): the token into the history, ring position and
   lengths; the embedding row; per segment its Engram block (addresses hashed here, as NativeStep.engram_addrs)
   then the first layer's QKV and tc_layers; the head and the softcap into logits. All fields are int64 (pointers as
   integers); native.py builds the same layout with ctypes. */
#define TC_MAXN 8                                  /* the highest Engram order the hashing takes */
typedef struct {
    int64_t d, hidden, H, Hk, D, W, gstride, V, n_seg, n1;
    int64_t tab, x, h, xq, qkv, y, u, logits, sc, embed, cos_, sin_, lk, lv, gk, gv, lpos, tokens, lens, lens_cpu,
        head_q, head_s, cid, segs;
    int64_t wfmt;                                  /* the layers' weights' formats (a TC_F_* mask); the head is int8 */
    int64_t drop;                                  /* 0, or the drop table (tc_drop): n_layers + 1 rows */
} tc_plan;
typedef struct {
    int64_t a, b, qkv_q, qkv_s, qkv_n;             /* layers [a, b); the fused QKV of layer a */
    int64_t engram;                                /* 1: an Engram block before layer a */
    int64_t table, edim, vq, vs, kq, ks, n_tab, size, hash, e, exq, ek, ev, addrs;
} tc_seg;                                          /* hash: n_tab rows of (order, offset, TC_MAXN multipliers) */

void tc_step(const tc_plan *p, int64_t tok, int64_t L, float inv, float cap, int nt) {
    int64_t d = p->d, W = p->W, half = p->D / 2;
    int64_t *tokens = (int64_t *)p->tokens, *lpos = (int64_t *)p->lpos;
    const int64_t *cid = (const int64_t *)p->cid;
    int64_t ctx[TC_MAXN + 1];                      /* the n1 previous ids (0 before position 0), then tok */
    for (int64_t i = 0; i < p->n1; i++) ctx[i] = L - p->n1 + i >= 0 ? tokens[L - p->n1 + i] : 0;
    ctx[p->n1] = tok;
    tokens[L] = tok;
    lpos[L % W] = L;
    float *x = (float *)p->x, *h = (float *)p->h, *qkv = (float *)p->qkv;
    void *xq = (void *)p->xq;
    memcpy(x, (const float *)p->embed + tok * d, d * sizeof(float));
    const tc_seg *segs = (const tc_seg *)p->segs;
    for (int64_t si = 0; si < p->n_seg; si++) {
        const tc_seg *s = segs + si;
        if (s->engram) {
            const int64_t *hs = (const int64_t *)s->hash;
            int64_t *ad = (int64_t *)s->addrs;
            for (int64_t t = 0; t < s->n_tab; t++) {
                const int64_t *row = hs + t * (2 + TC_MAXN);
                int64_t acc = 0;
                for (int64_t j = 0; j < row[0]; j++) acc ^= cid[ctx[p->n1 - j]] * row[2 + j];
                ad[t] = acc % s->size + row[1];
            }
            tc_engram(x, (const float *)s->table, ad, s->n_tab, s->edim, (const int8_t *)s->vq, (const float *)s->vs,
                      (const int8_t *)s->kq, (const float *)s->ks, d, (float *)s->e, (void *)s->exq,
                      (float *)s->ek, (float *)s->ev, nt);
        }
        tc_norm_gemv(x, h, xq, inv, (const void *)s->qkv_q, (const void *)s->qkv_s, qkv, s->qkv_n, d,
                     TC_FMT(p->wfmt, TC_F_QKV), nt);
        tc_layers((const int64_t *)p->tab, s->a, s->b, x, h, xq, inv, qkv, (float *)p->y, (float *)p->u, p->hidden,
                  d, p->H, p->Hk, p->D, (const float *)p->cos_ + L * half, (const float *)p->sin_ + L * half,
                  (float *)p->lk, (float *)p->lv, W, (float *)p->gk, (float *)p->gv, p->gstride, lpos, L,
                  (float *)p->sc, (const int64_t *)p->drop, (int)p->wfmt, nt);
    }
    ((int64_t *)p->lens)[0] += 1;
    ((int64_t *)p->lens_cpu)[0] += 1;
    tc_norm_gemv(x, h, xq, inv, (const void *)p->head_q, (const void *)p->head_s, (float *)p->logits, p->V, d, 0, nt);
    tc_softcap((float *)p->logits, p->V, cap);
    if (p->drop) tc_drop((const int64_t *)p->drop + segs[p->n_seg - 1].b * 2 * TC_DROP_RANGES, TC_DROP_RANGES);
}

#include "native_llama.h"

/* The fp16 cache's kernels alone, for the tests: the H q heads (H*D, rotated and scaled) against keys 0..L of fp16
   gk / gv ((Hk, gstride, D) of IEEE fp16 bits), as tc_llama_step's kv16 attention runs them; sc: nt * (H / Hk) *
   (L + 1) floats. And rows rounded to fp16 / widened back, as its cache writes round them. */
void tc_attend_h(const float *q, int64_t H, int64_t Hk, int64_t D, const uint16_t *gk, const uint16_t *gv,
                 int64_t gstride, int64_t L, float *y, float *sc, int nt) {
    attend_all_h(q, H, Hk, D, gk, gv, gstride, gk, gv, 0, NULL, L, y, sc, nt);
}
void tc_f2h_rows(const float *x, uint16_t *h, int64_t n) { tc_f2h_row(h, x, n); }
void tc_h2f_rows(const uint16_t *h, float *x, int64_t n) { tc_h2f_row(x, h, n); }

int tc_abi_version(void) { return 22; }
