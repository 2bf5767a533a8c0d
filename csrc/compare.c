/*
 * compare.c — the harness's own hot loop: how far apart two float32 tensors
 * are, in one pass and no temporaries (the torch expression it replaces,
 * harness/diff.py, made several full-size float64 copies per tensor pair).
 *
 * For a and b of n floats: max |a_j - b_j| (see compare8) over the elements that
 * differ (equal values, and NaN in both, count 0; NaN in one only makes the
 * result NaN), max |b_j| (NaN if b has a NaN), and how many elements differ.
 * Maxima and counts are exact in any order, so any thread split gives the
 * same result; blocks still follow the library's fixed-block rule.
 */
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>

typedef struct {
    double max_diff, max_b;
    int64_t differing;
    int diff_nan, b_nan;
} block_figures;

/* 8 lanes at a time (vec.h). |a - b| is taken in float: exact whenever a and
 * b are within a factor of 2 of each other (Sterbenz), which every pair
 * close enough for its difference to matter is; otherwise it is the exact
 * difference rounded once, and rounding is monotonic, so the maximum is
 * still the rounded exact maximum. Equal pairs (NaN in both included)
 * contribute 0 and are not counted; a NaN difference or |b| sets a flag and
 * stays out of the maxima, so the maxima are plain, order-free ones. */
static inline __attribute__((always_inline)) void compare8(ckp_v8f x, ckp_v8f y, ckp_v8f *max_diff, ckp_v8f *max_b,
                                                          ckp_v8i *differing, ckp_v8i *diff_nan, ckp_v8i *b_nan) {
    const ckp_v8i abs_mask = (ckp_v8i)ckp_splat8(0.0f) | 0x7fffffff;
    ckp_v8i x_nan = x != x, y_nan = y != y;
    ckp_v8i same = (x == y) | (CKP_MUTANT(COMPARE_NAN_EQUAL) ? (x_nan | y_nan) : (x_nan & y_nan));
    ckp_v8f d = (ckp_v8f)((ckp_v8i)(x - y) & abs_mask);
    ckp_v8i d_nan = ~same & (d != d);
    ckp_v8f magnitude = (ckp_v8f)((ckp_v8i)y & abs_mask);
    d = ckp_select8(same | d_nan, ckp_splat8(0.0f), d);
    magnitude = ckp_select8(y_nan, ckp_splat8(0.0f), magnitude);
    *differing -= ~same;  /* lanes are -1 where true */
    *diff_nan |= d_nan;
    *b_nan |= y_nan;
    *max_diff = ckp_select8(d > *max_diff, d, *max_diff);
    *max_b = ckp_select8(magnitude > *max_b, magnitude, *max_b);
}

CKP_CLONES static void compare_block(const float *a, const float *b, int64_t lo, int64_t hi, block_figures *out) {
    ckp_v8f max_diff = ckp_splat8(0.0f), max_b = ckp_splat8(0.0f);
    ckp_v8i zero = {0}, differing = zero, diff_nan = zero, b_nan = zero;
    int64_t j = lo;
    for (; j + CKP_VLANES <= hi; j += CKP_VLANES)
        compare8(ckp_load8(a + j), ckp_load8(b + j), &max_diff, &max_b, &differing, &diff_nan, &b_nan);
    if (j < hi && !CKP_MUTANT(COMPARE_TAIL_SKIPPED))  /* the tail: equal fill lanes count for nothing */
        compare8(ckp_load8_tail(a + j, hi - j, 0.0f), ckp_load8_tail(b + j, hi - j, 0.0f), &max_diff, &max_b,
                 &differing, &diff_nan, &b_nan);
    block_figures f = {0.0, 0.0, 0, 0, 0};
    for (int l = 0; l < CKP_VLANES; l++) {
        f.max_diff = max_diff[l] > f.max_diff ? max_diff[l] : f.max_diff;
        f.max_b = max_b[l] > f.max_b ? max_b[l] : f.max_b;
        f.differing += differing[l];
        f.diff_nan |= diff_nan[l] != 0;
        f.b_nan |= b_nan[l] != 0;
    }
    *out = f;
}

ckp_status ckp_compare(const float *a, const float *b, int64_t n, double *max_abs_diff, double *max_abs_b,
                       int64_t *differing) {
    if (a == NULL || b == NULL || max_abs_diff == NULL || max_abs_b == NULL || differing == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "a, b and the outputs must not be NULL");
    if (n <= 0) return ckp_fail(CKP_ERR_BAD_SIZE, "n must be positive, got %lld", (long long)n);
    /* the outputs are written after every read, so overlapping a and b is harmless; overlapping each other is not */
    if (ckp_overlaps(max_abs_diff, sizeof(double), max_abs_b, sizeof(double)) ||
        ckp_overlaps(differing, sizeof(int64_t), max_abs_diff, sizeof(double)) ||
        ckp_overlaps(differing, sizeof(int64_t), max_abs_b, sizeof(double)))
        return ckp_fail(CKP_ERR_ALIASING, "max_abs_diff, max_abs_b and differing must not overlap each other");
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
