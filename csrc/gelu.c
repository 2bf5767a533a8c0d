/*
 * gelu.c — GELU in its tanh form, F.gelu(x, approximate="tanh") (GPT-2's), as ATen's GeluKernelImpl and
 * GeluBackwardKernelImpl compute it (aten/src/ATen/native/cpu/Activation.cpp, Gelu.h):
 *   inner = beta * (x + kappa * x^3),  beta = float(sqrt(2) * 2/sqrt(pi) * 0.5),  kappa = 0.044715f
 *   y  = (0.5 * x) * (1 + tanh(inner))
 *   dx = dy * (0.5 * (1 + t) + ((0.5 * x) * (1 - t * t)) * (beta * (1 + 3 kappa x^2))),  t = tanh(inner)
 * (x^3 is (x * x) * x.) F.gelu's default form, erf, is gelu_erf.c (oneDNN's, where torch hands it).
 *
 * Every element repeats torch's float operations in torch's order, at the CPU capability torch runs at
 * (ckp_get_capability), and where torch's loop puts it:
 * - AVX512 and AVX2: cpu_kernel_vec runs whole vector pairs (32 floats at AVX-512, 16 at AVX2) from the
 *   start of each piece of the tensor with Vectorized<float>::tanh -- SLEEF's tanhf_u10: exp(|x|) in
 *   double-float (expk2f), (e - 1/e) / (e + 1/e) in double-float, 1 past |x| 8.664339742 -- and the rest
 *   of the piece with the C library's tanhf. Those builds have FMA and GCC contracts x + kappa * x^3,
 *   1 - t * t, 1 + 3 kappa * x^2 and the backward's last sum, in the vector code and the scalar code alike.
 * - DEFAULT: Vectorized<float> is lane arrays whose tanh is libm's per lane, and the build has no FMA:
 *   every element is the scalar code without contraction.
 * The pieces are torch's threads' (TensorIterator's for_each over at::parallel_for): the whole tensor
 * on one thread; with torch_threads T > 1, divup(n, k) elements a piece for k = min(T, divup(n, grain))
 * pieces, grain the forward's n / T once n > 16384 (GeluKernelImpl's own), the backward's 32768
 * (at::internal::GRAIN_SIZE), and one piece when n does not exceed the grain. So y and dx are torch's
 * bits at that thread count, whatever threads this library runs on (they split a piece into spans of
 * whole vector pairs: an element's arithmetic depends only on where its piece's vector pairs end).
 */
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>

#define KBETA ((float)(1.41421356237309504880 * 1.12837916709551257390 * 0.5)) /* float(M_SQRT2 * M_2_SQRTPI * 0.5) */
#define KKAPPA 0.044715f
#define FORWARD_MIN_ELEMENTS_FOR_THREADS 16384            /* GeluKernelImpl's GELU_MIN_ELEMENTS_FOR_MULTI_THREADING */
#define ATEN_GRAIN_SIZE 32768                             /* at::internal::GRAIN_SIZE */

/* The length of each of torch's pieces of n elements at torch_threads with the loop's grain. */
static int64_t piece_length(int64_t n, int torch_threads, int64_t grain) {
    if (torch_threads <= 1 || n <= grain) return n; /* for_each serial below the grain; parallel_for, at it */
    int64_t pieces = (n + grain - 1) / grain;
    if (pieces > torch_threads) pieces = torch_threads;
    return (n + pieces - 1) / pieces;
}

/* The vector code on N lanes (8, and 16 where the CPU runs AVX-512: gelu_wide), each lane the same operations:
 * SLEEF's double-float arithmetic, its tanh, and the tanh form's forward and backward. */
#define GELU_DEFINE_TANH(N, ATTR)                                                                                     \
/* SLEEF's double-float arithmetic (df.h, its FMA forms) on N lanes: a value hi + lo. */                              \
typedef struct {                                                                                                      \
    ckp_v##N##f hi, lo;                                                                                               \
} f2x##N;                                                                                                             \
                                                                                                                      \
ATTR static inline __attribute__((always_inline)) f2x##N df_add2_f##N(f2x##N x, ckp_v##N##f y) { /* dfadd2_vf2_vf2_vf */   \
    ckp_v##N##f s = x.hi + y, v = s - x.hi;                                                                           \
    return (f2x##N){s, ((x.hi - (s - v)) + (y - v)) + x.lo};                                                          \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_add2##N(f2x##N x, f2x##N y) { /* dfadd2_vf2_vf2_vf2 */         \
    ckp_v##N##f s = x.hi + y.hi, v = s - x.hi;                                                                        \
    return (f2x##N){s, ((x.hi - (s - v)) + (y.hi - v)) + (x.lo + y.lo)};                                              \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_add##N(f2x##N x, f2x##N y) { /* dfadd_vf2_vf2_vf2: |x| >= |y| */ \
    ckp_v##N##f s = x.hi + y.hi;                                                                                      \
    return (f2x##N){s, (((x.hi - s) + y.hi) + x.lo) + y.lo};                                                          \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_add_f_f2##N(ckp_v##N##f x, f2x##N y) { /* dfadd_vf2_vf_vf2 */  \
    ckp_v##N##f s = x + y.hi;                                                                                         \
    return (f2x##N){s, ((x - s) + y.hi) + y.lo};                                                                      \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_mul_f##N(f2x##N x, ckp_v##N##f y) { /* dfmul_vf2_vf2_vf */     \
    ckp_v##N##f s = x.hi * y;                                                                                         \
    return (f2x##N){s, ckp_fma##N(x.lo, y, ckp_fma##N(x.hi, y, -s))};                                                 \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_mul##N(f2x##N x, f2x##N y) { /* dfmul_vf2_vf2_vf2 */           \
    ckp_v##N##f s = x.hi * y.hi;                                                                                      \
    return (f2x##N){s, ckp_fma##N(x.hi, y.lo, ckp_fma##N(x.lo, y.hi, ckp_fma##N(x.hi, y.hi, -s)))};                   \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_squ##N(f2x##N x) { /* dfsqu_vf2_vf2 */                         \
    ckp_v##N##f s = x.hi * x.hi;                                                                                      \
    return (f2x##N){s, ckp_fma##N(x.hi + x.hi, x.lo, ckp_fma##N(x.hi, x.hi, -s))};                                    \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_rec##N(f2x##N d) { /* dfrec_vf2_vf2 */                         \
    ckp_v##N##f s = 1.0f / d.hi;                                                                                      \
    return (f2x##N){s, s * ckp_fma##N(-d.lo, s, ckp_fma##N(-d.hi, s, ckp_splat##N(1.0f)))};                           \
}                                                                                                                     \
ATTR static inline __attribute__((always_inline)) f2x##N df_div##N(f2x##N n, f2x##N d) { /* dfdiv_vf2_vf2_vf2 */           \
    ckp_v##N##f t = 1.0f / d.hi, s = n.hi * t;                                                                        \
    ckp_v##N##f u = ckp_fma##N(t, n.hi, -s), v = ckp_fma##N(-d.lo, t, ckp_fma##N(-d.hi, t, ckp_splat##N(1.0f)));      \
    return (f2x##N){s, ckp_fma##N(s, v, ckp_fma##N(n.lo, t, u))};                                                     \
}                                                                                                                     \
                                                                                                                      \
/* 2^q as a float, for q in [-126, 127] (SLEEF's vpow2i). */                                                          \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f pow2i##N(ckp_v##N##i q) { return (ckp_v##N##f)((q + 0x7f) << 23); } \
                                                                                                                      \
/* Vectorized<float>::tanh at AVX2 and AVX-512: SLEEF's xtanhf_u1 (Sleef_tanhf8_u10, Sleef_tanhf16_u10), lane         \
 * by lane in its FMA form. Lanes past 8.664339742 (or NaN) are 1 (then the sign) before any exp is taken:            \
 * their q is computed from 0 (a float past INT_MAX converted to int is undefined in C). */                           \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f tanh_sleef##N(ckp_v##N##f x) {                               \
    const ckp_v##N##u sign = (ckp_v##N##u)x & 0x80000000u;                                                            \
    const ckp_v##N##f ax = (ckp_v##N##f)((ckp_v##N##u)x ^ sign);                                                      \
    const ckp_v##N##i far = (ckp_v##N##i)(ax > 8.664339742f) | (ckp_v##N##i)(ax != ax);                               \
    const ckp_v##N##f y = ckp_select##N(far, ckp_splat##N(0.0f), ax);                                                 \
    /* expk2f((y, 0)) */                                                                                              \
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: y / ln2 <= 12.5 rounded to nearest even (vrint) */          \
    const ckp_v##N##f qf = (y * 1.442695040888963407359924681001892137426645954152985934135449406931f + round_magic) - \
                       round_magic;                                                                                   \
    const ckp_v##N##i q = __builtin_convertvector(qf, ckp_v##N##i);                                                   \
    f2x##N s = df_add2_f##N((f2x##N){y, ckp_splat##N(0.0f)}, qf * -0.693145751953125f);                               \
    s = df_add2_f##N(s, qf * -1.428606765330187045e-06f);                                                             \
    ckp_v##N##f u = ckp_fma##N(ckp_splat##N(0.1980960224e-3f), s.hi, ckp_splat##N(0.1394256484e-2f));                 \
    u = ckp_fma##N(u, s.hi, ckp_splat##N(0.8333456703e-2f));                                                          \
    u = ckp_fma##N(u, s.hi, ckp_splat##N(0.4166637361e-1f));                                                          \
    f2x##N t = df_add2_f##N(df_mul_f##N(s, u), ckp_splat##N(0.166666659414234244790680580464e+0f));                   \
    t = df_add2_f##N(df_mul##N(s, t), ckp_splat##N(0.5f));                                                            \
    t = df_add2##N(s, df_mul##N(df_squ##N(s), t));                                                                    \
    t = df_add_f_f2##N(ckp_splat##N(1.0f), t);                                                                        \
    const ckp_v##N##i half = q >> 1; /* vldexp2: two multiplies by powers of two */                                   \
    t.hi = t.hi * pow2i##N(half) * pow2i##N(q - half);                                                                \
    t.lo = t.lo * pow2i##N(half) * pow2i##N(q - half);                                                                \
    /* (e - 1/e) / (e + 1/e) */                                                                                       \
    const f2x##N e = df_rec##N(t);                                                                                    \
    const f2x##N d = df_div##N(df_add##N(t, (f2x##N){-e.hi, -e.lo}), df_add##N(t, e));                                \
    ckp_v##N##f r = d.hi + d.lo;                                                                                      \
    r = ckp_select##N(far | (ckp_v##N##i)(r != r), ckp_splat##N(1.0f), r);                                            \
    r = (ckp_v##N##f)((ckp_v##N##u)r ^ sign);                                                                         \
    const ckp_v##N##i nan = (ckp_v##N##i)(x != x);                                                                    \
    return ckp_select##N(nan, (ckp_v##N##f)nan, r); /* a NaN's lanes all ones, as SLEEF's or with the mask */         \
}                                                                                                                     \
                                                                                                                      \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f forward##N(ckp_v##N##f x) {                                  \
    return 0.5f * x * (1.0f + tanh_sleef##N(KBETA * ckp_fma##N(ckp_splat##N(KKAPPA), x * x * x, x)));                 \
}                                                                                                                     \
                                                                                                                      \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f backward##N(ckp_v##N##f x, ckp_v##N##f dy) {                 \
    ckp_v##N##f sq = x * x, t = tanh_sleef##N(KBETA * ckp_fma##N(ckp_splat##N(KKAPPA), sq * x, x));                   \
    ckp_v##N##f left = 0.5f * x, right = 1.0f + t;                                                                    \
    ckp_v##N##f tanh_slope = ckp_fma##N(-t, t, ckp_splat##N(1.0f));                                                   \
    ckp_v##N##f inner_slope = KBETA * ckp_fma##N(ckp_splat##N(3.0f * KKAPPA), sq, ckp_splat##N(1.0f));                \
    return dy * ckp_fma##N(ckp_splat##N(0.5f), right, left * tanh_slope * inner_slope);                               \
}
#define AVX512_COPY __attribute__((target("arch=x86-64-v4")))
GELU_DEFINE_TANH(8, )
GELU_DEFINE_TANH(16, AVX512_COPY)

/* x + kappa * x^3 as the build computes it: contracted where it has FMA. */
/* The forward and the backward of one element (scalar code) and of 8 (vector code), in float. fma: the
 * build contracts x + kappa * x^3, 1 - t * t, 1 + 3 kappa * x^2 and the backward's last sum. */
static inline __attribute__((always_inline)) float forward1(float x, int fma) {
    float cube = x * x * x, inner = KBETA * (fma ? fmaf(KKAPPA, cube, x) : x + KKAPPA * cube);
    return 0.5f * x * (1.0f + tanhf(inner));
}

static inline __attribute__((always_inline)) float backward1(float x, float dy, int fma) {
    float sq = x * x, cube = sq * x;
    float t = tanhf(KBETA * (fma ? fmaf(KKAPPA, cube, x) : x + KKAPPA * cube));
    float left = 0.5f * x, right = 1.0f + t;
    float tanh_slope = fma ? fmaf(-t, t, 1.0f) : 1.0f - t * t;
    float inner_slope = KBETA * (fma ? fmaf(3.0f * KKAPPA, sq, 1.0f) : 1.0f + 3.0f * KKAPPA * sq);
    float right_slope = left * tanh_slope * inner_slope;
    return dy * (fma ? fmaf(0.5f, right, right_slope) : 0.5f * right + right_slope);
}

/* ---- the erf form as ATen computes it (Gelu.h's vectorized_gelu and scalar_gelu, GeluBackwardKernelImpl's) --
 * torch runs it where it does not hand the erf form to oneDNN (gelu_erf.c's Note): one element, oneDNN
 * disabled, bf16 below avx512_core. Vector code: Vectorized<float>::erf -- A&S 7.1.26 with SLEEF's expf_u10,
 * its FMAs as written --, y = (x * 0.5) * (1 + erf(x * float(1/sqrt 2))), dx = dy * fma(x, pdf, cdf) with
 * cdf = 0.5 * (1 + erf(.)), pdf = kBeta * exp((x * x) * -0.5); scalar code the same with libm's erff and expf
 * and cdf + x * pdf not contracted (both measured, at every capability). */
#define KALPHA_ERF ((float)0.70710678118654752440)                                  /* float(M_SQRT1_2) */
#define KBETA_ERF ((float)(1.12837916709551257390 * 0.70710678118654752440 * 0.5)) /* M_2_SQRTPI * M_SQRT1_2 / 2 */

/* The erf form's vector code on N lanes (as GELU_DEFINE_TANH's). */
#define GELU_DEFINE_ERF(N, ATTR)                                                                                      \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f erf_aten##N(ckp_v##N##f v) {                                 \
    const ckp_v##N##u sign = (ckp_v##N##u)v & 0x80000000u;                                                            \
    const ckp_v##N##f one = ckp_splat##N(1.0f), t = one / ckp_fma##N(ckp_splat##N(0.3275911f), (ckp_v##N##f)((ckp_v##N##u)v ^ sign), one); \
    ckp_v##N##f r = ckp_fma##N(ckp_splat##N(1.061405429f), t, ckp_splat##N(-1.453152027f));                           \
    r = ckp_fma##N(r, t, ckp_splat##N(1.421413741f));                                                                 \
    r = ckp_fma##N(r, t, ckp_splat##N(-0.284496736f));                                                                \
    r = ckp_fma##N(r, t, ckp_splat##N(0.254829592f));                                                                 \
    const ckp_v##N##f e = ckp_exp_sleef##N((ckp_v##N##f)((ckp_v##N##u)(v * v) ^ 0x80000000u));                        \
    return (ckp_v##N##f)((ckp_v##N##u)ckp_fma##N((ckp_v##N##f)((ckp_v##N##u)e ^ 0x80000000u) * t, r, one) ^ sign);    \
}                                                                                                                     \
                                                                                                                      \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f forward_erf##N(ckp_v##N##f x) {                              \
    return x * 0.5f * (1.0f + erf_aten##N(x * KALPHA_ERF));                                                           \
}                                                                                                                     \
                                                                                                                      \
ATTR static inline __attribute__((always_inline)) ckp_v##N##f backward_erf##N(ckp_v##N##f x, ckp_v##N##f dy) {             \
    const ckp_v##N##f cdf = 0.5f * (1.0f + erf_aten##N(x * KALPHA_ERF));                                              \
    const ckp_v##N##f pdf = KBETA_ERF * ckp_exp_sleef##N(x * x * -0.5f);                                              \
    return dy * ckp_fma##N(x, pdf, cdf);                                                                              \
}
GELU_DEFINE_ERF(8, )
GELU_DEFINE_ERF(16, AVX512_COPY)


static inline __attribute__((always_inline)) float forward_erf1(float x) { return x * 0.5f * (1.0f + erff(x * KALPHA_ERF)); }

static inline __attribute__((always_inline)) float backward_erf1(float x, float dy) {
    const float cdf = 0.5f * (1.0f + erff(x * KALPHA_ERF)), pdf = KBETA_ERF * expf(x * x * -0.5f);
    return dy * (cdf + x * pdf);
}

/* A span of a piece: its first vec_count elements (a multiple of 16) in ATen's vector code, the rest in its
 * scalar code; x and dy (NULL for the forward) are the span's, out its output. float32 and bfloat16 (torch's
 * BFloat16 GELU: the same float formula on the widened values, rounded to bf16 once, as it stores). NAME##_f32
 * and NAME##_bf16 on N-lane vectors under ATTR: 8 lanes in the clones, 16 in an AVX-512 copy (GCC 12 scalarizes
 * 16-lane comparisons in a target_clones function, not under a plain target attribute). F and B name the form's
 * vector forward and backward, F1 and B1 its scalar ones (tanh's take the build's contraction flag). */
#define GELU_DEFINE_SPANS(NAME, N, ATTR, F, B, F1, B1)                                                              \
    ATTR static void NAME##_f32(const void *x_, const void *dy_, int64_t count, int64_t vec_count,                  \
                                ckp_aten_layout at, void *out_) {                                                   \
        const float *x = x_, *dy = dy_;                                                                             \
        float *out = out_;                                                                                          \
        int64_t j = 0;                                                                                              \
        (void)at;                                                                                                   \
        for (; j < vec_count; j += N)                                                                               \
            ckp_elem_store##N(out, j, dy == NULL ? F(ckp_elem_load##N(x, j, sizeof(float)))                         \
                                                 : B(ckp_elem_load##N(x, j, sizeof(float)),                         \
                                                     ckp_elem_load##N(dy, j, sizeof(float))), sizeof(float));      \
        for (; j < count; j++) out[j] = dy == NULL ? F1(x[j]) : B1(x[j], dy[j]);                                    \
    }                                                                                                               \
    ATTR static void NAME##_bf16(const void *x_, const void *dy_, int64_t count, int64_t vec_count,                 \
                                 ckp_aten_layout at, void *out_) {                                                  \
        const uint16_t *x = x_, *dy = dy_;                                                                          \
        uint16_t *out = out_;                                                                                       \
        int64_t j = 0;                                                                                              \
        (void)at;                                                                                                   \
        for (; j < vec_count; j += N)                                                                               \
            ckp_bf16_store##N(out + j, dy == NULL ? F(ckp_bf16_load##N(x + j))                                      \
                                                  : B(ckp_bf16_load##N(x + j), ckp_bf16_load##N(dy + j)));          \
        for (; j < count; j++)                                                                                      \
            out[j] = ckp_f_to_bf16(dy == NULL ? F1(ckp_bf16_to_f(x[j]))                                            \
                                              : B1(ckp_bf16_to_f(x[j]), ckp_bf16_to_f(dy[j])));                    \
    }

#define TANH_F1(x) forward1(x, at.fma)
#define TANH_B1(x, dy) backward1(x, dy, at.fma)
GELU_DEFINE_SPANS(span_tanh, 8, CKP_CLONES, forward8, backward8, TANH_F1, TANH_B1)
GELU_DEFINE_SPANS(span_erf, 8, CKP_CLONES, forward_erf8, backward_erf8, forward_erf1, backward_erf1)
GELU_DEFINE_SPANS(span_tanh_wide, 16, AVX512_COPY, forward16, backward16, TANH_F1, TANH_B1)
GELU_DEFINE_SPANS(span_erf_wide, 16, AVX512_COPY, forward_erf16, backward_erf16, forward_erf1, backward_erf1)

/* Whether this CPU runs the 16-lane copies (x86-64-v4: AVX-512 F, BW, CD, DQ, VL). */
static int gelu_wide(void) { return __builtin_cpu_supports("x86-64-v4"); }

typedef void (*span_fn)(const void *, const void *, int64_t, int64_t, ckp_aten_layout, void *);

enum { SPAN = 8192 }; /* this library's threads take spans of a piece: a multiple of every vector pair */

/* torch's pieces of [0, n) of piece_len elements (elem bytes each), one after another; each split into spans
 * for this library's threads. dy is NULL for the forward. A bf16 vector pair is twice a float one: ATen's
 * loop steps two Vectorized<BFloat16>, each widened to two float vectors. */
static void run_pieces(span_fn fn, const void *x, const void *dy, int64_t n, int64_t piece_len, size_t elem,
                       void *out) {
    const ckp_aten_layout at = ckp_aten_layout_for_capability();
    const int64_t pair = elem == sizeof(float) ? at.vec_pair : 2 * at.vec_pair;
    for (int64_t start = 0; start < n; start += piece_len) {
        const int64_t count = n - start < piece_len ? n - start : piece_len;
        const int64_t vec_count = pair == 0 ? 0 : count - count % pair;
        const int64_t spans = (count + SPAN - 1) / SPAN;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (count >= 32768)
        for (int64_t k = 0; k < spans; k++) {
            const int64_t lo = k * SPAN, hi = count - lo < SPAN ? count : lo + SPAN;
            const int64_t vec = vec_count <= lo ? 0 : (vec_count >= hi ? hi - lo : vec_count - lo);
            const size_t at_ = (size_t)(start + lo) * elem;
            fn((const char *)x + at_, dy == NULL ? NULL : (const char *)dy + at_, hi - lo, vec, at,
               (char *)out + at_);
        }
    }
}

/* The span function of a form (erf 1, tanh 0) for elem-byte elements, 16 lanes where the CPU has them. */
static span_fn span_for(size_t elem, int erf) {
    if (gelu_wide())
        return elem == sizeof(float) ? (erf ? span_erf_wide_f32 : span_tanh_wide_f32)
                                     : (erf ? span_erf_wide_bf16 : span_tanh_wide_bf16);
    return elem == sizeof(float) ? (erf ? span_erf_f32 : span_tanh_f32) : (erf ? span_erf_bf16 : span_tanh_bf16);
}

static ckp_status check_args(const void *x, const void *dy, int has_dy, const void *out, int64_t n,
                             int torch_threads, size_t elem) {
    ckp_status s = ckp_check_elementwise(x, dy, has_dy, out, n, elem);
    if (s == CKP_OK && torch_threads < 1)
        return ckp_fail(CKP_ERR_BAD_SIZE, "torch_threads must be >= 1, got %d", torch_threads);
    return s;
}

/* The tanh form (erf 0) or ATen's erf form (erf 1): GeluKernelImpl's grain serves both. */
static ckp_status forward(const void *x, int64_t n, int torch_threads, void *y, size_t elem, int erf) {
    ckp_status s = check_args(x, NULL, 0, y, n, torch_threads, elem);
    if (s != CKP_OK) return s;
    ckp_clear_error();
    const int64_t grain = n > FORWARD_MIN_ELEMENTS_FOR_THREADS ? n / torch_threads : ATEN_GRAIN_SIZE;
    run_pieces(span_for(elem, erf), x, NULL, n, piece_length(n, torch_threads, grain), elem, y);
    return CKP_OK;
}

static ckp_status backward(const void *dy, const void *x, int64_t n, int torch_threads, void *dx, size_t elem,
                           int erf) {
    ckp_status s = check_args(x, dy, 1, dx, n, torch_threads, elem);
    if (s != CKP_OK) return s;
    ckp_clear_error();
    run_pieces(span_for(elem, erf), x, dy, n, piece_length(n, torch_threads, ATEN_GRAIN_SIZE), elem, dx);
    return CKP_OK;
}

ckp_status ckp_gelu_aten_erf_forward(const void *x, int64_t n, int torch_threads, void *y, size_t elem) {
    return forward(x, n, torch_threads, y, elem, 1);
}

ckp_status ckp_gelu_aten_erf_backward(const void *dy, const void *x, int64_t n, int torch_threads, void *dx,
                                      size_t elem) {
    return backward(dy, x, n, torch_threads, dx, elem, 1);
}

ckp_status ckp_gelu_forward(const float *x, int64_t n, int torch_threads, float *y) {
    return forward(x, n, torch_threads, y, sizeof(float), 0);
}

ckp_status ckp_gelu_backward(const float *dy, const float *x, int64_t n, int torch_threads, float *dx) {
    return backward(dy, x, n, torch_threads, dx, sizeof(float), 0);
}

ckp_status ckp_gelu_forward_bf16(const uint16_t *x, int64_t n, int torch_threads, uint16_t *y) {
    return forward(x, n, torch_threads, y, sizeof(uint16_t), 0);
}

ckp_status ckp_gelu_backward_bf16(const uint16_t *dy, const uint16_t *x, int64_t n, int torch_threads,
                                  uint16_t *dx) {
    return backward(dy, x, n, torch_threads, dx, sizeof(uint16_t), 0);
}
