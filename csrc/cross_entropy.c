/*
 * cross_entropy.c — F.cross_entropy forward and backward in one call.
 *
 * logits x is (N, V); per row i, with m = max_j x_ij and lse = m + log sum_j exp(x_ij - m):
 *   class target t:  loss_i = (1-ls) w_t (lse - x_it) + (ls/V) sum_j w_j (lse - x_ij) + z lse^2
 *   probabilities P: loss_i = sum_j w_j q_ij (lse - x_ij) + z lse^2,  q = P (1-ls) + ls/V
 * (ls = label_smoothing, z = z_loss, w = class weights or ones). A class row whose
 * target is ignore_index contributes 0. Reductions follow ATen (LossNLL.cpp):
 * mean divides class-target losses by the summed weight of the non-ignored
 * targets and probability-target losses by N.
 * Gradient (upstream gradient 1), with p = softmax(x_i) and r the reduction scale:
 *   class:  dx_ij = r [ p_j ((1-ls) w_t + (ls/V) W + 2 z lse) - (1-ls) w_t [j==t] - (ls/V) w_j ]
 *   probs:  dx_ij = r [ p_j (sum_k w_k q_k + 2 z lse) - w_j q_j ],    W = sum_j w_j
 *
 * Two variants:
 *   default  fused, threaded over fixed row blocks, per-row sums in double
 *            over 8 fixed lanes, a branch-free exp the compiler vectorizes,
 *            the gradient in float but for the target's entry (no
 *            probability clamp: log-sum-exp all the way).
 *   ptref    ATen's CPU order of operations in float: log_softmax
 *            (SoftMaxKernel.cpp, _vec_log_softmax_lastdim), nll_loss with its
 *            cascade sum (LossNLL.cpp), then log_softmax's backward
 *            grad - exp(logp) * sum(grad); sums over the class dimension as
 *            SumKernel.cpp orders them. Single-threaded, for A/B parity.
 */
#include "aten_sum.h"
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Checks every argument before anything is written. logits and dlogits hold
 * elem bytes a value (float32, or bf16 for the bf16 entry points), target_probs
 * p_elem; loss is float32. */
static ckp_status validate(const void *logits, const int64_t *target, const void *target_probs,
                           int64_t N, int64_t V, const ckp_cross_entropy_options *opt,
                           const float *loss, const void *dlogits, size_t elem, size_t p_elem) {
    if (logits == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "logits is NULL");
    if (opt == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "options is NULL");
    if (loss == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "loss is NULL");
    if ((target == NULL) == (target_probs == NULL))
        return ckp_fail(CKP_ERR_NULL_POINTER,
                        "exactly one of target and target_probs must be given");
    if (N <= 0 || V <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and V must be positive, got N=%lld V=%lld",
                        (long long)N, (long long)V);
    if (N > INT64_MAX / V || N * V > (int64_t)(SIZE_MAX / (elem > p_elem ? elem : p_elem)))
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*V overflows: N=%lld V=%lld", (long long)N,
                        (long long)V);
    if (opt->reduction != CKP_REDUCTION_NONE && opt->reduction != CKP_REDUCTION_MEAN &&
        opt->reduction != CKP_REDUCTION_SUM)
        return ckp_fail(CKP_ERR_BAD_OPTION, "reduction must be 0 (none), 1 (mean) or 2 (sum), got %d",
                        (int)opt->reduction);
    if (opt->variant != CKP_CE_DEFAULT && opt->variant != CKP_CE_PTREF)
        return ckp_fail(CKP_ERR_BAD_OPTION, "variant must be 0 (default) or 1 (ptref), got %d",
                        (int)opt->variant);
    if (!(opt->label_smoothing >= 0.0 && opt->label_smoothing <= 1.0))
        return ckp_fail(CKP_ERR_BAD_OPTION, "label_smoothing must be in [0, 1], got %g",
                        opt->label_smoothing);
    if (!(opt->z_loss >= 0.0 && isfinite(opt->z_loss)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "z_loss must be finite and >= 0, got %g", opt->z_loss);
    ckp_status threads_ok = ckp_check_torch_threads(opt->torch_threads);
    if (threads_ok != CKP_OK) return threads_ok;

    size_t matrix_bytes = (size_t)(N * V) * elem;
    size_t loss_bytes = (opt->reduction == CKP_REDUCTION_NONE ? (size_t)N : 1) * sizeof(float);
    if (dlogits != NULL && dlogits != logits && ckp_overlaps(dlogits, matrix_bytes, logits, matrix_bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dlogits partially overlaps logits (only exact in-place is allowed)");
    /* dlogits holds each row's exps before the gradient is formed, and the
     * loss is written row by row: an input read after that (targets, target
     * probabilities, weights, row_grad) must not live inside either. */
    const ckp_span read_late[] = {{target, (size_t)N * sizeof(int64_t)}, {target_probs, (size_t)(N * V) * p_elem},
                                  {opt->weight, (size_t)V * sizeof(float)}, {opt->row_grad, loss_bytes}};
    if (ckp_overlaps_any((ckp_span){dlogits, matrix_bytes}, read_late, 4))
        return ckp_fail(CKP_ERR_ALIASING, "dlogits overlaps target, target_probs, weight or row_grad");
    if (ckp_overlaps_any((ckp_span){loss, loss_bytes}, read_late, 4) ||
        ckp_overlaps_any((ckp_span){loss, loss_bytes}, (ckp_span[]){{logits, matrix_bytes}, {dlogits, matrix_bytes}}, 2))
        return ckp_fail(CKP_ERR_ALIASING, "loss overlaps an input or dlogits");

    if (target != NULL) {
        for (int64_t i = 0; i < N; i++) {
            int64_t t = target[i];
            if (t != opt->ignore_index && (t < 0 || t >= V))
                return ckp_fail(CKP_ERR_TARGET_OUT_OF_RANGE,
                                "Target %lld is out of bounds at row %lld (classes: %lld, ignore_index: %lld)",
                                (long long)t, (long long)i, (long long)V,
                                (long long)opt->ignore_index);
        }
    } else if (opt->ignore_index >= 0) {
        /* torch: "ignore_index is not supported for floating point target" */
        return ckp_fail(CKP_ERR_BAD_OPTION,
                        "ignore_index must be negative with probability targets, got %lld",
                        (long long)opt->ignore_index);
    }
    return CKP_OK;
}

/* ------------------------------------------------------------------------
 * default variant
 * ---------------------------------------------------------------------- */

/* What every row needs to know, fixed for the whole call. */
typedef struct {
    const float *weight;     /* (V) or NULL */
    double weight_total;     /* W = sum_j w_j */
    double smoothing;        /* ls */
    double classes;          /* V, what ls is spread over */
    double z_loss;
    double grad_scale;       /* r: 1 / mean denominator, or 1 (times row_grad[i] per row) */
} ce_ctx;

/* the first n (< 8) values of a float32 or bf16 row from j (vec.h's ckp_elem_load), the other lanes fill */
static inline __attribute__((always_inline)) ckp_v8f ce_load8_tail(const void *x, int64_t j, int64_t n, float fill,
                                                                   size_t elem) {
    float lanes[CKP_VLANES];
    for (int l = 0; l < CKP_VLANES; l++) lanes[l] = l < n ? ckp_elem_load(x, j + l, elem) : fill;
    return ckp_load8(lanes);
}

/* Lanes of the per-row reductions: a fixed width (csrc/vec.h), so the bits
 * never depend on how the compiler vectorizes. A row's last V % 8 elements go
 * through the same lanes, padded with a value that does not change the result
 * (-inf: neither a new max nor, after exp, a nonzero term).
 * The row's maximum runs two chains of lanes, the even vectors' and the odd ones' (one chain waits
 * on its compare and select every vector: (2048, 32000) bf16 default loss 23.8 -> 20.7 ms, float32
 * 21.2 -> 19.5). A maximum is exact in any order; only the sign of a zero maximum can depend on the
 * order, and nothing downstream sees it: zeros of both signs mean two zeros or more, so the sum of
 * exps is >= 2 and log_sum > 0, and m enters every result as x - m (a zero of either sign, exp 1)
 * next to log_sum or inside sums where a zero term's sign does not change a nonzero total. */
static inline __attribute__((always_inline)) float row_max(const void *x, int64_t V, size_t elem) {
    ckp_v8f a = ckp_splat8(ckp_elem_load(x, 0, elem)), b = a;
    ckp_v8i nan = {0};
    int64_t j = 0;
    for (; j + 2 * CKP_VLANES <= V; j += 2 * CKP_VLANES) {
        ckp_v8f u = ckp_elem_load8(x, j, elem), v = ckp_elem_load8(x, j + CKP_VLANES, elem);
        a = ckp_select8(u > a, u, a);
        b = ckp_select8(v > b, v, b);
        nan |= (u != u) | (v != v);
    }
    a = ckp_select8(b > a, b, a);
    if (j + CKP_VLANES <= V) {
        ckp_v8f v = ckp_elem_load8(x, j, elem);
        a = ckp_select8(v > a, v, a);
        nan |= v != v;
        j += CKP_VLANES;
    }
    if (j < V) {
        ckp_v8f v = ce_load8_tail(x, j, V - j, -INFINITY, elem);
        a = ckp_select8(v > a, v, a);
        nan |= v != v;
    }
    float m = a[0];
    int32_t any_nan = nan[0];
    for (int l = 1; l < CKP_VLANES; l++) {
        m = a[l] > m ? a[l] : m;
        any_nan |= nan[l];
    }
    return any_nan ? NAN : m; /* NaN propagates, as torch's max does */
}

/* The gradient of an ignored row (x and dx of elem bytes a value). torch still runs log_softmax's
 * backward on it, 0 - exp(logp_j) * 0: +0 on a row whose max is finite, NaN on every element of one
 * whose max is not (a NaN; an inf: inf - inf; -inf everywhere: -inf - -inf), so a NaN in padding
 * logits reaches the gradient as in torch instead of vanishing into zeros. */
static void ignored_row_grad(const void *x, int64_t V, size_t elem, void *dx) {
    if (isfinite(row_max(x, V, elem))) {
        memset(dx, 0, (size_t)V * elem);
        return;
    }
    for (int64_t j = 0; j < V; j++) ckp_elem_store(dx, j, NAN, elem);
}

/* exp(x) for x <= 0 (x = logit - row max) on 8 lanes: Cody-Waite reduction
 * x = n ln2 + r, Cephes' degree-6 polynomial for e^r in Horner form with
 * fused multiply-adds (about 1 ULP, like torch's Sleef expf, which also uses
 * FMA), 2^n put into the exponent bits. Below -87 (where 2^n would leave the
 * normal range) the result is 0; NaN stays NaN. */
static inline __attribute__((always_inline)) ckp_v8f exp_nonpositive(ckp_v8f x) {
    ckp_v8i tiny = x < -87.0f;
    ckp_v8f xc = ckp_select8(tiny, ckp_splat8(-87.0f), x);
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    ckp_v8f n = ckp_fma8(xc, ckp_splat8(1.44269504088896341f), ckp_splat8(round_magic)) - round_magic;
    ckp_v8f r = ckp_fma8(n, ckp_splat8(-0.693359375f), xc); /* ln2 split in a high part exact in float... */
    r = ckp_fma8(n, ckp_splat8(2.12194440e-4f), r);          /* ...and the rest */
    ckp_v8f p = ckp_fma8(r, ckp_splat8(1.9875691500e-4f), ckp_splat8(1.3981999507e-3f));
    p = ckp_fma8(p, r, ckp_splat8(8.3334519073e-3f));
    p = ckp_fma8(p, r, ckp_splat8(4.1665795894e-2f));
    p = ckp_fma8(p, r, ckp_splat8(1.6666665459e-1f));
    p = ckp_fma8(p, r, ckp_splat8(5.0000001201e-1f));
    if (CKP_MUTANT(CE_CHEAP_EXP)) p = ckp_fma8(r, ckp_splat8(1.6666665459e-1f), ckp_splat8(5.0000001201e-1f));
    ckp_v8f y = ckp_fma8(p, r * r, r + 1.0f);
    /* n is an integer in [-126, 0], or NaN in a NaN lane: converted as 0 there
     * (converting NaN to an integer is undefined in C), so y's NaN stays NaN */
    ckp_v8f n_or_0 = ckp_select8(n == n, n, ckp_splat8(0.0f));
    ckp_v8u scaled = (ckp_v8u)y + ((ckp_v8u)__builtin_convertvector(n_or_0, ckp_v8i) << 23);
    return ckp_select8(tiny, ckp_splat8(0.0f), (ckp_v8f)scaled);
}

/* Rows are processed in chunks this long: exp into the output (or a stack
 * buffer), then summed from there while it is in L1. */
enum { CE_CHUNK = 512 };

/* sum_j exp(x_j - m) in double over the 8 lanes; when e != NULL also stores
 * each exp(x_j - m) there (the row stays in cache for the gradient pass, which
 * then needs no second exp). e may be x itself (float32): each x_j is read
 * before e_j is written. */
static inline __attribute__((always_inline)) double row_sum_exp(const void *x, int64_t V, float m, float *e,
                                                                size_t elem) {
    double lane[CKP_VLANES] = {0};
    float chunk[CE_CHUNK], mutant_sum = 0.0f;
    for (int64_t j0 = 0; j0 < V; j0 += CE_CHUNK) {
        int64_t n = V - j0 < CE_CHUNK ? V - j0 : CE_CHUNK;
        float *out = e != NULL ? e + j0 : chunk;
        int64_t i = 0;
        for (; i + CKP_VLANES <= n; i += CKP_VLANES)
            ckp_store8(out + i, exp_nonpositive(ckp_elem_load8(x, j0 + i, elem) - m));
        if (i < n)
            ckp_store8_tail(out + i, n - i, exp_nonpositive(ce_load8_tail(x, j0 + i, n - i, -INFINITY, elem) - m));
        if (CKP_MUTANT(CE_FLOAT_ACCUMULATOR))
            for (int64_t k = 0; k < n; k++) mutant_sum += out[k];
        else
            ckp_accumulate8d(lane, out, n);
    }
    if (CKP_MUTANT(CE_FLOAT_ACCUMULATOR)) return mutant_sum;
    double sum = lane[0];
    for (int l = 1; l < CKP_VLANES; l++) sum += lane[l];
    return sum;
}

/* dx_j = bf16(e_j k - b w_j) (or - b without weights) over whole vectors of N lanes: the class rows'
 * gradient in bf16, its constants splatted once (written inline, GCC 12 rebuilt the splat from
 * scalars in every iteration). Returns the first element not written. */
#define CE_DEFINE_GRAD_BF16(N)                                                                              \
    static inline __attribute__((always_inline)) int64_t ce_grad_bf16_##N(const float *e, const float *w,  \
                                                                          int64_t V, float k, float b,      \
                                                                          void *dx) {                       \
        const ckp_v##N##f kv = ckp_splat##N(k), bv = ckp_splat##N(b);                                       \
        int64_t j = 0;                                                                                      \
        for (; j + N <= V; j += N) {                                                                        \
            ckp_v##N##f ej, wj = bv;                                                                        \
            memcpy(&ej, e + j, sizeof ej);                                                                  \
            if (w) {                                                                                        \
                memcpy(&wj, w + j, sizeof wj);                                                              \
                wj = bv * wj;                                                                               \
            }                                                                                               \
            ckp_bf16_store##N((uint16_t *)dx + j, ej * kv - wj);                                            \
        }                                                                                                   \
        return j;                                                                                           \
    }

CE_DEFINE_GRAD_BF16(8)
CE_DEFINE_GRAD_BF16(16)

/* One class-target row: returns its loss; writes dx when dx != NULL.
 * Its exps go to e (float32: e is dx itself; bf16: the thread's float row),
 * then the gradient from e into dx. x and dx may be the same row (in place):
 * every sum that reads x runs before the pass that stores exp(x_j - m) into
 * e, and x[t] is read first. */
static inline __attribute__((always_inline)) double ce_row_class_of(const void *x, int64_t t, int64_t V,
                                                                    const ce_ctx *c, double scale, void *dx, float *e,
                                                                    size_t elem) {
    const float *w = c->weight;
    float m = row_max(x, V, elem);
    float x_t = ckp_elem_load(x, t, elem);
    double weighted_shifted = 0.0; /* sum_j w_j (x_j - m), for label smoothing */
    if (c->smoothing > 0.0)
        for (int64_t j = 0; j < V; j++)
            weighted_shifted += (w ? (double)w[j] : 1.0) * ((double)ckp_elem_load(x, j, elem) - (double)m);
    double sum_exp = row_sum_exp(x, V, m, dx != NULL ? e : NULL, elem); /* e now holds exp(x_j - m) */
    double log_sum = log(sum_exp);
    double lse = (double)m + log_sum;
    double w_t = w ? (double)w[t] : 1.0;
    double nll = log_sum - ((double)x_t - (double)m);
    if (CKP_MUTANT(CE_PROB_CLAMP)) nll = -log(exp((double)x_t - (double)m) / sum_exp + 1e-10);
    double loss = (1.0 - c->smoothing) * w_t * nll + c->z_loss * lse * lse;
    if (c->smoothing > 0.0) loss += c->smoothing / c->classes * (c->weight_total * log_sum - weighted_shifted);
    if (dx != NULL) {
        double a = (1.0 - c->smoothing) * w_t * scale;
        double b = c->smoothing / c->classes * scale;
        double k = a + b * c->weight_total + (CKP_MUTANT(CE_ZLOSS_NO_GRAD) ? 0.0 : 2.0) * c->z_loss * lse * scale;
        /* dx_j = p_j k - b w_j, in float (vectorized); p_j = exp(x_j - m) / sum */
        const float k_over_sum = (float)(k / sum_exp), b_f = (float)b;
        float e_t = e[t];
        if (elem == sizeof(float)) { /* in place over e (dx), the loops the compiler vectorizes */
            float *d = dx;
            if (w != NULL)
                for (int64_t j = 0; j < V; j++) d[j] = e[j] * k_over_sum - b_f * w[j];
            else
                for (int64_t j = 0; j < V; j++) d[j] = e[j] * k_over_sum - b_f;
        } else { /* 16 lanes where torch runs AVX512 (elementwise: the same bits), 8 elsewhere */
            const int64_t j = ckp_lanes16() ? ce_grad_bf16_16(e, w, V, k_over_sum, b_f, dx)
                                            : ce_grad_bf16_8(e, w, V, k_over_sum, b_f, dx);
            for (int64_t i = j; i < V; i++) ckp_elem_store(dx, i, e[i] * k_over_sum - b_f * (w ? w[i] : 1.0f), elem);
        }
        /* the target's entry subtracts a from a value near a: evaluated in double */
        ckp_elem_store(dx, t, (float)((double)e_t / sum_exp * k - b * w_t - a), elem);
    }
    return loss;
}

/* One probability-target row (P is the row of target probabilities, p_elem bytes a value); dx and
 * e as for class rows. */
static inline __attribute__((always_inline)) double ce_row_probs_of(const void *x, const void *P, int64_t V,
                                                                    const ce_ctx *c, double scale, void *dx, float *e,
                                                                    size_t elem, size_t p_elem) {
    const float *w = c->weight;
    double keep = 1.0 - c->smoothing, spread = c->smoothing / (double)V;
    float m = row_max(x, V, elem);
    double wq_total = 0.0, wq_shifted = 0.0; /* sum_j w_j q_j and sum_j w_j q_j (x_j - m) */
    for (int64_t j = 0; j < V; j++) {
        double wq = (w ? (double)w[j] : 1.0) * ((double)ckp_elem_load(P, j, p_elem) * keep + spread);
        wq_total += wq;
        wq_shifted += wq * ((double)ckp_elem_load(x, j, elem) - (double)m);
    }
    double sum_exp = row_sum_exp(x, V, m, dx != NULL ? e : NULL, elem); /* e now holds exp(x_j - m) */
    double log_sum = log(sum_exp);
    double lse = (double)m + log_sum;
    double loss = wq_total * log_sum - wq_shifted + c->z_loss * lse * lse;
    if (dx != NULL) {
        double k = (wq_total + (CKP_MUTANT(CE_ZLOSS_NO_GRAD) ? 0.0 : 2.0) * c->z_loss * lse) * scale;
        double inv_sum = 1.0 / sum_exp;
        for (int64_t j = 0; j < V; j++) {
            double wq = (w ? (double)w[j] : 1.0) * ((double)ckp_elem_load(P, j, p_elem) * keep + spread);
            ckp_elem_store(dx, j, (float)((double)e[j] * inv_sum * k - wq * scale), elem);
        }
    }
    return loss;
}

CKP_CLONES static double ce_row_class(const float *x, int64_t t, int64_t V, const ce_ctx *c, double scale,
                                     float *dx) {
    return ce_row_class_of(x, t, V, c, scale, dx, dx, sizeof(float));
}

CKP_CLONES static double ce_row_class_bf16(const uint16_t *x, int64_t t, int64_t V, const ce_ctx *c, double scale,
                                          uint16_t *dx, float *e) {
    return ce_row_class_of(x, t, V, c, scale, dx, e, sizeof(uint16_t));
}

CKP_CLONES static double ce_row_probs(const float *x, const float *P, int64_t V, const ce_ctx *c, double scale,
                                     float *dx) {
    return ce_row_probs_of(x, P, V, c, scale, dx, dx, sizeof(float), sizeof(float));
}

CKP_CLONES static double ce_row_probs_bf16(const uint16_t *x, const uint16_t *P, int64_t V, const ce_ctx *c,
                                          double scale, uint16_t *dx, float *e) {
    return ce_row_probs_of(x, P, V, c, scale, dx, e, sizeof(uint16_t), sizeof(uint16_t));
}

CKP_CLONES static double ce_row_probs_bf16_f32p(const uint16_t *x, const float *P, int64_t V, const ce_ctx *c,
                                               double scale, uint16_t *dx, float *e) {
    return ce_row_probs_of(x, P, V, c, scale, dx, e, sizeof(uint16_t), sizeof(float));
}

/* The default variant on float32 rows (elem 4), or on bf16 rows (elem 2): the bf16 rows (and their
 * target probabilities, bf16 or float32: p_elem) read in place, widened exactly as they load, the
 * float32 arithmetic, each row's exps in the thread's float row and its gradient rounded once as it
 * is stored -- what the float32 kernel on the widened logits, then a cast of dlogits to bf16, gives,
 * without an (N, V) float copy of either. */
static ckp_status ce_default(const void *logits, const int64_t *target, const void *target_probs,
                             int64_t N, int64_t V, const ckp_cross_entropy_options *opt,
                             float *loss, void *dlogits, size_t elem, size_t p_elem) {
    const int bf16 = elem == sizeof(uint16_t), threads = ckp_threads();
    /* bf16: each thread's row of exps, allocated before any output is written */
    float *rows = bf16 && dlogits ? malloc((size_t)threads * (size_t)V * sizeof(float)) : NULL;
    if (bf16 && dlogits && rows == NULL)
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for the float rows of a bf16 cross_entropy (V=%lld)",
                        (long long)V);
    ce_ctx c = {opt->weight, (double)V, opt->label_smoothing, (double)(CKP_MUTANT(CE_SMOOTHING_WRONG_V) ? V - 1 : V),
                opt->z_loss, 1.0};
    if (opt->weight != NULL) {
        c.weight_total = 0.0;
        for (int64_t j = 0; j < V; j++) c.weight_total += (double)opt->weight[j];
    }
    /* Mean denominator: summed weight of the non-ignored targets, or N for probabilities. */
    double denominator = (double)N;
    if (target != NULL) {
        denominator = 0.0;
        for (int64_t i = 0; i < N; i++)
            if (target[i] != opt->ignore_index)
                denominator += opt->weight ? (double)opt->weight[target[i]] : 1.0;
            else if (CKP_MUTANT(CE_MEAN_COUNTS_IGNORED))
                denominator += 1.0;
    }
    if (opt->reduction == CKP_REDUCTION_MEAN) c.grad_scale = 1.0 / denominator;

    int64_t nblocks = ckp_num_blocks(N);
    double block_sum[CKP_MAX_BLOCKS];
    int parallel = N * V >= 16384 && nblocks > 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (parallel)
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t lo, hi;
        ckp_block_range(N, nblocks, b, &lo, &hi);
        float *e = rows ? rows + (size_t)omp_get_thread_num() * (size_t)V : NULL;
        double acc = 0.0;
        for (int64_t i = lo; i < hi; i++) {
            const size_t at = (size_t)(i * V) * elem; /* the row's byte offset */
            const void *x = (const char *)logits + at;
            const void *P = target_probs ? (const char *)target_probs + (size_t)(i * V) * p_elem : NULL;
            void *dx = dlogits ? (char *)dlogits + at : NULL;
            double upstream = opt->row_grad ? (double)opt->row_grad[opt->reduction == CKP_REDUCTION_NONE ? i : 0] : 1.0;
            double row_loss, scale = c.grad_scale * upstream;
            if (target != NULL && target[i] == opt->ignore_index) {
                row_loss = 0.0;
                if (dx && !CKP_MUTANT(CE_IGNORED_GRAD_NOT_ZEROED)) ignored_row_grad(x, V, elem, dx);
            } else if (bf16) {
                row_loss = target != NULL         ? ce_row_class_bf16(x, target[i], V, &c, scale, dx, e)
                           : p_elem == sizeof(float) ? ce_row_probs_bf16_f32p(x, P, V, &c, scale, dx, e)
                                                     : ce_row_probs_bf16(x, P, V, &c, scale, dx, e);
            } else {
                row_loss = target == NULL ? ce_row_probs(x, P, V, &c, scale, dx)
                                          : ce_row_class(x, target[i], V, &c, scale, dx);
            }
            if (opt->reduction == CKP_REDUCTION_NONE) loss[i] = (float)row_loss;
            acc += row_loss;
        }
        block_sum[b] = acc;
    }
    free(rows);
    if (opt->reduction != CKP_REDUCTION_NONE) {
        double total = 0.0;
        for (int64_t b = 0; b < nblocks; b++) total += block_sum[CKP_MUTANT(CE_BLOCKS_REVERSED) ? nblocks - 1 - b : b];
        /* all targets ignored: 0/0 = NaN, as torch */
        loss[0] = (float)(opt->reduction == CKP_REDUCTION_MEAN ? total / denominator : total);
    }
    return CKP_OK;
}

/* ------------------------------------------------------------------------
 * ptref variant: ATen's order of operations, in float.
 * ---------------------------------------------------------------------- */

/* How torch's log_softmax and its backward (SoftMaxKernel.cpp,
 * LogSoftmaxKernelImpl.h) compute at the running CPU capability:
 * Vectorized<float> has 16 lanes with AVX-512 and 8 otherwise (the DEFAULT
 * build's lane arrays too); vec_reduce_all folds a vector's lanes as a halving
 * tree where it is specialized (AVX2, AVX-512) and left to right in the
 * DEFAULT build; exp and log are SLEEF's expf_u10/logf_u10 on vectors, libm's
 * expf/logf lane by lane at DEFAULT; and the AVX2/AVX-512 builds contract the
 * backward's g - exp(logp) * sum into one FMA (DEFAULT has none). */
typedef struct {
    int lanes, tree_fold, sleef, fma;
} pt_layout;

static pt_layout pt_layout_for_capability(void) {
    switch (ckp_get_capability()) {
    case CKP_CAPABILITY_AVX512: return (pt_layout){16, 1, 1, 1};
    case CKP_CAPABILITY_AVX2: return (pt_layout){8, 1, 1, 1};
    default: return (pt_layout){8, 0, 0, 0};
    }
}

/* One row as torch sees it after log_softmax. */
typedef struct {
    const float *x;        /* logits row */
    const float *P;        /* target probabilities row, or NULL */
    const float *w;        /* class weights or NULL */
    int64_t t;             /* class target (class rows) */
    float m, log_sum;      /* row max and log(sum exp(x - m)) */
    float least;           /* the least x - m: pt_row_stats */
    float keep, spread;    /* (1-ls) and ls/V as float scalars, as torch's scalar ops */
    int smoothed;
    pt_layout at;          /* torch's arithmetic at the running capability */
    float smooth_grad;     /* gradient reaching each logp_j * w_j product */
    float nll_grad;        /* gradient reaching logp_t from nll_loss */
    int sum_threads;       /* how torch splits a sum over the row: a (1, V) input's row sum is a
                              reduction to one value, split on torch's threads (ckp_aten_full_sum) */
} pt_row;

/* A map from element index to value; ctx is a pt_row. */
typedef ckp_float_map pt_map;

static float pt_logp(const pt_row *r, int64_t j) { return r->x[j] - r->m - r->log_sum; }
static float pt_q(const pt_row *r, int64_t j) {
    return r->smoothed ? r->P[j] * r->keep + r->spread : r->P[j];
}
/* exp as ATen's vectorized softmax code computes it: SLEEF's expf_u10 (vec.h)
 * on every element (its vector loops load partial vectors for the tails), or
 * libm's expf at DEFAULT. Cloned so that SLEEF's FMAs are instructions, not
 * fmaf calls. */
CKP_CLONES static float pt_exp_sleef(float x) { return ckp_exp_sleef8(ckp_splat8(x))[0]; }

/* A row's loss term j for torch.sum: logp_j * q_j * w_j with probabilities (q smoothed), logp_j * w_j
 * for label smoothing's class rows; without weights, no w_j. */
static float pt_term(const pt_row *r, int64_t j) {
    float v = r->P ? pt_logp(r, j) * pt_q(r, j) : pt_logp(r, j);
    return r->w ? v * r->w[j] : v;
}
/* d loss / d logp_j, the input of log_softmax's backward. */
static float pt_grad_logp(void *ctx, int64_t j) {
    const pt_row *r = ctx;
    float g = r->w ? r->smooth_grad * r->w[j] : r->smooth_grad;
    if (r->P != NULL) return g * pt_q(r, j);
    /* + 0 off the target: torch's nll gradient there is a +0 that the smoothing's (or, without
     * smoothing, nothing) adds to, so a -0 is +0 -- seen where exp(logp) underflows to 0 and the
     * gradient is g_j itself */
    return j == r->t ? g + r->nll_grad : g + 0.0f;
}

/* vec_reduce_all's fold of an accumulator's lanes: a halving tree, or left to right at DEFAULT. */
static float pt_fold(float *lane, pt_layout at) {
    if (!at.tree_fold) {
        for (int l = 1; l < at.lanes; l++) lane[0] += lane[l];
        return lane[0];
    }
    for (int step = at.lanes / 2; step >= 1; step /= 2)
        for (int l = 0; l < step; l++) lane[l] += lane[l + step];
    return lane[0];
}

/* vec::map_reduce_all(map, +) and vec::reduce_all(+): one partial per lane
 * (the tail's partial vector adds to the first lanes only), the lanes folded
 * by vec_reduce_all; under one vector, a plain left-to-right sum. */
static float pt_vec_sum(pt_map map, void *ctx, int64_t n, pt_layout at) {
    if (n < at.lanes) {
        float acc = map(ctx, 0);
        for (int64_t j = 1; j < n; j++) acc += map(ctx, j);
        return acc;
    }
    float lane[16];
    for (int l = 0; l < at.lanes; l++) lane[l] = map(ctx, l);
    int64_t d = at.lanes;
    for (; d < n - n % at.lanes; d += at.lanes)
        for (int l = 0; l < at.lanes; l++) lane[l] += map(ctx, d + l);
    for (int64_t l = 0; d + l < n; l++) lane[l] += map(ctx, d + l);
    return pt_fold(lane, at);
}

/* The exp a row loop computes: libm's per lane (DEFAULT), SLEEF's on the vector, or SLEEF's without its
 * range selects where every argument is in [-87, 0] (ckp_exp_sleef_normal: the same bits).
 * pt_exp_kind picks it for a row from the least argument the row can give (NaN: SLEEF's). */
enum { PT_EXP_LIBM, PT_EXP_SLEEF, PT_EXP_SLEEF_NORMAL };

static int pt_exp_kind(pt_layout at, float least) {
    return !at.sleef ? PT_EXP_LIBM : least >= -86.0f ? PT_EXP_SLEEF_NORMAL : PT_EXP_SLEEF;
}

static float pt_exp_at(pt_layout at, float x) { return at.sleef ? pt_exp_sleef(x) : expf(x); }

/* The rows' vector loops at N lanes, float32 and bf16 (PT_DEFINE_ROW_LOOPS): 16 or 8 (ckp_lanes16),
 * which is torch's float vector at the capability (pt_layout's lanes), so a loop's accumulator is
 * torch's. An exp does not depend on the lanes beside it and a max is exact.
 *   pt_exp<N>: exp per lane as pt_exp_at does each one, of the given kind (a constant in each loop:
 *     GCC 12 left the test in the loop and reloaded SLEEF's constants every vector).
 *   pt_max<N>: the max over the whole vectors of N from x (float32 or bf16: elem bytes a value), NaN
 *     ignored; *nan set where one may be (a NaN, or an inf beside a -inf: the caller takes such a row
 *     again); *lo lowered to their least value; *j past them. Four chains: one waited on its compare
 *     every vector.
 *   pt_sum_blocks<N>: float32 rows: vec::map_reduce_all's accumulator over the whole vectors of x,
 *     the sums of exp(x[d + l] - m) into lanes[0..N); returns the first element past them. It starts
 *     at 0, and 0 + e is e (an exp is never -0).
 *   pt_g<N>: pt_grad_logp on N lanes (a class row's target lane, a probability row's q_j).
 *   pt_grad_sum<N>, pt_grad<N>: a float32 row's sum_k g_k, lanes as vec::reduce_all's, and its dx over
 *     whole vectors (pt_row_grad). */
#define PT_DEFINE_ROW_LOOPS(N)                                                                                        \
    static inline __attribute__((always_inline)) ckp_v##N##f pt_exp##N(int kind, ckp_v##N##f v) {                     \
        if (kind == PT_EXP_SLEEF_NORMAL) return ckp_exp_sleef_normal##N(v);                                           \
        if (kind == PT_EXP_SLEEF) return ckp_exp_sleef##N(v);                                                         \
        for (int l = 0; l < N; l++) v[l] = expf(v[l]);                                                                \
        return v;                                                                                                     \
    }                                                                                                                 \
    static inline __attribute__((always_inline)) float pt_max##N(const void *x, size_t elem,                          \
                                                                 int64_t V, int64_t *j, int *nan, float *lo) {        \
        ckp_v##N##f mv = ckp_splat##N(-INFINITY), mv1 = mv, mv2 = mv, mv3 = mv, lv = ckp_splat##N(INFINITY);          \
        ckp_v##N##i nans = (ckp_v##N##i){0};                                                                          \
        for (; *j + 4 * N <= V; *j += 4 * N) { /* four chains: one waited on its compare every vector */              \
            ckp_v##N##f v = ckp_elem_load##N(x, *j, elem), v1 = ckp_elem_load##N(x, *j + N, elem);                    \
            ckp_v##N##f v2 = ckp_elem_load##N(x, *j + 2 * N, elem), v3 = ckp_elem_load##N(x, *j + 3 * N, elem);       \
            ckp_v##N##f probe = (v + v1) + (v2 + v3); /* NaN if any is (or inf - inf: the slow path too) */           \
            nans |= probe != probe;                                                                                   \
            mv = ckp_select##N(v > mv, v, mv);                                                                        \
            mv1 = ckp_select##N(v1 > mv1, v1, mv1);                                                                   \
            mv2 = ckp_select##N(v2 > mv2, v2, mv2);                                                                   \
            mv3 = ckp_select##N(v3 > mv3, v3, mv3);                                                                   \
            ckp_v##N##f l01 = ckp_select##N(v < v1, v, v1), l23 = ckp_select##N(v2 < v3, v2, v3);                     \
            l01 = ckp_select##N(l01 < l23, l01, l23);                                                                 \
            lv = ckp_select##N(l01 < lv, l01, lv);                                                                    \
        }                                                                                                             \
        mv = ckp_select##N(mv1 > mv, mv1, mv);                                                                        \
        mv2 = ckp_select##N(mv3 > mv2, mv3, mv2);                                                                     \
        mv = ckp_select##N(mv2 > mv, mv2, mv);                                                                        \
        for (; *j + N <= V; *j += N) {                                                                                \
            ckp_v##N##f v = ckp_elem_load##N(x, *j, elem);                                                            \
            nans |= v != v;                                                                                           \
            mv = ckp_select##N(v > mv, v, mv);                                                                        \
            lv = ckp_select##N(v < lv, v, lv);                                                                        \
        }                                                                                                             \
        float mx = -INFINITY;                                                                                         \
        for (int l = 0; l < N; l++) {                                                                                 \
            *nan |= nans[l] != 0;                                                                                     \
            mx = mv[l] > mx ? mv[l] : mx;                                                                             \
            *lo = lv[l] < *lo ? lv[l] : *lo;                                                                          \
        }                                                                                                             \
        return mx;                                                                                                    \
    }                                                                                                                 \
    /* pt_term on the lanes j..j+N of a row */                                                                        \
    static inline __attribute__((always_inline)) ckp_v##N##f pt_terms##N(const pt_row *r, int64_t j) {                \
        ckp_v##N##f v = (ckp_elem_load##N(r->x, j, sizeof *r->x) - ckp_splat##N(r->m)) - ckp_splat##N(r->log_sum);    \
        if (r->P) {                                                                                                   \
            ckp_v##N##f q = ckp_elem_load##N(r->P, j, sizeof *r->P);                                                  \
            v = v * (r->smoothed ? q * ckp_splat##N(r->keep) + ckp_splat##N(r->spread) : q);                          \
        }                                                                                                             \
        return r->w ? v * ckp_elem_load##N(r->w, j, sizeof *r->w) : v;                                                \
    }                                                                                                                 \
    static inline __attribute__((always_inline)) int64_t pt_sum_blocks_of##N(const float *x, int64_t V, float m,      \
                                                                             int kind, float *lanes) {                \
        const ckp_v##N##f mv = ckp_splat##N(m);                                                                       \
        ckp_v##N##f a = ckp_splat##N(0.0f);                                                                           \
        int64_t d = 0;                                                                                                \
        for (; d + N <= V; d += N) a += pt_exp##N(kind, ckp_elem_load##N(x, d, sizeof *x) - mv);                      \
        memcpy(lanes, &a, sizeof a);                                                                                  \
        return d;                                                                                                     \
    }                                                                                                                 \
    static inline __attribute__((always_inline)) int64_t pt_sum_blocks##N(const float *x, int64_t V, float m,         \
                                                                          int kind, float *lanes) {                   \
        switch (kind) {                                                                                               \
        case PT_EXP_SLEEF_NORMAL: return pt_sum_blocks_of##N(x, V, m, PT_EXP_SLEEF_NORMAL, lanes);                    \
        case PT_EXP_SLEEF: return pt_sum_blocks_of##N(x, V, m, PT_EXP_SLEEF, lanes);                                  \
        default: return pt_sum_blocks_of##N(x, V, m, PT_EXP_LIBM, lanes);                                             \
        }                                                                                                             \
    }                                                                                                                 \
    /* pt_grad_logp on the lanes j..j+N of a row */                                                                   \
    static inline __attribute__((always_inline)) ckp_v##N##f pt_g##N(const pt_row *r, int64_t j) {                    \
        ckp_v##N##f g = ckp_splat##N(r->smooth_grad);                                                                 \
        if (r->w) g = g * ckp_elem_load##N(r->w, j, sizeof *r->w);                                                    \
        if (r->P) {                                                                                                   \
            ckp_v##N##f q = ckp_elem_load##N(r->P, j, sizeof *r->P);                                                  \
            return g * (r->smoothed ? q * ckp_splat##N(r->keep) + ckp_splat##N(r->spread) : q);                       \
        }                                                                                                             \
        g = g + ckp_splat##N(0.0f);                                                                                   \
        if (r->t >= j && r->t < j + N) g[r->t - j] = pt_grad_logp((void *)r, r->t);                                   \
        return g;                                                                                                     \
    }                                                                                                                 \
    static inline __attribute__((always_inline)) int64_t pt_grad_sum##N(const pt_row *r, int64_t V, float *lanes) {   \
        ckp_v##N##f a = pt_g##N(r, 0);                                                                                \
        int64_t d = N;                                                                                                \
        for (; d + N <= V; d += N) a += pt_g##N(r, d);                                                                \
        memcpy(lanes, &a, sizeof a);                                                                                  \
        return d;                                                                                                     \
    }                                                                                                                 \
    static inline __attribute__((always_inline)) int64_t pt_grad_of##N(const pt_row *r, int64_t V, float grad_sum,    \
                                                                       float z_coef, int kind, int fused,             \
                                                                       float *dx) {                                   \
        const ckp_v##N##f mv = ckp_splat##N(r->m), lv = ckp_splat##N(r->log_sum);                                     \
        const ckp_v##N##f sv = ckp_splat##N(grad_sum), zv = ckp_splat##N(z_coef);          \
        int64_t j = 0;                                                                                                \
        for (; j + N <= V; j += N) {                                                                                  \
            ckp_v##N##f p = pt_exp##N(kind, (ckp_elem_load##N(r->x, j, sizeof *r->x) - mv) - lv);                     \
            ckp_v##N##f g = pt_g##N(r, j);                                                                            \
            ckp_v##N##f v = fused ? ckp_fma##N(-p, sv, g) : g - p * sv;                                               \
            ckp_elem_store##N(dx, j, z_coef != 0.0f ? v + zv * p : v, sizeof *dx);                                    \
        }                                                                                                             \
        return j;                                                                                                     \
    }                                                                                                                 \
    static inline __attribute__((always_inline)) int64_t pt_grad##N(const pt_row *r, int64_t V, float grad_sum,       \
                                                                    float z_coef, int kind, int fused, float *dx) {   \
        switch (kind) {                                                                                               \
        case PT_EXP_SLEEF_NORMAL: return pt_grad_of##N(r, V, grad_sum, z_coef, PT_EXP_SLEEF_NORMAL, fused, dx);       \
        case PT_EXP_SLEEF: return pt_grad_of##N(r, V, grad_sum, z_coef, PT_EXP_SLEEF, fused, dx);                     \
        default: return pt_grad_of##N(r, V, grad_sum, z_coef, PT_EXP_LIBM, fused, dx);                                \
        }                                                                                                             \
    }

PT_DEFINE_ROW_LOOPS(8)
PT_DEFINE_ROW_LOOPS(16)

/* A float32 row's max and log(sum exp(x - max)) as torch's log_softmax computes them (pt_vec_sum's
 * lanes, by the loops above), and its least x - m (-inf where unknown: a NaN or an inf beside a -inf,
 * whose max is then taken again in order; NaN where the max is not finite), from which the exps' kind
 * is picked. */
CKP_CLONES static void pt_row_stats(const float *x, int64_t V, pt_layout at, float *m, float *log_sum,
                                    float *least) {
    int64_t j = 0;
    int any_nan = 0;
    float lo = INFINITY;
    float mx = ckp_lanes16() ? pt_max16(x, sizeof *x, V, &j, &any_nan, &lo) : pt_max8(x, sizeof *x, V, &j, &any_nan, &lo);
    for (; j < V; j++) {
        any_nan |= x[j] != x[j];
        mx = x[j] > mx ? x[j] : mx;
        lo = x[j] < lo ? x[j] : lo;
    }
    if (any_nan) {
        mx = row_max(x, V, sizeof *x);
        lo = -INFINITY;
    }
    *least = lo - mx;
    float sum;
    if (V < at.lanes) { /* one partial vector, folded left to right (vec_reduce_all with a size) */
        sum = pt_exp_at(at, x[0] - mx);
        for (int64_t k = 1; k < V; k++) sum += pt_exp_at(at, x[k] - mx);
    } else {
        float lane[16];
        const int kind = pt_exp_kind(at, *least);
        int64_t d = ckp_lanes16() ? pt_sum_blocks16(x, V, mx, kind, lane) : pt_sum_blocks8(x, V, mx, kind, lane);
        for (int64_t l = 0; d + l < V; l++) lane[l] += pt_exp_at(at, x[d + l] - mx);
        sum = pt_fold(lane, at);
    }
    *m = mx;
    *log_sum = at.sleef && !CKP_MUTANT(PTREF_LIBM_LOG) ? ckp_log_sleef(sum) : logf(sum);
}

/* Where element j of a flattened (N, V) batch lies: its row and the row's first element, found from
 * the last element's (the sums visit j in ascending order; begin: the chunk's first element, as
 * ckp_aten_split_sum hands chunks out). ce_cursor_move says whether the row changed. */
typedef struct {
    int64_t V, begin, row, row_start; /* row -1: none yet */
} ce_cursor;

static inline __attribute__((always_inline)) int ce_cursor_move(ce_cursor *c, int64_t j) {
    if (c->row >= 0 && j >= c->row_start && j < c->row_start + c->V) return 0;
    c->row = j / c->V;
    c->row_start = c->row * c->V;
    return 1;
}

/* The element maps of a sum over a flattened batch (CKP_DEFINE_ATEN_SUM's map1 and map8): element j's
 * row (AT, from the cursor at), its term (TERM), or 8 terms on a vector where they lie in one row
 * (TERMS8). */
#define CE_DEFINE_BATCH_MAPS(P, ROW, AT, TERM, TERMS8)                                                      \
    static inline __attribute__((always_inline)) float P##_batch1(const void *ctx, int64_t j) {            \
        P##_batch *b = (P##_batch *)ctx; /* the row cursor moves; nothing the sum reads */                  \
        j += b->at.begin;                                                                                   \
        const ROW *r = AT(b, j); /* before row_start is read: it moves the cursor */                       \
        return TERM(r, j - b->at.row_start);                                                                \
    }                                                                                                       \
    static inline __attribute__((always_inline)) ckp_v8f P##_batch8(const void *ctx, int64_t j) {          \
        P##_batch *b = (P##_batch *)ctx;                                                                    \
        const ROW *r = AT(b, j + b->at.begin);                                                              \
        int64_t c = j + b->at.begin - b->at.row_start;                                                      \
        if (c + 8 > b->at.V) { /* across rows */                                                            \
            float e[8];                                                                                     \
            for (int l = 0; l < 8; l++) e[l] = P##_batch1(ctx, j + l);                                      \
            return ckp_load8(e);                                                                            \
        }                                                                                                   \
        return TERMS8(r, c);                                                                                \
    }

/* torch.sum over a batch's terms (MAP8: WIDTH of them a vector step) and the chunk sum
 * ckp_aten_split_sum takes, P##_batch_range: a copy of the batch in ctx with its cursor at the chunk's
 * start, its total through FINISH (bf16 rounds each chunk's total; CE_AS_IS keeps it). */
#define CE_AS_IS(x) (x)
#define CE_DEFINE_BATCH_SUM(P, MAP8, WIDTH, FINISH)                                                         \
    CKP_DEFINE_ATEN_SUM(P##_batch_sum, MAP8, P##_batch1, WIDTH)                                             \
    CKP_CLONES static float P##_batch_range(const void *ctx, int64_t begin, int64_t n) {                   \
        P##_batch b = *(const P##_batch *)ctx;                                                              \
        b.at.begin = begin;                                                                                 \
        b.at.row = -1;                                                                                      \
        return FINISH(P##_batch_sum(&b, n));                                                                \
    }

/* Rows' loss terms (pt_term) as one flattened sequence for torch.sum: a whole batch's (probability
 * targets' sum over every element) or one row's (a batch of one row). */
typedef struct {
    const float *logits, *probs;
    const float *m, *log_sum; /* each row's, from the rows' pass */
    ce_cursor at;
    pt_row row;               /* the row at the cursor */
} pt_batch;

static inline __attribute__((always_inline)) const pt_row *pt_batch_at(pt_batch *b, int64_t j) {
    if (ce_cursor_move(&b->at, j)) {
        b->row.x = b->logits + b->at.row_start;
        b->row.P = b->probs ? b->probs + b->at.row_start : NULL;
        b->row.m = b->m[b->at.row];
        b->row.log_sum = b->log_sum[b->at.row];
    }
    return &b->row;
}

CE_DEFINE_BATCH_MAPS(pt, pt_row, pt_batch_at, pt_term, pt_terms8)
CE_DEFINE_BATCH_SUM(pt, pt_batch8, CKP_VLANES, CE_AS_IS)

/* torch.sum over one row's terms, split as torch splits a (1, V) input's (r->sum_threads) */
static float pt_row_terms_sum(const pt_row *r, int64_t V) {
    pt_batch one = {r->x, r->P, &r->m, &r->log_sum, {V, 0, -1, 0}, *r};
    return ckp_aten_split_sum(pt_batch_range, &one, V, r->sum_threads, 0);
}

/* The class weights of the non-ignored targets, in row order: element j is
 * the weight of the j-th kept row's target. A cursor that steps to row j from
 * where the last call left it, so any call order is right and ascending order
 * is O(1) a call. */
typedef struct {
    const int64_t *target;
    const float *w;
    int64_t ignore_index, row, kept;
} pt_kept_weights;

static float pt_kept_weight(void *ctx, int64_t j) {
    pt_kept_weights *k = ctx;
    while (k->kept < j) {
        do k->row++;
        while (k->target[k->row] == k->ignore_index);
        k->kept++;
    }
    while (k->kept > j) {
        do k->row--;
        while (k->target[k->row] == k->ignore_index);
        k->kept--;
    }
    return k->w[k->target[k->row]];
}

/* nll_loss's cascade sum (LossNLL.cpp): 8 levels flushed by the row index. */
typedef struct {
    float loss[8], weight[8];
    int64_t level_power;
} pt_nll_sum;

static void pt_nll_sum_add(pt_nll_sum *cs, int64_t row, float logp_times_w, float w) {
    cs->loss[0] -= logp_times_w;
    cs->weight[0] += w;
    int64_t mask0 = ((int64_t)1 << cs->level_power) - 1;
    for (int j = 0; j + 1 < 8; j++) {
        if ((row & (mask0 << (j * cs->level_power))) != 0) break;
        cs->weight[j + 1] += cs->weight[j];
        cs->loss[j + 1] += cs->loss[j];
        cs->weight[j] = 0;
        cs->loss[j] = 0;
    }
}

static float pt_levels_total(const float *levels) {
    float s = 0;
    for (int j = 0; j < 8; j++) s += levels[j];
    return s;
}

/* dx_j of log_softmax's backward from x_j (read before dx_j is written: dx may be the logits). */
static float pt_grad_one(const pt_row *r, float xj, int64_t j, float grad_sum, float z_coef, int fused) {
    float p = pt_exp_at(r->at, (xj - r->m) - r->log_sum);
    float g = pt_grad_logp((void *)r, j);
    float v = fused ? fmaf(-p, grad_sum, g) : g - p * grad_sum;
    return z_coef != 0.0f ? v + z_coef * p : v;
}

/* log_softmax backward: dx_j = g_j - exp(logp_j) * sum_k g_k (+ the z-loss term), g = pt_grad_logp, on
 * the vector loops; a row shorter than one vector element by element. */
CKP_CLONES static void pt_row_grad(const pt_row *r, int64_t V, float z_coef, float *dx) {
    const int fused = r->at.fma && !CKP_MUTANT(PTREF_UNFUSED_BACKWARD), lanes16 = ckp_lanes16();
    if (V < r->at.lanes) {
        const float grad_sum = pt_vec_sum(pt_grad_logp, (void *)r, V, r->at);
        for (int64_t j = 0; j < V; j++) dx[j] = pt_grad_one(r, r->x[j], j, grad_sum, z_coef, fused);
        return;
    }
    float lane[16];
    int64_t d = lanes16 ? pt_grad_sum16(r, V, lane) : pt_grad_sum8(r, V, lane);
    for (int64_t l = 0; d + l < V; l++) lane[l] += pt_grad_logp((void *)r, d + l);
    const float grad_sum = pt_fold(lane, r->at);
    const int kind = pt_exp_kind(r->at, r->least - r->log_sum); /* the least logp, as the loop computes it */
    int64_t j = lanes16 ? pt_grad16(r, V, grad_sum, z_coef, kind, fused, dx)
                        : pt_grad8(r, V, grad_sum, z_coef, kind, fused, dx);
    for (; j < V; j++) dx[j] = pt_grad_one(r, r->x[j], j, grad_sum, z_coef, fused);
}

/* What ce_ptref's backward needs for every row, known before any row is read: the reduction's
 * divisors and the upstream gradient (1 without row_grad). */
typedef struct {
    const int64_t *target;
    const float *row_grad;
    int none, mean, smoothed;
    float z_loss, total_weight, smooth_weight;
} pt_backward;

/* Row i's gradient (upstream gradient 1, or row_grad's), chained the way autograd chains it. */
static void pt_row_backward(const pt_backward *b, pt_row *r, int64_t i, int64_t V, float *dx) {
    const float upstream = b->row_grad ? b->row_grad[b->none ? i : 0] : 1.0f;
    const float scale = b->mean ? 1.0f / b->total_weight : 1.0f;
    const float z_coef = 2.0f * b->z_loss * (r->m + r->log_sum) * scale * upstream;
    if (b->target == NULL) {
        /* -(logp * q * w).sum() / N: each product receives -1/N */
        r->smooth_grad = -(b->mean ? upstream / b->total_weight : upstream);
    } else {
        r->t = b->target[i];
        float nll_upstream = b->smoothed ? upstream * r->keep : upstream;
        float grad = -(b->mean ? nll_upstream / b->total_weight : nll_upstream);
        r->nll_grad = r->w ? r->w[r->t] * grad : grad;
        float smooth_upstream = b->smoothed ? upstream * r->spread : 0.0f;
        r->smooth_grad = -(b->mean ? smooth_upstream / b->smooth_weight : smooth_upstream);
    }
    pt_row_grad(r, V, z_coef, dx);
}

/* ptref in float32. Three steps:
 * - from the targets alone: the kept rows' count, nll_loss's total_weight (the weights' cascade) and
 *   smoothing's mean divisor, which every row's gradient needs;
 * - the rows, on the library's threads (a row's bits do not depend on which thread runs it): max and
 *   log_sum, the forward's per-row terms (logp_t; a row's smoothing or probability sum) and, while the
 *   row is in cache, its gradient -- after the forward instead where the forward reads the logits
 *   again (a probability target's batch sum) and dlogits overwrites them;
 * - the forward in row order: nll_loss's cascade, z-loss's beside it, the reductions. */
static ckp_status ce_ptref(const float *logits, const int64_t *target, const float *target_probs,
                           int64_t N, int64_t V, const ckp_cross_entropy_options *opt,
                           float *loss, float *dlogits) {
    const int none = opt->reduction == CKP_REDUCTION_NONE;
    const int mean = opt->reduction == CKP_REDUCTION_MEAN;
    const int smoothed = opt->label_smoothing > 0.0;
    const float z_loss = (float)opt->z_loss;
    pt_row proto = {0};
    proto.w = opt->weight;
    proto.keep = (float)(1.0 - opt->label_smoothing);
    proto.spread = (float)(opt->label_smoothing / (double)V);
    proto.smoothed = smoothed;
    proto.at = pt_layout_for_capability();
    proto.sum_threads = N == 1 ? opt->torch_threads : 1; /* more rows: torch splits by rows, a row whole */
    /* each row's m, log_sum and forward term, allocated before any output is written */
    float *terms = malloc((size_t)N * 4 * sizeof(float));
    if (terms == NULL)
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for the %lld rows' terms of a ptref cross_entropy",
                        (long long)N);
    float *m = terms, *log_sum = terms + N, *logp_t = terms + 2 * N, *row_term = terms + 3 * N;

    int64_t counted = 0;
    pt_nll_sum weights = {{0}, {0}, 0};
    weights.level_power = ckp_ceil_log2(N) / 8 > 4 ? ckp_ceil_log2(N) / 8 : 4;
    for (int64_t i = 0; target != NULL && i < N; i++) {
        if (target[i] == opt->ignore_index) continue;
        counted++;
        if (opt->weight) pt_nll_sum_add(&weights, i, 0.0f, opt->weight[target[i]]);
    }
    const float total_weight = target_probs != NULL ? (float)N
                               : opt->weight ? pt_levels_total(weights.weight) : (float)counted;
    /* Label smoothing's mean divides by its own sum of the kept targets'
     * weights, weight.gather(0, target[~ignored]).sum() (LossNLL.cpp,
     * cross_entropy_loss_label_smoothing), not by nll_loss's cascade total. */
    float smooth_weight = total_weight;
    if (smoothed && mean && opt->weight && target != NULL && counted > 0 &&
        !CKP_MUTANT(PTREF_SMOOTHING_CASCADE_DENOMINATOR)) {
        pt_kept_weights kept = {target, opt->weight, opt->ignore_index, -1, -1};
        smooth_weight = ckp_aten_full_sum(pt_kept_weight, &kept, counted, opt->torch_threads);
    }
    const pt_backward back = {target, opt->row_grad, none, mean, smoothed, z_loss, total_weight, smooth_weight};
    const int late = dlogits == logits && target_probs != NULL && !none;

#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * V >= 32768)
    for (int64_t i = 0; i < N; i++) {
        float *dx = dlogits != NULL && !late ? dlogits + i * V : NULL;
        if (target != NULL && target[i] == opt->ignore_index) {
            row_term[i] = 0.0f;
            if (dx) ignored_row_grad(logits + i * V, V, sizeof(float), dx);
            continue;
        }
        pt_row r = proto;
        r.x = logits + i * V;
        r.P = target_probs ? target_probs + i * V : NULL;
        pt_row_stats(r.x, V, r.at, &r.m, &r.log_sum, &r.least);
        m[i] = r.m;
        log_sum[i] = r.log_sum;
        if (target_probs != NULL) /* the row's loss with none (the batch's sum is over every element) */
            row_term[i] = none ? -pt_row_terms_sum(&r, V) : 0.0f;
        else /* smooth_loss_i = -(logp_i * w).sum(), beside logp_t */
            row_term[i] = smoothed ? -pt_row_terms_sum(&r, V) : 0.0f;
        if (target != NULL) logp_t[i] = pt_logp(&r, target[i]);
        if (dx) pt_row_backward(&back, &r, i, V, dx);
    }

    pt_nll_sum nll_sum = {{0}, {0}, 0}, z_sum = {{0}, {0}, 0};
    nll_sum.level_power = z_sum.level_power = weights.level_power;
    for (int64_t i = 0; i < N; i++) {
        if (target != NULL && target[i] == opt->ignore_index) {
            if (none) loss[i] = 0.0f;
            continue;
        }
        float lse = m[i] + log_sum[i];
        float z = z_loss * lse * lse;
        pt_nll_sum_add(&z_sum, i, -z, 0.0f);
        if (target_probs != NULL) {
            if (none) loss[i] = z_loss != 0.0f ? row_term[i] + z : row_term[i];
            continue;
        }
        float w_t = opt->weight ? opt->weight[target[i]] : 1.0f;
        pt_nll_sum_add(&nll_sum, i, logp_t[i] * w_t, w_t);
        if (none) {
            float nll = -logp_t[i] * w_t;
            float value = smoothed ? proto.keep * nll + row_term[i] * proto.spread : nll;
            loss[i] = z_loss != 0.0f ? value + z : value; /* + 0 would turn torch's -0 (logp_t 0) into +0 */
        }
    }
    if (!none) {
        float z = pt_levels_total(z_sum.loss);
        float out;
        if (target_probs != NULL) {
            /* -(logp * q * w).sum(): one reduction over every element, split as torch splits it */
            pt_batch batch = {logits, target_probs, m, log_sum, {V, 0, -1, 0}, proto};
            out = -ckp_aten_split_sum(pt_batch_range, &batch, N * V, opt->torch_threads, 0);
        } else {
            out = pt_levels_total(nll_sum.loss);
            if (mean) out /= total_weight;
            if (smoothed) {
                float smooth = ckp_aten_full_sum_array(row_term, N, opt->torch_threads);
                if (mean) smooth /= smooth_weight;
                out = proto.keep * out + smooth * proto.spread;
            }
        }
        if (mean) {
            if (target_probs != NULL) out /= total_weight;
            z /= total_weight;
        }
        loss[0] = z_loss != 0.0f ? out + z : out; /* + 0 would turn a -0 into +0 */
    }
    if (late) {
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * V >= 32768)
        for (int64_t i = 0; i < N; i++) {
            pt_row r = proto;
            r.x = logits + i * V;
            r.P = target_probs + i * V;
            r.m = m[i];
            r.log_sum = log_sum[i];
            r.least = -INFINITY; /* not kept: SLEEF's exp with its range selects, the same bits */
            pt_row_backward(&back, &r, i, V, dlogits + i * V);
        }
    }
    free(terms);
    return CKP_OK;
}

ckp_status ckp_cross_entropy_options_init(ckp_cross_entropy_options *opt) {
    if (opt == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "options is NULL");
    opt->weight = NULL;
    opt->ignore_index = -100;
    opt->reduction = CKP_REDUCTION_MEAN;
    opt->label_smoothing = 0.0;
    opt->z_loss = 0.0;
    opt->variant = CKP_CE_DEFAULT;
    opt->row_grad = NULL;
    opt->torch_threads = 1;
    ckp_clear_error();
    return CKP_OK;
}

ckp_status ckp_cross_entropy(const float *logits, const int64_t *target, const float *target_probs,
                             int64_t N, int64_t V, const ckp_cross_entropy_options *opt,
                             float *loss, float *dlogits) {
    ckp_status s = validate(logits, target, target_probs, N, V, opt, loss, dlogits, sizeof(float), sizeof(float));
    if (s != CKP_OK) return s;
    ckp_clear_error();
    if (opt->variant == CKP_CE_PTREF)
        return ce_ptref(logits, target, target_probs, N, V, opt, loss, dlogits);
    return ce_default(logits, target, target_probs, N, V, opt, loss, dlogits, sizeof(float), sizeof(float));
}

ckp_status ckp_cross_entropy_default_bf16(const uint16_t *logits, const int64_t *target, const uint16_t *target_probs,
                                          int64_t N, int64_t V, const ckp_cross_entropy_options *opt, float *loss,
                                          uint16_t *dlogits) {
    ckp_status s = validate(logits, target, target_probs, N, V, opt, loss, dlogits, sizeof(uint16_t),
                            sizeof(uint16_t));
    if (s != CKP_OK) return s;
    if (opt->variant != CKP_CE_DEFAULT)
        return ckp_fail(CKP_ERR_BAD_OPTION, "ckp_cross_entropy_default_bf16 is the default variant (ptref in bf16: "
                        "ckp_cross_entropy_bf16), got variant %d", (int)opt->variant);
    ckp_clear_error();
    return ce_default(logits, target, target_probs, N, V, opt, loss, dlogits, sizeof(uint16_t), sizeof(uint16_t));
}

/* ------------------------------------------------------------------------
 * ptref in bfloat16 (ckp_cross_entropy_bf16): torch's F.cross_entropy on
 * bf16 logits with class targets, class weights and label smoothing, with
 * torch's bf16 rounding points:
 * - log_softmax (LogSoftmaxKernelImpl.h) keeps each row's max and sum of
 *   exps in bf16 temporaries: sum = bf16(sum_j exp(x_j - m)), log_sum =
 *   bf16(log(sum)), logp_j = bf16((x_j - m) - log_sum), in float between;
 * - the sum is vec::map_reduce_all on bf16 data (functional_bfloat16.h): one
 *   bf16 vector (2 x the float lanes) at a time, split into two float
 *   vectors with an accumulator each, the tail by partial loads whose padding
 *   lanes are dropped, the two added, then folded as vec_reduce_all folds
 *   (a tree at AVX2/AVX-512); a row shorter than one bf16 vector is summed
 *   lane 0 first, left to right;
 * - nll_loss (LossNLL.cpp) runs its cascade on bf16 partial sums, each -=
 *   bf16(logp_t * w_t) (a BFloat16 product); its total_weight is the
 *   kept-row count as a bf16 (rounded past 256 rows), or with weights the
 *   weights' own bf16 cascade; mean = bf16(total / total_weight);
 * - label smoothing is cross_entropy_loss_label_smoothing's tensor ops, each
 *   rounding to bf16: smooth_i = -sum_j bf16(logp_j * w_j) (torch.sum on bf16:
 *   aten_sum.c), 0 on ignored rows; mean divides sum_i smooth_i by the kept
 *   count (a float) or by torch.sum of the kept rows' weights; the loss is
 *   bf16(bf16(nll * (1 - ls)) + bf16(smooth * (ls / V))), the two scalars
 *   floats (a Python scalar multiplying a bf16 tensor stays a float);
 * - backward is autograd's chain over those ops, each rounding: nll's grad
 *   bf16(w_t * -bf16(u' / total_weight)) (mean) or bf16(w_t * -u'), u' =
 *   bf16(u * (1 - ls)) with smoothing, else u, the upstream gradient
 *   (row_grad; 1 without it); smoothing's bf16(-s_i * w_j) on every element,
 *   s_i = bf16(bf16(u * ls / V) / divisor) (mean); the two added in bf16
 *   (autograd's accumulation); then log_softmax's backward, bf16(g_j -
 *   exp(logp_j) * sum_k g_k) in float, sum_k by vec::reduce_all's structure
 *   on bf16 data (one FMA where the build contracts it, as in float32).
 * Probability targets (ckp_cross_entropy_probs_bf16) are
 * cross_entropy_loss_prob_target's tensor ops: the target smoothed as
 * bf16(bf16(q * (1 - ls)) + bf16(ls / V)) (a Scalar added takes the tensor's
 * dtype); bf16(bf16(logp_j * q_j) * w_j); torch.sum over every element (mean,
 * sum; split on torch's threads) or over each row (none), negated; mean
 * divides by N as a float. Backward: -bf16(u / N) (mean) or -u, times w_j,
 * times q_j, each rounded, then log_softmax's backward as above.
 * ---------------------------------------------------------------------- */

/* The bf16 rows' own vector loops, defined at N lanes by BF_DEFINE_ROW_LOOPS beside the shared ones
 * (PT_DEFINE_ROW_LOOPS: pt_exp<N>, pt_max<N>), the width torch's float vector's. The exp-sum keeps
 * torch's accumulators whatever the width (bf_sum_exp).
 *   bf_sum_blocks<N>: lanes[0..2N) = vec::map_reduce_all's two float accumulators over the whole
 *     bf16 vectors of 2N from x, the sums of exp(x[d + i] - m); returns the first element past them.
 *     They start at 0, and 0 + e is e (never -0).
 *   bf_grad<N>: bf_grad_row's dx over whole vectors of N; returns the first element not written.
 * The exp's kind is a constant in each loop (the _of forms); GCC 12 kept the two accumulators of a
 * variable-length array in memory (a store and a load on every add). logp only feeds the exp, so it
 * skips the NaN select (ckp_bf16_round_any_nan: its NaNs come from a bf16 load or x86's arithmetic);
 * dx is stored through ckp_bf16_store, which writes torch's NaN. */
/* One bf16 row's terms as a float row (bf_terms_row), for torch.sum over them or for log_softmax's
 * backward, each product rounded to bf16 as torch's bf16 ops round it:
 *   logp: bf16(bf16(logp_j * q'_j) * w_j), without q or w as far as given (label smoothing's
 *     bf16(logp_j * w_j); a probability row's loss terms);
 *   else: bf16(bf16(scale * w_j) * q'_j), likewise (smoothing's gradient bf16(-s * w_j); a probability
 *     row's gradient);
 * q'_j = bf16(bf16(q_j * keep) + spread) when smoothed (a smoothed probability target), else q_j. */
typedef struct {
    const uint16_t *x, *q; /* the logits row (logp); the probability row or NULL */
    const float *w;        /* class weights or NULL */
    float m, log_sum, keep, spread, scale;
    int logp, smoothed;
} bf_terms;

#define BF_DEFINE_ROW_LOOPS(N)                                                                              \
    static inline __attribute__((always_inline)) int64_t bf_sum_blocks_of##N(const uint16_t *x, int64_t V,  \
                                                                             float m, int kind,             \
                                                                             const uint16_t *ahead,         \
                                                                             float *lanes) {                \
        const ckp_v##N##f mv = ckp_splat##N(m);                                                             \
        ckp_v##N##f a0 = ckp_splat##N(0.0f), a1 = a0;                                                       \
        int64_t d = 0;                                                                                      \
        for (; d < V - V % (2 * N); d += 2 * N) {                                                           \
            __builtin_prefetch(ahead + d);                                                                  \
            a0 += pt_exp##N(kind, ckp_bf16_load##N(x + d) - mv);                                            \
            a1 += pt_exp##N(kind, ckp_bf16_load##N(x + d + N) - mv);                                        \
        }                                                                                                   \
        memcpy(lanes, &a0, sizeof a0);                                                                      \
        memcpy(lanes + N, &a1, sizeof a1);                                                                  \
        return d;                                                                                           \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t bf_sum_blocks##N(const uint16_t *x, int64_t V,     \
                                                                          float m, int kind,                \
                                                                          const uint16_t *ahead,            \
                                                                          float *lanes) {                   \
        switch (kind) {                                                                                     \
        case PT_EXP_SLEEF_NORMAL: return bf_sum_blocks_of##N(x, V, m, PT_EXP_SLEEF_NORMAL, ahead, lanes);   \
        case PT_EXP_SLEEF: return bf_sum_blocks_of##N(x, V, m, PT_EXP_SLEEF, ahead, lanes);                 \
        default: return bf_sum_blocks_of##N(x, V, m, PT_EXP_LIBM, ahead, lanes);                            \
        }                                                                                                   \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t bf_grad_of##N(const uint16_t *x, int64_t V, float m, \
                                                                       float log_sum, float grad_sum,       \
                                                                       const float *gs, int kind, int fused, \
                                                                       uint16_t *dx) {                      \
        const ckp_v##N##f mv = ckp_splat##N(m), lv = ckp_splat##N(log_sum), sv = ckp_splat##N(grad_sum);    \
        const ckp_v##N##f zero = ckp_splat##N(0.0f);                                                        \
        int64_t j = 0;                                                                                      \
        for (; j + N <= V; j += N) {                                                                        \
            ckp_v##N##f logp = ckp_bf16_round_any_nan##N((ckp_bf16_load##N(x + j) - mv) - lv);              \
            ckp_v##N##f p = pt_exp##N(kind, logp);                                                          \
            ckp_v##N##f g = gs ? ckp_elem_load##N(gs, j, sizeof *gs) : zero;                                \
            ckp_bf16_store##N(dx + j, fused ? ckp_fma##N(-p, sv, g) : g - p * sv);                          \
        }                                                                                                   \
        return j;                                                                                           \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t bf_grad##N(const uint16_t *x, int64_t V, float m,  \
                                                                    float log_sum, float grad_sum,          \
                                                                    const float *gs, int kind, uint16_t *dx) { \
        /* fused where torch fuses it: at.fma, which pt_layout sets exactly where at.sleef is */            \
        switch (kind) {                                                                                     \
        case PT_EXP_SLEEF_NORMAL: return bf_grad_of##N(x, V, m, log_sum, grad_sum, gs, PT_EXP_SLEEF_NORMAL, 1, dx); \
        case PT_EXP_SLEEF: return bf_grad_of##N(x, V, m, log_sum, grad_sum, gs, PT_EXP_SLEEF, 1, dx);       \
        default: return bf_grad_of##N(x, V, m, log_sum, grad_sum, gs, PT_EXP_LIBM, 0, dx);                  \
        }                                                                                                   \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t bf_reduce_blocks##N(const float *g, int64_t V,     \
                                                                            float *lanes) {                 \
        ckp_v##N##f a0 = ckp_elem_load##N(g, 0, sizeof *g), a1 = ckp_elem_load##N(g, N, sizeof *g);         \
        int64_t d = 2 * N;                                                                                  \
        for (; d + 2 * N <= V; d += 2 * N) {                                                                \
            a0 += ckp_elem_load##N(g, d, sizeof *g);                                                        \
            a1 += ckp_elem_load##N(g, d + N, sizeof *g);                                                    \
        }                                                                                                   \
        memcpy(lanes, &a0, sizeof a0);                                                                      \
        memcpy(lanes + N, &a1, sizeof a1);                                                                  \
        return d;                                                                                           \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t bf_terms_of##N(const bf_terms *r, int64_t V, float *e) { \
        const ckp_v##N##f mv = ckp_splat##N(r->m), lv = ckp_splat##N(r->log_sum);                           \
        const ckp_v##N##f keep = ckp_splat##N(r->keep), spread = ckp_splat##N(r->spread);                   \
        const ckp_v##N##f scale = ckp_splat##N(r->scale);                                                   \
        int64_t j = 0;                                                                                      \
        for (; j + N <= V; j += N) {                                                                        \
            ckp_v##N##f v;                                                                                  \
            if (r->logp) { /* bf16(logp_j * q_j) or logp_j */                                               \
                v = ckp_bf16_round##N((ckp_bf16_load##N(r->x + j) - mv) - lv);                              \
            } else { /* a gradient's bf16(scale * w_j) * q_j: scale alone, or rounded times w_j */          \
                v = scale;                                                                                  \
                if (r->w) v = ckp_bf16_round##N(v * ckp_elem_load##N(r->w, j, sizeof *r->w));               \
            }                                                                                               \
            if (r->q) {                                                                                     \
                ckp_v##N##f q = ckp_bf16_load##N(r->q + j);                                                 \
                if (r->smoothed) q = ckp_bf16_round##N(ckp_bf16_round##N(q * keep) + spread);               \
                v = ckp_bf16_round##N(v * q);                                                               \
            }                                                                                               \
            if (r->logp && r->w) v = ckp_bf16_round##N(v * ckp_elem_load##N(r->w, j, sizeof *r->w));        \
            ckp_elem_store##N(e, j, v, sizeof *e);                                                          \
        }                                                                                                   \
        return j;                                                                                           \
    }

BF_DEFINE_ROW_LOOPS(8)
BF_DEFINE_ROW_LOOPS(16)

/* The end of map_reduce_all / reduce_all on bf16 data: the two float accumulators added lane by
 * lane, then the lanes folded as vec_reduce_all folds them (a halving tree, or left to right at
 * DEFAULT). */
static float bf_fold(float *a0, const float *a1, pt_layout at) {
    for (int l = 0; l < at.lanes; l++) a0[l] += a1[l];
    return pt_fold(a0, at);
}

/* vec::map_reduce_all(exp(x - m), +) over one bf16 row: each lane's partial sum
 * in its order, 8 or 16 lanes of exps at a time (the lane sums do not depend on that). */
CKP_CLONES static float bf_sum_exp(const uint16_t *x, int64_t V, float m, pt_layout at, int kind,
                                   const uint16_t *ahead) {
    const int L = at.lanes;
    const int64_t B = 2 * (int64_t)L;
    float a0[16] = {0}, a1[16] = {0};
#define BF_MAP(j) pt_exp_at(at, ckp_bf16_to_f(x[j]) - m)
    if (V < B) { /* one partial bf16 vector, folded left to right (vec_reduce_all with a size) */
        int64_t n = V > L ? L : V;
        for (int64_t l = 0; l < n; l++) a0[l] = BF_MAP(l);
        for (int64_t l = 0; l + L < V; l++) a0[l] += BF_MAP(L + l);
        float acc = a0[0];
        for (int64_t l = 1; l < n; l++) acc += a0[l];
        return acc;
    }
    /* the two accumulators side by side: a0's L lanes, then a1's (the loops' width is L) */
    float lanes[32];
    int64_t d = ckp_lanes16() ? bf_sum_blocks16(x, V, m, kind, ahead, lanes) : bf_sum_blocks8(x, V, m, kind, ahead, lanes);
    memcpy(a0, lanes, (size_t)L * sizeof *a0);
    memcpy(a1, lanes + L, (size_t)L * sizeof *a1);
    for (int64_t l = 0; d + l < V && l < L; l++) a0[l] += BF_MAP(d + l);
    for (int64_t l = 0; d + L + l < V; l++) a1[l] += BF_MAP(d + L + l);
#undef BF_MAP
    return bf_fold(a0, a1, at);
}

/* A bf16 row's max, left to right (NaN if any element is: vec::maximum propagates it). */
static float bf_row_max_scalar(const uint16_t *x, int64_t V) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < V; j++) {
        float v = ckp_bf16_to_f(x[j]);
        mx = (v > mx || v != v || mx != mx) ? (mx != mx ? mx : v) : mx;
    }
    return mx;
}

/* The same, 8 or 16 lanes at a time: a max is exact in any order, except which zero a row of zeros
 * keeps (the order above keeps the first), so a zero maximum is taken again left to right. *lo: the
 * row's least value, -inf where the row was taken again (a NaN, a zero maximum). */
CKP_CLONES static float bf_row_max(const uint16_t *x, int64_t V, float *lo) {
    int64_t j = 0;
    int any_nan = 0;
    *lo = INFINITY;
    float mx = ckp_lanes16() ? pt_max16(x, sizeof *x, V, &j, &any_nan, lo) : pt_max8(x, sizeof *x, V, &j, &any_nan, lo);
    for (; j < V; j++) {
        float v = ckp_bf16_to_f(x[j]);
        any_nan |= v != v;
        mx = v > mx ? v : mx;
        *lo = v < *lo ? v : *lo;
    }
    if (any_nan || mx == 0.0f) {
        *lo = -INFINITY; /* unknown: no row-wide shortcut */
        return bf_row_max_scalar(x, V);
    }
    return mx;
}

/* One row's max and bf16 log_sum, and *least: the least x - m of the row (-inf where unknown; NaN where
 * the max is not finite), from which the exps' kind is picked (pt_exp_kind). ahead: the row that comes
 * next (x itself for the last), brought into the cache while the exps run: its max then finds it there
 * (the max, which waits on memory, took a tenth of the (2048, 32000) loss; the exps leave the memory
 * idle). */
static void bf_row(const uint16_t *x, int64_t V, pt_layout at, const uint16_t *ahead, float *m, float *log_sum,
                   float *least) {
    float lo, mx = bf_row_max(x, V, &lo);
    *least = lo - mx;
    float sum = ckp_bf16_round(bf_sum_exp(x, V, mx, at, pt_exp_kind(at, *least), ahead));
    *m = mx;
    *log_sum = ckp_bf16_round(at.sleef ? ckp_log_sleef(sum) : logf(sum));
}

static float bf_logp(const uint16_t *x, int64_t j, float m, float log_sum) {
    return ckp_bf16_round((ckp_bf16_to_f(x[j]) - m) - log_sum);
}

/* One row of log_softmax's backward: dx_j = bf16(g_j - exp(logp_j) * sum_k g_k), where g is gi at the
 * target t (none: t < 0, an ignored row) and 0 elsewhere; 8 or 16 lanes at a time, the target's element
 * again on its own. Fused where torch fuses it (at.fma): fma(-p, s, 0) keeps the sign of a product
 * too small for a float, where 0 - p * s rounds the product to a zero first and gives +0 (found with
 * exps in the subnormals); neither gives -(p * s) for an exact zero product (-0 in an ignored row).
 * least: bf_row's; the least logp is bf16(least - log_sum) (log_sum >= 0: every logp <= 0). */
CKP_CLONES static void bf_grad_row(const uint16_t *x, int64_t V, float m, float log_sum, float least, int64_t t,
                                   float gi, pt_layout at, uint16_t *dx) {
    const float grad_sum = t >= 0 ? gi : 0.0f;
    const int kind = pt_exp_kind(at, least - log_sum); /* -86 or more rounds to -86.5 or more */
    int64_t j = ckp_lanes16() ? bf_grad16(x, V, m, log_sum, grad_sum, NULL, kind, dx)
                              : bf_grad8(x, V, m, log_sum, grad_sum, NULL, kind, dx);
    for (; j < V; j++) {
        float p = pt_exp_at(at, bf_logp(x, j, m, log_sum));
        dx[j] = ckp_f_to_bf16(at.fma ? fmaf(-p, grad_sum, 0.0f) : 0.0f - p * grad_sum);
    }
    if (t >= 0) {
        float p = pt_exp_at(at, bf_logp(x, t, m, log_sum));
        dx[t] = ckp_f_to_bf16(at.fma ? fmaf(-p, grad_sum, gi) : gi - p * grad_sum);
    }
}

/* vec::reduce_all(+) over one row of bf16 values held as floats: bf_sum_exp's lane structure without
 * the map (the exp-sum keeps its own vector loop). */
CKP_CLONES static float bf_reduce_all(const float *g, int64_t V, pt_layout at) {
    const int L = at.lanes;
    const int64_t B = 2 * (int64_t)L;
    float a0[16] = {0}, a1[16] = {0};
    if (V < B) {
        int64_t n = V > L ? L : V;
        for (int64_t l = 0; l < n; l++) a0[l] = g[l];
        for (int64_t l = 0; l + L < V; l++) a0[l] += g[L + l];
        float acc = a0[0];
        for (int64_t l = 1; l < n; l++) acc += a0[l];
        return acc;
    }
    float lanes[32];
    int64_t d = ckp_lanes16() ? bf_reduce_blocks16(g, V, lanes) : bf_reduce_blocks8(g, V, lanes);
    memcpy(a0, lanes, (size_t)L * sizeof *a0);
    memcpy(a1, lanes + L, (size_t)L * sizeof *a1);
    for (int64_t l = 0; d + l < V && l < L; l++) a0[l] += g[d + l];
    for (int64_t l = 0; d + L + l < V; l++) a1[l] += g[d + L + l];
    return bf_fold(a0, a1, at);
}

/* bf_terms' element j, as bf_terms_of<N> computes each lane */
static float bf_term(const bf_terms *r, int64_t j) {
    float v = r->logp ? bf_logp(r->x, j, r->m, r->log_sum) : r->w ? ckp_bf16_round(r->scale * r->w[j]) : r->scale;
    if (r->q) {
        float q = ckp_bf16_to_f(r->q[j]);
        if (r->smoothed) q = ckp_bf16_round(ckp_bf16_round(q * r->keep) + r->spread);
        v = ckp_bf16_round(v * q);
    }
    return r->logp && r->w ? ckp_bf16_round(v * r->w[j]) : v;
}

CKP_CLONES static void bf_terms_row(const bf_terms *r, int64_t V, float *e) {
    int64_t j = ckp_lanes16() ? bf_terms_of16(r, V, e) : bf_terms_of8(r, V, e);
    for (; j < V; j++) e[j] = bf_term(r, j);
}

/* One row of log_softmax's backward with a gradient on every element, g (bf16 values as floats):
 * dx_j = bf16(g_j - exp(logp_j) * sum_k g_k), as bf_grad_row computes it. */
CKP_CLONES static void bf_grad_row_dense(const uint16_t *x, int64_t V, float m, float log_sum, float least,
                                         const float *g, pt_layout at, uint16_t *dx) {
    const float grad_sum = bf_reduce_all(g, V, at);
    const int kind = pt_exp_kind(at, least - log_sum);
    int64_t j = ckp_lanes16() ? bf_grad16(x, V, m, log_sum, grad_sum, g, kind, dx)
                              : bf_grad8(x, V, m, log_sum, grad_sum, g, kind, dx);
    for (; j < V; j++) {
        float p = pt_exp_at(at, bf_logp(x, j, m, log_sum));
        dx[j] = ckp_f_to_bf16(at.fma ? fmaf(-p, grad_sum, g[j]) : g[j] - p * grad_sum);
    }
}

/* nll_loss's cascade of bf16 partial sums over the kept rows (LossNLL.cpp): the loss's and, with
 * weights, the weights'. */
static void bf_nll_cascade(const int64_t *target, int64_t N, int64_t ignore_index, const float *logp_t_w,
                           const float *w, float *total, float *total_weight) {
    float parts[8] = {0}, wparts[8] = {0};
    int64_t level_power = ckp_ceil_log2(N) / 8 > 4 ? ckp_ceil_log2(N) / 8 : 4;
    int64_t mask0 = ((int64_t)1 << level_power) - 1;
    for (int64_t i = 0; i < N; i++) {
        if (target[i] == ignore_index) continue;
        parts[0] = ckp_bf16_round(parts[0] - logp_t_w[i]);
        if (w) wparts[0] = ckp_bf16_round(wparts[0] + w[target[i]]);
        for (int j = 0; j + 1 < 8; j++) {
            if ((i & (mask0 << (j * level_power))) != 0) break;
            parts[j + 1] = ckp_bf16_round(parts[j + 1] + parts[j]);
            wparts[j + 1] = ckp_bf16_round(wparts[j + 1] + wparts[j]);
            parts[j] = wparts[j] = 0;
        }
    }
    *total = *total_weight = 0;
    for (int j = 0; j < 8; j++) {
        *total = ckp_bf16_round(*total + parts[j]);
        *total_weight = ckp_bf16_round(*total_weight + wparts[j]);
    }
}

/* The checks both bf16 entry points make before anything is written: pointers, sizes, options
 * (ptref without z_loss), torch_threads, and no output overlapping an input or the other output.
 * target is the (N) class targets, or with probs the (N, V) bf16 probabilities. */
static ckp_status bf_check_args(const uint16_t *logits, const void *target, int probs, int64_t N, int64_t V,
                                const ckp_cross_entropy_options *opt, const uint16_t *loss, const uint16_t *dlogits) {
    const char *target_name = probs ? "target_probs" : "target";
    if (logits == NULL || target == NULL || opt == NULL || loss == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "logits, %s, options and loss must not be NULL", target_name);
    if (N <= 0 || V <= 0 || N > INT64_MAX / V)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and V must be positive and N*V must not overflow, got N=%lld V=%lld",
                        (long long)N, (long long)V);
    if (opt->reduction != CKP_REDUCTION_NONE && opt->reduction != CKP_REDUCTION_MEAN &&
        opt->reduction != CKP_REDUCTION_SUM)
        return ckp_fail(CKP_ERR_BAD_OPTION, "reduction must be 0 (none), 1 (mean) or 2 (sum), got %d",
                        (int)opt->reduction);
    if (!(opt->label_smoothing >= 0.0 && opt->label_smoothing <= 1.0))
        return ckp_fail(CKP_ERR_BAD_OPTION, "label_smoothing must be in [0, 1], got %g", opt->label_smoothing);
    if (opt->variant != CKP_CE_PTREF || opt->z_loss != 0.0)
        return ckp_fail(CKP_ERR_BAD_OPTION, "bf16 cross_entropy is the ptref variant without z_loss (torch has "
                        "no z-loss to follow in bf16)");
    ckp_status st = ckp_check_torch_threads(opt->torch_threads);
    if (st != CKP_OK) return st;
    size_t matrix = (size_t)(N * V) * 2, rows = opt->reduction == CKP_REDUCTION_NONE ? (size_t)N : 1;
    size_t loss_bytes = rows * 2, target_bytes = probs ? matrix : (size_t)N * sizeof(int64_t);
    const ckp_span inputs[] = {{logits, matrix}, {target, target_bytes}, {opt->row_grad, rows * sizeof(float)},
                               {opt->weight, (size_t)V * sizeof(float)}};
    if (ckp_overlaps_any((ckp_span){dlogits, matrix}, inputs, 4) || ckp_overlaps_any((ckp_span){loss, loss_bytes}, inputs, 4) ||
        ckp_overlaps(loss, loss_bytes, dlogits, matrix))
        return ckp_fail(CKP_ERR_ALIASING, "loss and dlogits must not overlap logits, %s, weight, row_grad or each other",
                        target_name);
    return CKP_OK;
}

ckp_status ckp_cross_entropy_bf16(const uint16_t *logits, const int64_t *target, int64_t N, int64_t V,
                                  const ckp_cross_entropy_options *opt, uint16_t *loss, uint16_t *dlogits) {
    ckp_status st = bf_check_args(logits, target, 0, N, V, opt, loss, dlogits);
    if (st != CKP_OK) return st;
    for (int64_t i = 0; i < N; i++)
        if (target[i] != opt->ignore_index && (target[i] < 0 || target[i] >= V))
            return ckp_fail(CKP_ERR_TARGET_OUT_OF_RANGE,
                            "Target %lld is out of bounds at row %lld (classes: %lld, ignore_index: %lld)",
                            (long long)target[i], (long long)i, (long long)V, (long long)opt->ignore_index);
    ckp_clear_error();
    const pt_layout at = pt_layout_for_capability();
    const int none = opt->reduction == CKP_REDUCTION_NONE, mean = opt->reduction == CKP_REDUCTION_MEAN;
    const int smoothed = opt->label_smoothing > 0.0;
    const float *w = opt->weight;
    const float keep = (float)(1.0 - opt->label_smoothing), spread = (float)(opt->label_smoothing / (double)V);

    /* What the backward needs from the targets alone, before any row: nll_loss's total_weight (the kept
     * count, or the weights' cascade) and smoothing's mean divisor (the kept count as a float, or
     * torch.sum of the kept rows' weights). */
    int64_t kept = 0;
    for (int64_t i = 0; i < N; i++) kept += target[i] != opt->ignore_index;
    float *logp_t = malloc((size_t)N * sizeof(float)), *smooth = smoothed ? malloc((size_t)N * sizeof(float)) : NULL;
    if (logp_t == NULL || (smoothed && smooth == NULL)) {
        free(logp_t);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for the %lld rows' terms of a bf16 cross_entropy",
                        (long long)N);
    }
    float total_weight = ckp_bf16_round((float)kept), divisor = (float)kept, unused;
    if (w) {
        for (int64_t i = 0; i < N; i++) logp_t[i] = 0.0f; /* the weights' cascade alone */
        bf_nll_cascade(target, N, opt->ignore_index, logp_t, w, &unused, &total_weight);
        pt_kept_weights kw = {target, w, opt->ignore_index, -1, -1};
        if (smoothed && mean && kept > 0) divisor = ckp_aten_full_sum_bf16(pt_kept_weight, &kw, kept, opt->torch_threads);
    }
    /* the upstream gradient u (bf16 values in row_grad: one per row with none; 1 without it) split between
     * the nll term and the smoothing term */
    const float u = opt->row_grad != NULL && !none ? opt->row_grad[0] : 1.0f;
    const float u_nll = smoothed ? ckp_bf16_round(u * keep) : u, u_smooth = ckp_bf16_round(u * spread);
    const float g_nll = mean ? -ckp_bf16_round(u_nll / total_weight) : -u_nll;
    const float s_all = mean ? ckp_bf16_round(u_smooth / divisor) : u_smooth;
    const int row_threads = N == 1 ? opt->torch_threads : 1; /* a (1, V) row sum is a reduction to one value */
    const int threads = ckp_threads();
    /* each thread's row of terms (smoothing's, then its gradient's), allocated before any output is
     * written: a failure loses nothing */
    float *scratch = smoothed ? malloc((size_t)threads * (size_t)V * sizeof(float)) : NULL;
    if (smoothed && scratch == NULL) {
        free(logp_t);
        free(smooth);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for %d gradient rows of a bf16 cross_entropy (V=%lld)",
                        threads, (long long)V);
    }
#pragma omp parallel num_threads(threads) if (N * V >= 32768)
    {
        float *g = scratch != NULL ? scratch + (size_t)omp_get_thread_num() * (size_t)V : NULL;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            const uint16_t *x = logits + i * V;
            const int64_t t = target[i] == opt->ignore_index ? -1 : target[i];
            bf_terms r = {x, NULL, w, 0.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1, 0};
            if (t < 0 && dlogits == NULL) {
                logp_t[i] = 0.0f;
                if (smoothed) smooth[i] = 0.0f;
                continue;
            }
            float least;
            bf_row(x, V, at, i + 1 < N ? x + V : x, &r.m, &r.log_sum, &least);
            logp_t[i] = t < 0 ? 0.0f : (w ? ckp_bf16_round(bf_logp(x, t, r.m, r.log_sum) * w[t])
                                          : bf_logp(x, t, r.m, r.log_sum));
            if (smoothed && t >= 0) bf_terms_row(&r, V, g); /* bf16(logp_j * w_j) */
            if (smoothed) smooth[i] = t < 0 ? 0.0f : -ckp_aten_full_sum_array_bf16(g, V, row_threads);
            if (dlogits == NULL) continue;
            const float gn = none ? -(opt->row_grad ? (smoothed ? ckp_bf16_round(opt->row_grad[i] * keep)
                                                                 : opt->row_grad[i]) : u_nll) : g_nll;
            const float gi = w && t >= 0 ? ckp_bf16_round(w[t] * gn) : gn;
            if (!smoothed) {
                bf_grad_row(x, V, r.m, r.log_sum, least, t, gi, at, dlogits + i * V);
            } else {
                const float s = t < 0 ? 0.0f : none ? (opt->row_grad ? ckp_bf16_round(opt->row_grad[i] * spread)
                                                                      : u_smooth) : s_all;
                r.logp = 0;
                r.scale = -s;
                bf_terms_row(&r, V, g); /* bf16(-s * w_j) */
                if (t >= 0) g[t] = ckp_bf16_round(g[t] + gi);
                bf_grad_row_dense(x, V, r.m, r.log_sum, least, g, at, dlogits + i * V);
            }
        }
    }
    free(scratch);
    /* forward: nll_loss (row by row with none, else its cascade), then the smoothing term */
    if (none) {
        for (int64_t i = 0; i < N; i++) {
            float nll = target[i] == opt->ignore_index ? 0.0f : -logp_t[i];
            loss[i] = ckp_f_to_bf16(smoothed ? ckp_bf16_round(nll * keep) + ckp_bf16_round(smooth[i] * spread) : nll);
        }
    } else {
        float total;
        bf_nll_cascade(target, N, opt->ignore_index, logp_t, NULL, &total, &unused);
        float nll = mean ? ckp_bf16_round(total / total_weight) : total;
        if (smoothed) {
            float ret = ckp_aten_full_sum_array_bf16(smooth, N, opt->torch_threads);
            if (mean) ret = ckp_bf16_round(ret / divisor);
            nll = ckp_bf16_round(nll * keep) + ckp_bf16_round(ret * spread);
        }
        loss[0] = ckp_f_to_bf16(nll);
    }
    free(logp_t);
    free(smooth);
    return CKP_OK;
}

/* The batch's loss terms as one flattened (N * V) sequence, for torch.sum over every element (split
 * as torch splits it: ckp_aten_split_sum). */
typedef struct {
    bf_terms proto;
    const uint16_t *logits, *probs;
    const float *m, *log_sum;
    ce_cursor at;
    bf_terms r; /* the row at the cursor */
} bf_batch;

static inline __attribute__((always_inline)) const bf_terms *bf_batch_at(bf_batch *b, int64_t j) {
    if (ce_cursor_move(&b->at, j)) {
        b->r = b->proto;
        b->r.x = b->logits + b->at.row_start;
        b->r.q = b->probs + b->at.row_start;
        b->r.m = b->m[b->at.row];
        b->r.log_sum = b->log_sum[b->at.row];
    }
    return &b->r;
}

/* bf_terms' elements c..c+8 of a row, on a vector */
static inline __attribute__((always_inline)) ckp_v8f bf_terms8(const bf_terms *r, int64_t c) {
    bf_terms shifted = *r;
    shifted.x += c;
    shifted.q += c;
    if (shifted.w) shifted.w += c;
    float e[8];
    bf_terms_of8(&shifted, 8, e);
    return ckp_load8(e);
}

CE_DEFINE_BATCH_MAPS(bf, bf_terms, bf_batch_at, bf_term, bf_terms8)

static inline __attribute__((always_inline)) ckp_v8f bf_batch8_bf16(const void *ctx, int64_t j) {
    return bf_batch8(ctx, j) + bf_batch8(ctx, j + CKP_VLANES);
}

CE_DEFINE_BATCH_SUM(bf, bf_batch8_bf16, 2 * CKP_VLANES, ckp_bf16_round)

ckp_status ckp_cross_entropy_probs_bf16(const uint16_t *logits, const uint16_t *target_probs, int64_t N, int64_t V,
                                        const ckp_cross_entropy_options *opt, uint16_t *loss, uint16_t *dlogits) {
    ckp_status st = bf_check_args(logits, target_probs, 1, N, V, opt, loss, dlogits);
    if (st != CKP_OK) return st;
    ckp_clear_error();
    const pt_layout at = pt_layout_for_capability();
    const int none = opt->reduction == CKP_REDUCTION_NONE, mean = opt->reduction == CKP_REDUCTION_MEAN;
    const int smoothed = opt->label_smoothing > 0.0;
    const float keep = smoothed ? (float)(1.0 - opt->label_smoothing) : 1.0f;
    const float spread = smoothed ? ckp_bf16_round((float)(opt->label_smoothing / (double)V)) : 0.0f;
    const bf_terms proto = {NULL, NULL, opt->weight, 0.0f, 0.0f, keep, spread, 0.0f, 1, spread != 0.0f || keep != 1.0f};
    const float u = opt->row_grad != NULL && !none ? opt->row_grad[0] : 1.0f;
    const float g_all = mean ? -ckp_bf16_round(u / (float)N) : -u;
    const int row_threads = N == 1 ? opt->torch_threads : 1; /* a (1, V) row sum is a reduction to one value */
    const int threads = ckp_threads();
    /* every buffer allocated before any output is written: a failure loses nothing */
    float *m = malloc((size_t)N * sizeof(float)), *log_sum = malloc((size_t)N * sizeof(float));
    const int rows = none || dlogits != NULL; /* each thread's row of terms: the loss's (none), the gradient's */
    float *scratch = rows ? malloc((size_t)threads * (size_t)V * sizeof(float)) : NULL;
    if (m == NULL || log_sum == NULL || (rows && scratch == NULL)) {
        free(m);
        free(log_sum);
        free(scratch);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for the working rows of a bf16 cross_entropy (N=%lld, "
                        "V=%lld)", (long long)N, (long long)V);
    }
#pragma omp parallel num_threads(threads) if (N * V >= 32768)
    {
        float *g = scratch != NULL ? scratch + (size_t)omp_get_thread_num() * (size_t)V : NULL;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            bf_terms r = proto;
            r.x = logits + i * V;
            r.q = target_probs + i * V;
            float least;
            bf_row(r.x, V, at, i + 1 < N ? r.x + V : r.x, &r.m, &r.log_sum, &least);
            m[i] = r.m;
            log_sum[i] = r.log_sum;
            if (none) {
                bf_terms_row(&r, V, g); /* bf16(bf16(logp_j * q_j) * w_j) */
                loss[i] = ckp_f_to_bf16(-ckp_aten_full_sum_array_bf16(g, V, row_threads));
            }
            if (dlogits == NULL) continue;
            r.logp = 0;
            r.scale = none ? -(opt->row_grad ? opt->row_grad[i] : 1.0f) : g_all;
            bf_terms_row(&r, V, g); /* bf16(bf16(g * w_j) * q_j) */
            bf_grad_row_dense(r.x, V, r.m, r.log_sum, least, g, at, dlogits + i * V);
        }
    }
    free(scratch);
    if (!none) { /* -(logp * q * w).sum(): one reduction over every element, split as torch splits it */
        bf_batch b = {proto, logits, target_probs, m, log_sum, {V, 0, -1, 0}, proto};
        float total = -ckp_aten_split_sum(bf_batch_range, &b, N * V, opt->torch_threads, 1);
        loss[0] = ckp_f_to_bf16(mean ? total / (float)N : total);
    }
    free(m);
    free(log_sum);
    return CKP_OK;
}

/* ------------------------------------------------------------------------
 * bf16 logits with float32 probability targets, as torch takes them
 * (cross_entropy_loss_prob_target): log_softmax in bf16, then
 * -(logp * target * weight).sum() in float32 -- a bf16 tensor times a float32
 * one is a float32 product of the widened values -- and the loss float32. In
 * backward the float32 gradient reaching logp, (g * w_j) * q_j, is cast to
 * logp's dtype by autograd, one bf16 rounding, before log_softmax's bf16
 * backward. So a row is the float32 ptref's pt_row on the row's bf16 logp (as
 * floats, with m = log_sum = 0: (l - 0) - 0 is l, bit for bit), and the
 * gradient bf_grad_row_dense's on the rounded g.
 * ---------------------------------------------------------------------- */

/* One row: its bf16 logits and log_softmax statistics, and the float32 row (P, w, smoothing) whose
 * terms pt_term computes on a logp. */
typedef struct {
    pt_row pt;
    const uint16_t *x;
    float m, log_sum;
} bm_row;

/* the row's logp_j .. logp_{j+n} as floats, in e */
static inline __attribute__((always_inline)) void bm_logp(const bm_row *r, int64_t j, int64_t n, float *e) {
    for (int64_t k = 0; k < n; k++) e[k] = bf_logp(r->x, j + k, r->m, r->log_sum);
}

/* A row's logp (bm_logp) and the gradient reaching it (pt_grad_logp, rounded to bf16) on vectors of N
 * lanes, as far as whole vectors go; each returns the first element it did not write. */
#define BM_DEFINE_ROW_LOOPS(N)                                                                              \
    static inline __attribute__((always_inline)) int64_t bm_logp_of##N(const bm_row *r, int64_t V, float *e) { \
        const ckp_v##N##f mv = ckp_splat##N(r->m), lv = ckp_splat##N(r->log_sum);                           \
        int64_t j = 0;                                                                                      \
        for (; j + N <= V; j += N)                                                                          \
            ckp_elem_store##N(e, j, ckp_bf16_round##N((ckp_bf16_load##N(r->x + j) - mv) - lv), sizeof *e);  \
        return j;                                                                                           \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t bm_grad_of##N(const pt_row *f, int64_t V, float *g) { \
        int64_t j = 0;                                                                                      \
        for (; j + N <= V; j += N) ckp_elem_store##N(g, j, ckp_bf16_round##N(pt_g##N(f, j)), sizeof *g);    \
        return j;                                                                                           \
    }

BM_DEFINE_ROW_LOOPS(8)
BM_DEFINE_ROW_LOOPS(16)

CKP_CLONES static void bm_logp_row(const bm_row *r, int64_t V, float *e) {
    int64_t j = ckp_lanes16() ? bm_logp_of16(r, V, e) : bm_logp_of8(r, V, e);
    bm_logp(r, j, V - j, e + j);
}

/* g_j = bf16((g * w_j) * q_j): autograd's cast of the float32 gradient to logp's dtype */
CKP_CLONES static void bm_grad_row(const pt_row *f, int64_t V, float *g) {
    int64_t j = ckp_lanes16() ? bm_grad_of16(f, V, g) : bm_grad_of8(f, V, g);
    for (; j < V; j++) g[j] = ckp_bf16_round(pt_grad_logp((void *)f, j));
}

static float bm_term(const bm_row *r, int64_t j) {
    float l;
    bm_logp(r, j, 1, &l);
    pt_row t = r->pt;
    t.x = &l;
    t.P += j;
    if (t.w) t.w += j;
    return pt_term(&t, 0);
}

static inline __attribute__((always_inline)) ckp_v8f bm_terms8(const bm_row *r, int64_t c) {
    float l[8];
    ckp_store8(l, ckp_bf16_round8((ckp_bf16_load8(r->x + c) - ckp_splat8(r->m)) - ckp_splat8(r->log_sum)));
    pt_row t = r->pt;
    t.x = l;
    t.P += c;
    if (t.w) t.w += c;
    return pt_terms8(&t, 0);
}

/* The batch's terms as one flattened (N * V) sequence for torch.sum over every element */
typedef struct {
    bm_row proto;
    const uint16_t *logits;
    const float *probs;
    const float *m, *log_sum;
    ce_cursor at;
    bm_row r; /* the row at the cursor */
} bm_batch;

static inline __attribute__((always_inline)) const bm_row *bm_batch_at(bm_batch *b, int64_t j) {
    if (ce_cursor_move(&b->at, j)) {
        b->r = b->proto;
        b->r.x = b->logits + b->at.row_start;
        b->r.pt.P = b->probs + b->at.row_start;
        b->r.m = b->m[b->at.row];
        b->r.log_sum = b->log_sum[b->at.row];
    }
    return &b->r;
}

CE_DEFINE_BATCH_MAPS(bm, bm_row, bm_batch_at, bm_term, bm_terms8)
CE_DEFINE_BATCH_SUM(bm, bm_batch8, CKP_VLANES, CE_AS_IS)

/* ptref: the rows on the library's threads (each row's statistics, its loss with reduction none, its
 * gradient), then the batch's sum in element order. */
static ckp_status bm_ptref(const uint16_t *logits, const float *target_probs, int64_t N, int64_t V,
                           const ckp_cross_entropy_options *opt, float *loss, uint16_t *dlogits) {
    const int none = opt->reduction == CKP_REDUCTION_NONE, mean = opt->reduction == CKP_REDUCTION_MEAN;
    bm_row proto = {{0}, NULL, 0.0f, 0.0f};
    proto.pt.w = opt->weight;
    proto.pt.keep = (float)(1.0 - opt->label_smoothing);
    proto.pt.spread = (float)(opt->label_smoothing / (double)V);
    proto.pt.smoothed = opt->label_smoothing > 0.0;
    proto.pt.at = pt_layout_for_capability();
    proto.pt.sum_threads = N == 1 ? opt->torch_threads : 1; /* a (1, V) row sum is a reduction to one value */
    proto.pt.t = -1;
    const int threads = ckp_threads();
    /* every buffer allocated before any output is written: a failure loses nothing */
    float *stats = malloc((size_t)N * 2 * sizeof(float));
    float *scratch = malloc((size_t)threads * 2 * (size_t)V * sizeof(float)); /* a logp row and a g row */
    if (stats == NULL || scratch == NULL) {
        free(stats);
        free(scratch);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for the working rows of a bf16 cross_entropy with float32 "
                        "probabilities (N=%lld, V=%lld)", (long long)N, (long long)V);
    }
    float *m = stats, *log_sum = stats + N;
#pragma omp parallel num_threads(threads) if (N * V >= 32768)
    {
        float *logp = scratch + (size_t)omp_get_thread_num() * 2 * (size_t)V, *g = logp + V;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            bm_row r = proto;
            r.x = logits + i * V;
            float least;
            bf_row(r.x, V, r.pt.at, i + 1 < N ? r.x + V : r.x, &r.m, &r.log_sum, &least);
            m[i] = r.m;
            log_sum[i] = r.log_sum;
            if (!none && dlogits == NULL) continue;
            bm_logp_row(&r, V, logp);
            pt_row f = r.pt; /* the float32 row on the logp */
            f.x = logp;
            f.P = target_probs + i * V;
            if (none) loss[i] = -pt_row_terms_sum(&f, V);
            if (dlogits == NULL) continue;
            const float u = opt->row_grad != NULL ? opt->row_grad[none ? i : 0] : 1.0f;
            f.smooth_grad = -(mean ? u / (float)N : u); /* -(...).sum() / N: each product receives -u/N */
            bm_grad_row(&f, V, g);
            bf_grad_row_dense(r.x, V, r.m, r.log_sum, least, g, r.pt.at, dlogits + i * V);
        }
    }
    free(scratch);
    if (!none) { /* one reduction over every element, split as torch splits it */
        bm_batch b = {proto, logits, target_probs, m, log_sum, {V, 0, -1, 0}, proto};
        float total = -ckp_aten_split_sum(bm_batch_range, &b, N * V, opt->torch_threads, 0);
        loss[0] = mean ? total / (float)N : total;
    }
    free(stats);
    return CKP_OK;
}

ckp_status ckp_cross_entropy_probs_bf16_f32p(const uint16_t *logits, const float *target_probs, int64_t N,
                                             int64_t V, const ckp_cross_entropy_options *opt, float *loss,
                                             uint16_t *dlogits) {
    if (target_probs == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "target_probs is NULL");
    ckp_status s = validate(logits, NULL, target_probs, N, V, opt, loss, dlogits, sizeof(uint16_t), sizeof(float));
    if (s != CKP_OK) return s;
    if (opt->variant == CKP_CE_PTREF) {
        if (opt->z_loss != 0.0)
            return ckp_fail(CKP_ERR_BAD_OPTION, "bf16 cross_entropy is the ptref variant without z_loss (torch has "
                            "no z-loss to follow in bf16)");
        if (dlogits != NULL && ckp_overlaps(dlogits, (size_t)(N * V) * 2, logits, (size_t)(N * V) * 2))
            return ckp_fail(CKP_ERR_ALIASING, "ptref's dlogits must not overlap the logits (the batch's sum reads "
                            "them after the rows' gradients)");
    }
    ckp_clear_error();
    if (opt->variant == CKP_CE_PTREF) return bm_ptref(logits, target_probs, N, V, opt, loss, dlogits);
    return ce_default(logits, NULL, target_probs, N, V, opt, loss, dlogits, sizeof(uint16_t), sizeof(float));
}
