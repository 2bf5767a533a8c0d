/*
 * rms_norm.c — F.rms_norm(x, (D,), weight, eps) forward and backward.
 *
 * torch 2.13 on the CPU evaluates the composite (layer_norm.cpp, rms_norm):
 *   rstd = rsqrt(pow(x, 2).mean(-1, keepdim) + eps);  y = (x * rstd) * weight
 * Here mean(x^2) and rstd are computed and saved in double; y keeps torch's
 * two float products with rstd rounded to float, so y differs from torch only
 * through rstd. Backward (autograd's chain of that composite), per row with
 * g = dy * weight:
 *   dx_j = rstd * g_j - x_j * rstd^3 * (sum_k g_k x_k) / D
 *   dweight_j = sum_i dy_ij * (x_ij * rstd_i)
 * dweight is reduced over rows in row order for each column: the columns are
 * split among threads, so the bits never depend on the thread count.
 */
#include "ckp_internal.h"

#include <math.h>

static ckp_status check_sizes(int64_t N, int64_t D) {
    if (N <= 0 || D <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and D must be positive, got N=%lld D=%lld",
                        (long long)N, (long long)D);
    if (N > INT64_MAX / D)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*D overflows: N=%lld D=%lld", (long long)N, (long long)D);
    return CKP_OK;
}

ckp_status ckp_rms_norm_forward(const float *x, const float *weight, int64_t N, int64_t D,
                                double eps, float *y, double *rstd) {
    if (x == NULL || y == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, y and rstd must not be NULL");
    ckp_status s = check_sizes(N, D);
    if (s != CKP_OK) return s;
    if (!(eps >= 0.0 && isfinite(eps)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "eps must be finite and >= 0, got %g", eps);
    ckp_clear_error();

    /* x (N, D), weight (D), y (N, D), rstd (N) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * D >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *xi = x + i * D;
        float *yi = y + i * D;
        double sum_sq = 0.0;
        for (int64_t j = 0; j < D; j++) sum_sq += (double)xi[j] * (double)xi[j];
        double r_exact = 1.0 / sqrt(sum_sq / (double)D + eps);
        float r = (float)r_exact;
        rstd[i] = r_exact;
        for (int64_t j = 0; j < D; j++) {
            float normalized = xi[j] * r;
            yi[j] = weight ? normalized * weight[j] : normalized;
        }
    }
    return CKP_OK;
}

/* Columns per task of the dweight reduction: a cache line's worth of floats
 * per row read, and a fixed split that does not depend on the thread count. */
enum { DWEIGHT_COLUMNS = 64 };

ckp_status ckp_rms_norm_backward(const float *dy, const float *x, const float *weight,
                                 const double *rstd, int64_t N, int64_t D,
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

    /* dweight first: dx may overwrite dy in place. */
    if (dweight != NULL) {
        int64_t chunks = (D + DWEIGHT_COLUMNS - 1) / DWEIGHT_COLUMNS;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (parallel)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t lo = c * DWEIGHT_COLUMNS, hi = lo + DWEIGHT_COLUMNS < D ? lo + DWEIGHT_COLUMNS : D;
            double acc[DWEIGHT_COLUMNS] = {0};
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = lo; j < hi; j++)
                    acc[j - lo] += (double)dy[i * D + j] * (double)(x[i * D + j] * (float)rstd[i]);
            for (int64_t j = lo; j < hi; j++) dweight[j] = (float)acc[j - lo];
        }
    }

#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (parallel)
    for (int64_t i = 0; i < N; i++) {
        const float *dyi = dy + i * D, *xi = x + i * D;
        float *dxi = dx + i * D;
        double r = rstd[i], dot = 0.0;
        for (int64_t j = 0; j < D; j++)
            dot += (double)dyi[j] * (weight ? (double)weight[j] : 1.0) * (double)xi[j];
        double coef = r * r * r * dot / (double)D;
        for (int64_t j = 0; j < D; j++) {
            double g = (double)dyi[j] * (weight ? (double)weight[j] : 1.0);
            dxi[j] = (float)(r * g - (double)xi[j] * coef);
        }
    }
    return CKP_OK;
}
