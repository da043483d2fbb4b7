/* The int4 weights' byte layout (`--quant int4`; engine/int4_layout.py writes and reads it in PyTorch) and the
   activations' re-layout the int4 GEMV reads (included by native_q4.h).

   A matrix of N rows and K columns, Kp = tc_pad64(K) (zero columns past K), u = q + 8 in 0..15, two to a byte; its
   scales: one fp16 per group of 32 columns. Rows go by groups of four: rows 4g .. 4g + 3 take the bytes (and the
   scales) rows 4g .. 4g + 3 take in a plain row-major array, 2 * Kp bytes and Kp / 8 scales, but interleaved so a
   GEMV reads one stream of both (docs/benchmarks.md, "The grouped int4 layout"). A row slice starting and ending at
   multiples of four (or at N) is a matrix of the same layout. Within a group, for nsb = Kp / 512 super-blocks and a
   tail of T = Kp - 512 * nsb columns (0 .. 448, whole chunks of 64):
     super-block b (columns 512b .. 512b + 511, its groups of 32: G = 16b + l, l = 0 .. 15), 1,024 bytes at 1024b:
       step s (0 .. 7) of row r: 32 bytes at 128s + 32r; byte m holds column 4s + m % 4 of group l = m / 4 in its
       low nibble and the same column of group l = 8 + m / 4 in its high one. A step is a register of 64 columns
       whose 4-byte lanes are the 16 groups: 8 dot-product steps leave 16 exact group sums in one register;
     tail chunk c (64 columns at 512 nsb + 64c), 128 bytes at 1024 nsb + 128c: row r's 32 bytes at 32r, byte j
       holding column j of the chunk in its low nibble and column j + 32 in its high one;
     scales: super-block b's of row r at 64b + 16r (16 of them, l = 0 .. 15), then the tail's: row r's Kp_t / 32 at
       64 nsb + r * T / 32.
   The last N % 4 rows (no group): plain rows, row n's Kp / 2 bytes at n * Kp / 2 in tail-chunk form (chunk c: 32
   bytes at 32c, byte j columns j and j + 32), its scales at n * Kp / 32.

   The GEMV's activations (tc_act8, native_q8.h) in the super-blocks' order, once per vector (tc_act_sb): r[512b +
   64s + 4l + j] = q[(16b + l) * 32 + 4s + j] (the tail's columns are read from q as they are), gc[G] = -8 * the sum
   of group G's q (the start of an accumulator that multiplies u = q + 8), gs[G] its fp32 scale. */
#ifndef TC_NATIVE_Q4_LAYOUT_H
#define TC_NATIVE_Q4_LAYOUT_H
#include <stdlib.h>
#include "native_q8.h"

#define TC_SB 512                                  /* columns of a super-block */

typedef struct {
    int64_t Kp, nsb, tg;                           /* padded columns, super-blocks, tail groups of 32 (T / 32) */
    int64_t rb, rs;                                /* a row's bytes (Kp / 2) and scales (Kp / 32) */
} tc4_geo;

static inline tc4_geo tc4_geometry(int64_t K) {
    tc4_geo g;
    g.Kp = tc_pad64(K), g.nsb = g.Kp / TC_SB, g.tg = (g.Kp - TC_SB * g.nsb) / 32, g.rb = g.Kp / 2, g.rs = g.Kp / 32;
    return g;
}

/* A 64-column chunk's 32 bytes (byte j: column j in the low nibble, column j + 32 in the high one) as 64 values q;
   a super-block step's bytes split the same way give its 64 values in a register's order (lane l: group l). */
static inline void tc4_chunk_vals(const uint8_t *b, int8_t *o) {
    for (int j = 0; j < 32; j++) {                 /* contiguous: the compiler vectorizes the nibble split */
        o[j] = (int8_t)((b[j] & 15) - 8);
        o[32 + j] = (int8_t)((b[j] >> 4) - 8);
    }
}

/* Row n's values q (u - 8, Kp of them) into o and, where sc is not NULL, its Kp / 32 group scales (fp16 bits) into
   sc: the layout's one reader that every path can share (the reference dot, the prefill's unpack, the bf16 rows). */
static void tc4_row(const uint8_t *q, const uint16_t *ws, int64_t N, int64_t K, int64_t n, int8_t *o, uint16_t *sc) {
    tc4_geo g = tc4_geometry(K);
    if (n >= N / 4 * 4) {                          /* a plain row */
        for (int64_t c = 0; c < g.Kp; c += 64) tc4_chunk_vals(q + n * g.rb + c / 2, o + c);
        if (sc) memcpy(sc, ws + n * g.rs, (size_t)g.rs * 2);
        return;
    }
    int64_t r = n % 4, n0 = n - r;
    const uint8_t *p = q + n0 * g.rb;
    const uint16_t *s = ws + n0 * g.rs;
    for (int64_t b = 0; b < g.nsb; b++) {
        int8_t steps[8][64];                       /* step st: 4 columns of each group l at 4l */
        for (int st = 0; st < 8; st++) tc4_chunk_vals(p + 1024 * b + 128 * st + 32 * r, steps[st]);
        for (int l = 0; l < 16; l++)               /* then transposed by 4-byte lanes into column order */
            for (int st = 0; st < 8; st++) memcpy(o + TC_SB * b + 32 * l + 4 * st, &steps[st][4 * l], 4);
        if (sc) memcpy(sc + 16 * b, s + 64 * b + 16 * r, 32);
    }
    for (int64_t c = 0; c < g.tg / 2; c++)
        tc4_chunk_vals(p + 1024 * g.nsb + 128 * c + 32 * r, o + TC_SB * g.nsb + 64 * c);
    if (sc) memcpy(sc + 16 * g.nsb, s + 64 * g.nsb + r * g.tg, (size_t)g.tg * 2);
}

/* The super-block copies of a's activations (K columns; a from tc_quant8 into a tc_act_bytes scratch, which counts
   them: r (Kp bytes) after c, then gc and gs (Kp / 32 each, 64-byte aligned)). */
static void tc_act_sb(tc_act8 *a, int64_t K) {
    int64_t Kp = tc_pad64(K), nsb = Kp / TC_SB, ng = Kp / 32, gb = tc_act_group_bytes(Kp);
    int8_t *base = (int8_t *)a->c + Kp;            /* after c: Kp bytes (Kp / 4 int32) */
    a->r = base;
    a->gc = (int32_t *)(base + Kp);
    a->gs = (float *)(base + Kp + gb);
    for (int64_t b = 0; b < nsb; b++)
        for (int l = 0; l < 16; l++) {
            const int8_t *src = a->q + (16 * b + l) * 32;
            int8_t *dst = a->r + TC_SB * b + 4 * l;
            for (int st = 0; st < 8; st++) memcpy(dst + 64 * st, src + 4 * st, 4);
        }
    for (int64_t G = 0; G < ng; G++) {
        int32_t t = 0;
        for (int j = 0; j < 8; j++) t += a->c[8 * G + j] >> 4;      /* c = -128 * a lane's sum: exact */
        a->gc[G] = t, a->gs[G] = a->s[8 * G];
    }
}
#endif /* TC_NATIVE_Q4_LAYOUT_H */
