/*
 * clip_grad_norm.c — the total gradient norm of torch.nn.utils.clip_grad_norm_:
 *   total = || (||g_1||_p, ..., ||g_k||_p) ||_p,   ||g||_p = (sum |g_j|^p)^(1/p)
 *   (p = inf: max |g_j|).
 * Sums are in double over fixed blocks combined in block order, and inside a
 * block over 8 fixed lanes (written as lane loops so they vectorize), so the
 * bits do not depend on the thread count or the target. NaN anywhere gives NaN and inf gives inf
 * (for p = inf too: the max propagates NaN), never a finite norm.
 */
#include "ckp_internal.h"

#include <math.h>

enum { LANES = 8 };

static double lanes_total(const double lane[LANES]) {
    double total = lane[0];
    for (int l = 1; l < LANES; l++) total += lane[l];
    return total;
}

CKP_CLONES
static double block_power_sum(const float *g, int64_t lo, int64_t hi, double p) {
    double acc = 0.0, lane[LANES] = {0};
    int64_t j = lo;
    if (isinf(p)) {
        for (; j < hi; j++) {
            double a = fabs((double)g[j]);
            if (a > acc || a != a) acc = a;
            if (acc != acc) break;
        }
    } else if (p == 2.0) {
        if (CKP_MUTANT(GRAD_NORM_FLOAT_ACCUMULATOR)) {
            float facc = 0.0f;
            for (; j < hi; j++) facc += g[j] * g[j];
            return facc;
        }
        for (; j + LANES <= hi; j += LANES)
            for (int l = 0; l < LANES; l++) lane[l] += (double)g[j + l] * (double)g[j + l];
        for (int l = 0; j < hi; j++, l++) lane[l] += (double)g[j] * (double)g[j];
        acc = lanes_total(lane);
    } else if (p == 1.0) {
        for (; j + LANES <= hi; j += LANES)
            for (int l = 0; l < LANES; l++) lane[l] += fabs((double)g[j + l]);
        for (int l = 0; j < hi; j++, l++) lane[l] += fabs((double)g[j]);
        acc = lanes_total(lane);
    } else {
        for (; j < hi; j++) acc += pow(fabs((double)g[j]), p);
    }
    return acc;
}

/* sum_j |g_j|^p of one tensor (max |g_j| for p = inf) */
static double tensor_power_sum(const float *g, int64_t n, double p) {
    int64_t nblocks = ckp_num_blocks((n + 4095) / 4096);
    double partial[CKP_MAX_BLOCKS];
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (n >= 65536)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t lo, hi;
        ckp_block_range(n, nblocks, b, &lo, &hi);
        partial[b] = block_power_sum(g, lo, hi, p);
    }
    double total = 0.0;
    for (int64_t b = 0; b < nblocks; b++) {
        if (isinf(p)) total = (partial[b] > total || partial[b] != partial[b]) ? partial[b] : total;
        else total += partial[b];
        if (total != total) break;
    }
    return total;
}

ckp_status ckp_grad_norm(const float *const *tensors, const int64_t *sizes, int64_t count,
                         double norm_type, double *total_norm) {
    if (tensors == NULL || sizes == NULL || total_norm == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "tensors, sizes and total_norm must not be NULL");
    if (count < 0) return ckp_fail(CKP_ERR_BAD_SIZE, "count must be >= 0, got %lld", (long long)count);
    if (!(norm_type > 0.0))
        return ckp_fail(CKP_ERR_BAD_OPTION, "norm_type must be > 0 or inf, got %g", norm_type);
    for (int64_t k = 0; k < count; k++) {
        if (sizes[k] < 0) return ckp_fail(CKP_ERR_BAD_SIZE, "tensor %lld has negative size", (long long)k);
        if (sizes[k] > 0 && tensors[k] == NULL)
            return ckp_fail(CKP_ERR_NULL_POINTER, "tensor %lld is NULL", (long long)k);
    }
    ckp_clear_error();
    double total = 0.0;
    for (int64_t k = 0; k < count; k++) {
        if (sizes[k] == 0) continue;
        double s = tensor_power_sum(tensors[k], sizes[k], norm_type);
        /* the p-norm of the per-tensor p-norms is the p-norm of everything */
        if (isinf(norm_type)) total = (s > total || s != s) ? s : total;
        else total += s;
    }
    if (!isinf(norm_type))
        total = norm_type == 2.0 ? sqrt(total) : norm_type == 1.0 ? total : pow(total, 1.0 / norm_type);
    *total_norm = total;
    return CKP_OK;
}
