/* The AVX2 + AVX-VNNI level on an AVX-512 host that lacks AVX-VNNI (AMD Zen 4): build with
 *     -march=x86-64-v3 -mavx512vnni -mavx512vl -mprefer-vector-width=256 -include tests/perf/evex256.h
 * so that `vpdpbusd ymm` in its EVEX form stands in for AVX-VNNI's VEX form (same operation, same rate).
 * -mavx512vl implies AVX512F, and GCC defines __AVX512F__ again whenever an intrinsics header pops its target
 * pragma, so -U__AVX512F__ on the command line does not hold: include the headers first, then undefine it here,
 * and code keyed on __AVX512F__ (tinychat's float kernels, ggml's) takes its 256-bit paths as on a laptop. */
#include <immintrin.h>
#undef __AVX512F__
