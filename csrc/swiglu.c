/*
 * swiglu.c — SwiGLU: x is (N, 2H), gate g = x[:, :H], up u = x[:, H:],
 *   out = silu(g) * u,  silu(g) = g / (1 + exp(-g))   (F.silu, Activation.cpp)
 * Backward (torch's silu_backward, then the product rule):
 *   s = sigmoid(g) = 1 / (1 + exp(-g))
 *   dg = dout * u * s * (1 + g * (1 - s)),   du = dout * silu(g)
 * Each element is evaluated in double and rounded once, so the result is at
 * least as accurate as torch's float evaluation. exp(-g) overflowing to inf
 * (g < -88) gives silu = -0 and s = 0 exactly as in torch: no NaN for any
 * finite gate.
 */
#include "ckp_internal.h"

#include <math.h>

static ckp_status check_args(const void *a, const void *b, int64_t N, int64_t H) {
    if (a == NULL || b == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "a tensor argument is NULL");
    if (N <= 0 || H <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and H must be positive, got N=%lld H=%lld",
                        (long long)N, (long long)H);
    if (N > INT64_MAX / (2 * H))
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*2H overflows: N=%lld H=%lld", (long long)N, (long long)H);
    return CKP_OK;
}

ckp_status ckp_swiglu_forward(const float *x, int64_t N, int64_t H, float *out) {
    ckp_status s = check_args(x, out, N, H);
    if (s != CKP_OK) return s;
    if (ckp_overlaps(out, (size_t)(N * H) * sizeof(float), x, (size_t)(N * 2 * H) * sizeof(float)))
        return ckp_fail(CKP_ERR_ALIASING, "out overlaps x");
    ckp_clear_error();
    /* x (N, 2H), out (N, H) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * H >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *gate = x + i * 2 * H, *up = gate + H;
        for (int64_t j = 0; j < H; j++) {
            double g = gate[j];
            out[i * H + j] = (float)(g / (1.0 + exp(-g)) * (double)up[j]);
        }
    }
    return CKP_OK;
}

ckp_status ckp_swiglu_backward(const float *dout, const float *x, int64_t N, int64_t H, float *dx) {
    ckp_status s = check_args(dout, x, N, H);
    if (s != CKP_OK) return s;
    if (dx == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "dx is NULL");
    size_t x_bytes = (size_t)(N * 2 * H) * sizeof(float);
    if (ckp_overlaps(dx, x_bytes, x, x_bytes) ||
        ckp_overlaps(dx, x_bytes, dout, (size_t)(N * H) * sizeof(float)))
        return ckp_fail(CKP_ERR_ALIASING, "dx overlaps x or dout");
    ckp_clear_error();
    /* dout (N, H), x (N, 2H), dx (N, 2H) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * H >= 32768)
    for (int64_t i = 0; i < N; i++) {
        const float *gate = x + i * 2 * H, *up = gate + H, *dy = dout + i * H;
        float *dgate = dx + i * 2 * H, *dup = dgate + H;
        for (int64_t j = 0; j < H; j++) {
            double g = gate[j], one_plus = 1.0 + exp(-g), sig = 1.0 / one_plus;
            dgate[j] = (float)((double)dy[j] * (double)up[j] * sig * (1.0 + g * (1.0 - sig)));
            dup[j] = (float)((double)dy[j] * (g / one_plus));
        }
    }
    return CKP_OK;
}
