/*
 * swiglu.c — SwiGLU: x is (N, 2H), gate g = x[:, :H], up u = x[:, H:],
 *   out = silu(g) * u,  silu(g) = g / (1 + exp(-g))   (F.silu, Activation.cpp)
 * Backward (autograd's MulBackward0, then silu_backward):
 *   s = sigmoid(g) = 1 / (1 + exp(-g))
 *   dg = ((dout * u) * s) * (g * (1 - s) + 1),   du = dout * silu(g)
 *
 * Every element repeats torch's float operations in torch's order, with
 * torch's exp, at the CPU capability torch runs at (ckp_get_capability):
 * - AVX512 and AVX2: ATen's cpu_kernel_vec evaluates exp(-g) with
 *   Vectorized<float>::exp (SLEEF's expf_u10, the same algorithm and FMA form
 *   at both widths) on whole vector pairs from the start of each row -- 32
 *   floats at a time with AVX-512, 16 with AVX2 -- and with the C library's
 *   expf on the rest of the row. Those builds have FMA and GCC contracts
 *   g * (1 - s) + 1 into one (measured: without it a fifth of dg differs).
 * - DEFAULT: Vectorized<float> is lane arrays whose exp is libm's expf per
 *   lane, and the build has no FMA: every element is plain scalar arithmetic.
 * So out, dg and du are bit-identical to F.silu(g) * u and its backward
 * (tests/test_swiglu.py, tests/test_capability.py) -- when torch runs a row in
 * one piece, as it does single-threaded or when its thread split falls on a
 * multiple of the vector pair within the row.
 * exp(-g) overflowing (g < -100) gives silu = -0 and s = 0, as in torch.
 * dg and du add +0 to their stored value (in bf16 after rounding): torch's dx
 * is the two slices' gradients, each padded with zeros, added by autograd, so
 * a -0 (dout * -0, or a tiny negative rounded) reaches dx as +0.
 *
 * bfloat16 (the _bf16 entry points): torch runs F.silu(g) * u on bf16 tensors
 * as two ops, each computing in float and rounding its result to bf16, and
 * autograd's backward as bf16 ops too:
 *   out = bf16(bf16(silu(g)) * u)
 *   dsilu = bf16(dout * u),  du = bf16(dout * bf16(silu(g))),
 *   dg = bf16(dsilu * s * (g * (1 - s) + 1))   (silu_backward, in float)
 * (a product of two bf16 values is exact in float: the multiplies round once).
 * silu and silu_backward on bf16 step their vectorized loop over two
 * Vectorized<BFloat16> -- 64 values at AVX-512, 32 at AVX2, twice the float
 * loop's -- each converted to two float vectors and evaluated as above; the
 * rest of the row is scalar, with libm's expf.
 * float16 (the _f16 entry points): torch's Half runs the same code as its BFloat16 (both reduced
 * floating types: float math, a rounding where each op stores), so the same rows with float16's
 * rounding (a product of two float16 values is exact in float too).
 */
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>

static ckp_status check_args(const void *a, const void *b, int64_t N, int64_t H) {
    if (a == NULL || b == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "a tensor argument is NULL");
    if (N <= 0 || H <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and H must be positive, got N=%lld H=%lld",
                        (long long)N, (long long)H);
    if (H > INT64_MAX / 2 || N > INT64_MAX / (2 * H))
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*2H overflows: N=%lld H=%lld", (long long)N, (long long)H);
    return CKP_OK;
}

/* One row of the forward: out = silu(g) * u. */
CKP_CLONES
static void forward_row(const float *g, const float *u, int64_t H, ckp_aten_layout at, float *out) {
    int64_t vec_end = CKP_MUTANT(SWIGLU_LIBM_EXP) || at.vec_pair == 0 ? 0 : H - H % at.vec_pair, j = 0;
    for (; j < vec_end; j += CKP_VLANES) {
        ckp_v8f gv = ckp_load8(g + j);
        ckp_store8(out + j, gv / (1.0f + ckp_exp_sleef8(-gv)) * ckp_load8(u + j));
    }
    for (; j < H; j++) out[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
}

/* One row of the backward. */
CKP_CLONES
static void backward_row(const float *dy, const float *g, const float *u, int64_t H, ckp_aten_layout at, float *dg,
                         float *du) {
    int64_t vec_end = CKP_MUTANT(SWIGLU_LIBM_EXP) || at.vec_pair == 0 ? 0 : H - H % at.vec_pair, j = 0;
    for (; j < vec_end; j += CKP_VLANES) {
        ckp_v8f gv = ckp_load8(g + j), dyv = ckp_load8(dy + j);
        ckp_v8f one_plus = 1.0f + ckp_exp_sleef8(-gv);
        ckp_v8f sig = 1.0f / one_plus;
        ckp_v8f slope = CKP_MUTANT(SWIGLU_UNFUSED_SLOPE) ? gv * (1.0f - sig) + 1.0f
                                                        : ckp_fma8(gv, 1.0f - sig, ckp_splat8(1.0f));
        ckp_store8(dg + j, dyv * ckp_load8(u + j) * sig * slope + 0.0f);
        ckp_store8(du + j, dyv * (gv / one_plus) + 0.0f);
    }
    for (; j < H; j++) {
        float one_plus = 1.0f + expf(-g[j]), sig = 1.0f / one_plus;
        float slope = at.fma && !CKP_MUTANT(SWIGLU_UNFUSED_SLOPE) ? fmaf(g[j], 1.0f - sig, 1.0f)
                                                                  : g[j] * (1.0f - sig) + 1.0f;
        dg[j] = dy[j] * u[j] * sig * slope + 0.0f;
        du[j] = dy[j] * (g[j] / one_plus) + 0.0f;
    }
}

/* The 16-bit formats' rows (F: bf16 or f16, vec.h's ckp_<F>_ helpers), their vector loops over
 * [0, vec_end) at N lanes, 16 or 8 (ckp_lanes16). Elementwise: the width changes no bit. */
#define SWIGLU_DEFINE_HALF_LOOPS(F, N)                                                                      \
    static inline __attribute__((always_inline)) void forward_##F##_loop##N(                                \
        const uint16_t *g, const uint16_t *u, int64_t vec_end, uint16_t *out) {                             \
        for (int64_t j = 0; j < vec_end; j += N) {                                                          \
            ckp_v##N##f gv = ckp_##F##_load##N(g + j);                                                      \
            ckp_v##N##f silu = ckp_##F##_round##N(gv / (1.0f + ckp_exp_sleef##N(-gv)));                     \
            ckp_##F##_store##N(out + j, silu * ckp_##F##_load##N(u + j));                                   \
        }                                                                                                   \
    }                                                                                                       \
    static inline __attribute__((always_inline)) void backward_##F##_loop##N(                               \
        const uint16_t *dy, const uint16_t *g, const uint16_t *u, int64_t vec_end, uint16_t *dg,            \
        uint16_t *du) {                                                                                     \
        for (int64_t j = 0; j < vec_end; j += N) {                                                          \
            ckp_v##N##f gv = ckp_##F##_load##N(g + j), dyv = ckp_##F##_load##N(dy + j);                     \
            ckp_v##N##f one_plus = 1.0f + ckp_exp_sleef##N(-gv);                                            \
            ckp_v##N##f sig = 1.0f / one_plus;                                                              \
            ckp_v##N##f dsilu = ckp_##F##_round##N(dyv * ckp_##F##_load##N(u + j));                         \
            ckp_v##N##f slope = ckp_fma##N(gv, 1.0f - sig, ckp_splat##N(1.0f));                             \
            ckp_##F##_store##N(dg + j, ckp_##F##_round##N(dsilu * sig * slope) + 0.0f);                     \
            ckp_##F##_store##N(du + j, ckp_##F##_round##N(dyv * ckp_##F##_round##N(gv / one_plus)) + 0.0f); \
        }                                                                                                   \
    }                                                                                                       \

#define SWIGLU_DEFINE_HALF_ROWS(F)                                                                                  \
    /* One row of the forward. */                                                                                   \
    CKP_CLONES static void forward_row_##F(const uint16_t *g, const uint16_t *u, int64_t H, ckp_aten_layout at,         \
                                           uint16_t *out) {                                                         \
        int64_t vec_end = at.vec_pair == 0 ? 0 : H - H % (2 * at.vec_pair), j = vec_end;                            \
        if (ckp_lanes16())                                                                                          \
            forward_##F##_loop16(g, u, vec_end, out);                                                               \
        else                                                                                                        \
            forward_##F##_loop8(g, u, vec_end, out);                                                                \
        for (; j < H; j++) {                                                                                        \
            float gj = ckp_##F##_to_f(g[j]);                                                                        \
            out[j] = ckp_f_to_##F(ckp_##F##_round(gj / (1.0f + expf(-gj))) * ckp_##F##_to_f(u[j]));                 \
        }                                                                                                           \
    }                                                                                                               \
    /* One row of the backward. */                                                                                  \
    CKP_CLONES static void backward_row_##F(const uint16_t *dy, const uint16_t *g, const uint16_t *u, int64_t H,    \
                                            ckp_aten_layout at, uint16_t *dg, uint16_t *du) {                           \
        int64_t vec_end = at.vec_pair == 0 ? 0 : H - H % (2 * at.vec_pair), j = vec_end;                            \
        if (ckp_lanes16())                                                                                          \
            backward_##F##_loop16(dy, g, u, vec_end, dg, du);                                                       \
        else                                                                                                        \
            backward_##F##_loop8(dy, g, u, vec_end, dg, du);                                                        \
        for (; j < H; j++) {                                                                                        \
            float gj = ckp_##F##_to_f(g[j]), dyj = ckp_##F##_to_f(dy[j]);                                           \
            float one_plus = 1.0f + expf(-gj), sig = 1.0f / one_plus;                                               \
            float slope = at.fma ? fmaf(gj, 1.0f - sig, 1.0f) : gj * (1.0f - sig) + 1.0f;                           \
            dg[j] = ckp_f_to_##F(ckp_##F##_round(ckp_##F##_round(dyj * ckp_##F##_to_f(u[j])) * sig * slope) + 0.0f); \
            du[j] = ckp_f_to_##F(ckp_##F##_round(dyj * ckp_##F##_round(gj / one_plus)) + 0.0f);                     \
        }                                                                                                           \
    }                                                                                                               \

SWIGLU_DEFINE_HALF_LOOPS(bf16, 8)
SWIGLU_DEFINE_HALF_LOOPS(bf16, 16)
SWIGLU_DEFINE_HALF_LOOPS(f16, 8)
SWIGLU_DEFINE_HALF_LOOPS(f16, 16)
SWIGLU_DEFINE_HALF_ROWS(bf16)
SWIGLU_DEFINE_HALF_ROWS(f16)

/* elem: the entry point's element (vec.h): sizeof(float), sizeof(uint16_t) (bf16) or CKP_ELEM_F16. */
static ckp_status forward(const void *x, int64_t N, int64_t H, void *out, size_t elem) {
    ckp_status s = check_args(x, out, N, H);
    if (s != CKP_OK) return s;
    const size_t bytes = ckp_elem_bytes(elem);
    if (ckp_overlaps(out, (size_t)(N * H) * bytes, x, (size_t)(N * 2 * H) * bytes))
        return ckp_fail(CKP_ERR_ALIASING, "out overlaps x");
    ckp_clear_error();
    const ckp_aten_layout at = ckp_aten_layout_for_capability();
    /* x (N, 2H), out (N, H) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * H >= 32768)
    for (int64_t i = 0; i < N; i++) {
        if (elem == sizeof(float)) {
            forward_row((const float *)x + i * 2 * H, (const float *)x + i * 2 * H + H, H, at, (float *)out + i * H);
            continue;
        }
        const uint16_t *gate = (const uint16_t *)x + i * 2 * H;
        if (elem == sizeof(uint16_t))
            forward_row_bf16(gate, gate + H, H, at, (uint16_t *)out + i * H);
        else
            forward_row_f16(gate, gate + H, H, at, (uint16_t *)out + i * H);
    }
    return CKP_OK;
}

static ckp_status backward(const void *dout, const void *x, int64_t N, int64_t H, void *dx, size_t elem) {
    ckp_status s = check_args(dout, x, N, H);
    if (s != CKP_OK) return s;
    if (dx == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "dx is NULL");
    const size_t bytes = ckp_elem_bytes(elem), x_bytes = (size_t)(N * 2 * H) * bytes;
    if (ckp_overlaps(dx, x_bytes, x, x_bytes) || ckp_overlaps(dx, x_bytes, dout, (size_t)(N * H) * bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dx overlaps x or dout");
    ckp_clear_error();
    const ckp_aten_layout at = ckp_aten_layout_for_capability();
    /* dout (N, H), x (N, 2H), dx (N, 2H) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * H >= 32768)
    for (int64_t i = 0; i < N; i++) {
        if (elem != sizeof(float)) {
            const uint16_t *gate = (const uint16_t *)x + i * 2 * H, *dy = (const uint16_t *)dout + i * H;
            uint16_t *dgate = (uint16_t *)dx + i * 2 * H;
            if (elem == sizeof(uint16_t))
                backward_row_bf16(dy, gate, gate + H, H, at, dgate, dgate + H);
            else
                backward_row_f16(dy, gate, gate + H, H, at, dgate, dgate + H);
            continue;
        }
        const float *gate = (const float *)x + i * 2 * H;
        float *dgate = (float *)dx + i * 2 * H;
        if (CKP_MUTANT(SWIGLU_SWAP_BACKWARD))
            backward_row((const float *)dout + i * H, gate + H, gate, H, at, dgate + H, dgate);
        else
            backward_row((const float *)dout + i * H, gate, gate + H, H, at, dgate, dgate + H);
    }
    return CKP_OK;
}

ckp_status ckp_swiglu_forward(const float *x, int64_t N, int64_t H, float *out) {
    return forward(x, N, H, out, sizeof(float));
}

ckp_status ckp_swiglu_backward(const float *dout, const float *x, int64_t N, int64_t H, float *dx) {
    return backward(dout, x, N, H, dx, sizeof(float));
}

ckp_status ckp_swiglu_forward_bf16(const uint16_t *x, int64_t N, int64_t H, uint16_t *out) {
    return forward(x, N, H, out, sizeof(uint16_t));
}

ckp_status ckp_swiglu_backward_bf16(const uint16_t *dout, const uint16_t *x, int64_t N, int64_t H, uint16_t *dx) {
    return backward(dout, x, N, H, dx, sizeof(uint16_t));
}

ckp_status ckp_swiglu_forward_f16(const uint16_t *x, int64_t N, int64_t H, uint16_t *out) {
    return forward(x, N, H, out, CKP_ELEM_F16);
}

ckp_status ckp_swiglu_backward_f16(const uint16_t *dout, const uint16_t *x, int64_t N, int64_t H, uint16_t *dx) {
    return backward(dout, x, N, H, dx, CKP_ELEM_F16);
}
