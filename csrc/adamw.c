/*
 * adamw.c — one step of torch.optim.AdamW (torch/optim/adam.py,
 * _single_tensor_adam with decoupled weight decay), operation for operation,
 * aiming at bit-identical params and moments. Per element, in float:
 *   g = maximize ? -grad : grad
 *   p = p * (1 - lr*wd)                           param.mul_(1 - lr * weight_decay)
 *   m = lerp(m, g, 1 - beta1)                     exp_avg.lerp_(grad, 1 - beta1)
 *   v = fma((1 - beta2) * g, g, v * beta2)        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   vmax = max(vmax, v)                           amsgrad only
 *   denom = sqrt(v or vmax) / sqrt(bc2) + eps     (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *   p = p + (-step_size * m) / denom              param.addcdiv_(exp_avg, denom, value=-step_size)
 * with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step, step_size = lr / bc1 and
 * sqrt(bc2) = bc2 ** 0.5, all in double as Python computes them; every double
 * scalar is rounded to float where torch hands it to a float kernel.
 * The fused forms follow torch's build at the running CPU capability
 * (ckp_get_capability; checked bitwise at each): the AVX2 and AVX-512 builds
 * have FMA, so lerp is ATen's lerp_vec, fma(weight, end - start, start) for
 * weight < 0.5 and fma(weight - 1, end - start, end) otherwise (Lerp.h; the
 * scalar tail's contracted self + weight * (end - self) gives the same bits),
 * and addcmul is contracted to one fma; the DEFAULT build has no FMA, so both
 * round their product and their sum separately. addcdiv is never contracted.
 * Known difference: torch's sqrt on this build (MKL's vectorized sqrt) returns
 * the float just below the correctly rounded root for about 0.6% of inputs;
 * sqrtf here is correctly rounded, so those elements' params differ by an ULP.
 *
 * bfloat16 (ckp_adamw_step_bf16: param, grad and the moments bf16, as torch
 * keeps a bf16 parameter's state): torch's same ops, each computing in float
 * (the same fused forms) and rounding its result to bf16 -- the decayed param,
 * the lerp, exp_avg_sq * beta2, the addcmul, sqrt (on bf16, ATen's own
 * correctly rounded vector sqrt, not MKL's), the division by sqrt(bc2), + eps
 * (eps itself rounded to bf16 first: add_'s Scalar takes the tensor's dtype,
 * where mul_ and div keep theirs in float), and the addcdiv. Measured against torch's bf16 AdamW: every param and moment
 * at DEFAULT, AVX2 and AVX512 (tests/test_bf16.py, the adamw sweep).
 *
 * fused (options.fused: torch.optim.AdamW(fused=True), ATen's
 * cpu/FusedAdamKernel.cpp), float32 and bf16 alike: every element loaded to
 * float, the math in float, the moments and the param rounded only where
 * they are stored -- the param's update reads the unrounded m and v, eps is
 * float's, sqrt(bc2) is sqrt() of the double. Its lerp is the single-tensor
 * one; exp_avg_sq * beta2 + (1 - beta2) * g * g is contracted by torch's
 * build as the code around it is compiled (found against torch's bits, per
 * position, with inputs where the forms differ): in the vector loop (L
 * elements a step: float 16 at AVX512, 8 at AVX2; bf16 32 and 16) as
 * fma((1 - beta2) * g, g, v * beta2); in the scalar tail (the last n % L
 * elements; the thread chunks are whole 64-byte units, so only the tensor's
 * own tail) as fma(v, beta2, ((1 - beta2) * g) * g) -- except that the
 * AVX512 build vectorizes the tail's first 8 floats (16 bf16) like the loop;
 * at DEFAULT nothing is contracted. */
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>

static inline __attribute__((always_inline)) float lerp_vec(float start, float end, float weight, int fused) {
    if (!fused || CKP_MUTANT(ADAMW_LERP_UNFUSED)) return fabsf(weight) < 0.5f ? start + weight * (end - start) : end + (weight - 1.0f) * (end - start);
    return fabsf(weight) < 0.5f ? fmaf(weight, end - start, start) : fmaf(weight - 1.0f, end - start, end);
}

/* addcmul_'s self + value * t1 * t2 with value * t1 folded into w2g. */
static inline __attribute__((always_inline)) float addcmul(float self, float w2g, float g, int fused) {
    return fused ? fmaf(w2g, g, self) : self + w2g * g;
}

static ckp_status check_options(const ckp_adamw_options *o, double step) {
    if (!(o->lr >= 0.0 && isfinite(o->lr)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "lr must be finite and >= 0, got %g", o->lr);
    if (!(o->beta1 >= 0.0 && o->beta1 < 1.0))
        return ckp_fail(CKP_ERR_BAD_OPTION, "beta1 must be in [0, 1), got %g", o->beta1);
    if (!(o->beta2 >= 0.0 && o->beta2 < 1.0))
        return ckp_fail(CKP_ERR_BAD_OPTION, "beta2 must be in [0, 1), got %g", o->beta2);
    if (!(o->eps >= 0.0 && isfinite(o->eps)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "eps must be finite and >= 0, got %g", o->eps);
    if (!(o->weight_decay >= 0.0 && isfinite(o->weight_decay)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "weight_decay must be finite and >= 0, got %g",
                        o->weight_decay);
    if (!(step >= 1.0 && step == floor(step)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "step must be a whole number >= 1, got %g", step);
    return CKP_OK;
}

/* The per-element update over [lo, hi), built per target (CKP_CLONES): with
 * FMA, fmaf is one instruction and the loop vectorizes; every operation is a
 * single IEEE-rounded one, so every build gives the same bits. */
typedef struct {
    float decay, w1, beta2, w2, neg_step_size, bc2_sqrt, eps, sign;
    float weight_decay; /* for the ADAMW_COUPLED_DECAY mutant only (mutants.h) */
    int decays, amsgrad;
    int fused; /* torch's build contracts lerp and addcmul (not at DEFAULT) */
} adamw_scalars;

/* One loop of adamw_range with fused and amsgrad constant at each call: a
 * plain loop the compiler vectorizes (with either read per element, it did
 * not: 20 ms against 7 at 16M floats). Without amsgrad no load of
 * max_exp_avg_sq, which is NULL then: vectorized, a branch would become masked
 * loads from unmapped pages, a microcode assist each. */
static inline __attribute__((always_inline)) void adamw_run(float *restrict param, const float *restrict grad,
                                                            float *restrict exp_avg, float *restrict exp_avg_sq,
                                                            float *restrict max_exp_avg_sq, int64_t lo, int64_t hi,
                                                            const adamw_scalars *k, int fused, int amsgrad) {
    const float decay = k->decays ? k->decay : 1.0f; /* x * 1 == x: no decay is exact */
    const float w1 = k->w1, beta2 = k->beta2, w2 = k->w2;
    const float neg_step_size = k->neg_step_size, bc2_sqrt = k->bc2_sqrt, eps = k->eps, sign = k->sign;
    for (int64_t i = lo; i < hi; i++) {
        float g = sign * grad[i];
        if (CKP_MUTANT(ADAMW_COUPLED_DECAY)) g += k->weight_decay * param[i];
        float p = CKP_MUTANT(ADAMW_COUPLED_DECAY) ? param[i] : param[i] * decay;
        float m = lerp_vec(exp_avg[i], g, w1, fused);
        float v = addcmul(exp_avg_sq[i] * beta2, w2 * g, g, fused);
        float vmax = v;
        if (amsgrad) {
            vmax = max_exp_avg_sq[i];
            vmax = (v > vmax || v != v) ? v : vmax; /* torch.maximum propagates NaN */
            max_exp_avg_sq[i] = vmax;
        }
        param[i] = p + (neg_step_size * m) / (CKP_MUTANT(ADAMW_EPS_INSIDE_SQRT) ? sqrtf(vmax / (bc2_sqrt * bc2_sqrt) + eps)
                                                                           : sqrtf(vmax) / bc2_sqrt + eps);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
    }
}

CKP_CLONES
static void adamw_range(float *restrict param, const float *restrict grad, float *restrict exp_avg,
                        float *restrict exp_avg_sq, float *restrict max_exp_avg_sq, int64_t lo, int64_t hi,
                        const adamw_scalars *k) {
    if (k->fused) {
        if (k->amsgrad) adamw_run(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, k, 1, 1);
        else adamw_run(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, k, 1, 0);
    } else {
        if (k->amsgrad) adamw_run(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, k, 0, 1);
        else adamw_run(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, k, 0, 0);
    }
}

/* adamw_range in bfloat16: every op's result rounded (ckp_bf16_round); vectors of N lanes (each lane
 * the scalar element's IEEE operations, so the same bits), the tail one by one. The vector loop is
 * defined at N lanes by ADAMW_DEFINE_BF16_LOOP: 16 or 8 (ckp_lanes16); fused is a constant at each
 * call. Returns the first element it did not update.
 * [Note: the bf16 step in stages] One element's update is a chain of ~20 dependent operations --
 * sqrt, two divisions and seven roundings among them, ~80 cycles -- and written as one loop body
 * the out-of-order core held little more than one vector's chain at a time: 9 ms at 16M
 * parameters where the fused step (the same sqrt and divisions, three roundings) takes 3. So a
 * block of up to ADAMW_BF16_VECS vectors goes through three short loops, the moments, the
 * denominators, the params, each vector's work independent of the next, their values kept in two
 * small arrays (L1). Which operations run, and on what, is unchanged. The roundings whose results
 * only feed more arithmetic skip the NaN select (ckp_bf16_round_any_nan: every NaN here is a bf16
 * load's, a rounding's or the default NaN, and the options' scalars are finite); the stored ones
 * keep it. From 9.1 ms at 16M parameters (AVX512, 2 threads) to 5.0, 4.6-4.8 without the selects. */
enum { ADAMW_BF16_VECS = 16 };
#define ADAMW_DEFINE_BF16_LOOP(N)                                                                           \
    static inline __attribute__((always_inline)) ckp_v##N##f lerp##N(ckp_v##N##f start, ckp_v##N##f end,   \
                                                                      float weight, int fused) {            \
        if (!fused)                                                                                         \
            return fabsf(weight) < 0.5f ? start + weight * (end - start) : end + (weight - 1.0f) * (end - start); \
        return fabsf(weight) < 0.5f ? ckp_fma##N(ckp_splat##N(weight), end - start, start)                  \
                                    : ckp_fma##N(ckp_splat##N(weight - 1.0f), end - start, end);            \
    }                                                                                                       \
    static inline __attribute__((always_inline)) int64_t adamw_bf16_loop##N(                                \
        uint16_t *restrict param, const uint16_t *restrict grad, uint16_t *restrict exp_avg,                \
        uint16_t *restrict exp_avg_sq, int64_t i, int64_t hi, float decay, float eps, const adamw_scalars *k, \
        int fused) {                                                                                        \
        const float sign = k->sign, w1 = k->w1, beta2 = k->beta2, w2 = k->w2, bc2_sqrt = k->bc2_sqrt;      \
        const float neg_step_size = k->neg_step_size;                                                       \
        ckp_v##N##f m[ADAMW_BF16_VECS], denom[ADAMW_BF16_VECS];                                             \
        for (int64_t vecs; (vecs = (hi - i) / N) > 0; i += vecs * N) {                                      \
            if (vecs > ADAMW_BF16_VECS) vecs = ADAMW_BF16_VECS;                                             \
            for (int64_t j = 0; j < vecs; j++) { /* the moments, stored */                                  \
                const int64_t e = i + j * N;                                                                \
                ckp_v##N##f g = sign * ckp_bf16_load##N(grad + e);                                          \
                m[j] = ckp_bf16_round##N(lerp##N(ckp_bf16_load##N(exp_avg + e), g, w1, fused));             \
                ckp_v##N##f vb = ckp_bf16_round_any_nan##N(ckp_bf16_load##N(exp_avg_sq + e) * beta2);       \
                denom[j] = ckp_bf16_round##N(fused ? ckp_fma##N(w2 * g, g, vb) : vb + (w2 * g) * g);        \
                ckp_bf16_store_exact##N(exp_avg + e, m[j]);                                                 \
                ckp_bf16_store_exact##N(exp_avg_sq + e, denom[j]);                                          \
            }                                                                                               \
            for (int64_t j = 0; j < vecs; j++) { /* exp_avg_sq's root, over sqrt(bc2), + eps */             \
                ckp_v##N##f root;                                                                           \
                for (int l = 0; l < N; l++) root[l] = sqrtf(denom[j][l]);                                   \
                denom[j] = ckp_bf16_round_any_nan##N(                                                       \
                    ckp_bf16_round_any_nan##N(ckp_bf16_round_any_nan##N(root) / bc2_sqrt) + eps);           \
            }                                                                                               \
            for (int64_t j = 0; j < vecs; j++) { /* the decayed param, then addcdiv */                      \
                const int64_t e = i + j * N;                                                                \
                ckp_v##N##f p = ckp_bf16_round_any_nan##N(ckp_bf16_load##N(param + e) * decay);             \
                ckp_bf16_store##N(param + e, p + (neg_step_size * m[j]) / denom[j]);                        \
            }                                                                                               \
        }                                                                                                   \
        return i;                                                                                           \
    }

ADAMW_DEFINE_BF16_LOOP(8)
ADAMW_DEFINE_BF16_LOOP(16)

CKP_CLONES
static void adamw_range_bf16(uint16_t *restrict param, const uint16_t *restrict grad, uint16_t *restrict exp_avg,
                             uint16_t *restrict exp_avg_sq, uint16_t *restrict max_exp_avg_sq, int64_t lo, int64_t hi,
                             const adamw_scalars *k) {
    const float decay = k->decays ? k->decay : 1.0f;
    /* add_(eps) on a bf16 tensor adds eps as a bf16 number: a Scalar operand of
     * add takes the tensor's dtype (mul and div keep theirs in float) */
    const float eps = ckp_bf16_round(k->eps);
    int64_t i = lo;
    if (!k->amsgrad)
        i = ckp_lanes16() ? (k->fused ? adamw_bf16_loop16(param, grad, exp_avg, exp_avg_sq, i, hi, decay, eps, k, 1)
                                      : adamw_bf16_loop16(param, grad, exp_avg, exp_avg_sq, i, hi, decay, eps, k, 0))
                          : (k->fused ? adamw_bf16_loop8(param, grad, exp_avg, exp_avg_sq, i, hi, decay, eps, k, 1)
                                      : adamw_bf16_loop8(param, grad, exp_avg, exp_avg_sq, i, hi, decay, eps, k, 0));
    for (; i < hi; i++) {
        float g = k->sign * ckp_bf16_to_f(grad[i]);
        float p = ckp_bf16_round(ckp_bf16_to_f(param[i]) * decay);
        float m = ckp_bf16_round(lerp_vec(ckp_bf16_to_f(exp_avg[i]), g, k->w1, k->fused));
        float v = ckp_bf16_round(addcmul(ckp_bf16_round(ckp_bf16_to_f(exp_avg_sq[i]) * k->beta2), k->w2 * g, g,
                                         k->fused));
        float vmax = v;
        if (k->amsgrad) {
            vmax = ckp_bf16_to_f(max_exp_avg_sq[i]);
            vmax = (v > vmax || v != v) ? v : vmax; /* torch.maximum propagates NaN */
            max_exp_avg_sq[i] = ckp_f_to_bf16(vmax);
        }
        float denom = ckp_bf16_round(ckp_bf16_round(ckp_bf16_round(sqrtf(vmax)) / k->bc2_sqrt) + eps);
        param[i] = ckp_f_to_bf16(p + (k->neg_step_size * m) / denom);
        exp_avg[i] = ckp_f_to_bf16(m);
        exp_avg_sq[i] = ckp_f_to_bf16(v);
    }
}

/* ---- fused=True ---------------------------------------------------------------- */

/* Where torch's fused build contracts exp_avg_sq's update, by the element's
 * place (see the file's comment): [0, vector_end) the vector loop's form,
 * [vector_end, n) the scalar tail's. */
typedef struct {
    int64_t vector_end;
    float bc2_sqrt, eps; /* sqrt() of the double, and eps in float (not rounded to the storage dtype) */
} fused_layout;

enum { FORM_NONE, FORM_VECTOR, FORM_SCALAR }; /* DEFAULT's, the vector loop's, the scalar tail's (above) */

/* One run of elements of one form; elem, form and amsgrad are constants at
 * each call (adamw_fused_range), so every instance is a plain loop the
 * compiler vectorizes. */
static inline __attribute__((always_inline)) void fused_run(void *restrict param, const void *restrict grad,
                                                            void *restrict exp_avg, void *restrict exp_avg_sq,
                                                            void *restrict max_exp_avg_sq, int64_t lo, int64_t hi,
                                                            const adamw_scalars *k, const fused_layout *f,
                                                            size_t elem, int form, int amsgrad) {
    const float decay = k->decays ? k->decay : 1.0f, w1 = k->w1, beta2 = k->beta2, w2 = k->w2;
    const float neg_step_size = k->neg_step_size, bc2_sqrt = f->bc2_sqrt, eps = f->eps, sign = k->sign;
    for (int64_t i = lo; i < hi; i++) {
        float g = sign * ckp_elem_load(grad, i, elem);
        float p = ckp_elem_load(param, i, elem) * decay;
        float m = lerp_vec(ckp_elem_load(exp_avg, i, elem), g, w1, form != FORM_NONE);
        float v0 = ckp_elem_load(exp_avg_sq, i, elem), w2g = w2 * g;
        float v = form == FORM_NONE ? v0 * beta2 + w2g * g
                : form == FORM_VECTOR || CKP_MUTANT(ADAMW_FUSED_TAIL_AS_VECTOR) ? fmaf(w2g, g, v0 * beta2)
                : fmaf(v0, beta2, w2g * g);
        float vmax = v;
        if (amsgrad) {
            vmax = ckp_elem_load(max_exp_avg_sq, i, elem);
            vmax = (v > vmax || v != v) ? v : vmax; /* Vectorized maximum propagates NaN */
            ckp_elem_store(max_exp_avg_sq, i, vmax, elem);
        }
        float denom = CKP_MUTANT(ADAMW_FUSED_BC2_UNDER_SQRT) ? sqrtf(vmax / (bc2_sqrt * bc2_sqrt)) + eps
                                                            : sqrtf(vmax) / bc2_sqrt + eps;
        ckp_elem_store(param, i, p + (neg_step_size * m) / denom, elem);
        ckp_elem_store(exp_avg, i, m, elem);
        ckp_elem_store(exp_avg_sq, i, v, elem);
    }
}

#define FUSED_RUN(lo, hi, elem, form)                                                                          \
    (k->amsgrad ? fused_run(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, k, f, elem, form, 1)   \
                : fused_run(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, k, f, elem, form, 0))

CKP_CLONES
static void adamw_fused_range(void *restrict param, const void *restrict grad, void *restrict exp_avg,
                              void *restrict exp_avg_sq, void *restrict max_exp_avg_sq, int64_t lo, int64_t hi,
                              const adamw_scalars *k, const fused_layout *f, size_t elem) {
    int64_t mid = f->vector_end < lo ? lo : f->vector_end > hi ? hi : f->vector_end;
    if (elem == sizeof(float)) {
        if (!k->fused) {
            FUSED_RUN(lo, hi, sizeof(float), FORM_NONE);
        } else {
            FUSED_RUN(lo, mid, sizeof(float), FORM_VECTOR);
            FUSED_RUN(mid, hi, sizeof(float), FORM_SCALAR);
        }
    } else if (!k->fused) {
        FUSED_RUN(lo, hi, sizeof(uint16_t), FORM_NONE);
    } else {
        FUSED_RUN(lo, mid, sizeof(uint16_t), FORM_VECTOR);
        FUSED_RUN(mid, hi, sizeof(uint16_t), FORM_SCALAR);
    }
}
#undef FUSED_RUN

/* The first element of the scalar tail of n elements of elem bytes at the
 * running capability (see the file's comment). */
static int64_t fused_vector_end(int64_t n, size_t elem) {
    int capability = ckp_get_capability();
    int64_t lanes = (capability == CKP_CAPABILITY_AVX512 ? 64 : 32) / (int64_t)elem;
    int64_t body = n - n % lanes, tail = n % lanes;
    int64_t vectorized_tail = capability == CKP_CAPABILITY_AVX512 ? 32 / (int64_t)elem : 0;
    return body + (vectorized_tail && tail >= vectorized_tail ? vectorized_tail : 0);
}

static ckp_status adamw_step(void *param, const void *grad, void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
                             int64_t n, double step, const ckp_adamw_options *opt, size_t elem);

ckp_status ckp_adamw_step(float *param, const float *grad, float *exp_avg, float *exp_avg_sq,
                          float *max_exp_avg_sq, int64_t n, double step,
                          const ckp_adamw_options *opt) {
    return adamw_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, step, opt, sizeof(float));
}

ckp_status ckp_adamw_step_bf16(uint16_t *param, const uint16_t *grad, uint16_t *exp_avg, uint16_t *exp_avg_sq,
                               uint16_t *max_exp_avg_sq, int64_t n, double step, const ckp_adamw_options *opt) {
    return adamw_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, step, opt, sizeof(uint16_t));
}

/* elem: 4 (float) or 2 (bf16) bytes per element. */
static ckp_status adamw_step(void *param, const void *grad, void *exp_avg, void *exp_avg_sq, void *max_exp_avg_sq,
                             int64_t n, double step, const ckp_adamw_options *opt, size_t elem) {
    if (param == NULL || grad == NULL || exp_avg == NULL || exp_avg_sq == NULL || opt == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "param, grad, exp_avg, exp_avg_sq and options must not be NULL");
    if (opt->amsgrad && max_exp_avg_sq == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "amsgrad needs max_exp_avg_sq");
    if (n <= 0) return ckp_fail(CKP_ERR_BAD_SIZE, "n must be positive, got %lld", (long long)n);
    ckp_status s = check_options(opt, step);
    if (s != CKP_OK) return s;
    size_t bytes = (size_t)n * elem;
    const void *buffers[] = {param, grad, exp_avg, exp_avg_sq, opt->amsgrad ? max_exp_avg_sq : NULL};
    for (int a = 0; a < 5; a++)
        for (int b = a + 1; b < 5; b++)
            if (buffers[a] && buffers[b] && ckp_overlaps(buffers[a], bytes, buffers[b], bytes))
                return ckp_fail(CKP_ERR_ALIASING, "param, grad and the moments must not overlap");
    ckp_clear_error();

    const float decay = (float)(1.0 - opt->lr * opt->weight_decay);
    const int decays = opt->weight_decay != 0.0;
    const float w1 = (float)(1.0 - opt->beta1);
    const float beta2 = (float)opt->beta2, w2 = (float)(1.0 - opt->beta2);
    double bias_correction1 = 1.0 - pow(opt->beta1, step);
    double bias_correction2 = 1.0 - pow(opt->beta2, step);
    if (CKP_MUTANT(ADAMW_BIAS_CORRECTION_FLOAT)) {
        bias_correction1 = 1.0f - powf((float)opt->beta1, (float)step);
        bias_correction2 = 1.0f - powf((float)opt->beta2, (float)step);
    }
    if (CKP_MUTANT(ADAMW_NO_BIAS_CORRECTION)) bias_correction1 = bias_correction2 = 1.0;
    const float neg_step_size = (float)-(opt->lr / bias_correction1);
    const float bc2_sqrt = (float)pow(bias_correction2, 0.5);
    const float eps = (float)opt->eps;
    const float sign = opt->maximize ? -1.0f : 1.0f;

    const adamw_scalars k = {decay, w1, beta2, w2, neg_step_size, bc2_sqrt, eps, sign, (float)opt->weight_decay,
                             decays, opt->amsgrad, ckp_get_capability() != CKP_CAPABILITY_DEFAULT};
    const fused_layout f = {fused_vector_end(n, elem), (float)sqrt(bias_correction2), (float)opt->eps};
    const int64_t chunk = 1 << 16, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * chunk, hi = c * chunk + chunk < n ? c * chunk + chunk : n;
        if (opt->fused)
            adamw_fused_range(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, &k, &f, elem);
        else if (elem == sizeof(float))
            adamw_range(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, &k);
        else
            adamw_range_bf16(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, lo, hi, &k);
    }
    return CKP_OK;
}
