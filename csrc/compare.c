/*
 * compare.c — the harness's own hot loop: how far apart two float32 tensors
 * are, in one pass and no temporaries (the torch expression it replaces,
 * harness/diff.py, made several full-size float64 copies per tensor pair).
 *
 * For a and b of n floats: max |a_j - b_j| in double over the elements that
 * differ (equal values, and NaN in both, count 0; NaN in one only makes the
 * result NaN), max |b_j| (NaN if b has a NaN), and how many elements differ.
 * Maxima and counts are exact in any order, so any thread split gives the
 * same result; blocks still follow the library's fixed-block rule.
 */
#include "ckp_internal.h"

#include <math.h>

typedef struct {
    double max_diff, max_b;
    int64_t differing;
    int diff_nan, b_nan;
} block_figures;

CKP_CLONES static void compare_block(const float *a, const float *b, int64_t lo, int64_t hi, block_figures *out) {
    double max_diff = 0.0, max_b = 0.0;
    int64_t differing = 0;
    int diff_nan = 0, b_nan = 0;
    for (int64_t j = lo; j < hi; j++) {
        float x = a[j], y = b[j];
        int x_nan = x != x, y_nan = y != y;
        double magnitude = fabs((double)y);
        b_nan |= y_nan;
        max_b = magnitude > max_b ? magnitude : max_b;
        if (x == y || (x_nan && y_nan)) continue;
        differing++;
        double d = fabs((double)x - (double)y);
        if (d != d) diff_nan = 1;  /* one side NaN, or infinities of one sign on one side only */
        else if (d > max_diff) max_diff = d;
    }
    *out = (block_figures){max_diff, max_b, differing, diff_nan, b_nan};
}

ckp_status ckp_compare(const float *a, const float *b, int64_t n, double *max_abs_diff, double *max_abs_b,
                       int64_t *differing) {
    if (a == NULL || b == NULL || max_abs_diff == NULL || max_abs_b == NULL || differing == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "a, b and the outputs must not be NULL");
    if (n <= 0) return ckp_fail(CKP_ERR_BAD_SIZE, "n must be positive, got %lld", (long long)n);
    ckp_clear_error();
    int64_t nblocks = ckp_num_blocks((n + 4095) / 4096);
    block_figures part[CKP_MAX_BLOCKS];
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (n >= 65536)
    for (int64_t k = 0; k < nblocks; k++) {
        int64_t lo, hi;
        ckp_block_range(n, nblocks, k, &lo, &hi);
        compare_block(a, b, lo, hi, &part[k]);
    }
    block_figures total = {0.0, 0.0, 0, 0, 0};
    for (int64_t k = 0; k < nblocks; k++) {
        total.max_diff = part[k].max_diff > total.max_diff ? part[k].max_diff : total.max_diff;
        total.max_b = part[k].max_b > total.max_b ? part[k].max_b : total.max_b;
        total.differing += part[k].differing;
        total.diff_nan |= part[k].diff_nan;
        total.b_nan |= part[k].b_nan;
    }
    *max_abs_diff = total.diff_nan ? NAN : total.max_diff;
    *max_abs_b = total.b_nan ? NAN : total.max_b;
    *differing = total.differing;
    return CKP_OK;
}
