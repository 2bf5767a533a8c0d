/*
 * aten_sum.c — torch.sum over a contiguous run of float32 values, single-
 * threaded, in the order ATen's SumKernel.cpp adds them, so that a kernel
 * that must reproduce a torch reduction bit for bit can.
 *
 * vectorized_inner_sum -> row_sum -> multi_row_sum: the run is seen as whole
 * vectors of 8 lanes (torch 2.13's reduction kernels run at AVX2 width on
 * this build even where its softmax runs at AVX-512: checked bitwise against
 * x.sum(-1)); the vectors form a (rows, 4) array summed column-wise through a
 * 4-level cascade (level step 2^max(4, ceil_log2(rows)/4)); leftover vectors
 * join the first column; the columns are added, then the leftover elements
 * are summed first and the 8 lanes are added to them one by one.
 */
#include "ckp_internal.h"

#include <string.h>

enum { LANES = 8, ILP = 4, LEVELS = 4 };

int64_t ckp_ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t bits = 0;
    for (uint64_t v = (uint64_t)x - 1; v; v >>= 1) bits++;
    return bits;
}

static void add_vector(float *acc, ckp_float_map map, void *ctx, int64_t vec) {
    for (int l = 0; l < LANES; l++) acc[l] += map(ctx, vec * LANES + l);
}

float ckp_aten_sum(ckp_float_map map, void *ctx, int64_t n) {
    int64_t nvec = n / LANES, rows = nvec / ILP;
    int64_t level_power = ckp_ceil_log2(rows) / LEVELS > 4 ? ckp_ceil_log2(rows) / LEVELS : 4;
    int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;
    float acc[LEVELS][ILP][LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + level_step <= rows) {
        for (int64_t j = 0; j < level_step; j++, i++)
            for (int k = 0; k < ILP; k++) add_vector(acc[0][k], map, ctx, i * ILP + k);
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < LANES; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (level_mask << (j * level_power))) != 0) break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < ILP; k++) add_vector(acc[0][k], map, ctx, i * ILP + k);
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < LANES; l++) acc[0][k][l] += acc[j][k][l];
    float *partial = acc[0][0];
    for (int64_t v = rows * ILP; v < nvec; v++) add_vector(partial, map, ctx, v);
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < LANES; l++) partial[l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t j = nvec * LANES; j < n; j++) total += map(ctx, j);
    for (int l = 0; l < LANES; l++) total += partial[l];
    return total;
}
