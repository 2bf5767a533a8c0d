/*
 * gelu_erf.c — GELU in its erf form, F.gelu(x) (approximate="none"), as torch 2.13 computes it on CPU.
 *
 * [Note: torch's erf GELU is oneDNN's]
 * ATen's gelu_out_cpu and gelu_backward_out_cpu (Activation.cpp) hand the erf form to oneDNN's eltwise
 * gelu_erf (ideep::eltwise_forward / eltwise_backward) when use_mkldnn(x): oneDNN enabled, x contiguous
 * with more than one element, float32 -- or bfloat16 where oneDNN runs avx512_core. Otherwise (one element,
 * a strided x, oneDNN disabled, bf16 below avx512_core) ATen's own GeluKernel runs. oneDNN's JIT code
 * (jit_uni_eltwise_injector.cpp, oneDNN 3.12 in the wheel) is one formula per ISA, every element alike (its
 * tails are masked vectors, not scalar code), so its bits depend on the ISA oneDNN picks -- from the CPU
 * and ONEDNN_MAX_CPU_ISA, not from ATen's capability -- and on nothing else (ckparity.cpu.onednn_isa):
 *   - MINIMAX (an avx512 ISA): erf(x / sqrt 2) as a degree-5 polynomial in |x| (Horner, FMAs) chosen from
 *     25 by the bits of |x| ((bits + 0xc21fffff) >> 21, clamped to [1, 24]; 23 past 5.54 where erf is 1),
 *     its sign set from x; y = (x * (1 + erf)) * 0.5.
 *   - ABRAMOWITZ_STEGUN (avx2 and below): A&S 7.1.26 on z = x * float(1/sqrt 2): t = 1 / fma(p, |z|, 1),
 *     erf = sign(x) * fma(-exp(-z^2) * t, poly(t), 1) with oneDNN's own exp; S = 0.5 x, y = fma(erf, S, S).
 *   - the backward (every ISA): with R = x / sqrt 2, dgelu = fma(erf(R), 0.5, R / sqrt(pi) * exp(-R^2) +
 *     0.5), erf as above (A&S), and dx = dgelu * dy.
 *   - oneDNN's exp: n = floor(x log2 e + 0.5), r = x - n ln 2 (one FMA), 2^(n-1) from the exponent bits
 *     (0 below ln FLT_MIN), a degree-5 polynomial in r, times 2^(n-1), times 2.
 *   - ATEN: ATen's own code (one element, oneDNN disabled, bf16 below avx512_core): gelu.c's, where ATen's
 *     GELU kernel lives.
 * Measured on torch 2.13 (oneDNN 3.12), an Intel Xeon at avx512_core and, with ONEDNN_MAX_CPU_ISA=AVX2, at
 * avx2: every element of the sweeps bit-identical (ckparity.kernels.gelu). bf16 is oneDNN's f32 formula on
 * the widened values, rounded once to bf16 (dx: the product with dy, then rounded) -- by vcvtneps2bf16 at
 * avx512_core_bf16 and above, which flushes a float denormal to zero (CKP_GELU_ERF_BF16_FLUSH), by an
 * emulated round to nearest even below it.
 * The constants are oneDNN's table entries (their float bits), as the JIT code loads them.
 */
#include "ckp_internal.h"
#include "vec.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* x86's minps/maxps: the second operand unless the comparison holds (a NaN gives the second). */
static inline float min_ps(float a, float b) { return a < b ? a : b; }
static inline float max_ps(float a, float b) { return a > b ? a : b; }

/* oneDNN's exp_compute_vector_fwd. */
static inline float onednn_exp(float x) {
    const float ln_flt_min = from_bits(0xc2aeac50), ln_flt_max = from_bits(0x42b17218);
    const int under = x < ln_flt_min;
    x = max_ps(min_ps(x, ln_flt_max), ln_flt_min);
    const float n = floorf(x * from_bits(0x3fb8aa3b) + 0.5f); /* two roundings: vmulps, then vaddps */
    const float r = fmaf(-n, from_bits(0x3f317218), x);
    const float pow2 = under ? 0.0f : from_bits((uint32_t)((int32_t)rintf(n - 1.0f) + 127) << 23);
    float p = from_bits(0x3c07cfce);
    p = fmaf(p, r, from_bits(0x3d2b9d0d));
    p = fmaf(p, r, from_bits(0x3e2aad40));
    p = fmaf(p, r, from_bits(0x3efffee3));
    p = fmaf(p, r, from_bits(0x3f7ffffb));
    p = fmaf(p, r, 1.0f);
    return (p * pow2) * 2.0f;
}

#define ONE_OVER_SQRT2 from_bits(0x3f3504f3)
#define AS_P from_bits(0x3ea7ba05) /* A&S 7.1.26's p = 0.3275911 */
static const uint32_t AS_POLY[5] = {0x3e827906, 0xbe91a98e, 0x3fb5f0e3, 0xbfba00e3, 0x3f87dc22};

/* -exp(-z^2)-scaled A&S erf of z given e = -exp(-z^2): sign(z) * fma(e * t, poly(t), 1). */
static inline float as_erf(float z, float neg_exp) {
    const float t = 1.0f / fmaf(AS_P, fabsf(z), 1.0f);
    float r = from_bits(AS_POLY[4]);
    for (int d = 3; d >= 0; d--) r = fmaf(r, t, from_bits(AS_POLY[d]));
    return from_bits(bits_of(fmaf(neg_exp * t, r, 1.0f)) ^ (bits_of(z) & 0x80000000u));
}

/* oneDNN's 25 minimax polynomials of erf(x / sqrt 2) in |x|: coefficient d of polynomial i (bits; as floats
 * for the vector code, each degree padded to 32 for its two-register permute). */
static const union {
    uint32_t bits[6][32];
    float f[6][32];
} MINIMAX __attribute__((aligned(64))) = {.bits = {
    {0xa6f2cb94, 0x32827792, 0x3381cc0c, 0x34523d4a, 0x351ac44d, 0x35f36d88, 0x36ee8229, 0x37b8a3bb, 0x3867a213,
     0x3940033b, 0x3a2a5a1d, 0x3ae35863, 0x3b7828f2, 0x3c08b14b, 0x3c515ed3, 0xbb503236, 0xbd8d8e5e, 0xbe8abcd9,
     0xbf0c19a2, 0xbeccb328, 0x3e176ced, 0x3f470d99, 0x3f7abb28, 0x3f800000, 0x00000000},
    {0x3f4c422a, 0x3f4c421f, 0x3f4c4207, 0x3f4c41cb, 0x3f4c413b, 0x3f4c3fad, 0x3f4c3a2f, 0x3f4c2d40, 0x3f4c146a,
     0x3f4bc341, 0x3f4ad08c, 0x3f48f8cf, 0x3f45fac7, 0x3f404e07, 0x3f3b980f, 0x3f48dff3, 0x3f78b21b, 0x3fbb0704,
     0x40019c32, 0x3fe536d6, 0x3f81331e, 0x3e6c8684, 0x3c98f936, 0x00000000, 0x3f800000},
    {0xb62173f4, 0x3735e4cf, 0x37f2ff89, 0x388c23be, 0x3917535c, 0x39ab2ab0, 0x3a60fadb, 0x3af9b960, 0x3b6e5491,
     0x3c0a4ec5, 0x3ca5aa8c, 0x3d2138d9, 0x3d8737d4, 0x3ddfb660, 0x3e0f27ab, 0x3d94004b, 0xbe0efdeb, 0xbf1d96c3,
     0xbf89db58, 0xbf6d9897, 0xbef69fb8, 0xbdc4f8a8, 0xbbde6422, 0x00000000, 0x00000000},
    {0xbe081a19, 0xbe084570, 0xbe08639b, 0xbe089837, 0xbe08f409, 0xbe09ab95, 0xbe0b66d0, 0xbe0e400a, 0xbe124df8,
     0xbe1bde02, 0xbe2f19c9, 0xbe4931bf, 0xbe685fbc, 0xbe89c95f, 0xbe96cbca, 0xbe8044aa, 0xbe0550f2, 0x3dcfd6a1,
     0x3e94c826, 0x3e79345f, 0x3decec91, 0x3ca46568, 0x3aa1e00a, 0x00000000, 0x00000000},
    {0xba3d61db, 0x39f097a3, 0x3a5845dc, 0x3ab1fa35, 0x3b0cefb8, 0x3b653ab6, 0x3bcae527, 0x3c221712, 0x3c6c5840,
     0x3cc0a703, 0x3d1dcc19, 0x3d63656d, 0x3d955907, 0x3dbf9910, 0x3dd53f69, 0x3db7dcef, 0x3d639ebe, 0xba6ede48,
     0xbd22be69, 0xbd041cf1, 0xbc64f5ab, 0xbb097a32, 0xb8ebf380, 0x00000000, 0x00000000},
    {0x3cb7d80c, 0x3c9b6050, 0x3c978d11, 0x3c92e850, 0x3c8d058b, 0x3c848454, 0x3c6cd623, 0x3c4c824b, 0x3c2a7935,
     0x3be0b390, 0x3b0651ac, 0xbb232f53, 0xbbd42fa0, 0xbc2c5366, 0xbc492c9e, 0xbc2a7aa6, 0xbbd55d04, 0xba823a76,
     0x3b102aa8, 0x3ae25a7e, 0x3a31f792, 0x38b84375, 0x3689bb5a, 0x00000000, 0x00000000}}};

static inline float forward_minimax(float x) {
    const float ax = from_bits(bits_of(x) & 0x7fffffffu);
    int32_t i = (int32_t)(bits_of(ax) + 0xc21fffffu) >> 21; /* an arithmetic shift: denormals map to 1 */
    i = i < 1 ? 1 : i > 24 ? 24 : i;
    if (from_bits(0x40b15cee) < ax) i = 23; /* past the last interval erf is 1 (polynomial 23); NaN keeps i */
    float p = MINIMAX.f[5][i];
    for (int d = 4; d >= 0; d--) p = fmaf(p, ax, MINIMAX.f[d][i]);
    p = from_bits(bits_of(p) ^ (bits_of(x) & 0x80000000u));
    return (x * (p + 1.0f)) * 0.5f;
}

static inline float forward_abramowitz_stegun(float x) {
    const float z = x * ONE_OVER_SQRT2;
    const float erf = as_erf(z, -onednn_exp(-(z * z)));
    const float half = x * 0.5f;
    return fmaf(erf, half, half);
}

static inline float backward_onednn(float x, float dy) {
    const float r = x * ONE_OVER_SQRT2;
    const float q = onednn_exp(-(r * r));
    const float density = (r * from_bits(0x3f106eba)) * q; /* R / sqrt(pi) * exp(-R^2) */
    return fmaf(as_erf(r, -q), 0.5f, density + 0.5f) * dy;
}

static inline float forward_one(float x, int form) {
    return form == CKP_GELU_ERF_MINIMAX ? forward_minimax(x) : forward_abramowitz_stegun(x);
}

/* A result as oneDNN stores it: a bf16 one through vcvtneps2bf16 with `flush` (a float denormal becomes a
 * zero of its sign), else rounded to nearest even; float32 as it is. */
static inline void store(void *a, int64_t i, float v, size_t elem, int flush) {
    if (flush && fpclassify(v) == FP_SUBNORMAL) v = copysignf(0.0f, v);
    ckp_elem_store(a, i, v, elem);
}

/* ---- the same arithmetic on vectors (speed only: every lane repeats the scalar code's operations) ---------- */
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))
#define SPLAT8(u) _mm256_castsi256_ps(_mm256_set1_epi32((int)(u)))

AVX2 static inline __m256 onednn_exp8(__m256 x) {
    const __m256 ln_flt_min = SPLAT8(0xc2aeac50), one = _mm256_set1_ps(1.0f);
    const __m256 under = _mm256_cmp_ps(x, ln_flt_min, _CMP_LT_OS);
    x = _mm256_max_ps(_mm256_min_ps(x, SPLAT8(0x42b17218)), ln_flt_min);
    const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, SPLAT8(0x3fb8aa3b)), _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_fnmadd_ps(n, SPLAT8(0x3f317218), x);
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_sub_ps(n, one)), _mm256_set1_epi32(127));
    const __m256 pow2 = _mm256_andnot_ps(under, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
    __m256 p = SPLAT8(0x3c07cfce);
    p = _mm256_fmadd_ps(p, r, SPLAT8(0x3d2b9d0d));
    p = _mm256_fmadd_ps(p, r, SPLAT8(0x3e2aad40));
    p = _mm256_fmadd_ps(p, r, SPLAT8(0x3efffee3));
    p = _mm256_fmadd_ps(p, r, SPLAT8(0x3f7ffffb));
    p = _mm256_fmadd_ps(p, r, one);
    return _mm256_mul_ps(_mm256_mul_ps(p, pow2), _mm256_set1_ps(2.0f));
}

AVX2 static inline __m256 as_erf8(__m256 z, __m256 neg_exp) {
    const __m256 sign = SPLAT8(0x80000000u), one = _mm256_set1_ps(1.0f);
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(SPLAT8(0x3ea7ba05), _mm256_andnot_ps(sign, z), one));
    __m256 r = SPLAT8(AS_POLY[4]);
    for (int d = 3; d >= 0; d--) r = _mm256_fmadd_ps(r, t, SPLAT8(AS_POLY[d]));
    return _mm256_xor_ps(_mm256_fmadd_ps(_mm256_mul_ps(neg_exp, t), r, one), _mm256_and_ps(z, sign));
}

/* 8 elements of the A&S forward (out) or, with dy, of the backward. */
AVX2 static void abramowitz_stegun8(const float *x, const float *dy, float *out) {
    const __m256 sign = SPLAT8(0x80000000u), half = _mm256_set1_ps(0.5f), v = _mm256_loadu_ps(x);
    const __m256 z = _mm256_mul_ps(v, SPLAT8(0x3f3504f3));
    const __m256 q = onednn_exp8(_mm256_xor_ps(_mm256_mul_ps(z, z), sign));
    if (dy == NULL) {
        const __m256 h = _mm256_mul_ps(v, half);
        _mm256_storeu_ps(out, _mm256_fmadd_ps(as_erf8(z, _mm256_xor_ps(q, sign)), h, h));
        return;
    }
    const __m256 density = _mm256_mul_ps(_mm256_mul_ps(z, SPLAT8(0x3f106eba)), q);
    const __m256 d = _mm256_fmadd_ps(as_erf8(z, _mm256_xor_ps(q, sign)), half, _mm256_add_ps(density, half));
    _mm256_storeu_ps(out, _mm256_mul_ps(d, _mm256_loadu_ps(dy)));
}

/* 16 elements of the minimax forward: the coefficients gathered from two 16-entry halves of each degree. */
AVX512 static inline __m512 minimax16v(__m512 v) {
    const __m512 ax = _mm512_abs_ps(v);
    __m512i i = _mm512_srai_epi32(_mm512_add_epi32(_mm512_castps_si512(ax), _mm512_set1_epi32((int)0xc21fffffu)), 21);
    i = _mm512_min_epi32(_mm512_max_epi32(i, _mm512_set1_epi32(1)), _mm512_set1_epi32(24));
    i = _mm512_mask_mov_epi32(i, _mm512_cmp_ps_mask(_mm512_set1_ps(from_bits(0x40b15cee)), ax, _CMP_LT_OS),
                              _mm512_set1_epi32(23));
    __m512 p = _mm512_permutex2var_ps(_mm512_load_ps(MINIMAX.f[5]), i, _mm512_load_ps(MINIMAX.f[5] + 16));
    for (int d = 4; d >= 0; d--)
        p = _mm512_fmadd_ps(p, ax, _mm512_permutex2var_ps(_mm512_load_ps(MINIMAX.f[d]), i, _mm512_load_ps(MINIMAX.f[d] + 16)));
    p = _mm512_xor_ps(p, _mm512_and_ps(v, _mm512_castsi512_ps(_mm512_set1_epi32((int)0x80000000u))));
    return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_add_ps(p, _mm512_set1_ps(1.0f))), _mm512_set1_ps(0.5f));
}

AVX512 static void minimax16(const float *x, float *out) { _mm512_storeu_ps(out, minimax16v(_mm512_loadu_ps(x))); }

/* The minimax forward of bf16 elements [i, end) 16 at a time, in registers: widened, then stored as store16 does
 * (through memory each block of 16 had taken over twice the float32 run's time). The flush and the rounding
 * (ckp_bf16_round's, NaN 0x7FC0) are written in intrinsics here: store16's generic vectors in this loop ran the
 * forward a fifth slower (measured). */
AVX512 static int64_t minimax_bf16(const uint16_t *x, int64_t i, int64_t end, int flush, uint16_t *out) {
    const __m512i exponent = _mm512_set1_epi32(0x7f800000), sign = _mm512_set1_epi32((int)0x80000000u);
    for (; i + 16 <= end; i += 16) {
        const __m512 v = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i))), 16));
        __m512i u = _mm512_castps_si512(minimax16v(v));
        if (flush) /* a zero or a denormal: a zero of its sign */
            u = _mm512_mask_and_epi32(u, _mm512_testn_epi32_mask(u, exponent), u, sign);
        const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(u), _mm512_castsi512_ps(u), _CMP_UNORD_Q);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
        r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
        _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(r));
    }
    return i;
}

enum { BLOCK = 16 };

/* 16 results as oneDNN stores them (store(), on a vector): bf16 ones with `flush` a float denormal a zero of its
 * sign, then rounded to nearest even. */
static inline __attribute__((always_inline)) void store16(void *a, int64_t i, const float v[BLOCK], size_t elem,
                                                          int flush) {
    ckp_v16f w;
    memcpy(&w, v, sizeof w);
    if (flush) {
        const ckp_v16u u = (ckp_v16u)w, tiny = (ckp_v16u)((u & 0x7f800000u) == 0); /* a zero or a denormal */
        w = (ckp_v16f)((tiny & u & 0x80000000u) | (~tiny & u));
    }
    ckp_elem_store16(a, i, w, elem);
}

/* Elements [lo, hi) of the forward (dy NULL) or backward: blocks of 16 on the vector code where this CPU has
 * it and the form is oneDNN's, the rest element by element (the same operations, so the same bits). A bf16
 * block is widened and rounded 16 at a time (one at a time it had taken 8x the float32 run). */
CKP_CLONES static void run_span(const void *x, const void *dy, int64_t lo, int64_t hi, int form, int flush,
                                size_t elem, void *out) {
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int vector = form == CKP_GELU_ERF_MINIMAX && dy == NULL ? __builtin_cpu_supports("avx512f") && avx2 : avx2;
    int64_t i = lo;
    if (vector && elem == sizeof(uint16_t) && form == CKP_GELU_ERF_MINIMAX && dy == NULL)
        i = minimax_bf16((const uint16_t *)x, i, hi, flush, (uint16_t *)out);
    if (vector) {
        float xb[BLOCK], db[BLOCK], ob[BLOCK];
        const int f32 = elem == sizeof(float); /* read and written in place; bf16 through the buffers */
        for (; i + BLOCK <= hi; i += BLOCK) {
            const float *xs = f32 ? (const float *)x + i : xb, *ds = f32 && dy != NULL ? (const float *)dy + i : db;
            float *os = f32 ? (float *)out + i : ob;
            if (!f32) {
                const ckp_v16f xv = ckp_elem_load16(x, i, elem);
                memcpy(xb, &xv, sizeof xb);
                if (dy != NULL) {
                    const ckp_v16f dv = ckp_elem_load16(dy, i, elem);
                    memcpy(db, &dv, sizeof db);
                }
            }
            if (form == CKP_GELU_ERF_MINIMAX && dy == NULL) {
                minimax16(xs, os);
            } else {
                abramowitz_stegun8(xs, dy == NULL ? NULL : ds, os);
                abramowitz_stegun8(xs + 8, dy == NULL ? NULL : ds + 8, os + 8);
            }
            if (!f32) store16(out, i, ob, elem, flush);
        }
    }
    for (; i < hi; i++) {
        const float xi = ckp_elem_load(x, i, elem);
        const float v = dy == NULL ? forward_one(xi, form) : backward_onednn(xi, ckp_elem_load(dy, i, elem));
        store(out, i, v, elem, flush);
    }
}

enum { SPAN = 8192 }; /* elements a thread takes at a time; every element is its own, so no split moves a bit */

static void run(const void *x, const void *dy, int64_t n, int form, size_t elem, void *out) {
    const int flush = form & CKP_GELU_ERF_BF16_FLUSH;
    form &= ~CKP_GELU_ERF_BF16_FLUSH;
    const int64_t spans = (n + SPAN - 1) / SPAN;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (spans > 1)
    for (int64_t k = 0; k < spans; k++) run_span(x, dy, k * SPAN, n - k * SPAN < SPAN ? n : (k + 1) * SPAN, form, flush, elem, out);
}

static ckp_status check_args(const void *x, const void *dy, int has_dy, const void *out, int64_t n, int form,
                             size_t elem) {
    ckp_status s = ckp_check_elementwise(x, dy, has_dy, out, n, elem);
    if (s != CKP_OK) return s;
    const int flush = elem == sizeof(uint16_t) ? CKP_GELU_ERF_BF16_FLUSH : 0, base = form & ~flush;
    if (base != CKP_GELU_ERF_MINIMAX && base != CKP_GELU_ERF_ABRAMOWITZ_STEGUN) /* ATEN went to gelu.c */
        return ckp_fail(CKP_ERR_BAD_OPTION,
                        "form must be CKP_GELU_ERF_MINIMAX, _ABRAMOWITZ_STEGUN or _ATEN%s, got %d",
                        flush ? " (with CKP_GELU_ERF_BF16_FLUSH)" : "", form);
    return CKP_OK;
}


static ckp_status forward(const void *x, int64_t n, int form, int torch_threads, void *y, size_t elem) {
    if (form == CKP_GELU_ERF_ATEN) return ckp_gelu_aten_erf_forward(x, n, torch_threads, y, elem);
    ckp_status s = check_args(x, NULL, 0, y, n, form, elem);
    if (s != CKP_OK) return s;
    ckp_clear_error();
    run(x, NULL, n, form, elem, y);
    return CKP_OK;
}

static ckp_status backward(const void *dy, const void *x, int64_t n, int form, int torch_threads, void *dx,
                           size_t elem) {
    if (form == CKP_GELU_ERF_ATEN) return ckp_gelu_aten_erf_backward(dy, x, n, torch_threads, dx, elem);
    ckp_status s = check_args(x, dy, 1, dx, n, form, elem);
    if (s != CKP_OK) return s;
    ckp_clear_error();
    run(x, dy, n, form, elem, dx);
    return CKP_OK;
}

ckp_status ckp_gelu_erf_forward(const float *x, int64_t n, int form, int torch_threads, float *y) {
    return forward(x, n, form, torch_threads, y, sizeof(float));
}

ckp_status ckp_gelu_erf_backward(const float *dy, const float *x, int64_t n, int form, int torch_threads, float *dx) {
    return backward(dy, x, n, form, torch_threads, dx, sizeof(float));
}

ckp_status ckp_gelu_erf_forward_bf16(const uint16_t *x, int64_t n, int form, int torch_threads, uint16_t *y) {
    return forward(x, n, form, torch_threads, y, sizeof(uint16_t));
}

ckp_status ckp_gelu_erf_backward_bf16(const uint16_t *dy, const uint16_t *x, int64_t n, int form, int torch_threads,
                                      uint16_t *dx) {
    return backward(dy, x, n, form, torch_threads, dx, sizeof(uint16_t));
}
