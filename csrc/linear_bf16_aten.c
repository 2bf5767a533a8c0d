/*
 * linear_bf16_aten.c — C (M x N, bf16) = A (M x K, bf16) . B (K x N, bf16) (+ bias) in the order ATen's own
 * bf16 GEMM sums it: torch's bf16 matmul on a CPU where it does not run oneDNN (no AVX-512 with bf16:
 * torch.ops.mkldnn._is_mkldnn_bf16_supported() false, as on an AMD CPU with AVX2 only, or oneDNN switched off),
 * and on every CPU for a product of at most 16^3 multiply-adds (ATen's floor for oneDNN).
 *
 * [Note: ATen's bf16 GEMM]
 * Measured (torch 2.13 on an AMD EPYC at DEFAULT and AVX2, and on an AMD Zen 5 with oneDNN off at DEFAULT, AVX2
 * and AVX512, one and two threads; scripts/aten_bf16_order.py plants +-2^30 pairs among ones and reads which
 * terms each pair swallowed). No MKL call is made (MKL_VERBOSE
 * prints none): ATen casts torch.mm(A, B) as the column-major C^T = B^T . A^T and picks a loop by the layouts
 * (CPUBlas.cpp's gemm -> BlasKernel.cpp), each output a float32 sum of its K products:
 *   - dot, where A is row-major and B column-major (both along K: F.linear's y = x . W^T; one row of x too): ATen's
 *     "dot with fp32 arith" -- 8 registers of L = 8 lanes at every capability (at AVX512 too: 16 differed from
 *     K = 16 on) over K's whole blocks of 8L terms, register r lane l a chain of the terms 8L*i + L*r + l; the registers added as a halving
 *     tree (r + 4, then r + 2, then r + 1); register 0's lanes reduced; then K's next whole blocks of 2L terms
 *     into one register (a block's first L terms, then its next L), its lanes reduced and added; then each term
 *     left added in order. A lane reduction is a halving tree (L/2, ..., 1) at AVX2 and AVX512 (vec_reduce_all's
 *     shuffles), in lane order at DEFAULT (its scalar fallback). C = bias + dot;
 *   - pairs, where A and B are both row-major or both column-major (dX = dY . W: torch.mm of two row-major
 *     matrices): four chains by k mod 4 over K's whole blocks of 4, the last K mod 4 terms onto chain 0, then
 *     ((p0 + p1) + p2) + p3 (ATen's sum with 4 partial sums). C = bias + that. Also a product of one output
 *     column (N = 1: y of one output feature);
 *   - chain, where A is column-major and B row-major (dW = dY^T . X): one chain over k, from the bias
 *     (or 0): the float32 buffer the loop accumulates into starts as C.
 * Every product of two bf16 values is exact in float32, so each step is one rounding, FMA or not; the sum is
 * rounded to bf16 once. Which loop a layout takes is the caller's (ckparity/ops/_aten_bf16.py, as ATen's
 * addmm picks its transposes). Every output is its own sum: the threads change no bit.
 * A[m,k] is a[m*a_rs + k*a_cs], B[k,n] is b[k*b_rs + n*b_cs]; both are widened to float32 once.
 */
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>

enum { REGISTERS = 8, LANES = 8 };

/* A lane reduction: vec_reduce_all's shuffles (a halving tree) at AVX2 and AVX512, its scalar loop at DEFAULT. */
static float reduce_lanes(float *v, int tree) {
    if (!tree) {
        float s = v[0];
        for (int l = 1; l < LANES; l++) s += v[l];
        return s;
    }
    for (int h = LANES / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) v[l] += v[l + h];
    return v[0];
}

/* The dot form over x[0..K) . w[0..K) (both widened, contiguous). */
CKP_CLONES static float dot_fp32(const float *x, const float *w, int64_t K, int tree) {
    float acc[REGISTERS][LANES] = {{0}};
    const int64_t per = REGISTERS * LANES, main = K / per * per, pair = 2 * LANES, paired = K / pair * pair;
    for (int64_t j = 0; j < main; j += per)
        for (int r = 0; r < REGISTERS; r++)
            for (int l = 0; l < LANES; l++) acc[r][l] += x[j + r * LANES + l] * w[j + r * LANES + l];
    for (int off = REGISTERS / 2; off >= 1; off /= 2)
        for (int r = 0; r < off; r++)
            for (int l = 0; l < LANES; l++) acc[r][l] += acc[r + off][l];
    float sum = reduce_lanes(acc[0], tree), tail[LANES] = {0};
    for (int64_t j = main; j < paired; j += pair)
        for (int64_t i = j; i < j + pair; i++) tail[i - j < LANES ? i - j : i - j - LANES] += x[i] * w[i];
    sum += reduce_lanes(tail, tree);
    for (int64_t j = paired; j < K; j++) sum += x[j] * w[j];
    return sum;
}

/* The pairs form over x (xs apart) and w (ws apart): four chains by k mod 4, the rest onto the first, added in
 * order. */
CKP_CLONES static float dot_pairs(const float *x, int64_t xs, const float *w, int64_t ws, int64_t K) {
    float p[4] = {0, 0, 0, 0};
    int64_t k = 0;
    for (; k + 4 <= K; k += 4)
        for (int q = 0; q < 4; q++) p[q] += x[(k + q) * xs] * w[(k + q) * ws];
    for (; k < K; k++) p[0] += x[k * xs] * w[k * ws];
    return ((p[0] + p[1]) + p[2]) + p[3];
}

/* The chain form for one row of C, acc its start and its result: each output's chain over k, k outermost (x's
 * k-th term xs apart, B's row k at b + k * ldb, its columns contiguous). ATen's loop takes val = x * alpha (rounded)
 * and adds b * val -- in one FMA where its build contracts it (fused: AVX2, AVX512), else rounded twice; with
 * alpha 1 the product is exact either way. */
CKP_CLONES static void chain_row(const float *x, int64_t xs, const float *b, int64_t ldb, int64_t K, int64_t N,
                                 float alpha, int fused, float *acc) {
    for (int64_t k = 0; k < K; k++) {
        const float val = x[k * xs] * alpha, *row = b + k * ldb;
        if (fused)
            for (int64_t n = 0; n < N; n++) acc[n] = fmaf(row[n], val, acc[n]);
        else
            for (int64_t n = 0; n < N; n++) acc[n] += row[n] * val;
    }
}

void ckp_aten_bf16_accumulate(int form, float alpha, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                              int64_t b_rs, int64_t b_cs, int64_t M, int64_t K, int64_t N, float *c, int64_t ldc) {
    const int fused = ckp_get_capability() != CKP_CAPABILITY_DEFAULT;
    for (int64_t m = 0; m < M; m++) {
        float *row = c + m * ldc;
        if (form == CKP_ATEN_BF16_CHAIN)
            chain_row(a + m * a_rs, a_cs, b, b_rs, K, N, alpha, fused, row);
        else
            for (int64_t n = 0; n < N; n++)
                row[n] += alpha * dot_pairs(a + m * a_rs, a_cs, b + n * b_cs, b_rs, K);
        for (int64_t n = 0; n < N; n++) row[n] = ckp_bf16_round(row[n]);
    }
}

/* An output's bf16: its sum rounded, and with bias_after the bias added to that and rounded again (matmul, then
 * add_: F.linear's way for an x it does not fold into addmm). */
static inline uint16_t finish(float sum, const uint16_t *bias, int bias_after, int64_t n) {
    if (!bias_after || bias == NULL) return ckp_f_to_bf16(sum);
    return ckp_f_to_bf16(ckp_bf16_round(sum) + ckp_bf16_to_f(bias[n]));
}

ckp_status ckp_gemm_bf16_aten(const uint16_t *a, int64_t a_rs, int64_t a_cs, const uint16_t *b, int64_t b_rs,
                              int64_t b_cs, int64_t M, int64_t K, int64_t N, const uint16_t *bias, int bias_after,
                              int form, uint16_t *c) {
    if (a == NULL || b == NULL || c == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "a, b and c must not be NULL");
    if (M <= 0 || K <= 0 || N <= 0 || M > INT32_MAX || K > INT32_MAX || N > INT32_MAX || M > INT64_MAX / 4 / N ||
        K > INT64_MAX / 4 / (M > N ? M : N))
        return ckp_fail(CKP_ERR_BAD_SIZE, "M, K and N must be positive, got M=%lld K=%lld N=%lld", (long long)M,
                        (long long)K, (long long)N);
    if (a_rs < 0 || a_cs < 0 || b_rs < 0 || b_cs < 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "strides must not be negative");
    if (bias_after != 0 && bias_after != 1)
        return ckp_fail(CKP_ERR_BAD_OPTION, "bias_after must be 0 (the bias in the GEMM) or 1, got %d", bias_after);
    if (form != CKP_ATEN_BF16_DOT && form != CKP_ATEN_BF16_PAIRS && form != CKP_ATEN_BF16_CHAIN)
        return ckp_fail(CKP_ERR_BAD_OPTION, "form must be CKP_ATEN_BF16_DOT, _PAIRS or _CHAIN, got %d", form);
    const size_t c_bytes = (size_t)(M * N) * sizeof(uint16_t);
    const size_t a_bytes = (size_t)((M - 1) * a_rs + (K - 1) * a_cs + 1) * sizeof(uint16_t);
    const size_t b_bytes = (size_t)((K - 1) * b_rs + (N - 1) * b_cs + 1) * sizeof(uint16_t);
    if (ckp_overlaps(c, c_bytes, a, a_bytes) || ckp_overlaps(c, c_bytes, b, b_bytes) ||
        (bias != NULL && ckp_overlaps(c, c_bytes, bias, (size_t)N * sizeof(uint16_t))))
        return ckp_fail(CKP_ERR_ALIASING, "c overlaps a, b or the bias");
    /* A widened by rows (each along K); B by columns along K for the dot forms, by rows along N for the chain */
    float *aw = malloc((size_t)(M * K) * sizeof(float)), *bw = malloc((size_t)(K * N) * sizeof(float));
    float *rows = malloc((size_t)(form == CKP_ATEN_BF16_CHAIN ? ckp_threads() : 1) * (size_t)N * sizeof(float));
    if (aw == NULL || bw == NULL || rows == NULL) {
        free(aw);
        free(bw);
        free(rows);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "gemm_bf16_aten: no memory for the widened operands");
    }
    ckp_clear_error();
    const int tree = ckp_get_capability() != CKP_CAPABILITY_DEFAULT;
    const int seeded = bias != NULL && !bias_after && form == CKP_ATEN_BF16_CHAIN;
    const int team = (double)M * (double)N * (double)K >= 1 << 18 ? ckp_threads() : 1;
#pragma omp parallel num_threads(team)
    {
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) aw[m * K + k] = ckp_bf16_to_f(a[m * a_rs + k * a_cs]);
        if (form == CKP_ATEN_BF16_CHAIN) {
#pragma omp for schedule(static)
            for (int64_t k = 0; k < K; k++)
                for (int64_t n = 0; n < N; n++) bw[k * N + n] = ckp_bf16_to_f(b[k * b_rs + n * b_cs]);
            float *acc = rows + (size_t)omp_get_thread_num() * (size_t)N;
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                for (int64_t n = 0; n < N; n++) acc[n] = seeded ? ckp_bf16_to_f(bias[n]) : 0.0f;
                chain_row(aw + m * K, 1, bw, N, K, N, 1.0f, 0, acc);
                for (int64_t n = 0; n < N; n++) c[m * N + n] = finish(acc[n], bias, bias_after, n);
            }
        } else {
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++) bw[n * K + k] = ckp_bf16_to_f(b[k * b_rs + n * b_cs]);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    const float *x = aw + m * K, *w = bw + n * K;
                    const float dot = form == CKP_ATEN_BF16_DOT ? dot_fp32(x, w, K, tree) : dot_pairs(x, 1, w, 1, K);
                    c[m * N + n] = finish(bias != NULL && !bias_after ? ckp_bf16_to_f(bias[n]) + dot : dot, bias,
                                          bias_after, n);
                }
        }
    }
    free(aw);
    free(bw);
    free(rows);
    return CKP_OK;
}
