/*
 * aten_sum.h — torch.sum's order of additions (ATen's SumKernel.cpp) as an
 * inline template over 8-lane vectors, for kernels that must reproduce a torch
 * reduction bit for bit and still run vectorized.
 *
 * vectorized_inner_sum -> row_sum -> multi_row_sum: the run is seen as whole
 * vectors of 8 lanes (torch 2.13's reduction kernels run at AVX2 width on
 * this build even where its softmax runs at AVX-512: checked bitwise against
 * x.sum(-1)); the vectors form a (rows, 4) array summed column-wise through a
 * 4-level cascade (level step 2^max(4, ceil_log2(rows)/4)); leftover vectors
 * join the first column; the columns are added, then the leftover elements
 * are summed first and the 8 lanes are added to them one by one.
 *
 * CKP_DEFINE_ATEN_SUM(name, map8, map1) defines `float name(const void *ctx,
 * int64_t n)` over the caller's element map: map8(ctx, j) gives elements
 * j..j+7 as a vector, map1(ctx, j) element j. A macro rather than function
 * pointers: the maps are called by name, so they are inlined in every build
 * (a vector returned through a pointer call crosses an ABI boundary between
 * target_clones builds: the ASan build, which does not inline, crashed).
 */
#ifndef CKP_ATEN_SUM_H
#define CKP_ATEN_SUM_H

#include "ckp_internal.h"
#include "vec.h"

enum { CKP_SUM_ILP = 4, CKP_SUM_LEVELS = 4 };

/* The cascade's level step for `rows` rows: 2^max(4, ceil_log2(rows) / 4). */
static inline int64_t ckp_cascade_power(int64_t rows) {
    int64_t p = ckp_ceil_log2(rows) / CKP_SUM_LEVELS;
    return p > 4 ? p : 4;
}

#define CKP_DEFINE_ATEN_SUM(name, map8, map1)                                                          \
static inline __attribute__((always_inline)) float name(const void *ctx, int64_t n) {                  \
    int64_t nvec = n / CKP_VLANES, rows = nvec / CKP_SUM_ILP;                                          \
    int64_t level_power = ckp_cascade_power(rows);                                                     \
    int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;                       \
    ckp_v8f acc[CKP_SUM_LEVELS][CKP_SUM_ILP] = {{{0}}};                                                \
    int64_t i = 0;                                                                                     \
    while (i + level_step <= rows) {                                                                   \
        for (int64_t s = 0; s < level_step; s++, i++)                                                  \
            for (int k = 0; k < CKP_SUM_ILP; k++) acc[0][k] += map8(ctx, (i * CKP_SUM_ILP + k) * CKP_VLANES);\
        for (int l = 1; l < CKP_SUM_LEVELS; l++) {                                                     \
            for (int k = 0; k < CKP_SUM_ILP; k++) {                                                    \
                acc[l][k] += acc[l - 1][k];                                                            \
                acc[l - 1][k] = ckp_splat8(0.0f);                                                      \
            }                                                                                          \
            if ((i & (level_mask << (l * level_power))) != 0) break;                                   \
        }                                                                                              \
    }                                                                                                  \
    for (; i < rows; i++)                                                                              \
        for (int k = 0; k < CKP_SUM_ILP; k++) acc[0][k] += map8(ctx, (i * CKP_SUM_ILP + k) * CKP_VLANES);\
    for (int l = 1; l < CKP_SUM_LEVELS; l++)                                                           \
        for (int k = 0; k < CKP_SUM_ILP; k++) acc[0][k] += acc[l][k];                                  \
    ckp_v8f partial = acc[0][0];                                                                       \
    for (int64_t v = rows * CKP_SUM_ILP; v < nvec; v++) partial += map8(ctx, v * CKP_VLANES);          \
    for (int k = 1; k < CKP_SUM_ILP; k++) partial += acc[0][k];                                        \
    float total = 0.0f;                                                                                \
    for (int64_t j = nvec * CKP_VLANES; j < n; j++) total += map1(ctx, j);                             \
    for (int l = 0; l < CKP_VLANES; l++) total += partial[l];                                          \
    return total;                                                                                      \
}

#endif
