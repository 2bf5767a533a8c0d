/*
 * rope.c — rotary position embedding, forward and backward, in the two layouts
 * people use. x is (N, T, d) (N = batch x heads), cos and sin are (T, d/2): one
 * angle per position and frequency. With h = d/2 and c, s = cos, sin[t, i]:
 *
 *   half (rotate-half, as in Llama; the torch formulation
 *   x * cat(cos, cos) + rotate_half(x) * cat(sin, sin), rotate_half(x) = cat(-x2, x1)):
 *     out[i]     = x[i] * c - x[i+h] * s          dx[i]     = g[i] * c + g[i+h] * s
 *     out[i+h]   = x[i+h] * c + x[i] * s          dx[i+h]   = g[i+h] * c - g[i] * s
 *   interleaved (pairs (x[2i], x[2i+1]); the torch formulation
 *   stack(x1 * cos - x2 * sin, x2 * cos + x1 * sin, -1).flatten(-2), x1, x2 = x[..., 0::2], x[..., 1::2]):
 *     out[2i]    = x[2i] * c - x[2i+1] * s        dx[2i]    = g[2i] * c + g[2i+1] * s
 *     out[2i+1]  = x[2i+1] * c + x[2i] * s        dx[2i+1]  = g[2i+1] * c - g[2i] * s
 *
 * Each element is two rounded products and one rounded sum, as torch computes
 * it (adding -(b*s) is subtracting b*s, exactly); the backward's two terms are
 * the gradients autograd adds for x's two uses (reference: ckparity.reference.rope
 * and its autograd). No sums across elements: any thread split gives the same bits.
 *
 * bfloat16 (x, cos, sin and out all bf16, as torch's ops on bf16 tensors):
 * every op rounds its result to bf16 -- each product, then the sum (in float,
 * then rounded): out[i] = bf16(bf16(x[i] * c) - bf16(x[i+h] * s)), and the
 * backward's two gradient terms are rounded each before autograd adds them.
 * float16 (the _f16 entry points): the same, each op rounding to float16, as torch's Half ops do.
 */
#include "ckp_internal.h"
#include "vec.h"

/* elem: the bytes of one element (4: float, 2: bf16 or float16) */
static ckp_status check_args(const void *x, const void *cos_, const void *sin_, const void *out, int64_t N,
                             int64_t T, int64_t d, int layout, size_t elem) {
    if (x == NULL || cos_ == NULL || sin_ == NULL || out == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, cos, sin and out must not be NULL");
    if (N <= 0 || T <= 0 || d <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N, T and d must be positive, got N=%lld T=%lld d=%lld", (long long)N,
                        (long long)T, (long long)d);
    if (d % 2 != 0) return ckp_fail(CKP_ERR_BAD_SIZE, "the head dim d must be even, got %lld", (long long)d);
    if (N > INT64_MAX / T / d)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*T*d overflows: N=%lld T=%lld d=%lld", (long long)N, (long long)T,
                        (long long)d);
    if (layout != CKP_ROPE_HALF && layout != CKP_ROPE_INTERLEAVED)
        return ckp_fail(CKP_ERR_BAD_OPTION, "layout must be 0 (half) or 1 (interleaved), got %d", layout);
    size_t bytes = (size_t)(N * T * d) * elem, table = (size_t)(T * d / 2) * elem;
    if (ckp_overlaps(out, bytes, x, bytes) || ckp_overlaps(out, bytes, cos_, table) ||
        ckp_overlaps(out, bytes, sin_, table))
        return ckp_fail(CKP_ERR_ALIASING, "the output overlaps an input");
    ckp_clear_error();
    return CKP_OK;
}

/* sign = -1: the forward rotation; +1: its transpose (the backward). */
CKP_CLONES static void rotate_row(const float *x, const float *c, const float *s, int64_t d, int layout, float sign,
                                  float *out) {
    int64_t h = d / 2, pairs = h;
    if (CKP_MUTANT(ROPE_BACKWARD_NOT_TRANSPOSED)) sign = -1.0f;
    if (CKP_MUTANT(ROPE_LAST_PAIR_SKIPPED) && h > 1) { /* the last pair copied through, not rotated */
        pairs = h - 1;
        int64_t a = layout == CKP_ROPE_HALF ? h - 1 : d - 2, b = d - 1;
        out[a] = x[a];
        out[b] = x[b];
    }
    if (layout == CKP_ROPE_HALF) {
        for (int64_t i = 0; i < pairs; i++) {
            out[i] = x[i] * c[i] + sign * (x[i + h] * s[i]);
            out[i + h] = x[i + h] * c[i] - sign * (x[i] * s[i]);
        }
    } else {
        for (int64_t i = 0; i < pairs; i++) {
            out[2 * i] = x[2 * i] * c[i] + sign * (x[2 * i + 1] * s[i]);
            out[2 * i + 1] = x[2 * i + 1] * c[i] - sign * (x[2 * i] * s[i]);
        }
    }
}

/* rotate_row in a 16-bit format F (bf16, f16: vec.h's ckp_<F>_ helpers): every product rounded, then
 * the sum; N pairs a vector (8, or 16 on an AVX512 capability: ckp_lanes16; elementwise, so the same
 * bits as one at a time), the last ones alone. The interleaved layout splits 2N values into the pairs'
 * halves and joins the results back (the index lists below). */
#define ROPE_EVEN8 0, 2, 4, 6, 8, 10, 12, 14
#define ROPE_ODD8 1, 3, 5, 7, 9, 11, 13, 15
#define ROPE_JOIN_LO8 0, 8, 1, 9, 2, 10, 3, 11
#define ROPE_JOIN_HI8 4, 12, 5, 13, 6, 14, 7, 15
#define ROPE_EVEN16 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define ROPE_ODD16 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31
#define ROPE_JOIN_LO16 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23
#define ROPE_JOIN_HI16 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31

#define ROPE_DEFINE_HALF_LOOPS(F, N, EVEN, ODD, JOIN_LO, JOIN_HI)                                                   \
    /* one rotated pair's two outputs, each the rounded sum of two rounded products */                              \
    static inline __attribute__((always_inline)) void rotate_pair_##F##N(ckp_v##N##f xa, ckp_v##N##f xb,            \
                                                                         ckp_v##N##f ci, ckp_v##N##f si,            \
                                                                         float sign, uint16_t *oa, uint16_t *ob,    \
                                                                         int interleaved) {                         \
        ckp_v##N##f a = ckp_##F##_round##N(xa * ci) + sign * ckp_##F##_round##N(xb * si);                           \
        ckp_v##N##f b = ckp_##F##_round##N(xb * ci) - sign * ckp_##F##_round##N(xa * si);                           \
        if (!interleaved) {                                                                                         \
            ckp_##F##_store##N(oa, a);                                                                              \
            ckp_##F##_store##N(ob, b);                                                                              \
        } else { /* joined back into pairs: oa the first N values, ob the next */                                   \
            ckp_##F##_store##N(oa, __builtin_shufflevector(a, b, JOIN_LO));                                         \
            ckp_##F##_store##N(ob, __builtin_shufflevector(a, b, JOIN_HI));                                         \
        }                                                                                                           \
    }                                                                                                               \
    /* the pairs from 0 while N of them fit; returns the first pair left */                                         \
    static inline __attribute__((always_inline)) int64_t rotate_pairs_##F##N(const uint16_t *x, const uint16_t *c,  \
                                                                              const uint16_t *s, int64_t h,         \
                                                                              int layout, float sign, uint16_t *out) { \
        int64_t i = 0;                                                                                              \
        if (layout == CKP_ROPE_HALF) {                                                                              \
            for (; i + N <= h; i += N)                                                                              \
                rotate_pair_##F##N(ckp_##F##_load##N(x + i), ckp_##F##_load##N(x + h + i), ckp_##F##_load##N(c + i), \
                                   ckp_##F##_load##N(s + i), sign, out + i, out + h + i, 0);                        \
            return i;                                                                                               \
        }                                                                                                           \
        for (; i + N <= h; i += N) { /* pairs (x[2i], x[2i+1]): 2N values split into the pairs' halves */           \
            ckp_v##N##f lo = ckp_##F##_load##N(x + 2 * i), hi = ckp_##F##_load##N(x + 2 * i + N);                   \
            rotate_pair_##F##N(__builtin_shufflevector(lo, hi, EVEN), __builtin_shufflevector(lo, hi, ODD),         \
                               ckp_##F##_load##N(c + i), ckp_##F##_load##N(s + i), sign, out + 2 * i,               \
                               out + 2 * i + N, 1);                                                                 \
        }                                                                                                           \
        return i;                                                                                                   \
    }                                                                                                               \

ROPE_DEFINE_HALF_LOOPS(bf16, 8, ROPE_EVEN8, ROPE_ODD8, ROPE_JOIN_LO8, ROPE_JOIN_HI8)
ROPE_DEFINE_HALF_LOOPS(bf16, 16, ROPE_EVEN16, ROPE_ODD16, ROPE_JOIN_LO16, ROPE_JOIN_HI16)
ROPE_DEFINE_HALF_LOOPS(f16, 8, ROPE_EVEN8, ROPE_ODD8, ROPE_JOIN_LO8, ROPE_JOIN_HI8)
ROPE_DEFINE_HALF_LOOPS(f16, 16, ROPE_EVEN16, ROPE_ODD16, ROPE_JOIN_LO16, ROPE_JOIN_HI16)

#define ROPE_DEFINE_HALF_ROW(F)                                                                                     \
    CKP_CLONES static void rotate_row_##F(const uint16_t *x, const uint16_t *c, const uint16_t *s, int64_t d,       \
                                          int layout, float sign, uint16_t *out) {                                  \
        int64_t h = d / 2;                                                                                          \
        int64_t i = ckp_lanes16() ? rotate_pairs_##F##16(x, c, s, h, layout, sign, out)                             \
                                  : rotate_pairs_##F##8(x, c, s, h, layout, sign, out);                             \
        int64_t lo_step = layout == CKP_ROPE_HALF ? 1 : 2, hi_offset = layout == CKP_ROPE_HALF ? h : 1;             \
        for (; i < h; i++) {                                                                                        \
            int64_t a = i * lo_step, b = a + hi_offset;                                                             \
            float xa = ckp_##F##_to_f(x[a]), xb = ckp_##F##_to_f(x[b]);                                             \
            float ci = ckp_##F##_to_f(c[i]), si = ckp_##F##_to_f(s[i]);                                             \
            out[a] = ckp_f_to_##F(ckp_##F##_round(xa * ci) + sign * ckp_##F##_round(xb * si));                      \
            out[b] = ckp_f_to_##F(ckp_##F##_round(xb * ci) - sign * ckp_##F##_round(xa * si));                      \
        }                                                                                                           \
    }                                                                                                               \

ROPE_DEFINE_HALF_ROW(bf16)
ROPE_DEFINE_HALF_ROW(f16)

/* The rows as rotate_row or rotate_row_<F> does them; elem (vec.h): sizeof(float), sizeof(uint16_t) (bf16)
 * or CKP_ELEM_F16. */
static ckp_status rotate(const void *x, const void *cos_, const void *sin_, int64_t N, int64_t T, int64_t d,
                         int layout, float sign, void *out, size_t elem) {
    ckp_status status = check_args(x, cos_, sin_, out, N, T, d, layout, ckp_elem_bytes(elem));
    if (status != CKP_OK) return status;
    /* x and out (N, T, d); cos and sin (T, d/2) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * T * d >= 32768)
    for (int64_t row = 0; row < N * T; row++) {
        int64_t t = row % T, at = row * d, table = t * (d / 2);
        if (elem == sizeof(float)) {
            rotate_row((const float *)x + at, (const float *)cos_ + table, (const float *)sin_ + table, d, layout,
                       sign, (float *)out + at);
            continue;
        }
        const uint16_t *xr = (const uint16_t *)x + at, *c = (const uint16_t *)cos_ + table;
        const uint16_t *s = (const uint16_t *)sin_ + table;
        if (elem == sizeof(uint16_t))
            rotate_row_bf16(xr, c, s, d, layout, sign, (uint16_t *)out + at);
        else
            rotate_row_f16(xr, c, s, d, layout, sign, (uint16_t *)out + at);
    }
    return CKP_OK;
}

ckp_status ckp_rope_forward(const float *x, const float *cos_, const float *sin_, int64_t N, int64_t T, int64_t d,
                            int layout, float *out) {
    return rotate(x, cos_, sin_, N, T, d, layout, -1.0f, out, sizeof(float));
}

ckp_status ckp_rope_backward(const float *dout, const float *cos_, const float *sin_, int64_t N, int64_t T,
                             int64_t d, int layout, float *dx) {
    return rotate(dout, cos_, sin_, N, T, d, layout, 1.0f, dx, sizeof(float));
}

ckp_status ckp_rope_forward_bf16(const uint16_t *x, const uint16_t *cos_, const uint16_t *sin_, int64_t N, int64_t T,
                                 int64_t d, int layout, uint16_t *out) {
    return rotate(x, cos_, sin_, N, T, d, layout, -1.0f, out, sizeof(uint16_t));
}

ckp_status ckp_rope_backward_bf16(const uint16_t *dout, const uint16_t *cos_, const uint16_t *sin_, int64_t N,
                                  int64_t T, int64_t d, int layout, uint16_t *dx) {
    return rotate(dout, cos_, sin_, N, T, d, layout, 1.0f, dx, sizeof(uint16_t));
}

ckp_status ckp_rope_forward_f16(const uint16_t *x, const uint16_t *cos_, const uint16_t *sin_, int64_t N, int64_t T,
                                int64_t d, int layout, uint16_t *out) {
    return rotate(x, cos_, sin_, N, T, d, layout, -1.0f, out, CKP_ELEM_F16);
}

ckp_status ckp_rope_backward_f16(const uint16_t *dout, const uint16_t *cos_, const uint16_t *sin_, int64_t N,
                                 int64_t T, int64_t d, int layout, uint16_t *dx) {
    return rotate(dout, cos_, sin_, N, T, d, layout, 1.0f, dx, CKP_ELEM_F16);
}
