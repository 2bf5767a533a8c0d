/*
 * aten_sum.h — torch.sum's order of additions (ATen's SumKernel.cpp), for
 * kernels that must reproduce a torch reduction bit for bit.
 *
 * [Note: ATen's summation order]
 * ATen's cascade_sum views a reduction as (size0 reduced) x (size1 kept) and
 * picks one of four loops (torch 2.13's reduction kernels run at AVX2 width,
 * 8 floats, on this build even where its softmax runs at AVX-512: checked
 * bitwise against x.sum(-1)):
 *   - reduced elements contiguous and size0 >= 8: vectorized_inner_sum — the
 *     row as whole 8-lane vectors through row_sum, the leftover elements
 *     summed first, then the 8 lanes added to them one by one;
 *   - kept elements contiguous and size1 >= 8: vectorized_outer_sum — blocks
 *     of 4 vectors (32 columns) through multi_row_sum (one cascade per column
 *     over all rows), then single vectors and then single columns through
 *     row_sum;
 *   - otherwise, reduced stride < kept stride: scalar_inner_sum — row_sum per
 *     row (so a row sum of 5..7 floats is not a running sum);
 *   - otherwise scalar_outer_sum: groups of 4 columns through multi_row_sum,
 *     the leftover columns through row_sum.
 * multi_row_sum(size): nrows accumulators, each a 4-level cascade over the
 * size rows (level step 2^max(4, ceil_log2(size)/4)).
 * row_sum(n): the n values as a (n/4, 4) array through multi_row_sum (4
 * interleaved accumulators), the n % 4 leftovers added to the first, then
 * the other three added to it.
 * A full reduction of a contiguous tensor is the inner case with one row.
 *
 * Here: CKP_DEFINE_ATEN_SUM (below) is the inner sum over a row, vectorized;
 * ckp_multi_row_sum and ckp_row_sum (aten_sum.c) are the scalar forms, for
 * sums over rows (rms_norm's dweight) and elements computed on the fly.
 *
 * In bfloat16 (acc_t float) one vector load is a whole Vectorized<BFloat16>,
 * 16 values at that width, added to 8 floats as its two halves (lanes l and
 * l + 8: InnerSumCastLoadPolicy); cascade_sum takes the vectorized inner loop
 * from 16 elements on, the scalar row_sum below that, and rounds the float
 * total once, when it is stored.
 *
 * CKP_DEFINE_ATEN_SUM(name, map8, map1, width) defines `float name(const void
 * *ctx, int64_t n)` over the caller's element map: map8(ctx, j) gives the
 * 8-float vector of the load at element j (elements j..j+width-1; width 8 in
 * float32, 16 in bf16), map1(ctx, j) element j. A macro rather than function
 * pointers: the maps are called by name, so they are inlined in every build
 * (a vector returned through a pointer call crosses an ABI boundary between
 * target_clones builds: the ASan build, which does not inline, crashed).
 */
#ifndef CKP_ATEN_SUM_H
#define CKP_ATEN_SUM_H

#include "ckp_internal.h"
#include "vec.h"

enum { CKP_SUM_ILP = 4, CKP_SUM_LEVELS = 4 };

/* ATen's grain size (at::internal::GRAIN_SIZE): a reduction of fewer
 * elements runs on one thread; a reduction to one value of at least this
 * many is split across torch's threads (ckp_aten_full_sum). */
enum { CKP_ATEN_GRAIN_SIZE = 32768 };

/* The cascade's level step for `rows` rows: 2^max(4, ceil_log2(rows) / 4). */
static inline int64_t ckp_cascade_power(int64_t rows) {
    int64_t p = ckp_ceil_log2(rows) / CKP_SUM_LEVELS;
    return p > 4 ? p : 4;
}

#define CKP_DEFINE_ATEN_SUM(name, map8, map1, W)                                                        \
static inline __attribute__((always_inline)) float name(const void *ctx, int64_t n) {                  \
    if (n < (W)) { /* scalar_inner_sum: row_sum of under 4 rows of 4, no cascade */                   \
        float p[CKP_SUM_ILP] = {0.0f, 0.0f, 0.0f, 0.0f};                                               \
        int64_t whole = n - n % CKP_SUM_ILP;                                                           \
        for (int64_t j = 0; j < whole; j++) p[j % CKP_SUM_ILP] += map1(ctx, j);                        \
        for (int64_t j = whole; j < n; j++) p[0] += map1(ctx, j);                                      \
        for (int k = 1; k < CKP_SUM_ILP; k++) p[0] += p[k];                                            \
        return p[0];                                                                                   \
    }                                                                                                  \
    int64_t nvec = n / (W), rows = nvec / CKP_SUM_ILP;                                                 \
    int64_t level_power = ckp_cascade_power(rows);                                                     \
    int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;                       \
    ckp_v8f acc[CKP_SUM_LEVELS][CKP_SUM_ILP] = {{{0}}};                                                \
    int64_t i = 0;                                                                                     \
    while (i + level_step <= rows) {                                                                   \
        for (int64_t s = 0; s < level_step; s++, i++)                                                  \
            for (int k = 0; k < CKP_SUM_ILP; k++) acc[0][k] += map8(ctx, (i * CKP_SUM_ILP + k) * (W));   \
        for (int l = 1; l < CKP_SUM_LEVELS; l++) {                                                     \
            for (int k = 0; k < CKP_SUM_ILP; k++) {                                                    \
                acc[l][k] += acc[l - 1][k];                                                            \
                acc[l - 1][k] = ckp_splat8(0.0f);                                                      \
            }                                                                                          \
            if ((i & (level_mask << (l * level_power))) != 0) break;                                   \
        }                                                                                              \
    }                                                                                                  \
    for (; i < rows; i++)                                                                              \
        for (int k = 0; k < CKP_SUM_ILP; k++) acc[0][k] += map8(ctx, (i * CKP_SUM_ILP + k) * (W));   \
    for (int l = 1; l < CKP_SUM_LEVELS; l++)                                                           \
        for (int k = 0; k < CKP_SUM_ILP; k++) acc[0][k] += acc[l][k];                                  \
    ckp_v8f partial = acc[0][0];                                                                       \
    for (int64_t v = rows * CKP_SUM_ILP; v < nvec; v++) partial += map8(ctx, v * (W));                 \
    for (int k = 1; k < CKP_SUM_ILP; k++) partial += acc[0][k];                                        \
    float total = 0.0f;                                                                                \
    for (int64_t j = nvec * (W); j < n; j++) total += map1(ctx, j);                                    \
    for (int l = 0; l < CKP_VLANES; l++) total += partial[l];                                          \
    return total;                                                                                      \
}

#endif
