/*
 * vec.h — 8- and 16-lane float vectors (GCC vector extensions) for the hot loops.
 *
 * Why not leave it all to the auto-vectorizer: the kernels keep their sums in
 * a fixed number of lanes so the bits never depend on the compiler or the
 * target, and written as lane arrays GCC 12 left cross_entropy's row max
 * scalar and its exp loop spilling to the stack (perf annotate). Vector
 * extensions say the lane structure outright; GCC lowers them to AVX2/AVX-512
 * or to pairs of SSE2 registers, and each lane does the same IEEE operations
 * as scalar code would (contraction is off in meson.build; fused multiply-adds
 * are written out as ckp_fma8), so every target_clones build gives the same
 * bits. The one thing GCC 12 lowers badly is float->double conversion of a
 * vector: ckp_accumulate8d does that from memory, as plain loops.
 * Also here: ckp_exp_sleef8, exp as torch's vector code computes it (used by
 * swiglu and by cross_entropy's ptref variant).
 */
#ifndef CKP_VEC_H
#define CKP_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { CKP_VLANES = 8 };

/* bfloat16, stored as torch stores it: the high 16 bits of a float (uint16).
 * To float is exact; from float rounds to nearest even, as torch's
 * conversions do (c10::round_to_nearest_even, and the vectorized cvtfp32_bf16
 * of vec256/vec512_bfloat16.h: the same rounding). A NaN becomes 0x7FC0 here;
 * torch's vector path writes 0xFFFF -- both NaN, and ckparity's comparisons
 * take NaN as equal to NaN. */
static inline __attribute__((always_inline)) float ckp_bf16_to_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) uint16_t ckp_f_to_bf16(float f) {
    if (f != f) return 0x7FC0;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* f rounded to bfloat16 and read back as a float: what a bf16 tensor holds. */
static inline __attribute__((always_inline)) float ckp_bf16_round(float f) { return ckp_bf16_to_f(ckp_f_to_bf16(f)); }

/* float16 (IEEE binary16, stored as uint16), through GCC's _Float16: to float exact, from float
 * rounded to nearest even (overflow to inf, subnormals kept), as torch's conversions do (c10::Half's
 * fp16_ieee_from_fp32_value, and the vectorized cvtfp32_fp16: F16C's vcvtps2ph with round to
 * nearest). GCC 12 emits F16C's instructions in the x86-64-v3 and v4 clones and libgcc's
 * __truncsfhf2 in the baseline build: the same bits. A NaN's bits are not claimed. */
static inline __attribute__((always_inline)) float ckp_f16_to_f(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, sizeof v);
    return (float)v;
}

static inline __attribute__((always_inline)) uint16_t ckp_f_to_f16(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, sizeof h);
    return h;
}

static inline __attribute__((always_inline)) float ckp_f16_round(float f) { return (float)(_Float16)f; }

/* The vector helpers, defined once for each lane count by CKP_DEFINE_LANES:
 * ckp_v<N>f/i/u/h (float, int32, uint32, bf16 storage), ckp_splat<N>,
 * ckp_select<N>, ckp_fma<N>, ckp_bf16_load<N>/round<N>/store<N> and
 * ckp_exp_sleef<N>. 8 lanes are the kernels' working width; 16 serve the
 * elementwise bf16 loops on an AVX512 capability (ckp_lanes16, which says
 * why only there) -- elementwise, so the lane count never changes a bit.
 *
 * ckp_select: mask ? a : b per lane; mask lanes are all ones or all zeros (a comparison).
 * ckp_fma: a * b + c with one rounding, per lane. GCC turns the lane loop into
 *   one vfmadd where the target has FMA (x86-64-v3 and up); the baseline
 *   build calls fmaf per lane: slow, but the same bits.
 * ckp_bf16_load: N bf16 values widened to floats (defined after the lane counts: the two widths
 *   are written differently). Written for GCC 12's code, measured on the target_clones build: as a
 *   lane loop it built bf16 AdamW's exp_avg from sixteen scalar loads and shifts (the step at 16M:
 *   7.4 ms against 5.3-5.8); as one widening conversion, 16 lanes are a zero-extending move and a
 *   shift, but 8 lanes became two half loads and an insert (rms_norm's bf16 backward 14.1 ms against
 *   11.4 with the 8-lane form below, each bf16 interleaved with a zero).
 * ckp_bf16_round: v rounded to bfloat16 per lane, as floats (the low 16 bits zero).
 * ckp_bf16_round_any_nan: ckp_bf16_round without its NaN select, for a value that only feeds more
 *   arithmetic: a NaN stays a NaN (sign and payload as they come) provided its low 16 bits are zero
 *   -- a NaN loaded from bf16, one rounded before, or x86's default NaN (0xFFC00000) made from finite
 *   operands; a NaN whose low bits could carry into the exponent must not come here. Its results
 *   are stored only through ckp_bf16_round/store, which write torch's 0x7FC0.
 * ckp_bf16_store: v rounded to bfloat16, stored: the high halves of the rounded lanes.
 * ckp_bf16_store_exact: v already bf16 values (a ckp_bf16_round's result, NaN as 0x7FC0), stored:
 *   their high halves, without rounding again.
 * ckp_f16_load, ckp_f16_round, ckp_f16_store: the same for float16, by c10's own conversions
 *   (fp16_ieee_to_fp32_value, fp16_ieee_from_fp32_value: float and integer arithmetic, round to
 *   nearest even through the float multiplies and add), which vectorize in every clone. GCC 12 turns
 *   a _Float16 vector conversion into lane-by-lane ones (float16 rms_norm ran 5x bf16's time).
 *   ckp_f16_bits: the float16 bits of each lane, in a 32-bit lane.
 * ckp_exp_sleef: exp(d) per lane with SLEEF's expf_u10 algorithm, as torch's
 *   Vectorized<float>::exp computes it (FMA form): q = rint(d / ln2),
 *   s = d - q ln2 in two FMA steps, a degree-5 polynomial, then 2^q applied as
 *   two multiplies (so results that are subnormal round as SLEEF's do).
 *   d < -104 gives 0, d > 100 gives inf. q outside [-150, 150] (|d| > 104,
 *   inf) or NaN is converted as 0 (an out-of-range float-to-int conversion is
 *   undefined in C); the last selects give those lanes 0, inf or NaN anyway.
 *   The range is one comparison of |q|: GCC 12 turned the & of two 16-lane
 *   comparisons into sixteen scalar ones.
 * ckp_exp_sleef_normal: the same bits for -87 <= d <= 0 without the range's selects: q is then in
 *   [-126, 0], 2^q a normal float, and one multiply by it is SLEEF's two (the first of them, by
 *   2^(q/2), exact: only the last can round). ckp_exp_sleef_mantissa: their shared part, u and q. */
#define CKP_ALWAYS static inline __attribute__((always_inline))
#define CKP_DEFINE_LANES(N, BYTES)                                                                              \
    typedef float ckp_v##N##f __attribute__((vector_size(BYTES)));                                             \
    typedef int32_t ckp_v##N##i __attribute__((vector_size(BYTES)));                                           \
    typedef uint32_t ckp_v##N##u __attribute__((vector_size(BYTES)));                                          \
    typedef uint16_t ckp_v##N##h __attribute__((vector_size(BYTES / 2)));                                      \
    CKP_ALWAYS ckp_v##N##f ckp_splat##N(float v) {                                                             \
        ckp_v##N##f r;                                                                                          \
        for (int l = 0; l < N; l++) r[l] = v;                                                                   \
        return r;                                                                                               \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_select##N(ckp_v##N##i mask, ckp_v##N##f a, ckp_v##N##f b) {                     \
        return (ckp_v##N##f)(((ckp_v##N##i)a & mask) | ((ckp_v##N##i)b & ~mask));                              \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_fma##N(ckp_v##N##f a, ckp_v##N##f b, ckp_v##N##f c) {                           \
        ckp_v##N##f r;                                                                                          \
        for (int l = 0; l < N; l++) r[l] = __builtin_fmaf(a[l], b[l], c[l]);                                   \
        return r;                                                                                               \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_bf16_round##N(ckp_v##N##f v) {                                                  \
        ckp_v##N##u u = (ckp_v##N##u)v;                                                                         \
        ckp_v##N##u r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;                                         \
        return ckp_select##N(v != v, ckp_splat##N(ckp_bf16_to_f(0x7FC0)), (ckp_v##N##f)r);                     \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_bf16_round_any_nan##N(ckp_v##N##f v) {                                             \
        ckp_v##N##u u = (ckp_v##N##u)v;                                                                         \
        return (ckp_v##N##f)((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);                                   \
    }                                                                                                           \
    CKP_ALWAYS void ckp_bf16_store##N(uint16_t *p, ckp_v##N##f v) {                                            \
        ckp_v##N##h h = __builtin_convertvector((ckp_v##N##u)ckp_bf16_round##N(v) >> 16, ckp_v##N##h);         \
        memcpy(p, &h, sizeof h);                                                                                \
    }                                                                                                           \
    CKP_ALWAYS void ckp_bf16_store_exact##N(uint16_t *p, ckp_v##N##f v) {                                      \
        ckp_v##N##h h = __builtin_convertvector((ckp_v##N##u)v >> 16, ckp_v##N##h);                             \
        memcpy(p, &h, sizeof h);                                                                                \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_f16_load##N(const uint16_t *p) { /* c10's fp16_ieee_to_fp32_value */             \
        ckp_v##N##h h;                                                                                          \
        memcpy(&h, p, sizeof h);                                                                                \
        ckp_v##N##u w = __builtin_convertvector(h, ckp_v##N##u) << 16, two_w = w + w;                           \
        ckp_v##N##f normalized = (ckp_v##N##f)((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;                     \
        ckp_v##N##f denormalized = (ckp_v##N##f)((two_w >> 17) | (126u << 23)) - 0.5f;                          \
        ckp_v##N##u tiny = (ckp_v##N##u)(two_w < (1u << 27));                                                   \
        return (ckp_v##N##f)((w & 0x80000000u) | (tiny & (ckp_v##N##u)denormalized) |                           \
                             (~tiny & (ckp_v##N##u)normalized));                                                \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##u ckp_f16_bits##N(ckp_v##N##f f) { /* c10's fp16_ieee_from_fp32_value */               \
        ckp_v##N##u w = (ckp_v##N##u)f, shl1_w = w + w;                                                         \
        ckp_v##N##f base = ((ckp_v##N##f)(w & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;                        \
        ckp_v##N##u bias = shl1_w & 0xFF000000u, low = (ckp_v##N##u)(bias < 0x71000000u);                       \
        bias = (low & 0x71000000u) | (~low & bias);                                                             \
        ckp_v##N##u b = (ckp_v##N##u)((ckp_v##N##f)((bias >> 1) + 0x07800000u) + base);                         \
        ckp_v##N##u nonsign = ((b >> 13) & 0x7C00u) + (b & 0x0FFFu), nan = (ckp_v##N##u)(shl1_w > 0xFF000000u); \
        return ((w & 0x80000000u) >> 16) | (nan & 0x7E00u) | (~nan & nonsign);                                  \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_f16_round##N(ckp_v##N##f v) {                                                    \
        ckp_v##N##h h = __builtin_convertvector(ckp_f16_bits##N(v), ckp_v##N##h);                               \
        return ckp_f16_load##N((const uint16_t *)&h);                                                           \
    }                                                                                                           \
    CKP_ALWAYS void ckp_f16_store##N(uint16_t *p, ckp_v##N##f v) {                                              \
        ckp_v##N##h h = __builtin_convertvector(ckp_f16_bits##N(v), ckp_v##N##h);                               \
        memcpy(p, &h, sizeof h);                                                                                \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_exp_sleef_mantissa##N(ckp_v##N##f d, ckp_v##N##f *q_out) {                     \
        const float round_magic = 12582912.0f; /* 1.5 * 2^23: round to nearest even */                          \
        ckp_v##N##f q =                                                                                         \
            (d * 1.442695040888963407359924681001892137426645954152985934135449406931f + round_magic) -         \
            round_magic;                                                                                        \
        ckp_v##N##f s = ckp_fma##N(q, ckp_splat##N(-0.693145751953125f), d);                                   \
        s = ckp_fma##N(q, ckp_splat##N(-1.428606765330187045e-06f), s);                                        \
        ckp_v##N##f u = ckp_fma##N(ckp_splat##N(0.000198527617612853646278381f), s,                            \
                                   ckp_splat##N(0.00139304355252534151077271f));                               \
        u = ckp_fma##N(u, s, ckp_splat##N(0.00833336077630519866943359f));                                     \
        u = ckp_fma##N(u, s, ckp_splat##N(0.0416664853692054748535156f));                                      \
        u = ckp_fma##N(u, s, ckp_splat##N(0.166666671633720397949219f));                                       \
        u = ckp_fma##N(u, s, ckp_splat##N(0.5f));                                                              \
        *q_out = q;                                                                                             \
        return 1.0f + ckp_fma##N(s * s, u, s);                                                                 \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_exp_sleef_normal##N(ckp_v##N##f d) {                                            \
        ckp_v##N##f q, u = ckp_exp_sleef_mantissa##N(d, &q);                                                   \
        ckp_v##N##i qi = __builtin_convertvector(q, ckp_v##N##i);                                              \
        return u * (ckp_v##N##f)((ckp_v##N##u)(qi + 0x7f) << 23);                                              \
    }                                                                                                           \
    CKP_ALWAYS ckp_v##N##f ckp_exp_sleef##N(ckp_v##N##f d) {                                                   \
        ckp_v##N##f q, u = ckp_exp_sleef_mantissa##N(d, &q);                                                   \
        ckp_v##N##f abs_q = (ckp_v##N##f)((ckp_v##N##u)q & 0x7FFFFFFFu); /* one comparison, not two: */      \
        ckp_v##N##f q_in_range = ckp_select##N(abs_q <= 150.0f, q, ckp_splat##N(0.0f)); /* see below */       \
        ckp_v##N##i qi = __builtin_convertvector(q_in_range, ckp_v##N##i);                                     \
        ckp_v##N##i half = qi >> 1;                                                                             \
        ckp_v##N##f scale1 = (ckp_v##N##f)(((ckp_v##N##u)(half + 0x7f)) << 23);                                 \
        ckp_v##N##f scale2 = (ckp_v##N##f)(((ckp_v##N##u)(qi - half + 0x7f)) << 23);                            \
        u = (u * scale1) * scale2;                                                                              \
        u = ckp_select##N(d < -104.0f, ckp_splat##N(0.0f), u);                                                 \
        return ckp_select##N(d > 100.0f, ckp_splat##N(INFINITY), u);                                           \
    }

CKP_DEFINE_LANES(8, 32)
CKP_DEFINE_LANES(16, 64)

/* ckp_bf16_load<N>: see above. 8 lanes: each bf16 interleaved with a zero below it -- the float's
 * bits; 16: one widening conversion and a shift. */
CKP_ALWAYS ckp_v8f ckp_bf16_load8(const uint16_t *p) {
    ckp_v8h h;
    memcpy(&h, p, sizeof h);
    const ckp_v8h zero = {0};
    return (ckp_v8f)__builtin_shufflevector(zero, h, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
}
CKP_ALWAYS ckp_v16f ckp_bf16_load16(const uint16_t *p) {
    ckp_v16h h;
    memcpy(&h, p, sizeof h);
    return (ckp_v16f)(__builtin_convertvector(h, ckp_v16u) << 16);
}

/* Element i of an array of float32, bf16 or float16 values as a float, N from i as a vector, and a
 * float stored into one (rounded once to bf16 or float16): the kernels that do float32's arithmetic
 * on 16-bit data read and write it in place through these, elem a constant at every call. elem: what
 * an element is -- its byte count, which is what sizeof gives for float32 (4) and bf16 (2) -- or
 * CKP_ELEM_F16 for float16 (2 bytes as well, told apart by a bit above the count; ckp_elem_bytes
 * gives the count). */
enum { CKP_ELEM_F16 = sizeof(uint16_t) | 16 };
CKP_ALWAYS size_t ckp_elem_bytes(size_t elem) { return elem & 15; }
CKP_ALWAYS float ckp_elem_load(const void *a, int64_t i, size_t elem) {
    if (elem == CKP_ELEM_F16) return ckp_f16_to_f(((const uint16_t *)a)[i]);
    return elem == sizeof(uint16_t) ? ckp_bf16_to_f(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}
CKP_ALWAYS void ckp_elem_store(void *a, int64_t i, float v, size_t elem) {
    if (elem == CKP_ELEM_F16) ((uint16_t *)a)[i] = ckp_f_to_f16(v);
    else if (elem == sizeof(uint16_t)) ((uint16_t *)a)[i] = ckp_f_to_bf16(v);
    else ((float *)a)[i] = v;
}
#define CKP_DEFINE_ELEM_VECTORS(N)                                                                              \
    CKP_ALWAYS ckp_v##N##f ckp_elem_load##N(const void *a, int64_t i, size_t elem) {                           \
        if (elem == CKP_ELEM_F16) return ckp_f16_load##N((const uint16_t *)a + i);                             \
        if (elem == sizeof(uint16_t)) return ckp_bf16_load##N((const uint16_t *)a + i);                        \
        ckp_v##N##f v;                                                                                          \
        memcpy(&v, (const float *)a + i, sizeof v);                                                             \
        return v;                                                                                               \
    }                                                                                                           \
    CKP_ALWAYS void ckp_elem_store##N(void *a, int64_t i, ckp_v##N##f v, size_t elem) {                        \
        if (elem == CKP_ELEM_F16) ckp_f16_store##N((uint16_t *)a + i, v);                                      \
        else if (elem == sizeof(uint16_t)) ckp_bf16_store##N((uint16_t *)a + i, v);                            \
        else memcpy((float *)a + i, &v, sizeof v);                                                              \
    }
CKP_DEFINE_ELEM_VECTORS(8)
CKP_DEFINE_ELEM_VECTORS(16)

static inline __attribute__((always_inline)) ckp_v8f ckp_load8(const float *p) {
    ckp_v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The first n (< 8) floats at p, the other lanes set to fill. */
static inline __attribute__((always_inline)) ckp_v8f ckp_load8_tail(const float *p, int64_t n, float fill) {
    float lanes[CKP_VLANES];
    for (int l = 0; l < CKP_VLANES; l++) lanes[l] = l < n ? p[l] : fill;
    return ckp_load8(lanes);
}

static inline __attribute__((always_inline)) void ckp_store8(float *p, ckp_v8f v) { memcpy(p, &v, sizeof v); }

static inline __attribute__((always_inline)) void ckp_store8_tail(float *p, int64_t n, ckp_v8f v) {
    float lanes[CKP_VLANES];
    ckp_store8(lanes, v);
    for (int64_t l = 0; l < n; l++) p[l] = lanes[l];
}

/* lane[l] += v[i] (in double) for every i = l mod 8 of v[0..n), in order:
 * written as plain lane loops because that is the form GCC vectorizes into
 * vcvtps2pd + vaddpd with the lanes kept in registers. */
static inline __attribute__((always_inline)) void ckp_accumulate8d(double lane[CKP_VLANES], const float *v,
                                                                   int64_t n) {
    int64_t i = 0;
    for (; i + CKP_VLANES <= n; i += CKP_VLANES)
        for (int l = 0; l < CKP_VLANES; l++) lane[l] += (double)v[i + l];
    for (int l = 0; i + l < n; l++) lane[l] += (double)v[i + l];
}

/* log(d) with SLEEF's logf_u10 algorithm (xlogf_u1, FMA form), as torch's
 * Vectorized<float>::log computes it: for normal finite d > 0 (the softmax's
 * sum of exponentials, which is >= 1 unless it is NaN: a row whose max is +inf
 * sums exp(inf - inf)), then SLEEF's special cases -- inf for inf, NaN for a
 * NaN or d < 0, -inf for 0; without them log(NaN) came out 25081.6 and a row
 * holding +inf lost inf where torch's is NaN. d = m 2^e with m in [0.75, 1.5);
 * x = (m - 1) / (m + 1) and e ln2 in double-float (hi, lo) pairs; then
 * log d = e ln2 + 2x + x^3 t(x^2). The pair arithmetic is SLEEF's df.h with
 * FMA: exact products through fmaf, sums through two-sum. Scalar: it runs
 * once per row. */
typedef struct {
    float hi, lo;
} ckp_f2;

static inline ckp_f2 ckp_f2_add2(float x, float y) { /* two-sum, any order of magnitude */
    float s = x + y, v = s - x;
    return (ckp_f2){s, (x - (s - v)) + (y - v)};
}

static inline ckp_f2 ckp_f2_add_ff(ckp_f2 x, ckp_f2 y) { /* |x| >= |y| */
    float s = x.hi + y.hi;
    return (ckp_f2){s, (((x.hi - s) + y.hi) + x.lo) + y.lo};
}

static inline ckp_f2 ckp_f2_add_f(ckp_f2 x, float y) { /* |x| >= |y| */
    float s = x.hi + y;
    return (ckp_f2){s, ((x.hi - s) + y) + x.lo};
}

static inline ckp_f2 ckp_f2_mul_f(ckp_f2 x, float y) {
    float s = x.hi * y;
    return (ckp_f2){s, fmaf(x.lo, y, fmaf(x.hi, y, -s))};
}

static inline ckp_f2 ckp_f2_div(ckp_f2 n, ckp_f2 d) {
    float t = 1.0f / d.hi, s = n.hi * t;
    float u = fmaf(t, n.hi, -s);
    float v = fmaf(-d.lo, t, fmaf(-d.hi, t, 1.0f));
    return (ckp_f2){s, fmaf(s, v, fmaf(n.lo, t, u))};
}

static inline float ckp_log_sleef(float d) {
    uint32_t bits;
    float scaled = d * (1.0f / 0.75f);
    memcpy(&bits, &scaled, sizeof bits);
    int32_t e = (int32_t)((bits >> 23) & 0xff) - 0x7f; /* ilogb2k */
    memcpy(&bits, &d, sizeof bits);
    bits -= (uint32_t)e << 23; /* m = d * 2^-e, exact */
    float m;
    memcpy(&m, &bits, sizeof m);
    ckp_f2 s = ckp_f2_mul_f((ckp_f2){0.69314718246459960938f, -1.904654323148236017e-09f}, (float)e);
    ckp_f2 x = ckp_f2_div(ckp_f2_add2(-1.0f, m), ckp_f2_add2(1.0f, m));
    float x2 = x.hi * x.hi;
    float t = fmaf(0.3027294874e+0f, x2, 0.3996108174e+0f);
    t = fmaf(t, x2, 0.6666694880e+0f);
    s = ckp_f2_add_ff(s, (ckp_f2){x.hi * 2.0f, x.lo * 2.0f});
    s = ckp_f2_add_f(s, (x2 * x.hi) * t);
    if (d != d || d < 0.0f) return NAN;
    if (d == 0.0f) return -INFINITY;
    return d == INFINITY ? INFINITY : s.hi + s.lo;
}

#endif
