/*
 * attention.c — F.scaled_dot_product_attention's float32 training path on CPU (no mask, no dropout), as
 * ATen's flash kernel computes it (FlashAttentionKernel.cpp, cpu_flash_attention and
 * cpu_flash_attention_backward in torch 2.13):
 *
 * [Note: ATen's CPU flash attention]
 * Blocks: q rows in blocks of qSplit = 256 (Tq >= 768), 64 (Tq >= 192) or 32, at most Tq; keys in blocks
 * of kvSplit = min(512, Tk). Query head h reads kv head h / (Hq / Hkv) (enable_gqa). Causal is top-left:
 * row r sees keys <= r; only the keys below min(m + qB, Tk) are visited, in whole blocks of Tk's split
 * (the last block's keys past a row's diagonal are masked, -inf before the softmax, 0 after).
 * Forward, per (batch, head, q block), each on one thread: per key block n
 *   S = Q.K^T (one thread's MKL sgemm, ckp_gemm_serial), masked;
 *   per row: S *= scale with the running max over Vectorized lanes (a lane max then vec_reduce_all's
 *     shuffle tree, the tail elements scalar); max = max(old max, that);
 *     P = exp(S - max) by exp_u20 (a degree-5 polynomial, lanes) -- libm's expf for the tail and at
 *     DEFAULT -- summed: the lanes by the tree, then the tail added in order;
 *     e = expf(old max - max); sum = P's sum + e * sum (one FMA where the build has FMA);
 *     dst *= e (from the second block on);
 *   dst (+)= P.V (sgemm, beta 1 from the second block).
 *   Then out = dst * (1 / sum) and lse = max + logf(sum) (max of a row that saw nothing as 0, sum 1).
 * Backward, per (batch, kv head), its query heads in order, then q blocks, then key blocks:
 *   dsum = rowsum(dO * O) (map2_reduce_all: lanes from the first vector, the middle added, the last
 *     partial vector by FMA, then the tree; a row shorter than a vector added lane by lane);
 *   A = exp(scale Q.K^T - lse) (SLEEF's expf_u10 every lane; libm's at DEFAULT), masked to 0;
 *   dV += A^T.dO;  dA = dO.V^T;  dA = A * (dA - dsum);  dQ += scale dA.K;  dK += scale dA^T.Q
 *   (sgemm with alpha: each K block's product times alpha, rounded, added to C).
 * Lanes: 16 at AVX512, 8 at AVX2 and DEFAULT (Vectorized<float> is 32 bytes there); the tree pairs lane l
 * with l ^ 8 (AVX512), l ^ 4, l ^ 2, l ^ 1; DEFAULT adds the lanes in order and has no FMA.
 * Every (batch, head, q block) of the forward and every (batch, kv head) of the backward is one thread's,
 * so the bits are the same at any count of this library's threads -- and of torch's, but where a pass has one
 * such item: ATen's parallel_for then runs it on the calling thread, outside a parallel region, and MKL has
 * torch's threads for its GEMMs (on its AVX2 branch at 2 they share a few-row product: csrc/linear.c's
 * [Note: MKL's AVX2 sgemm on two threads]; ckp_gemm_serial's mkl_threads). The GEMMs are torch's bits
 * where ckp_gemm_serial follows MKL (csrc/linear.c's Note: its modelled branches; one-row or one-column
 * products take MKL's gemv paths, followed on its AVX2 branch only: [Note: MKL's AVX2 sgemv]), with each item's
 * block buffers placed as ATen's thread for it has them ([Note: ATen's per-thread buffers]).
 */
#include "ckp_internal.h"
#include "vec.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* How torch's build at the running capability computes the kernel's vector code. */
typedef struct {
    int lanes; /* Vectorized<float>::size() */
    int simd;  /* AVX2/AVX512: the shuffle tree, FMA contraction, exp_u20 and SLEEF; DEFAULT: none */
} at_layout;

static at_layout layout_now(void) {
    switch (ckp_get_capability()) {
    case CKP_CAPABILITY_AVX512: return (at_layout){16, 1};
    case CKP_CAPABILITY_AVX2: return (at_layout){8, 1};
    default: return (at_layout){8, 0};
    }
}

static inline float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Vectorized<float>::exp_u20 (vec512_float.h, vec256_float.h: the same per lane). */
static inline __attribute__((always_inline)) float exp_u20(float x) {
    const float lo = bits_f(0xc2aeac50u), hi = bits_f(0x42b17218u), log2e = bits_f(0x3fb8aa3bu),
                ln2 = bits_f(0x3f317218u);
    const int below = x < lo;
    float s = x < hi ? x : hi; /* _mm_min_ps(x, hi): hi when x is NaN */
    s = s > lo ? s : lo;
    const float fx = floorf(fmaf(s, log2e, 0.5f));
    const float r = fmaf(-fx, ln2, s);
    float p = fmaf(r, 0.00828929059f, 0.0418978221f);
    p = fmaf(r, p, 0.166676521f);
    p = fmaf(r, p, 0.499991506f);
    p = fmaf(r, p, 0.999999701f);
    p = fmaf(r, p, 1.0f);
    const int32_t n = (int32_t)(fx - 1.0f); /* an integer: _mm_cvtps_epi32's rounding is exact */
    const float two_n = below ? 0.0f : bits_f((uint32_t)(n + 127) << 23);
    return (p * two_n) * 2.0f;
}

/* Vectorized<float>::fexp_u20 (vec256_float.h, vec512_float.h: the same per lane), the flash kernel's exp for a
 * bf16 P: 2^(x log2 e) with 2^frac by a degree-3 polynomial, the result's bits made by an integer conversion
 * (Malossi et al.'s fast exponential); 0 below ln(FLT_MIN), inf above ln(FLT_MAX). */
static inline __attribute__((always_inline)) float fexp_u20(float x) {
    const float lo = bits_f(0xc2aeac50u), hi = bits_f(0x42b17218u), log2e = bits_f(0x3fb8aa3bu);
    float src = x * log2e;
    const float frac = src - floorf(src);
    float res = fmaf(frac, -0.079204240219773236f, -0.22433836478672356f);
    res = fmaf(frac, res, 0.30354260500649682f);
    res = fmaf(frac, res, 0.00010703434948458272f);
    src = src - res;
    const float t = fmaf(8388608.0f, src, 1065353216.0f); /* 2^23 src + 127 2^23 */
    /* the truncating conversion's own result for NaN or out of range (a NaN x gives -0), written so that a loop of
     * these is vectorized (a scalar conversion kept bf16's exp scalar: 12% of a bf16 T = 1024 profile) */
    const int32_t bits = t == t && fabsf(t) < 2147483648.0f ? (int32_t)t : INT32_MIN;
    return x < lo ? 0.0f : x > hi ? INFINITY : bits_f((uint32_t)bits);
}

/* vec::maximum: NaN if either is. */
static inline float vmax(float a, float b) { return a != a || b != b ? NAN : a > b ? a : b; }

/* vec_reduce_all over the lanes: the shuffle tree, or (DEFAULT) lane 0 combined with each in turn. */
static inline __attribute__((always_inline)) float reduce_lanes(float *v, at_layout L, int is_max) {
    if (!L.simd) {
        float acc = v[0];
        for (int l = 1; l < L.lanes; l++) acc = is_max ? vmax(acc, v[l]) : acc + v[l];
        return acc;
    }
    for (int half = L.lanes / 2; half >= 1; half /= 2) /* lanes l and l ^ half, the lower half kept */
        for (int l = 0; l < half; l++) v[l] = is_max ? vmax(v[l], v[l + half]) : v[l] + v[l + half];
    return v[0];
}

/* The lane loops below run W = Vectorized<float>::size() lanes a step, W a constant in each instantiation
 * (so that the loop is the CPU's vector code); the clones give the FMA and vector instructions. */
#define ATT_LANES(W, body)                                \
    do {                                                  \
        if ((W) == 16)                                    \
            for (int64_t i = 0; i < full; i += 16)        \
                for (int l = 0; l < 16; l++) { body }     \
        else                                              \
            for (int64_t i = 0; i < full; i += 8)         \
                for (int l = 0; l < 8; l++) { body }      \
    } while (0)

/* The lanes' r *= scale and max over [0, full) in vector instructions (the compiler leaves vmax's NaN test
 * scalar): max_ps(a, b) is a > b ? a : b, and a NaN in either made NaN, as vmax -- the same lanes. */
__attribute__((target("avx512f"))) static void mul_max16(float *r, float scale, int64_t full, float lane[16]) {
    const __m512 s = _mm512_set1_ps(scale), nan = _mm512_set1_ps(NAN);
    __m512 m = _mm512_loadu_ps(lane);
    for (int64_t i = 0; i < full; i += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(r + i), s);
        _mm512_storeu_ps(r + i, v);
        const __mmask16 unordered = _mm512_cmp_ps_mask(m, v, _CMP_UNORD_Q);
        m = _mm512_mask_mov_ps(_mm512_max_ps(m, v), unordered, nan);
    }
    _mm512_storeu_ps(lane, m);
}

__attribute__((target("avx2"))) static void mul_max8(float *r, float scale, int64_t full, float lane[8]) {
    const __m256 s = _mm256_set1_ps(scale), nan = _mm256_set1_ps(NAN);
    __m256 m = _mm256_loadu_ps(lane);
    for (int64_t i = 0; i < full; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(r + i), s);
        _mm256_storeu_ps(r + i, v);
        m = _mm256_blendv_ps(_mm256_max_ps(m, v), nan, _mm256_cmp_ps(m, v, _CMP_UNORD_Q));
    }
    _mm256_storeu_ps(lane, m);
}

/* _mul_reduce_max_fusion_kernel: r *= scale, returns the max. */
CKP_CLONES static float mul_reduce_max(float *r, float scale, int64_t n, at_layout L) {
    float lane[16];
    for (int l = 0; l < L.lanes; l++) lane[l] = -INFINITY;
    const int64_t full = n - n % L.lanes;
    if (L.lanes == 16 && __builtin_cpu_supports("avx512f"))
        mul_max16(r, scale, full, lane);
    else if (L.lanes == 8 && __builtin_cpu_supports("avx2"))
        mul_max8(r, scale, full, lane);
    else
        ATT_LANES(L.lanes, r[i + l] *= scale; lane[l] = vmax(lane[l], r[i + l]););
    float tail = -INFINITY;
    for (int64_t i = full; i < n; i++) {
        r[i] *= scale;
        tail = tail < r[i] ? r[i] : tail; /* std::max */
    }
    const float lanes = reduce_lanes(lane, L, 1);
    return tail < lanes ? lanes : tail;
}

/* _exp_reduce_sum_fusion_kernel: r = exp(r - max), returns the sum. With a bf16 P (bf16: its other form, as
 * measured against torch 2.13 at DEFAULT and AVX2): fexp_u20 in two registers of lanes over whole blocks of 2 W terms, then one more
 * whole W into the first register, the two registers added lane by lane and reduced; the tail as below. */
CKP_CLONES static float exp_reduce_sum(float *r, float max, int64_t n, at_layout L, int bf16) {
    float lane[16] = {0};
    const int64_t full = n - n % L.lanes;
    if (bf16) { /* fexp_u20 is libm's expf at DEFAULT */
        float two[32] = {0};
        const int64_t W = L.lanes, pairs = n - n % (2 * W);
        if (L.simd)
            for (int64_t i = 0; i < full; i++) r[i] = fexp_u20(r[i] - max);
        else
            for (int64_t i = 0; i < full; i++) r[i] = expf(r[i] - max);
        for (int64_t i = 0; i < pairs; i += 2 * W)
            for (int64_t l = 0; l < 2 * W; l++) two[l] += r[i + l];
        for (int64_t i = pairs; i < full; i += W)
            for (int64_t l = 0; l < W; l++) two[l] += r[i + l];
        for (int64_t l = 0; l < W; l++) lane[l] = two[l] + two[l + W];
    } else if (L.simd) {
        ATT_LANES(L.lanes, r[i + l] = exp_u20(r[i + l] - max); lane[l] += r[i + l];);
    } else {
        ATT_LANES(L.lanes, r[i + l] = expf(r[i + l] - max); lane[l] += r[i + l];);
    }
    float sum = reduce_lanes(lane, L, 0);
    for (int64_t i = full; i < n; i++) { /* the tail's exp is C's exp of a double (the kernel's exp(tmp1)) */
        r[i] = (float)exp((double)(r[i] - max));
        sum += r[i];
    }
    return sum;
}

/* map2_reduce_all(x * y, +) over n. */
CKP_CLONES static float dot_reduce(const float *x, const float *y, int64_t n, at_layout L) {
    if (n < L.lanes) {
        float acc = x[0] * y[0];
        for (int64_t i = 1; i < n; i++) acc = acc + x[i] * y[i];
        return acc;
    }
    float lane[16];
    for (int l = 0; l < L.lanes; l++) lane[l] = x[l] * y[l];
    /* the middle vectors (ATT_LANES runs [0, full)), then the last partial one: unfused */
    x += L.lanes, y += L.lanes;
    const int64_t full = n - n % L.lanes - L.lanes;
    ATT_LANES(L.lanes, lane[l] = lane[l] + x[i + l] * y[i + l];);
    for (int64_t i = full; i < n - L.lanes; i++) lane[i - full] = lane[i - full] + x[i] * y[i];
    return reduce_lanes(lane, L, 0);
}

/* map2_reduce_all<BFloat16>(x * y, +) over n (functional_bfloat16.h): a bf16 vector is two float ones, lo and hi.
 * From 2W terms (W = L.lanes) on: lo and hi from the first 2W products, each later whole 2W block's added to them,
 * a partial last block's added into the lanes it fills; then lo + hi, reduced as vec_reduce_all (the tree at SIMD).
 * Under 2W: the products (lo, and hi's added into lo's first n - W lanes), reduced lane by lane in order. */
CKP_CLONES static float dot_reduce_bf16(const float *x, const float *y, int64_t n, at_layout L) {
    const int64_t W = L.lanes;
    float lo[16] = {0}, hi[16] = {0};
    if (n < 2 * W) {
        for (int64_t i = 0; i < W && i < n; i++) lo[i] = x[i] * y[i];
        for (int64_t i = W; i < n; i++) lo[i - W] = lo[i - W] + x[i] * y[i];
        float acc = lo[0];
        for (int64_t i = 1; i < W && i < n; i++) acc = acc + lo[i];
        return acc;
    }
    for (int64_t i = 0; i < W; i++) lo[i] = x[i] * y[i], hi[i] = x[W + i] * y[W + i];
    int64_t d = 2 * W;
    for (; d < n - n % (2 * W); d += 2 * W)
        for (int64_t i = 0; i < W; i++) lo[i] = lo[i] + x[d + i] * y[d + i], hi[i] = hi[i] + x[d + W + i] * y[d + W + i];
    if (n - d > W) { /* a partial block past lo's lanes: all of lo takes its products (zero past n), hi those it fills */
        for (int64_t i = 0; i < W; i++) lo[i] = lo[i] + x[d + i] * y[d + i];
        for (int64_t i = 0; i < n - d - W; i++) hi[i] = hi[i] + x[d + W + i] * y[d + W + i];
    } else {
        for (int64_t i = 0; i < n - d; i++) lo[i] = lo[i] + x[d + i] * y[d + i];
    }
    for (int64_t i = 0; i < W; i++) lo[i] = lo[i] + hi[i];
    return reduce_lanes(lo, L, 0);
}

static void round_bf16(float *r, int64_t n) {
    for (int64_t i = 0; i < n; i++) r[i] = ckp_bf16_round(r[i]);
}

/* exp(r - c) in place, as Vectorized<float>::exp on every lane (SLEEF's expf_u10) or libm's at DEFAULT. */
CKP_CLONES static void exp_shifted(float *r, float c, int64_t n, at_layout L) {
    if (!L.simd) {
        for (int64_t i = 0; i < n; i++) r[i] = expf(r[i] - c);
        return;
    }
    for (int64_t i = 0; i < n; i += 8) {
        float lanes[8] = {0};
        const int64_t w = n - i < 8 ? n - i : 8;
        for (int64_t l = 0; l < w; l++) lanes[l] = r[i + l] - c;
        ckp_v8f e = ckp_exp_sleef8(ckp_load8(lanes));
        for (int64_t l = 0; l < w; l++) r[i + l] = e[l];
    }
}

typedef struct {
    const float *q, *k, *v, *dout, *out, *lse;
    /* batch, head, position strides; the head dim contiguous */
    int64_t q_s[3], k_s[3], v_s[3], do_s[3], dq_s[3], dk_s[3], dv_s[3];
    int64_t B, Hq, Hkv, Tq, Tk, d, qsplit, kvsplit;
    float scale;
    int causal;
    int mkl_threads; /* the threads MKL has for the GEMMs: 1 in ATen's parallel loop, torch's where it has one item */
    int bf16;        /* the inputs are bf16 values: torch's bf16 kernel ([Note: ATen's bf16 flash attention]) */
    int bf16_gemm;   /* with bf16: which GEMM adds into dQ, dK and dV (ckp_bf16_gemm) */
    at_layout L;
} attn;

/* C (ldc) += alpha X.Y into bf16 values, as ATen's cpublas::gemm adds a bf16 GEMM: through oneDNN where torch
 * runs it (bf16_gemm) and the product has more than 16^3 multiply-adds (mkldnn_bf16_gemm's floor), else ATen's own
 * loop in `form` (the one its transposes pick). Y's rows are contiguous (the head dim, or a block's row). */
static void add_bf16(const attn *a, int form, float alpha, const float *x, int64_t x_rs, int64_t x_cs, const float *y,
                     int64_t y_rs, int64_t M, int64_t K, int64_t N, float *c, int64_t ldc, float *scratch) {
    if (a->bf16_gemm == CKP_BF16_GEMM_ONEDNN && M * K * N > 16 * 16 * 16)
        ckp_onednn_bf16_accumulate(alpha, x, x_rs, x_cs, y, y_rs, M, K, N, c, ldc, scratch);
    else
        ckp_aten_bf16_accumulate(form, alpha, x, x_rs, x_cs, y, y_rs, 1, M, K, N, c, ldc);
}

/* MKL's gemm_bf16bf16f32 of one row or one column (M == 1 or N == 1) on its AVX2 branch, one thread: C (ldc) =
 * alpha A.B, or C += with accumulate, A and B floats holding bf16 values (every product exact). Measured through
 * cblas_gemm_bf16bf16f32 (torch 2.13, MKL 2024.2, an AMD Zen 5; planted pairs, then 45000 random outputs of 1 x
 * 1..37 and 1..37 x 1, K 1..513, beta 0 and 1, alpha 0.3 in the dot form), its copies' addresses moving no bit:
 *   - the dot form (B transposed, as Q.K^T and dO.V^T hand it; neither transposed with one column): terms k of
 *     the first K - K mod 4 in lane k mod 4 from 0, the lanes added (l0 + l2) + (l1 + l3), then C (beta 1), then
 *     the K mod 4 terms left in order; alpha multiplies the matrix's element (B's for one row, else A's);
 *   - the axpy form (neither transposed, one row: P.V of a one-row q block): from C (beta 1) or 0, each block of 4
 *     terms (p0 + p2) + (p1 + p3) added in turn, then the K mod 4 terms left from the last to the first; alpha is
 *     1 there (its one caller's), as measured. */
static void mkl_bf16_gemv(ckp_mkl_form form, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                          int64_t b_rs, int64_t b_cs, int64_t M, int64_t K, int64_t N, float alpha, int accumulate,
                          float *c, int64_t ldc) {
    const int axpy = form == CKP_MKL_NEITHER_TRANSPOSED && M == 1;
    const float sa = M == 1 ? 1.0f : alpha, sb = M == 1 ? alpha : 1.0f; /* the dot form's alpha, on the matrix */
    const int64_t whole = K / 4 * 4;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const float *x = a + m * a_rs, *y = b + n * b_cs;
            float *at = c + m * ldc + n, out = accumulate ? *at : 0.0f;
            if (axpy) {
                for (int64_t k = 0; k < whole; k += 4) {
                    const float p0 = x[k * a_cs] * y[k * b_rs], p1 = x[(k + 1) * a_cs] * y[(k + 1) * b_rs],
                                p2 = x[(k + 2) * a_cs] * y[(k + 2) * b_rs], p3 = x[(k + 3) * a_cs] * y[(k + 3) * b_rs];
                    out = out + ((p0 + p2) + (p1 + p3));
                }
                for (int64_t k = K - 1; k >= whole; k--) out = out + x[k * a_cs] * y[k * b_rs];
            } else {
                float lane[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (int64_t k = 0; k < whole; k++) lane[k % 4] = lane[k % 4] + (sa * x[k * a_cs]) * (sb * y[k * b_rs]);
                const float sum = (lane[0] + lane[2]) + (lane[1] + lane[3]);
                out = accumulate ? out + sum : sum;
                for (int64_t k = whole; k < K; k++) out = out + (sa * x[k * a_cs]) * (sb * y[k * b_rs]);
            }
            *at = out;
        }
}

/* A block's float-output GEMM: MKL's sgemm (ckp_gemm_serial), or with bf16 inputs its gemm_bf16bf16f32 -- the same
 * on the widened values, but for one row or one column (mkl_bf16_gemv). */
static void block_gemm(const attn *at, ckp_mkl_form form, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                       int64_t b_rs, int64_t b_cs, int64_t M, int64_t K, int64_t N, float alpha, int accumulate,
                       float *c, int64_t ldc, float *scratch, ckp_gemm_slot *slot) {
    if (at->bf16 && (M == 1 || N == 1) && ckp_get_gemm_order() == CKP_GEMM_ORDER_AVX2)
        mkl_bf16_gemv(form, a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, alpha, accumulate, c, ldc);
    else
        ckp_gemm_serial(a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, alpha, accumulate, c, ldc, scratch, slot, at->mkl_threads,
                        form);
}

static attn attn_for(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t d, double scale, int causal) {
    attn a = {0};
    a.B = B, a.Hq = Hq, a.Hkv = Hkv, a.Tq = Tq, a.Tk = Tk, a.d = d, a.scale = (float)scale, a.causal = causal;
    const int64_t qs = Tq >= 768 ? 256 : Tq >= 192 ? 64 : 32;
    a.qsplit = qs < Tq ? qs : Tq;
    a.kvsplit = Tk < 512 ? Tk : 512;
    a.L = layout_now();
    return a;
}

/* The scratch floats of a block's GEMMs: ckp_gemm_serial's, and oneDNN's bf16 accumulation's (add_bf16). */
static int64_t gemm_floats(const attn *a) {
    const int64_t qb = a->qsplit, kb = a->kvsplit, d = a->d;
    int64_t most = ckp_gemm_serial_floats(qb, d, kb), x;
    if ((x = ckp_gemm_serial_floats(qb, kb, d)) > most) most = x;
    if ((x = ckp_gemm_serial_floats(kb, qb, d)) > most) most = x;
    if (a->bf16_gemm == CKP_BF16_GEMM_ONEDNN) {
        if ((x = ckp_onednn_bf16_accumulate_floats(qb, kb, d)) > most) most = x; /* dQ += dS.K */
        if ((x = ckp_onednn_bf16_accumulate_floats(kb, qb, d)) > most) most = x; /* dK, dV */
    }
    return most;
}

/* The keys row r (of the block at n) is masked from: those past its diagonal, when causal. */
static void mask_row(const attn *a, int64_t m, int64_t row, int64_t n, float *r, int64_t kvb, int64_t num_keys, float fill) {
    if (!a->causal || num_keys - n > a->kvsplit) return;
    for (int64_t c = m + row - n + 1; c < kvb; c++)
        if (c >= 0) r[c] = fill;
}

/* [Note: ATen's per-thread buffers]
 * ATen's flash kernel gives each of its threads a slice of one buffer (at::empty: 64-byte aligned): thread t's
 * block buffers (the forward's S, its row maxima and sums, its output rows; the backward's P and dS) start
 * t x the slice's floats past the start -- and MKL's small paths and gemv on its AVX2 branch take their order from
 * where their rows start, mod 16 bytes. at::parallel_for hands thread t the items [t c, (t + 1) c), c = ceil(items /
 * min(threads, items)). So each item's buffers here start where ATen's thread for it has them, mod 16 bytes
 * (measured: at 2 torch threads a head dim under 12 or a block under 12 keys moved torch's bits until this was
 * followed). base: 16-byte aligned, with 3 floats to spare. */
static float *aten_slice(float *base, int64_t item, int64_t items, int torch_threads, int64_t slice_floats) {
    const int64_t team = torch_threads < items ? torch_threads : items, chunk = (items + team - 1) / team;
    return base + (item / chunk) * slice_floats % 4;
}

/* A thread's block buffer of `floats` (and the 3 spare): raw is what to free, the buffer starts 16-byte aligned. */
static float *aligned_floats(int64_t floats, void **raw) {
    *raw = malloc((size_t)(floats + 7) * sizeof(float));
    return *raw == NULL ? NULL : (float *)(((uintptr_t)*raw + 15) & ~(uintptr_t)15);
}

/* Packed K and V blocks kept for the next q block or head that reads them (ckp_gemm_slot): per key block,
 * up to a bound on the memory; the blocks past it are packed at each use. */
enum { SLOT_FLOATS_MAX = 1 << 22 };

typedef struct {
    ckp_gemm_slot *slots; /* `kinds` slots per key block, for the first `blocks` key blocks */
    int64_t blocks, kinds;
    float *mem;
} slots;

static int slots_init(slots *s, const attn *a, int kinds, const int64_t *K, const int64_t *N) {
    const int64_t nblocks = (a->Tk + a->kvsplit - 1) / a->kvsplit;
    int64_t per = 0;
    for (int i = 0; i < kinds; i++) per += ckp_gemm_slot_floats(K[i], N[i]);
    s->kinds = kinds;
    s->blocks = per > 0 ? (SLOT_FLOATS_MAX / per < nblocks ? SLOT_FLOATS_MAX / per : nblocks) : 0;
    s->slots = calloc((size_t)(s->blocks * kinds) + 1, sizeof *s->slots);
    s->mem = malloc((size_t)(s->blocks * per + 1) * sizeof(float));
    if (s->slots == NULL || s->mem == NULL) return 0;
    float *at = s->mem;
    for (int64_t blk = 0; blk < s->blocks; blk++)
        for (int i = 0; i < kinds; i++) {
            s->slots[blk * kinds + i].packed = at;
            at += ckp_gemm_slot_floats(K[i], N[i]);
        }
    return 1;
}

static ckp_gemm_slot *slot_for(const slots *s, int64_t n, int64_t kvsplit, int kind) {
    const int64_t blk = n / kvsplit;
    return blk < s->blocks ? &s->slots[blk * s->kinds + kind] : NULL;
}

static void slots_free(slots *s) {
    free(s->slots);
    free(s->mem);
}

CKP_CLONES static void forward_block(const attn *a, int64_t b, int64_t h, int64_t m, float *out, float *lse, float *buf,
                                     const slots *kept) {
    const int64_t qb = a->Tq - m < a->qsplit ? a->Tq - m : a->qsplit, d = a->d, kvh = h / (a->Hq / a->Hkv);
    float *qk = buf, *qmax = qk + a->qsplit * a->kvsplit, *qsum = qmax + a->qsplit, *dst = qsum + a->qsplit,
          *scratch = dst + a->qsplit * d;
    const float *qp = a->q + b * a->q_s[0] + h * a->q_s[1] + m * a->q_s[2];
    const float *kp = a->k + b * a->k_s[0] + kvh * a->k_s[1], *vp = a->v + b * a->v_s[0] + kvh * a->v_s[1];
    for (int64_t r = 0; r < qb; r++) qmax[r] = -INFINITY, qsum[r] = 0.0f;
    const int64_t num_keys = a->causal ? (m + qb < a->Tk ? m + qb : a->Tk) : a->Tk;
    for (int64_t n = 0; n < num_keys; n += a->kvsplit) {
        const int64_t kvb = a->Tk - n < a->kvsplit ? a->Tk - n : a->kvsplit;
        block_gemm(a, CKP_MKL_B_TRANSPOSED, qp, a->q_s[2], 1, kp + n * a->k_s[2], 1, a->k_s[2], qb, d, kvb, 1.0f, 0, qk,
                   kvb, scratch, slot_for(kept, n, a->kvsplit, 0));
        for (int64_t r = 0; r < qb; r++) {
            float *row = qk + r * kvb;
            mask_row(a, m, r, n, row, kvb, num_keys, -INFINITY);
            float tmax = mul_reduce_max(row, a->scale, kvb, a->L);
            tmax = qmax[r] > tmax ? qmax[r] : tmax;
            if (tmax == -INFINITY) {
                memset(row, 0, (size_t)kvb * sizeof *row);
                continue;
            }
            const float sum = exp_reduce_sum(row, tmax, kvb, a->L, a->bf16), e = expf(qmax[r] - tmax);
            if (a->bf16) round_bf16(row, kvb); /* P stored as bf16 for P.V; its sum is of the float values */
            qsum[r] = a->L.simd ? fmaf(e, qsum[r], sum) : sum + e * qsum[r];
            qmax[r] = tmax;
            if (n > 0)
                for (int64_t j = 0; j < d; j++) dst[r * d + j] *= e;
        }
        block_gemm(a, CKP_MKL_NEITHER_TRANSPOSED, qk, kvb, 1, vp + n * a->v_s[2], a->v_s[2], 1, qb, kvb, d, 1.0f, n > 0,
                   dst, d, scratch, slot_for(kept, n, a->kvsplit, 1));
    }
    for (int64_t r = 0; r < qb; r++) {
        const float mx = qmax[r] == -INFINITY ? 0.0f : qmax[r], sum = qsum[r] == 0.0f ? 1.0f : qsum[r];
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < d; j++) out[(m + r) * d + j] = dst[r * d + j] * inv;
        if (a->bf16) round_bf16(out + (m + r) * d, d);
        lse[m + r] = mx + logf(sum);
    }
}

static ckp_status check_shapes(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t d, double scale,
                               int torch_threads) {
    if (B <= 0 || Hq <= 0 || Hkv <= 0 || Tq <= 0 || Tk <= 0 || d <= 0 || d > INT32_MAX || Tq > INT32_MAX ||
        Tk > INT32_MAX)
        return ckp_fail(CKP_ERR_BAD_SIZE, "attention: B, heads, positions and head dim must be positive");
    if ((double)B * (double)Hq * (double)(Tq > Tk ? Tq : Tk) * (double)d > 0x1p60)
        return ckp_fail(CKP_ERR_BAD_SIZE, "attention: B x heads x positions x head dim is too large");
    if (Hq % Hkv != 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "attention: %lld query heads are not a multiple of %lld kv heads",
                        (long long)Hq, (long long)Hkv);
    if (!isfinite(scale)) return ckp_fail(CKP_ERR_BAD_OPTION, "attention: scale must be finite");
    if (torch_threads < 1)
        return ckp_fail(CKP_ERR_BAD_OPTION, "attention: torch_threads must be >= 1, got %d", torch_threads);
    return CKP_OK;
}

static void set_strides(int64_t dst[3], const int64_t *src) { memcpy(dst, src, 3 * sizeof *dst); }

/* The bytes a (B, H, T, d) operand's strides reach (its head dim contiguous); 0 for a negative stride. */
static size_t extent(const int64_t s[3], int64_t B, int64_t H, int64_t T, int64_t d) {
    if (s[0] < 0 || s[1] < 0 || s[2] < 0) return 0;
    return (size_t)((B - 1) * s[0] + (H - 1) * s[1] + (T - 1) * s[2] + d) * sizeof(float);
}

/* Whether a (B, H, T, d) output's strides give every row its own d floats: its dims, ordered by stride (the
 * head dim innermost, stride 1), each step at least the span of the ones inside it. */
static int disjoint_rows(const int64_t s[3], int64_t B, int64_t H, int64_t T, int64_t d) {
    int64_t stride[3] = {s[0], s[1], s[2]}, size[3] = {B, H, T};
    if (s[0] < 0 || s[1] < 0 || s[2] < 0) return 0;
    for (int i = 0; i < 3; i++) /* sorted by stride: a dim of size 1 may take any, it is never stepped */
        for (int j = i + 1; j < 3; j++)
            if (stride[j] < stride[i] || (stride[j] == stride[i] && size[j] < size[i])) {
                int64_t t = stride[i];
                stride[i] = stride[j], stride[j] = t, t = size[i], size[i] = size[j], size[j] = t;
            }
    int64_t span = d;
    for (int i = 0; i < 3; i++) {
        if (size[i] == 1) continue;
        if (stride[i] < span) return 0;
        span = stride[i] * size[i];
    }
    return 1;
}

static void zero_rows(float *t, const int64_t s[3], int64_t B, int64_t H, int64_t T, int64_t d) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < T; r++) memset(t + b * s[0] + h * s[1] + r * s[2], 0, (size_t)d * sizeof(float));
}

/* The inputs' spans (q, k, v), or CKP_ERR_BAD_SIZE for a negative stride. */
static ckp_status input_spans(const attn *a, ckp_span spans[3]) {
    const size_t q = extent(a->q_s, a->B, a->Hq, a->Tq, a->d), k = extent(a->k_s, a->B, a->Hkv, a->Tk, a->d),
                 v = extent(a->v_s, a->B, a->Hkv, a->Tk, a->d);
    if (q == 0 || k == 0 || v == 0) return ckp_fail(CKP_ERR_BAD_SIZE, "attention: strides must not be negative");
    spans[0] = (ckp_span){a->q, q}, spans[1] = (ckp_span){a->k, k}, spans[2] = (ckp_span){a->v, v};
    return CKP_OK;
}

/* The forward's items over this library's threads, each its own (batch, head, q block): out (B, Hq, Tq, d)
 * and lse (B, Hq, Tq), contiguous. */
static ckp_status forward_run(const attn *ap, float *out, float *lse, int torch_threads) {
    attn a = *ap;
    const int64_t B = a.B, Hq = a.Hq, Tq = a.Tq, d = a.d;
    const int64_t qslices = (Tq + a.qsplit - 1) / a.qsplit, items = B * Hq * qslices;
    a.mkl_threads = items == 1 ? torch_threads : 1;
    const int64_t floats = a.qsplit * a.kvsplit + 2 * a.qsplit + a.qsplit * d + gemm_floats(&a);
    int failed = 0;
    ckp_clear_error();
    const int64_t slice = a.qsplit * a.kvsplit + 2 * a.qsplit + a.qsplit * d; /* ATen's size_per_thread */
#pragma omp parallel num_threads(ckp_threads())
    {
        void *raw;
        float *buf = aligned_floats(floats, &raw);
        slots kept;
        const int64_t K[2] = {d, a.kvsplit}, N[2] = {a.kvsplit, d}; /* K^T's blocks, V's */
        const int ready = slots_init(&kept, &a, 2, K, N) && buf != NULL; /* this thread's buffers */
        if (!ready) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++) {
            if (!ready) continue; /* the call fails: what this thread would write is left */
            const int64_t bh = it / qslices, m = (it % qslices) * a.qsplit;
            forward_block(&a, bh / Hq, bh % Hq, m, out + bh * Tq * d, lse + bh * Tq,
                          aten_slice(buf, it, items, torch_threads, slice), &kept);
        }
        free(raw);
        slots_free(&kept);
    }
    if (failed) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "attention: no memory for the block buffers");
    return CKP_OK;
}

ckp_status ckp_attention_forward(const float *q, const int64_t *q_strides, const float *k, const int64_t *k_strides,
                                 const float *v, const int64_t *v_strides, int64_t B, int64_t Hq, int64_t Hkv,
                                 int64_t Tq, int64_t Tk, int64_t d, double scale, int is_causal, float *out,
                                 float *lse, int torch_threads) {
    if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL || q_strides == NULL ||
        k_strides == NULL || v_strides == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "attention: no pointer may be NULL");
    ckp_status st = check_shapes(B, Hq, Hkv, Tq, Tk, d, scale, torch_threads);
    if (st != CKP_OK) return st;
    attn a = attn_for(B, Hq, Hkv, Tq, Tk, d, scale, is_causal != 0);
    a.q = q, a.k = k, a.v = v;
    set_strides(a.q_s, q_strides), set_strides(a.k_s, k_strides), set_strides(a.v_s, v_strides);
    ckp_span in[3];
    if ((st = input_spans(&a, in)) != CKP_OK) return st;
    const ckp_span o = {out, (size_t)(B * Hq * Tq * d) * sizeof(float)}, l = {lse, (size_t)(B * Hq * Tq) * sizeof(float)};
    if (ckp_overlaps_any(o, in, 3) || ckp_overlaps_any(l, in, 3) || ckp_overlaps(out, o.bytes, lse, l.bytes))
        return ckp_fail(CKP_ERR_ALIASING, "attention: out and lse may overlap nothing");
    return forward_run(&a, out, lse, torch_threads);
}

/* One (batch, kv head): its query heads' gradients, and its own dK, dV, accumulated in order. */
CKP_CLONES static void backward_group(const attn *a, int64_t b, int64_t kvh, float *dq, float *dk, float *dv, float *buf,
                                      const slots *kept) {
    const int64_t d = a->d, group = a->Hq / a->Hkv;
    float *p = buf, *dp = p + a->qsplit * a->kvsplit, *dsum = dp + a->qsplit * a->kvsplit, *pr = dsum + a->qsplit;
    float *scratch = pr + (a->bf16 ? a->qsplit * a->kvsplit : 0); /* pr: P rounded to bf16, for dV */
    const float *kp = a->k + b * a->k_s[0] + kvh * a->k_s[1], *vp = a->v + b * a->v_s[0] + kvh * a->v_s[1];
    float *dkp = dk + b * a->dk_s[0] + kvh * a->dk_s[1], *dvp = dv + b * a->dv_s[0] + kvh * a->dv_s[1];
    for (int64_t g = 0; g < group; g++) {
        const int64_t h = kvh * group + g, bh = b * a->Hq + h;
        const float *qh = a->q + b * a->q_s[0] + h * a->q_s[1], *doh = a->dout + b * a->do_s[0] + h * a->do_s[1],
                    *oh = a->out + bh * a->Tq * d, *lh = a->lse + bh * a->Tq;
        float *dqh = dq + b * a->dq_s[0] + h * a->dq_s[1];
        for (int64_t m = 0; m < a->Tq; m += a->qsplit) {
            const int64_t qb = a->Tq - m < a->qsplit ? a->Tq - m : a->qsplit;
            const int64_t ldo = a->do_s[2];
            const float *qp = qh + m * a->q_s[2], *dop = doh + m * ldo;
            for (int64_t r = 0; r < qb; r++)
                dsum[r] = (a->bf16 ? dot_reduce_bf16 : dot_reduce)(dop + r * ldo, oh + (m + r) * d, d, a->L);
            const int64_t num_keys = a->causal ? (m + qb < a->Tk ? m + qb : a->Tk) : a->Tk;
            for (int64_t n = 0; n < num_keys; n += a->kvsplit) {
                const int64_t kvb = a->Tk - n < a->kvsplit ? a->Tk - n : a->kvsplit;
                block_gemm(a, CKP_MKL_B_TRANSPOSED, qp, a->q_s[2], 1, kp + n * a->k_s[2], 1, a->k_s[2], qb, d, kvb,
                           a->scale, 0, p, kvb, scratch, slot_for(kept, n, a->kvsplit, 0));
                for (int64_t r = 0; r < qb; r++) {
                    exp_shifted(p + r * kvb, lh[m + r], kvb, a->L);
                    mask_row(a, m, r, n, p + r * kvb, kvb, num_keys, 0.0f);
                }
                if (a->bf16) { /* dV (bf16) += P_bf16^T . dO: ATen's own loop, its one chain */
                    memcpy(pr, p, (size_t)(qb * kvb) * sizeof *p);
                    round_bf16(pr, qb * kvb);
                    add_bf16(a, CKP_ATEN_BF16_CHAIN, 1.0f, pr, 1, kvb, dop, ldo, kvb, qb, d, dvp + n * a->dv_s[2],
                             a->dv_s[2], scratch);
                } else {
                    ckp_gemm_serial(p, 1, kvb, dop, ldo, 1, kvb, qb, d, 1.0f, 1, dvp + n * a->dv_s[2], a->dv_s[2],
                                    scratch, NULL, a->mkl_threads, CKP_MKL_A_TRANSPOSED);
                }
                block_gemm(a, CKP_MKL_B_TRANSPOSED, dop, ldo, 1, vp + n * a->v_s[2], 1, a->v_s[2], qb, d, kvb, 1.0f, 0,
                           dp, kvb, scratch, slot_for(kept, n, a->kvsplit, 1));
                for (int64_t r = 0; r < qb; r++)
                    for (int64_t c = 0; c < kvb; c++) dp[r * kvb + c] = p[r * kvb + c] * (dp[r * kvb + c] - dsum[r]);
                if (a->bf16) { /* dS rounded to bf16; dQ += scale dS.K (four chains), dK += scale dS^T.Q (one) */
                    round_bf16(dp, qb * kvb);
                    add_bf16(a, CKP_ATEN_BF16_PAIRS, a->scale, dp, kvb, 1, kp + n * a->k_s[2], a->k_s[2], qb, kvb, d,
                             dqh + m * a->dq_s[2], a->dq_s[2], scratch);
                    add_bf16(a, CKP_ATEN_BF16_CHAIN, a->scale, dp, 1, kvb, qp, a->q_s[2], kvb, qb, d,
                             dkp + n * a->dk_s[2], a->dk_s[2], scratch);
                    continue;
                }
                ckp_gemm_serial(dp, kvb, 1, kp + n * a->k_s[2], a->k_s[2], 1, qb, kvb, d, a->scale, 1,
                                dqh + m * a->dq_s[2], a->dq_s[2], scratch, slot_for(kept, n, a->kvsplit, 2), a->mkl_threads,
                                CKP_MKL_NEITHER_TRANSPOSED);
                ckp_gemm_serial(dp, 1, kvb, qp, a->q_s[2], 1, kvb, qb, d, a->scale, 1, dkp + n * a->dk_s[2], a->dk_s[2],
                                scratch, NULL, a->mkl_threads, CKP_MKL_A_TRANSPOSED);
            }
        }
    }
}

/* The backward's items over this library's threads, each its own (batch, kv head); dq, dk and dv zeroed first. */
static ckp_status backward_run(const attn *ap, float *dq, float *dk, float *dv, int torch_threads) {
    attn a = *ap;
    const int64_t B = a.B, Hq = a.Hq, Hkv = a.Hkv, Tq = a.Tq, Tk = a.Tk, d = a.d;
    zero_rows(dq, a.dq_s, B, Hq, Tq, d);
    zero_rows(dk, a.dk_s, B, Hkv, Tk, d);
    zero_rows(dv, a.dv_s, B, Hkv, Tk, d);
    const int64_t floats = (a.bf16 ? 3 : 2) * a.qsplit * a.kvsplit + a.qsplit + gemm_floats(&a), items = B * Hkv;
    a.mkl_threads = items == 1 ? torch_threads : 1;
    int failed = 0;
    ckp_clear_error();
#pragma omp parallel num_threads(ckp_threads())
    {
        void *raw;
        float *buf = aligned_floats(floats, &raw);
        slots kept;
        const int64_t K[3] = {d, d, a.kvsplit}, N[3] = {a.kvsplit, a.kvsplit, d}; /* K^T's blocks, V^T's, K's */
        const int ready = slots_init(&kept, &a, 3, K, N) && buf != NULL;
        if (!ready) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < items; it++)
            if (ready)
                backward_group(&a, it / Hkv, it % Hkv, dq, dk, dv,
                               aten_slice(buf, it, items, torch_threads, 2 * a.qsplit * a.kvsplit), &kept);
        free(raw);
        slots_free(&kept);
    }
    if (failed) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "attention backward: no memory for the block buffers");
    return CKP_OK;
}

ckp_status ckp_attention_backward(const float *dout, const int64_t *dout_strides, const float *q,
                                  const int64_t *q_strides, const float *k,
                                  const int64_t *k_strides, const float *v, const int64_t *v_strides,
                                  const float *out, const float *lse, int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq,
                                  int64_t Tk, int64_t d, double scale, int is_causal, float *dq,
                                  const int64_t *dq_strides, float *dk, const int64_t *dk_strides, float *dv,
                                  const int64_t *dv_strides, int torch_threads) {
    if (dout == NULL || q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL || dq == NULL ||
        dk == NULL || dv == NULL || dout_strides == NULL || q_strides == NULL || k_strides == NULL ||
        v_strides == NULL || dq_strides == NULL || dk_strides == NULL || dv_strides == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "attention backward: no pointer may be NULL");
    ckp_status st = check_shapes(B, Hq, Hkv, Tq, Tk, d, scale, torch_threads);
    if (st != CKP_OK) return st;
    attn a = attn_for(B, Hq, Hkv, Tq, Tk, d, scale, is_causal != 0);
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.out = out, a.lse = lse;
    set_strides(a.q_s, q_strides), set_strides(a.k_s, k_strides), set_strides(a.v_s, v_strides);
    set_strides(a.do_s, dout_strides), set_strides(a.dq_s, dq_strides), set_strides(a.dk_s, dk_strides);
    set_strides(a.dv_s, dv_strides);
    ckp_span spans[8];
    if ((st = input_spans(&a, spans)) != CKP_OK) return st;
    const size_t qbytes = (size_t)(B * Hq * Tq * d) * sizeof(float);
    const size_t dout_bytes = extent(a.do_s, B, Hq, Tq, d);
    if (dout_bytes == 0) return ckp_fail(CKP_ERR_BAD_SIZE, "attention backward: strides must not be negative");
    spans[3] = (ckp_span){dout, dout_bytes}, spans[4] = (ckp_span){out, qbytes};
    spans[5] = (ckp_span){lse, (size_t)(B * Hq * Tq) * sizeof(float)};
    if (!disjoint_rows(a.dq_s, B, Hq, Tq, d) || !disjoint_rows(a.dk_s, B, Hkv, Tk, d) ||
        !disjoint_rows(a.dv_s, B, Hkv, Tk, d))
        return ckp_fail(CKP_ERR_BAD_SIZE, "attention backward: dq, dk and dv need strides that give each of their rows "
                                          "its own d floats");
    const ckp_span outs[3] = {{dq, extent(a.dq_s, B, Hq, Tq, d)}, {dk, extent(a.dk_s, B, Hkv, Tk, d)},
                              {dv, extent(a.dv_s, B, Hkv, Tk, d)}};
    for (int i = 0; i < 3; i++) {
        spans[6] = outs[(i + 1) % 3], spans[7] = outs[(i + 2) % 3];
        if (ckp_overlaps_any(outs[i], spans, 8))
            return ckp_fail(CKP_ERR_ALIASING, "attention backward: dq, dk and dv may overlap nothing");
    }
    return backward_run(&a, dq, dk, dv, torch_threads);
}

/* [Note: ATen's bf16 flash attention]
 * torch's bf16 flash kernel (the same FlashAttentionKernel.cpp, scalar_t BFloat16) on a CPU where its GEMMs are
 * MKL's and ATen's own (no oneDNN for bf16, no AMX: an AMD CPU with AVX2 only) computes in float32 as above but:
 *   - its float-output GEMMs (S = Q.K^T, P.V into dst, dP = dO.V^T) are MKL's gemm_bf16bf16f32, measured the same
 *     bits as MKL's sgemm on the widened values (from 16-byte aligned copies) at one thread: ckp_gemm_serial;
 *   - the forward stores P = exp(S - max) as bf16 for P.V (its row sum is of the float values), and the output
 *     as bf16;
 *   - the backward's dsum is map2_reduce_all over bf16 vectors (dot_reduce_bf16); P and dS are rounded to bf16 for
 *     the GEMMs that read them (dS = P (float) * (dP - dsum)), and dQ, dK and dV are bf16 tensors that each
 *     block's GEMM adds into -- ATen's own bf16 loops (csrc/linear_bf16_aten.c): dV += P^T.dO and dK += scale
 *     dS^T.Q in its one chain (from dK's bf16 value, val = dS * scale rounded, FMA at AVX2 and AVX512), dQ += scale
 *     dS.K in its four chains (C + the rounded scale * sum), each rounded to bf16 after every block.
 * Where torch runs oneDNN for bf16 without AMX (an AMD Zen 5, whose MKL runs its AVX2 code: the float-output GEMMs
 * above hold), ATen's cpublas::gemm sends each of those three block GEMMs of more than 16^3 multiply-adds to
 * oneDNN's AVX-512 bf16 brgemm, the scale as a src scale and beta 1 as a sum post-op (ONEDNN_VERBOSE:
 * brg_matmul:avx512_core_bf16, attr-scales:src0, attr-post-ops:sum), the smaller ones to its own loops as above:
 * add_bf16, by the caller's bf16_gemm ([Note: oneDNN's AVX-512 bf16 order] in csrc/linear_bf16.c).
 * The inputs are widened here (exactly), each row from a 16-byte boundary, as MKL's gemm_bf16bf16f32 widens them
 * into its own copies: its small paths (C of under 12 columns or 4 rows, csrc/linear.c's [Note: MKL's AVX2 small
 * sgemm]) start their vectors after the k before a row's first 16-byte boundary, which is then none (measured
 * through cblas_gemm_bf16bf16f32: the bf16 rows' own addresses change no bit, and with no such k the sgemm's
 * order holds on 41 of 41 K from 1 to 513 at every C of 2..11 columns x 2..31 rows, and of 12..15 columns x 2..3
 * rows, tried -- one row or one column is another path, mkl_bf16_gemv: one-row q blocks and one-key blocks; the
 * tensors' own addresses gave dQ other bits at 45 of 300 head dims at T = 5). The
 * outputs are rounded once more (exactly: they hold bf16 values already). */

/* A (B, H, T, d) operand's strides with each row d rounded up to 4 floats from the last: every row at a 16-byte
 * boundary in a 64-byte aligned buffer. */
static const int64_t *padded_rows(int64_t ws[3], int64_t H, int64_t T, int64_t d) {
    ws[2] = (d + 3) / 4 * 4, ws[1] = T * ws[2], ws[0] = H * ws[1];
    return ws;
}

/* A bf16 (B, H, T, d) operand (strides s) widened to float32 with the strides ws (its head dim contiguous), 64-byte
 * aligned (as torch's allocations); only its rows are written. NULL without memory. */
static float *widen_rows(const uint16_t *src, const int64_t s[3], int64_t B, int64_t H, int64_t T, int64_t d,
                         const int64_t ws[3]) {
    const size_t bytes = extent(ws, B, H, T, d);
    float *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (w == NULL) return NULL;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < T; r++) {
                const uint16_t *from = src + b * s[0] + h * s[1] + r * s[2];
                float *to = w + b * ws[0] + h * ws[1] + r * ws[2];
                for (int64_t j = 0; j < d; j++) to[j] = ckp_bf16_to_f(from[j]);
            }
    return w;
}

static void narrow_rows(const float *src, const int64_t s[3], uint16_t *dst, const int64_t t[3], int64_t B, int64_t H,
                        int64_t T, int64_t d) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t r = 0; r < T; r++)
                for (int64_t j = 0; j < d; j++)
                    dst[b * t[0] + h * t[1] + r * t[2] + j] = ckp_f_to_bf16(src[b * s[0] + h * s[1] + r * s[2] + j]);
}

static void free_all(float **p, int n) {
    for (int i = 0; i < n; i++) free(p[i]);
}

ckp_status ckp_attention_forward_bf16(const uint16_t *q, const int64_t *q_strides, const uint16_t *k,
                                      const int64_t *k_strides, const uint16_t *v, const int64_t *v_strides, int64_t B,
                                      int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t d, double scale,
                                      int is_causal, uint16_t *out, float *lse, int torch_threads) {
    if (q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL || q_strides == NULL ||
        k_strides == NULL || v_strides == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "attention (bf16): no pointer may be NULL");
    ckp_status st = check_shapes(B, Hq, Hkv, Tq, Tk, d, scale, torch_threads);
    if (st != CKP_OK) return st;
    attn a = attn_for(B, Hq, Hkv, Tq, Tk, d, scale, is_causal != 0);
    set_strides(a.q_s, q_strides), set_strides(a.k_s, k_strides), set_strides(a.v_s, v_strides);
    const size_t qx = extent(a.q_s, B, Hq, Tq, d), kx = extent(a.k_s, B, Hkv, Tk, d), vx = extent(a.v_s, B, Hkv, Tk, d);
    if (qx == 0 || kx == 0 || vx == 0) return ckp_fail(CKP_ERR_BAD_SIZE, "attention (bf16): strides must not be negative");
    const ckp_span in[3] = {{q, qx / 2}, {k, kx / 2}, {v, vx / 2}};
    const ckp_span o = {out, (size_t)(B * Hq * Tq * d) * sizeof(uint16_t)}, l = {lse, (size_t)(B * Hq * Tq) * sizeof(float)};
    if (ckp_overlaps_any(o, in, 3) || ckp_overlaps_any(l, in, 3) || ckp_overlaps(out, o.bytes, lse, l.bytes))
        return ckp_fail(CKP_ERR_ALIASING, "attention (bf16): out and lse may overlap nothing");
    float *w[4] = {widen_rows(q, q_strides, B, Hq, Tq, d, padded_rows(a.q_s, Hq, Tq, d)),
                   widen_rows(k, k_strides, B, Hkv, Tk, d, padded_rows(a.k_s, Hkv, Tk, d)),
                   widen_rows(v, v_strides, B, Hkv, Tk, d, padded_rows(a.v_s, Hkv, Tk, d)),
                   malloc((size_t)(B * Hq * Tq * d) * sizeof(float))};
    if (w[0] == NULL || w[1] == NULL || w[2] == NULL || w[3] == NULL) {
        free_all(w, 4);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "attention (bf16): no memory for the widened operands");
    }
    a.q = w[0], a.k = w[1], a.v = w[2], a.bf16 = 1;
    st = forward_run(&a, w[3], lse, torch_threads);
    if (st == CKP_OK) {
        const int64_t s[3] = {Hq * Tq * d, Tq * d, d};
        narrow_rows(w[3], s, out, s, B, Hq, Tq, d);
    }
    free_all(w, 4);
    return st;
}

ckp_status ckp_attention_backward_bf16(const uint16_t *dout, const int64_t *dout_strides, const uint16_t *q,
                                       const int64_t *q_strides, const uint16_t *k, const int64_t *k_strides,
                                       const uint16_t *v, const int64_t *v_strides, const uint16_t *out,
                                       const float *lse, int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk,
                                       int64_t d, double scale, int is_causal, uint16_t *dq, const int64_t *dq_strides,
                                       uint16_t *dk, const int64_t *dk_strides, uint16_t *dv,
                                       const int64_t *dv_strides, int bf16_gemm, int torch_threads) {
    if (dout == NULL || q == NULL || k == NULL || v == NULL || out == NULL || lse == NULL || dq == NULL ||
        dk == NULL || dv == NULL || dout_strides == NULL || q_strides == NULL || k_strides == NULL ||
        v_strides == NULL || dq_strides == NULL || dk_strides == NULL || dv_strides == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "attention backward (bf16): no pointer may be NULL");
    ckp_status st = check_shapes(B, Hq, Hkv, Tq, Tk, d, scale, torch_threads);
    if (st != CKP_OK) return st;
    if (bf16_gemm != CKP_BF16_GEMM_ATEN && bf16_gemm != CKP_BF16_GEMM_ONEDNN)
        return ckp_fail(CKP_ERR_BAD_OPTION, "attention backward (bf16): bf16_gemm must be CKP_BF16_GEMM_ATEN or "
                                            "CKP_BF16_GEMM_ONEDNN, got %d", bf16_gemm);
    attn a = attn_for(B, Hq, Hkv, Tq, Tk, d, scale, is_causal != 0);
    set_strides(a.q_s, q_strides), set_strides(a.k_s, k_strides), set_strides(a.v_s, v_strides);
    set_strides(a.do_s, dout_strides), set_strides(a.dq_s, dq_strides), set_strides(a.dk_s, dk_strides);
    set_strides(a.dv_s, dv_strides);
    const int64_t os[3] = {Hq * Tq * d, Tq * d, d};
    const size_t x[8] = {extent(a.do_s, B, Hq, Tq, d), extent(a.q_s, B, Hq, Tq, d), extent(a.k_s, B, Hkv, Tk, d),
                         extent(a.v_s, B, Hkv, Tk, d), extent(os, B, Hq, Tq, d), extent(a.dq_s, B, Hq, Tq, d),
                         extent(a.dk_s, B, Hkv, Tk, d), extent(a.dv_s, B, Hkv, Tk, d)};
    for (int i = 0; i < 8; i++)
        if (x[i] == 0) return ckp_fail(CKP_ERR_BAD_SIZE, "attention backward (bf16): strides must not be negative");
    if (!disjoint_rows(a.dq_s, B, Hq, Tq, d) || !disjoint_rows(a.dk_s, B, Hkv, Tk, d) ||
        !disjoint_rows(a.dv_s, B, Hkv, Tk, d))
        return ckp_fail(CKP_ERR_BAD_SIZE, "attention backward (bf16): dq, dk and dv need strides that give each of "
                                          "their rows its own d elements");
    ckp_span spans[8] = {{dout, x[0] / 2}, {q, x[1] / 2}, {k, x[2] / 2}, {v, x[3] / 2}, {out, x[4] / 2},
                         {lse, (size_t)(B * Hq * Tq) * sizeof(float)}};
    const ckp_span outs[3] = {{dq, x[5] / 2}, {dk, x[6] / 2}, {dv, x[7] / 2}};
    for (int i = 0; i < 3; i++) {
        spans[6] = outs[(i + 1) % 3], spans[7] = outs[(i + 2) % 3];
        if (ckp_overlaps_any(outs[i], spans, 8))
            return ckp_fail(CKP_ERR_ALIASING, "attention backward (bf16): dq, dk and dv may overlap nothing");
    }
    float *w[8] = {widen_rows(dout, dout_strides, B, Hq, Tq, d, padded_rows(a.do_s, Hq, Tq, d)),
                   widen_rows(q, q_strides, B, Hq, Tq, d, padded_rows(a.q_s, Hq, Tq, d)),
                   widen_rows(k, k_strides, B, Hkv, Tk, d, padded_rows(a.k_s, Hkv, Tk, d)),
                   widen_rows(v, v_strides, B, Hkv, Tk, d, padded_rows(a.v_s, Hkv, Tk, d)),
                   widen_rows(out, os, B, Hq, Tq, d, os), aligned_alloc(64, (x[5] + 63) / 64 * 64),
                   aligned_alloc(64, (x[6] + 63) / 64 * 64), aligned_alloc(64, (x[7] + 63) / 64 * 64)};
    for (int i = 0; i < 8; i++)
        if (w[i] == NULL) {
            free_all(w, 8);
            return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "attention backward (bf16): no memory for the widened operands");
        }
    a.dout = w[0], a.q = w[1], a.k = w[2], a.v = w[3], a.out = w[4], a.lse = lse, a.bf16 = 1, a.bf16_gemm = bf16_gemm;
    st = backward_run(&a, w[5], w[6], w[7], torch_threads);
    if (st == CKP_OK) {
        narrow_rows(w[5], a.dq_s, dq, a.dq_s, B, Hq, Tq, d);
        narrow_rows(w[6], a.dk_s, dk, a.dk_s, B, Hkv, Tk, d);
        narrow_rows(w[7], a.dv_s, dv, a.dv_s, B, Hkv, Tk, d);
    }
    free_all(w, 8);
    return st;
}
