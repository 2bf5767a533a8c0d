/*
 * vocab_parallel_cross_entropy.c — F.cross_entropy (class targets) of logits
 * split by vocabulary over ranks, as Megatron's vocab-parallel cross-entropy
 * and torch's loss_parallel compute it. This rank holds columns
 * [vocab_start, vocab_start + V_local) of the full (N, V) logits; the caller
 * all-reduces between the passes (ckparity.distributed does it with
 * torch.distributed):
 *
 *   1. ckp_vocab_parallel_ce_max:   m_i = max_j x_ij over the shard      -> all-reduce MAX -> M_i
 *   2. ckp_vocab_parallel_ce_sums:  per row, in double, over the shard:
 *        sums[i, 0] = sum_j exp(x_ij - M_i)
 *        sums[i, 1] = x_it if this shard owns the target t, else 0
 *        sums[i, 2] = sum_j x_ij          (for label smoothing)     -> all-reduce SUM -> S_i
 *   3. ckp_vocab_parallel_ce_loss:  lse_i = M_i + log S_i0 and each row's loss
 *        (1 - ls) (lse_i - S_i1) + ls (lse_i - S_i2 / V) + z lse_i^2,  0 for an ignored row
 *   4. ckp_vocab_parallel_ce_backward: the shard's dlogits, with p_ij = exp(x_ij - lse_i):
 *        row_grad_i ((1 - ls) (p_ij - [j == t]) + ls (p_ij - 1/V) + 2 z lse_i p_ij)
 *      (0 for an ignored row); row_grad_i carries the reduction (1/count for mean).
 *
 * Every pass is one sweep of the shard, rows split over threads, each row in
 * a fixed order: a rank's results depend on its shard alone. Across ranks the
 * all-reduce's order decides the bits of the sums, so results are the same
 * run after run for one world size and may differ in the last bits between
 * world sizes. Double sums keep that difference far below float32's ULP.
 */
#include "ckp_internal.h"

#include <math.h>

static ckp_status check_shard(const float *logits, int64_t N, int64_t V_local, int64_t vocab_start, int64_t V) {
    if (logits == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "logits is NULL");
    if (N <= 0 || V_local <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and V_local must be positive, got N=%lld V_local=%lld", (long long)N,
                        (long long)V_local);
    if (vocab_start < 0 || V < V_local || vocab_start > V - V_local)
        return ckp_fail(CKP_ERR_BAD_SIZE, "the shard [%lld, %lld) is not inside the vocabulary [0, %lld)",
                        (long long)vocab_start, (long long)(vocab_start + V_local), (long long)V);
    if (N > INT64_MAX / V_local)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*V_local overflows");
    return CKP_OK;
}

static ckp_status check_targets(const int64_t *target, int64_t N, int64_t V, int64_t ignore_index) {
    if (target == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "target is NULL");
    for (int64_t i = 0; i < N; i++)
        if (target[i] != ignore_index && (target[i] < 0 || target[i] >= V))
            return ckp_fail(CKP_ERR_TARGET_OUT_OF_RANGE, "Target %lld is out of bounds at row %lld (V=%lld)",
                            (long long)target[i], (long long)i, (long long)V);
    return CKP_OK;
}

static ckp_status check_options(double label_smoothing, double z_loss) {
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
        return ckp_fail(CKP_ERR_BAD_OPTION, "label_smoothing must be in [0, 1], got %g", label_smoothing);
    if (!(z_loss >= 0.0 && isfinite(z_loss)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "z_loss must be finite and >= 0, got %g", z_loss);
    return CKP_OK;
}

ckp_status ckp_vocab_parallel_ce_max(const float *logits, int64_t N, int64_t V_local, float *row_max) {
    ckp_status s = check_shard(logits, N, V_local, 0, V_local);
    if (s != CKP_OK) return s;
    if (row_max == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "row_max is NULL");
    if (ckp_overlaps(row_max, (size_t)N * sizeof(float), logits, (size_t)(N * V_local) * sizeof(float)))
        return ckp_fail(CKP_ERR_ALIASING, "row_max overlaps logits");
    ckp_clear_error();
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * V_local >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V_local;
        float m = x[0];
        for (int64_t j = 1; j < V_local; j++)
            if (x[j] > m || isnan(x[j])) m = isnan(m) ? m : x[j];  /* NaN wins, as in torch's max */
        row_max[i] = m;
    }
    return CKP_OK;
}

ckp_status ckp_vocab_parallel_ce_sums(const float *logits, const int64_t *target, int64_t N, int64_t V_local,
                                      int64_t vocab_start, int64_t V, int64_t ignore_index,
                                      const float *global_max, double *sums) {
    ckp_status s = check_shard(logits, N, V_local, vocab_start, V);
    if (s == CKP_OK) s = check_targets(target, N, V, ignore_index);
    if (s != CKP_OK) return s;
    if (global_max == NULL || sums == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "global_max or sums is NULL");
    const ckp_span inputs[] = {{logits, (size_t)(N * V_local) * sizeof(float)}, {target, (size_t)N * sizeof(int64_t)},
                               {global_max, (size_t)N * sizeof(float)}};
    if (ckp_overlaps_any((ckp_span){sums, (size_t)(3 * N) * sizeof(double)}, inputs, 3))
        return ckp_fail(CKP_ERR_ALIASING, "sums overlaps logits, target or global_max");
    ckp_clear_error();
    /* logits (N, V_local), target (N), global_max (N), sums (N, 3) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * V_local >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V_local;
        double m = (double)global_max[i], sum_exp = 0.0, sum_x = 0.0;
        for (int64_t j = 0; j < V_local; j++) {
            sum_exp += CKP_MUTANT(VP_CE_FLOAT_SUMS) ? (double)(float)((float)sum_exp + expf(x[j] - (float)m)) - sum_exp
                                                    : exp((double)x[j] - m);
            sum_x += (double)x[j];
        }
        int64_t t = target[i] - vocab_start;
        sums[3 * i] = sum_exp;
        sums[3 * i + 1] = target[i] != ignore_index && t >= (CKP_MUTANT(VP_CE_SHARD_START_TARGET) ? 1 : 0) && t < V_local
                              ? (double)x[t] : 0.0;
        sums[3 * i + 2] = sum_x;
    }
    return CKP_OK;
}

ckp_status ckp_vocab_parallel_ce_loss(const int64_t *target, int64_t N, int64_t V, int64_t ignore_index,
                                      double label_smoothing, double z_loss, const float *global_max,
                                      const double *global_sums, float *loss_rows) {
    if (N <= 0 || V <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and V must be positive, got N=%lld V=%lld", (long long)N, (long long)V);
    ckp_status s = check_targets(target, N, V, ignore_index);
    if (s == CKP_OK) s = check_options(label_smoothing, z_loss);
    if (s != CKP_OK) return s;
    if (global_max == NULL || global_sums == NULL || loss_rows == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "global_max, global_sums or loss_rows is NULL");
    const ckp_span inputs[] = {{target, (size_t)N * sizeof(int64_t)}, {global_max, (size_t)N * sizeof(float)},
                               {global_sums, (size_t)(3 * N) * sizeof(double)}};
    if (ckp_overlaps_any((ckp_span){loss_rows, (size_t)N * sizeof(float)}, inputs, 3))
        return ckp_fail(CKP_ERR_ALIASING, "loss_rows overlaps target, global_max or global_sums");
    ckp_clear_error();
    for (int64_t i = 0; i < N; i++) {
        if (target[i] == ignore_index) {
            loss_rows[i] = 0.0f;
            continue;
        }
        double lse = (double)global_max[i] + log(global_sums[3 * i]);
        double nll = lse - global_sums[3 * i + 1], smooth = lse - global_sums[3 * i + 2] / (double)V;
        loss_rows[i] = (float)((1.0 - label_smoothing) * nll + label_smoothing * smooth + z_loss * lse * lse);
    }
    return CKP_OK;
}

ckp_status ckp_vocab_parallel_ce_backward(const float *logits, const int64_t *target, int64_t N, int64_t V_local,
                                          int64_t vocab_start, int64_t V, int64_t ignore_index,
                                          double label_smoothing, double z_loss, const float *global_max,
                                          const double *global_sums, const float *row_grad, float *dlogits) {
    ckp_status s = check_shard(logits, N, V_local, vocab_start, V);
    if (s == CKP_OK) s = check_targets(target, N, V, ignore_index);
    if (s == CKP_OK) s = check_options(label_smoothing, z_loss);
    if (s != CKP_OK) return s;
    if (global_max == NULL || global_sums == NULL || row_grad == NULL || dlogits == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "global_max, global_sums, row_grad or dlogits is NULL");
    size_t bytes = (size_t)(N * V_local) * sizeof(float);
    if (dlogits != logits && ckp_overlaps(dlogits, bytes, logits, bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dlogits partially overlaps logits (only exact in-place is allowed)");
    const ckp_span read_per_row[] = {{target, (size_t)N * sizeof(int64_t)}, {global_max, (size_t)N * sizeof(float)},
                                     {global_sums, (size_t)(3 * N) * sizeof(double)}, {row_grad, (size_t)N * sizeof(float)}};
    if (ckp_overlaps_any((ckp_span){dlogits, bytes}, read_per_row, 4))
        return ckp_fail(CKP_ERR_ALIASING, "dlogits overlaps target, global_max, global_sums or row_grad");
    ckp_clear_error();
    const double smooth_each = label_smoothing / (double)V;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * V_local >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *x = logits + i * V_local;
        float *dx = dlogits + i * V_local;
        if (target[i] == ignore_index) {
            /* 0 - exp(logp_j) * 0, as torch's chain gives it: NaN on a row whose max or exp-sum is not
             * finite (a NaN, an inf, a row of -inf on every rank), +0 otherwise (cross_entropy.c's
             * ignored_row_grad; the sum is checked too: an all-reduce MAX may drop a shard's NaN) */
            const float fill = isfinite(global_max[i]) && isfinite(global_sums[3 * i]) ? 0.0f : NAN;
            for (int64_t j = 0; j < V_local; j++) dx[j] = fill;
            continue;
        }
        double lse = (double)global_max[i] + log(global_sums[3 * i]), g = (double)row_grad[i];
        double k = (1.0 - label_smoothing) + label_smoothing + 2.0 * z_loss * lse;
        int64_t t = target[i] - vocab_start;
        for (int64_t j = 0; j < V_local; j++) {
            double p = exp((double)x[j] - lse);
            dx[j] = (float)(g * (p * k - smooth_each - (j == t ? 1.0 - label_smoothing : 0.0)));
        }
    }
    return CKP_OK;
}
