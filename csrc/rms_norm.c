/*
 * rms_norm.c — F.rms_norm(x, (D,), weight, eps) forward and backward,
 * following torch's own float operations so that results match it bit for
 * bit where torch's order of operations can be reproduced.
 *
 * torch 2.13 evaluates rms_norm on the CPU as a composite (layer_norm.cpp):
 *   rstd = rsqrt(pow(x, 2).mean(-1, keepdim) + eps);  y = (x * rstd) * weight
 * with mean = sum / D (sum in ATen's order, aten_sum.c) and rsqrt = 1 / sqrt.
 * Backward is autograd's chain through that composite, per row with
 * a = x * rstd and g_a = dy * weight:
 *   g_rstd = sum_j g_a_j * x_j                       (mul backward, summed to (N, 1))
 *   g_mean = (-0.5 * g_rstd) * (rstd * rstd * rstd)  (rsqrt backward)
 *   dx_j   = g_a_j * rstd + (g_mean / D) * (2 * x_j) (mul backward + mean and pow backward)
 *   dweight_j = sum_i dy_ij * a_ij                   (summed over rows in ATen's outer-sum order)
 * Every row and every column is reduced by one thread in a fixed order, so the
 * bits never depend on the thread count.
 */
#include "ckp_internal.h"

#include <math.h>
#include <string.h>

static ckp_status check_sizes(int64_t N, int64_t D) {
    if (N <= 0 || D <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and D must be positive, got N=%lld D=%lld",
                        (long long)N, (long long)D);
    if (N > INT64_MAX / D)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*D overflows: N=%lld D=%lld", (long long)N, (long long)D);
    return CKP_OK;
}

static float square(void *row, int64_t j) {
    float v = ((const float *)row)[j];
    return v * v;
}

ckp_status ckp_rms_norm_forward(const float *x, const float *weight, int64_t N, int64_t D,
                                double eps, float *y, float *rstd) {
    if (x == NULL || y == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, y and rstd must not be NULL");
    ckp_status s = check_sizes(N, D);
    if (s != CKP_OK) return s;
    if (!(eps >= 0.0 && isfinite(eps)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "eps must be finite and >= 0, got %g", eps);
    ckp_clear_error();
    const float eps_f = (float)eps, D_f = (float)D;

    /* x (N, D), weight (D), y (N, D), rstd (N) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * D >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *xi = x + i * D;
        float *yi = y + i * D;
        float mean = ckp_aten_sum(square, (void *)xi, D) / D_f;
        float r = 1.0f / sqrtf(mean + eps_f);
        rstd[i] = r;
        for (int64_t j = 0; j < D; j++) {
            float normalized = xi[j] * r;
            yi[j] = weight ? normalized * weight[j] : normalized;
        }
    }
    return CKP_OK;
}

/* dweight's terms dy_ij * (x_ij * rstd_i), for column j of the row cascade. */
typedef struct {
    const float *dy, *x, *rstd;
    int64_t D, column;
} column_terms;

static float column_term(const column_terms *c, int64_t i) {
    int64_t k = i * c->D + c->column;
    return c->dy[k] * (c->x[k] * c->rstd[i]);
}

/* ATen's multi_row_sum over rows [0, size*nrows), nrows interleaved
 * accumulators (row i*nrows + k goes to accumulator k), 4 cascade levels. */
enum { LEVELS = 4 };
static void cascade_rows(const column_terms *c, int64_t size, int nrows, float *out) {
    int64_t level_power = ckp_ceil_log2(size) / LEVELS > 4 ? ckp_ceil_log2(size) / LEVELS : 4;
    int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;
    float acc[LEVELS][4] = {{0}};
    int64_t i = 0;
    while (i + level_step <= size) {
        for (int64_t j = 0; j < level_step; j++, i++)
            for (int k = 0; k < nrows; k++) acc[0][k] += column_term(c, i * nrows + k);
        for (int j = 1; j < LEVELS; j++) {
            for (int k = 0; k < nrows; k++) {
                acc[j][k] += acc[j - 1][k];
                acc[j - 1][k] = 0.0f;
            }
            if ((i & (level_mask << (j * level_power))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < nrows; k++) acc[0][k] += column_term(c, i * nrows + k);
    for (int j = 1; j < LEVELS; j++)
        for (int k = 0; k < nrows; k++) acc[0][k] += acc[j][k];
    for (int k = 0; k < nrows; k++) out[k] = acc[0][k];
}

/* dweight_j = sum over rows, as ATen's vectorized_outer_sum orders it: columns
 * inside whole 8-wide vectors get one cascade over the rows; the leftover
 * columns go through row_sum (4 interleaved accumulators, leftover rows into
 * the first, then the four added). */
static float column_term_map(void *ctx, int64_t i) { return column_term(ctx, i); }

static float dweight_column(const float *dy, const float *x, const float *rstd, int64_t N, int64_t D,
                            int64_t j) {
    column_terms c = {dy, x, rstd, D, j};
    /* D == 1: the rows are contiguous and torch reduces them as an inner sum */
    if (D == 1) return ckp_aten_sum(column_term_map, &c, N);
    float partial[4];
    if (j < D - D % 8) {
        cascade_rows(&c, N, 1, partial);
        return partial[0];
    }
    int64_t size_ilp = N / 4;
    cascade_rows(&c, size_ilp, 4, partial);
    for (int64_t i = size_ilp * 4; i < N; i++) partial[0] += column_term(&c, i);
    for (int k = 1; k < 4; k++) partial[0] += partial[k];
    return partial[0];
}

/* g_a_j * x_j for the g_rstd sum of one row */
typedef struct {
    const float *dy, *x, *weight;
} row_terms;

static float grad_a_times_x(void *ctx, int64_t j) {
    const row_terms *r = ctx;
    float g = r->weight ? r->dy[j] * r->weight[j] : r->dy[j];
    return g * r->x[j];
}

ckp_status ckp_rms_norm_backward(const float *dy, const float *x, const float *weight,
                                 const float *rstd, int64_t N, int64_t D,
                                 float *dx, float *dweight) {
    if (dy == NULL || x == NULL || rstd == NULL || dx == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dy, x, rstd and dx must not be NULL");
    if ((weight == NULL) != (dweight == NULL))
        return ckp_fail(CKP_ERR_NULL_POINTER, "dweight must be given exactly when weight is");
    ckp_status s = check_sizes(N, D);
    if (s != CKP_OK) return s;
    size_t bytes = (size_t)(N * D) * sizeof(float);
    if (dx != dy && ckp_overlaps(dx, bytes, dy, bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dx partially overlaps dy");
    if (ckp_overlaps(dx, bytes, x, bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dx overlaps x");
    ckp_clear_error();
    const int parallel = N * D >= 32768;
    const float D_f = (float)D;

    /* dweight first: dx may overwrite dy in place. */
    if (dweight != NULL) {
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (parallel)
        for (int64_t j = 0; j < D; j++) dweight[j] = dweight_column(dy, x, rstd, N, D, j);
    }

#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (parallel)
    for (int64_t i = 0; i < N; i++) {
        const float *dyi = dy + i * D, *xi = x + i * D;
        float *dxi = dx + i * D;
        float r = rstd[i];
        row_terms terms = {dyi, xi, weight};
        float grad_rstd = ckp_aten_sum(grad_a_times_x, &terms, D);
        float grad_mean = (-0.5f * grad_rstd) * (r * r * r) / D_f;
        for (int64_t j = 0; j < D; j++) {
            float g = weight ? dyi[j] * weight[j] : dyi[j];
            dxi[j] = g * r + grad_mean * (2.0f * xi[j]);
        }
    }
    return CKP_OK;
}
