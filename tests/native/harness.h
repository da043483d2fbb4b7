/* What the kernel harnesses here share (kv16_harness.c, q8_harness.c; tests/native_harness.py builds and runs them):
   the C library they print and allocate with, and one xorshift generator, seeded alike in each, for their random
   inputs. Included after the kernel header under test. */
#ifndef TC_HARNESS_H
#define TC_HARNESS_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t rng = 88172645463325252ULL;
static inline uint32_t next(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static inline float unif(void) { return (float)(next() & 0xffffff) / 16777216.0f * 2.0f - 1.0f; }   /* [-1, 1) */
#endif
