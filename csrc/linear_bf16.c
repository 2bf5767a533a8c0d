/*
 * linear_bf16.c — C (M x N, bf16) = A (M x K, bf16) . B (K x N, bf16) in the order oneDNN's AMX brgemm
 * matmul sums it ([Note: oneDNN's AMX bf16 order]).
 *
 * [Note: oneDNN's AMX bf16 order]
 * Measured (torch 2.13's oneDNN 3.12, brg_matmul:avx10_1_512_amx, Intel Xeon; scripts/onednn_bf16_order.py
 * plants +-2^30 pairs among ones and reads which terms each pair swallowed):
 *   - K is cut into chunks (where: oneDNN's choice by M, N, K and its threads; the caller says) whose sums
 *     start from 0 and are added in order: C = ((chunk0 + chunk1) + chunk2) ...;
 *   - a chunk is cut into tiles of `width` terms from its start (32, the AMX tile's depth, or another even
 *     width where K asks for it: 30 at K = 300); in a tile the terms at even places are one float32 chain
 *     and those at odd places another, each from 0, and the chunk's running sum takes (even + odd);
 *   - every product of two bf16 values is exact in float32, so each chain step is one rounding (an FMA
 *     here); TDPBF16PS flushes denormal inputs and results (DAZ, FTZ), so do these steps;
 *   - the result is rounded to bf16 once (to nearest even).
 * A[m,k] is a[m*a_rs + k*a_cs], B[k,n] is b[k*b_rs + n*b_cs]. One row of C at a time, its columns in
 * blocks: every element is its own sum, so the blocking and the threads change no bit.
 */
#include "ckp_internal.h"
#include "vec.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

enum { COLS = 64 };

/* DAZ/FTZ: a denormal is read, and written, as a zero of its sign. */
static inline float flushed(float v) { return fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v; }

static inline float widened(uint16_t h) { return flushed(ckp_bf16_to_f(h)); }

/* Row m's columns [n0, n0 + nc) into out; bw: B widened, (K x N) row-major. */
static void row_block(const uint16_t *a, int64_t a_cs, const float *bw, int64_t K, int64_t N, int64_t n0,
                      int64_t nc, int64_t width, const int64_t *starts, int64_t chunks, uint16_t *out) {
    float total[COLS], chunk[COLS], chain[2][COLS];
    for (int64_t c = 0; c <= chunks; c++) {
        const int64_t c0 = c == 0 ? 0 : starts[c - 1], c1 = c == chunks ? K : starts[c];
        for (int64_t j = 0; j < nc; j++) chunk[j] = 0.0f;
        for (int64_t t0 = c0; t0 < c1; t0 += width) {
            for (int64_t j = 0; j < nc; j++) chain[0][j] = chain[1][j] = 0.0f;
            const int64_t t1 = t0 + width < c1 ? t0 + width : c1;
            for (int64_t k = t0; k < t1; k++) {
                const float x = widened(a[k * a_cs]);
                const float *brow = bw + k * N + n0;
                float *acc = chain[(k - t0) & 1];
                for (int64_t j = 0; j < nc; j++) acc[j] = flushed(fmaf(x, brow[j], acc[j]));
            }
            for (int64_t j = 0; j < nc; j++) chunk[j] = flushed(chunk[j] + flushed(chain[0][j] + chain[1][j]));
        }
        for (int64_t j = 0; j < nc; j++) total[j] = c == 0 ? chunk[j] : flushed(total[j] + chunk[j]);
    }
    for (int64_t j = 0; j < nc; j++) out[j] = ckp_f_to_bf16(total[j]);
}

ckp_status ckp_gemm_bf16_tiles(const uint16_t *a, int64_t a_rs, int64_t a_cs, const uint16_t *b, int64_t b_rs,
                               int64_t b_cs, int64_t M, int64_t K, int64_t N, int64_t width,
                               const int64_t *chunk_starts, int64_t chunks, uint16_t *c) {
    if (a == NULL || b == NULL || c == NULL || (chunks > 0 && chunk_starts == NULL))
        return ckp_fail(CKP_ERR_NULL_POINTER, "a, b, c (and chunk_starts, with chunks) must not be NULL");
    if (M <= 0 || K <= 0 || N <= 0 || M > INT64_MAX / N || K > INT64_MAX / N)
        return ckp_fail(CKP_ERR_BAD_SIZE, "M, K and N must be positive, got M=%lld K=%lld N=%lld", (long long)M,
                        (long long)K, (long long)N);
    if (a_rs < 0 || a_cs < 0 || b_rs < 0 || b_cs < 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "strides must not be negative");
    if (width < 2 || width % 2 != 0)
        return ckp_fail(CKP_ERR_BAD_OPTION, "width must be an even number of terms >= 2, got %lld", (long long)width);
    if (chunks < 0) return ckp_fail(CKP_ERR_BAD_OPTION, "chunks must be >= 0, got %lld", (long long)chunks);
    for (int64_t i = 0; i < chunks; i++)
        if (chunk_starts[i] <= (i == 0 ? 0 : chunk_starts[i - 1]) || chunk_starts[i] >= K)
            return ckp_fail(CKP_ERR_BAD_OPTION, "chunk_starts must rise strictly within (0, K)");
    const size_t c_bytes = (size_t)(M * N) * sizeof(uint16_t);
    const size_t a_bytes = (size_t)((M - 1) * a_rs + (K - 1) * a_cs + 1) * sizeof(uint16_t);
    const size_t b_bytes = (size_t)((K - 1) * b_rs + (N - 1) * b_cs + 1) * sizeof(uint16_t);
    if (ckp_overlaps(c, c_bytes, a, a_bytes) || ckp_overlaps(c, c_bytes, b, b_bytes) ||
        (chunks > 0 && ckp_overlaps(c, c_bytes, chunk_starts, (size_t)chunks * sizeof(int64_t))))
        return ckp_fail(CKP_ERR_ALIASING, "c overlaps a, b or chunk_starts");
    float *bw = malloc((size_t)(K * N) * sizeof(float));
    if (bw == NULL) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "gemm_bf16_tiles: no memory for B widened");
    ckp_clear_error();
    const int team = (double)M * (double)N * (double)K >= 1 << 18 ? ckp_threads() : 1;
#pragma omp parallel for schedule(static) num_threads(team)
    for (int64_t k = 0; k < K; k++)
        for (int64_t n = 0; n < N; n++) bw[k * N + n] = widened(b[k * b_rs + n * b_cs]);
#pragma omp parallel for schedule(static) num_threads(team)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n0 = 0; n0 < N; n0 += COLS)
            row_block(a + m * a_rs, a_cs, bw, K, N, n0, N - n0 < COLS ? N - n0 : COLS, width, chunk_starts, chunks,
                      c + m * N + n0);
    free(bw);
    return CKP_OK;
}
