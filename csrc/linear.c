/*
 * linear.c — C = A·B (+ bias), float32, in the order of MKL's sgemm as torch 2.13's
 * wheel runs it on one thread on its AVX-512 branch ([Note: MKL's sgemm order]).
 *
 * [Note: MKL's sgemm order]
 * Measured (torch 2.13, MKL 2024.2, AMD Zen 4 and Intel Xeon, one thread):
 *   - K is cut into blocks of 384; a remainder r > 0 makes the last two blocks
 *     share 384 + r, the larger half first (K = 512: 256 + 256; K = 1000:
 *     384 + 308 + 308; K <= 384: one block) -- where C has fewer than 192
 *     columns, or K <= 768; from 192 columns on, a K over 768 ends in the
 *     remainder as a block of its own (K = 1000: 384 + 384 + 232) -- for F.linear's y (A's rows and
 *     B's columns along K); for other strides (dX, dW) only where C has 192 rows as well;
 *   - each block is an in-order chain acc = fma(a[m,k], b[k,n], acc) from +0.0;
 *   - the blocks' results are added left to right, C = acc0, C += acc1, ...;
 *   - K = 1 is a rank-1 update: the product alone (-x * 0 is -0.0, not +0.0 as from a chain), or one FMA
 *     onto the bias;
 *   - with a bias (addmm, beta 1), C starts as the bias and every block's result is added to it:
 *     ((bias + acc0) + acc1) + ... (with one block, bias + acc0: the same as the product plus the bias).
 *     F.linear takes addmm for a 2-D x and a contiguous 3-D one; any other x is matmul, then the bias
 *     added to the product (bias_after): ATen's linear (Linear.cpp).
 * That is what a Goto-style GEMM computes with a K panel of the block's depth and k innermost in its
 * micro-kernel, so following it costs no speed: B's block packed into panels of NR columns (a transposed
 * B through register transposes; a product too small to share -- under 2^18 multiply-adds -- runs as one
 * thread's GEMM that reads B's contiguous whole panels in place), A's rows
 * read by MR (packed into panels only where A is transposed and large), a register tile of MR x NR
 * accumulators per (row panel, column panel) from 0 over the block's k, stored (first block) or added
 * (the others) into C.
 * Every element's chain is its own: the tile sizes, the vector width and the thread split (over row
 * blocks, column blocks and column panels, never over K) change no bit.
 * Not followed: torch at 2 threads on this branch (MKL splits some shapes' K between its threads; under
 * MKL_CBWR=AUTO,STRICT it does not: [Note: MKL's strict order]), M = 1 or N = 1
 * (MKL's gemv paths), MKL's AVX2 branch (its own order: [Note: MKL's AVX2 order]). ckparity.kernels.linear says which.
 *
 * [Note: MKL's skinny sgemm]
 * F.linear's forward with a few rows takes other paths (measured as above, by planting +-2^30 pairs
 * among ones and reading which terms each pair swallowed). Where A's rows and B's columns both lie
 * along K (y = x.W^T: a_cs = b_rs = 1) and 2 <= M < 16, N >= 2, an element is a dot product over 16
 * lanes -- lane l the FMA chain of k = l, l + 16, ... from +0.0, a last partial step leaving the lanes
 * past K as they were, no K blocks at any K -- reduced in one of two ways:
 *   - quarters, for K >= 24 M: four 4-lane quarters added in order, then (q0 + q1) + (q2 + q3);
 *   - halving, for 2 <= K <= N <= 11 with M < N, and for N <= 3 with 2 <= K <= 31 (M < 16 at N = 2,
 *     M < 11 at N = 3): lanes l and l + 8 added, then l and l + 4, l and l + 2, l and l + 1.
 * A bias is added to the result. Not followed: N <= 3 with 32 <= K < 24 M (those M), another order.
 * dX and dW (other strides) keep the blocked order at every M; from 192 columns on they take the
 * remainder-alone rule only with 192 rows or more (F.linear's y at any M).
 *
 * Operands by strides (transposes without copies): A[m,k] at a[m*a_rs + k*a_cs], B[k,n] at
 * b[k*b_rs + n*b_cs]; C is M x N, row-major. F.linear's y = x·Wᵀ is A = x, B = Wᵀ (b_rs 1,
 * b_cs K); its dX = dY·W and dW = dYᵀ·X are the same GEMM on other strides.
 */
#include "aten_sum.h"
#include "ckp_internal.h"
#include "vec.h"

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { KBLOCK = 384, MC = 240, NC = 512, PACK_A_FLOATS = 1 << 17 };

/* [Note: MKL's strict order]
 * MKL_CBWR=AUTO,STRICT (Conditional Numerical Reproducibility, strict mode) makes MKL's sgemm give the same bits
 * at every thread count -- and changes its order (measured, torch 2.13, MKL 2024.2, AVX-512 branch, 1 and 2
 * threads, every M, N, K swept by ckparity.kernels.linear): no skinny paths, no thread's share of K, and the
 * remainder alone for every shape -- K in blocks of 384, K <= 768 as two sharing it (the larger first), a longer
 * K's remainder its own last block: what the wide rule below gives, now at every M and N. MKL's AVX2 branch in
 * strict mode (MKL_CBWR=AVX2,STRICT, or AUTO,STRICT on a CPU without AVX-512; the same bits on any CPU with AVX2:
 * that is what CNR's branches promise) is as simple: a K up to 256 one chain, up to 384 two sharing it, a
 * longer one in blocks of 192 with its remainder last (measured as above, at every M, N and K swept). A process
 * reads MKL_CBWR once (MKL does too, when it starts); ckp_set_gemm_order overrides it. */
static int gemm_order = -1;

static int order_from_env(void) {
    const char *value = getenv("MKL_CBWR");
    int strict = 0, avx2 = 0, avx512_named = 0, other = 0; /* a comma-separated list: a branch, then STRICT */
    for (const char *at = value == NULL ? "" : value; *at != '\0';) {
        const size_t len = strcspn(at, ",");
        if (len == 6 && strncasecmp(at, "STRICT", 6) == 0) strict = 1;
        else if (len == 4 && strncasecmp(at, "AVX2", 4) == 0) avx2 = 1;
        else if (len >= 6 && strncasecmp(at, "AVX512", 6) == 0) avx512_named = 1;
        else if (len > 0 && strncasecmp(at, "AUTO", 4) != 0) other = 1;
        at += len + (at[len] == ',');
    }
    if (other) return CKP_GEMM_ORDER_MKL; /* COMPATIBLE, SSE4_2, AVX: branches not followed */
    const int avx512 = __builtin_cpu_supports("avx512f");
    if (strict) return avx2 || !avx512 ? CKP_GEMM_ORDER_STRICT_AVX2 : CKP_GEMM_ORDER_STRICT;
    /* MKL's own AVX2 order where its AUTO branch is its AVX2 code: a CPU without AVX-512, or an AMD one with
     * AVX-512 other than Zen 4 (family 19h) -- measured on a Zen 5 (family 1Ah: MKL 2024.2 does not know it and
     * runs its AVX2 code there, this order bit for bit at 1 and 2 threads, while the AVX-512 branch's 384-deep
     * blocks differ from K = 193). Where the CPU has AVX-512, MKL_CBWR=AVX2 is not followed: it is another order
     * there (on that Zen 5, 14 of 300 products differ from AUTO's), nor is MKL_CBWR=AVX512 on that Zen 5 (neither
     * order: MKL's AVX-512 CNR code) */
    if (avx512 && ckp_mkl_auto_runs_avx2() && (avx2 || avx512_named))
        return CKP_GEMM_ORDER_MKL; /* not followed (cpu.py says) */
    return ckp_mkl_auto_runs_avx2() ? CKP_GEMM_ORDER_AVX2 : CKP_GEMM_ORDER_MKL;
}

int ckp_mkl_auto_runs_avx2(void) {
    const int avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int amd_past_zen4 = __builtin_cpu_is("amd") && !__builtin_cpu_is("amdfam19h");
    return avx2_fma && (!__builtin_cpu_supports("avx512f") || amd_past_zen4);
}

int ckp_get_gemm_order(void) {
    if (gemm_order < 0) gemm_order = order_from_env();
    return gemm_order;
}

ckp_status ckp_set_gemm_order(int order) {
    if (order != CKP_GEMM_ORDER_MKL && order != CKP_GEMM_ORDER_STRICT && order != CKP_GEMM_ORDER_STRICT_AVX2 &&
        order != CKP_GEMM_ORDER_AVX2)
        return ckp_fail(CKP_ERR_BAD_OPTION,
                        "gemm order must be 0 (MKL's), 1 (MKL's strict CNR order), 2 (its AVX2 branch's strict "
                        "order) or 3 (its AVX2 branch's own), got %d", order);
    gemm_order = order;
    ckp_clear_error();
    return CKP_OK;
}

static int strict_order(void) {
    const int order = ckp_get_gemm_order();
    return order == CKP_GEMM_ORDER_STRICT || order == CKP_GEMM_ORDER_STRICT_AVX2;
}

static int avx2_order(void) { return ckp_get_gemm_order() == CKP_GEMM_ORDER_AVX2; }

/* The K blocks: block b of nb is [start, start + size) (see the Note); `wide`: the remainder alone. */
enum { WIDE = 192, AVX2_DEPTH = 192 };

/* From 192 columns of C, with A's rows and B's columns along K (F.linear's y) or 192 rows as well. */
static int remainder_alone(int64_t a_cs, int64_t b_rs, int64_t M, int64_t N) {
    return strict_order() || avx2_order() || (N >= WIDE && ((a_cs == 1 && b_rs == 1) || M >= WIDE));
}

/* [Note: MKL's AVX2 order]
 * MKL's AVX2 branch on one thread (measured: torch 2.13, MKL 2024.2, an AMD EPYC without AVX-512, by planting
 * +-2^30 pairs among ones: scripts/mkl_avx2_order.py) cuts K into blocks of a depth d -- K itself up to 192,
 * half of K (rounded down) up to 384, else 192 -- and a remainder alone, last (K = 193: 96 + 96 + 1; 385:
 * 192 + 192 + 1; 1000: 5 x 192 + 40). Each block a chain from 0, the blocks added in order onto C (a bias is C's
 * start); K = 1 the product rounded, then added to the bias. Followed for GEMMs of 4+ rows and 12+ columns at one
 * torch thread; fewer take MKL's small-matrix paths, followed: with A's rows and B's columns along K (F.linear's
 * y, attention's Q.K^T) [Note: MKL's AVX2 small sgemm]; with B's rows contiguous (dX, dW, P.V) [Note: MKL's AVX2
 * small sgemm by columns]; with both transposed, plain chains (avx2_chain_row). At 2 threads MKL gives each
 * thread a share of a few-row GEMM's rows: [Note: MKL's AVX2 sgemm on two threads]. */
static int64_t avx2_depth(int64_t K) { return K <= AVX2_DEPTH ? K : K <= 2 * AVX2_DEPTH ? K / 2 : AVX2_DEPTH; }

/* [Note: MKL's AVX2 sgemm on two threads]
 * At 2 threads (torch.set_num_threads(2) sets MKL's too) MKL's AVX2 branch shares a GEMM it blocks (4+ rows,
 * 12+ columns) between its threads by C's rows, in groups of 4: the first thread ceil(groups / 2) of them, the
 * second the rest -- where the product is large enough: K > 16, or K > 4 with more than 16 columns, or K > 1 with
 * more than 100 (measured: torch 2.13, MKL 2024.2, an AMD EPYC without AVX-512, C of 2..13 rows x 2..1000
 * columns x K 1..1024, every transpose of A and B: scripts/mkl_avx2_threads.py). Each thread's rows are then a
 * GEMM of their own in the one-thread order, on their own path: a share under 4 rows takes a small path, one row
 * included (MKL's gemv is for a whole GEMM of one row). The bits move only for C of 5..11 rows (not 8): from 12
 * rows each share has 4+ and is blocked as the whole is, and below 4 MKL does not share. Only 2 threads are
 * measured (this machine has two cores); at more, the one-thread order is taken, not claimed.
 * Returns the first share's rows, or 0 where the order is the whole GEMM's. */
static int64_t avx2_first_share(int torch_threads, int64_t M, int64_t K, int64_t N) {
    if (!avx2_order() || torch_threads != 2 || M < 5 || M > 11 || M == 8 || N < 12) return 0;
    if (!(K > 16 || (K > 4 && N > 16) || (K > 1 && N > 100))) return 0;
    return 4 * (((M + 3) / 4 + 1) / 2);
}

/* A block's depth: 384 (MKL's AVX-512 code), in its AVX2 branch's strict order 256 up to K 384, else 192, in its
 * own order avx2_depth (its remainder alone: remainder_alone). */
static int64_t k_depth(int64_t K) {
    if (avx2_order()) return avx2_depth(K);
    if (ckp_get_gemm_order() != CKP_GEMM_ORDER_STRICT_AVX2) return KBLOCK;
    return K <= 384 ? 256 : 192;
}

static int64_t k_blocks(int64_t K) {
    const int64_t depth = k_depth(K);
    return K <= depth ? 1 : (K + depth - 1) / depth;
}

static void k_block(int64_t K, int wide, int64_t b, int64_t *start, int64_t *size) {
    const int64_t depth = k_depth(K), nb = k_blocks(K), r = K % depth;
    if (nb == 1) {
        *start = 0, *size = K;
        return;
    }
    if (r == 0 || b < nb - 2 || (wide && nb > 2 && b == nb - 2)) {
        *start = b * depth, *size = depth;
        return;
    }
    if (wide && nb > 2) { /* the remainder alone */
        *start = (nb - 1) * depth, *size = r;
        return;
    }
    int64_t shared = depth + r, first = (shared + 1) / 2; /* the larger half first */
    *start = (nb - 2) * depth + (b == nb - 2 ? 0 : first);
    *size = b == nb - 2 ? first : shared - first;
}

/* ---- the register tiles ------------------------------------------------------------------------ */
/* A tile of MR rows x NR columns (two vectors): acc from 0 over kb steps of A (A[i, k] at a[i*a_rs + k*a_cs]:
 * a packed panel, a_rs 1 and a_cs MR, or A where it lies -- a broadcast needs no contiguity) and B (B[k, j] at
 * b[k*ldb + j]: a packed panel, ldb NR, or B's rows where its columns are contiguous), one FMA per (row,
 * vector) a step -- each lane's chain in k order -- then stored into C (first) or added to it, rows < mr and
 * columns < nr only (rows past mr read row mr - 1, their sums discarded; B has nr whole vectors readable). The
 * rows are reached from one base pointer per three (base + index * scale addressing: few registers, so the
 * accumulators stay in theirs). The lanes and the tile size change no bit (every element is its own chain);
 * they are the CPU's: 16 lanes x 12 rows with AVX-512 (24 accumulators of its 32 registers), 8 x 6 with AVX2
 * (12 of 16). The k loop unrolled by 4 (the compiler leaves it rolled: its counter and branch a step cost 6-17% of
 * the AVX2 tile's time at attention's block GEMMs, measured against the rolled build in turn on an AMD EPYC). */
#define LINEAR_DEFINE_TILE(NAME, TARGET, VEC, LANES, MR, SET1, LOAD, STORE, ADD, FMA, ZERO)                     \
    __attribute__((target(TARGET))) static void NAME(int64_t kb, const float *a, int64_t a_rs, int64_t a_cs,     \
                                                   const float *b, int64_t ldb, float *c, int64_t ldc,         \
                                                   int64_t mr, int64_t nr, int first) {                        \
        VEC acc[MR][2];                                                                                         \
        for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = ZERO();                                            \
        const float *base[MR / 3];                                                                              \
        for (int g = 0; g < MR / 3; g++) base[g] = a + (3 * g < mr ? 3 * g : mr - 1) * a_rs;                   \
        const int64_t step[3] = {0, a_rs, 2 * a_rs};                                                            \
        _Pragma("GCC unroll 4") for (int64_t k = 0; k < kb; k++, b += ldb) {                                    \
            VEC b0 = LOAD(b), b1 = LOAD(b + LANES);                                                             \
            for (int i = 0; i < MR; i++) {                                                                      \
                VEC x = SET1(base[i / 3][i < mr ? step[i % 3] : 0]);                                            \
                acc[i][0] = FMA(x, b0, acc[i][0]);                                                              \
                acc[i][1] = FMA(x, b1, acc[i][1]);                                                              \
            }                                                                                                   \
            for (int g = 0; g < MR / 3; g++) base[g] += a_cs;                                                   \
        }                                                                                                       \
        if (nr == 2 * LANES) { /* whole columns: vector stores, the rows below mr */                           \
            for (int i = 0; i < mr; i++)                                                                        \
                for (int v = 0; v < 2; v++) {                                                                   \
                    float *at = c + i * ldc + v * LANES;                                                        \
                    STORE(at, first ? acc[i][v] : ADD(LOAD(at), acc[i][v]));                                    \
                }                                                                                               \
            return;                                                                                             \
        }                                                                                                       \
        float out[MR][2 * LANES];                                                                               \
        for (int i = 0; i < MR; i++)                                                                            \
            for (int v = 0; v < 2; v++) STORE(&out[i][v * LANES], acc[i][v]);                                   \
        for (int64_t i = 0; i < mr; i++)                                                                        \
            for (int64_t j = 0; j < nr; j++) c[i * ldc + j] = first ? out[i][j] : c[i * ldc + j] + out[i][j];     \
    }

LINEAR_DEFINE_TILE(tile16, "avx512f,fma", __m512, 16, 12, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                   _mm512_add_ps, _mm512_fmadd_ps, _mm512_setzero_ps)
LINEAR_DEFINE_TILE(tile8, "avx2,fma", __m256, 8, 6, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                   _mm256_add_ps, _mm256_fmadd_ps, _mm256_setzero_ps)

/* Any other x86-64 (no FMA instruction): the same chains, fmaf in software. */
static void tile_scalar(int64_t kb, const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t ldb,
                        float *c, int64_t ldc, int64_t mr, int64_t nr, int first) {
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < kb; k++) acc = fmaf(a[i * a_rs + k * a_cs], b[k * ldb + j], acc);
            c[i * ldc + j] = first ? acc : c[i * ldc + j] + acc;
        }
}

ckp_tiling ckp_tiling_for_cpu(void) {
    if (__builtin_cpu_supports("avx512f")) return (ckp_tiling){tile16, 12, 32};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return (ckp_tiling){tile8, 6, 16};
    return (ckp_tiling){tile_scalar, 4, 8};
}

/* ---- packing ----------------------------------------------------------------------------------- */
/* 16 rows of 16 floats transposed in registers (r[i][j] -> r[j][i]): pairs within 128-bit lanes, then quads,
 * then the lanes themselves. */
__attribute__((target("avx512f"))) static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* r[4i + c], lane L: element 4L + c of rows 4i..4i+3 */
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        const __m512 u0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), u1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        const __m512 u2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 u3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        t[8 + c] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
        t[4 + c] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* 8 rows of 8 floats transposed (AVX2): pairs, quads, then the 128-bit halves. */
__attribute__((target("avx2"))) static inline void transpose8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {
        t[c] = _mm256_permute2f128_ps(r[c], r[4 + c], 0x20);
        t[4 + c] = _mm256_permute2f128_ps(r[c], r[4 + c], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}

/* A transposed B's panel (its columns along k: src[k + j * b_cs]) into bp[k * nr + j], each value times
 * scale: the whole squares of L x L (j, k) through a register transpose, the rest one by one. The same
 * product per value either way: only the copy's speed differs (scalar, this was most of a small GEMM). */
#define LINEAR_DEFINE_PACK_COLUMNS(NAME, TARGET, VEC, L, SET1, LOAD, STORE, MUL, TRANSPOSE)                     \
    __attribute__((target(TARGET))) static void NAME(const float *src, int64_t b_cs, int64_t kb, int64_t cols,   \
                                                   int64_t nr, float scale, float *bp) {                       \
        const int64_t cj = cols / L * L, ck = kb / L * L;                                                       \
        const VEC s = SET1(scale);                                                                              \
        for (int64_t j0 = 0; j0 < cj; j0 += L)                                                                  \
            for (int64_t k0 = 0; k0 < ck; k0 += L) {                                                            \
                VEC r[L];                                                                                       \
                for (int i = 0; i < L; i++) r[i] = MUL(LOAD(src + (j0 + i) * b_cs + k0), s);                   \
                TRANSPOSE(r);                                                                                   \
                for (int i = 0; i < L; i++) STORE(bp + (k0 + i) * nr + j0, r[i]);                               \
            }                                                                                                   \
        for (int64_t j = 0; j < cols; j++)                                                                      \
            for (int64_t k = j < cj ? ck : 0; k < kb; k++) bp[k * nr + j] = src[k + j * b_cs] * scale;          \
    }

LINEAR_DEFINE_PACK_COLUMNS(pack_columns16, "avx512f", __m512, 16, _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps,
                           _mm512_mul_ps, transpose16)
LINEAR_DEFINE_PACK_COLUMNS(pack_columns8, "avx2", __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                           _mm256_mul_ps, transpose8)

/* Panel p of B's rows [k0, k0 + kb), columns [n0 + p*nr, ...): kb rows of nr columns, zero past the
 * block's nc columns. The tiling's nr says which vector transposes it has (32: AVX-512's, 16: AVX2's). */
static inline __attribute__((always_inline)) void pack_b_panel(const float *b, int64_t b_rs, int64_t b_cs, int64_t k0, int64_t kb, int64_t n0, int64_t nc,
                         int64_t nr, int64_t p, float scale, float *bp) {
    bp += p * nr * kb;
    const int64_t cols = nc - p * nr < nr ? nc - p * nr : nr;
    const float *src = b + k0 * b_rs + (n0 + p * nr) * b_cs;
    if (b_rs == 1 && b_cs != 1) { /* B's columns lie along k (a transposed operand): read them in order */
        if (nr == 32) pack_columns16(src, b_cs, kb, cols, nr, scale, bp);
        else if (nr == 16) pack_columns8(src, b_cs, kb, cols, nr, scale, bp);
        else
            for (int64_t j = 0; j < cols; j++)
                for (int64_t k = 0; k < kb; k++) bp[k * nr + j] = src[k + j * b_cs] * scale;
    } else if (b_cs == 1) { /* B's rows contiguous: a vector copy per k */
        for (int64_t k = 0; k < kb; k++)
            for (int64_t j = 0; j < cols; j++) bp[k * nr + j] = src[k * b_rs + j] * scale;
    } else {
        for (int64_t k = 0; k < kb; k++)
            for (int64_t j = 0; j < cols; j++) bp[k * nr + j] = src[k * b_rs + j * b_cs] * scale;
    }
    for (int64_t k = 0; k < kb; k++)
        for (int64_t j = cols; j < nr; j++) bp[k * nr + j] = 0.0f;
}

/* A's rows [m0, m0 + mc), columns [k0, k0 + kb) as panels of mr rows, zero past mc. */
static inline __attribute__((always_inline)) void pack_a(const float *a, int64_t a_rs, int64_t a_cs, int64_t m0, int64_t mc, int64_t k0, int64_t kb,
                   int64_t mr, float *ap) {
    for (int64_t q = 0; q < mc; q += mr, ap += kb * mr) {
        const int64_t rows = mc - q < mr ? mc - q : mr;
        const float *src = a + (m0 + q) * a_rs + k0 * a_cs;
        if (a_cs == 1) { /* A's rows lie along k: read each in order */
            for (int64_t i = 0; i < rows; i++)
                for (int64_t k = 0; k < kb; k++) ap[k * mr + i] = src[i * a_rs + k];
        } else {
            for (int64_t k = 0; k < kb; k++)
                for (int64_t i = 0; i < rows; i++) ap[k * mr + i] = src[i * a_rs + k * a_cs];
        }
        for (int64_t k = 0; k < kb; k++)
            for (int64_t i = rows; i < mr; i++) ap[k * mr + i] = 0.0f;
    }
}

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* ---- the skinny path: 16-lane dot products ([Note: MKL's skinny sgemm]) --------------------------- */
enum { DOT_LANES = 16, SKINNY_ROWS = 16, SKINNY_K_PER_ROW = 24 };
typedef enum { BLOCKED, QUARTERS, HALVING, AVX2_SMALL, AVX2_COLUMNS, AVX2_CHAIN, AVX2_GEMV, AVX2_SWEEP } gemm_path;

/* share: the rows are one thread's share of a GEMM MKL split ([Note: MKL's AVX2 sgemm on two threads]). */
static gemm_path path_for(int64_t a_rs, int64_t a_cs, int64_t b_rs, int64_t b_cs, int64_t M, int64_t K, int64_t N,
                          int share) {
    if (strict_order()) return BLOCKED;
    /* one row or one column along K: MKL's gemv ([Note: MKL's AVX2 sgemv]) -- a whole GEMM's, not a thread's share;
     * a single product whose B is given as a contiguous column is a plain chain (ATen hands MKL that B transposed) */
    if (avx2_order() && !share && a_cs == 1 && b_rs == 1 && M == 1 && N == 1 && b_cs == 1) return AVX2_SWEEP;
    if (avx2_order() && !share && a_cs == 1 && b_rs == 1 && (M == 1 || N == 1)) return AVX2_GEMV;
    if (avx2_order() && !share && N == 1 && a_rs == 1) return AVX2_SWEEP; /* one column, A's columns contiguous */
    if (N < 2) return BLOCKED;
    /* MKL's AVX2 branch blocks every GEMM of 4+ rows and 12+ columns, and runs its small paths below that: by
     * columns where B's rows are contiguous and A's rows or columns are, dot products where A's rows and B's
     * columns lie along K, plain chains where A's columns and B's columns do (a whole GEMM of one row with both
     * transposed: a gemv form not followed; a thread's share of one row takes the small paths). */
    if (avx2_order() && (M < 4 || N < 12)) {
        if (b_cs == 1 && (a_cs == 1 || a_rs == 1)) return AVX2_COLUMNS;
        if (a_cs == 1 && b_rs == 1 && (M >= 2 || share)) return AVX2_SMALL;
        if (a_rs == 1 && b_rs == 1 && (M >= 2 || share)) return AVX2_CHAIN;
    }
    if (avx2_order() || a_cs != 1 || b_rs != 1 || M < 2 || M >= SKINNY_ROWS) return BLOCKED;
    if (K >= SKINNY_K_PER_ROW * M) return QUARTERS;
    if (K >= 2 && ((K <= N && M < N && N <= 11) || (K <= 31 && (N == 2 || (N == 3 && M < 11))))) return HALVING;
    return BLOCKED;
}

/* The 16 lanes' chains of x[0..K) . w[0..K) (both contiguous), in out[16]. */
__attribute__((target("avx512f,fma"))) static void dot_lanes16(const float *x, const float *w, int64_t K,
                                                               float *out) {
    __m512 acc = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + DOT_LANES <= K; k += DOT_LANES) acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), _mm512_loadu_ps(w + k), acc);
    if (k < K) {
        const __mmask16 live = (__mmask16)((1u << (K - k)) - 1);
        acc = _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(live, x + k), _mm512_maskz_loadu_ps(live, w + k), acc, live);
    }
    _mm512_storeu_ps(out, acc);
}

__attribute__((target("avx2,fma"))) static void dot_lanes8x2(const float *x, const float *w, int64_t K, float *out) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + DOT_LANES <= K; k += DOT_LANES) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(w + k + 8), hi);
    }
    _mm256_storeu_ps(out, lo);
    _mm256_storeu_ps(out + 8, hi);
    for (int64_t l = 0; k + l < K; l++) out[l] = fmaf(x[k + l], w[k + l], out[l]);
}

static void dot_lanes_scalar(const float *x, const float *w, int64_t K, float *out) {
    for (int l = 0; l < DOT_LANES; l++) {
        out[l] = 0.0f;
        for (int64_t k = l; k < K; k += DOT_LANES) out[l] = fmaf(x[k], w[k], out[l]);
    }
}

static float dot_reduce16(gemm_path path, float v[DOT_LANES]) {
    if (path == HALVING) {
        for (int half = DOT_LANES / 2; half >= 1; half /= 2)
            for (int l = 0; l < half; l++) v[l] += v[l + half];
        return v[0];
    }
    float q[4];
    for (int j = 0; j < 4; j++) q[j] = ((v[j] + v[4 + j]) + v[8 + j]) + v[12 + j];
    return (q[0] + q[1]) + (q[2] + q[3]);
}

/* [Note: MKL's AVX2 small sgemm]
 * MKL's AVX2 branch on one thread, for C of 2..3 rows or 2..11 columns with A's rows and B's columns along K
 * (measured: torch 2.13, MKL 2024.2, an AMD EPYC without AVX-512, by planting +-2^30 pairs and on random inputs:
 * scripts/mkl_avx2_small.py), takes each element as a dot product of A's row x and B's column w, without FMA
 * (each product rounded, then added): the k before x's first 16-byte boundary (0..3 of them: its address decides)
 * a chain from 0 that starts lane 0; then lanes of k mod L over whole L-groups, L = 4 for C's columns in its
 * whole groups of 4 and 8 for the 1..3 columns after them; the lanes halved (lane l + lane l + L/2, down to one);
 * the k left over added to that in order. alpha multiplies the rounded sum; beta 1 adds C to that, as a bias. */
/* The floats before p's first 16-byte boundary (0..3): where MKL's small paths start their vectors. */
static inline int64_t floats_to_boundary(const float *p) {
    return (int64_t)((16 - (uintptr_t)p % 16) % 16 / sizeof(float));
}

static inline __attribute__((always_inline)) float avx2_small_dot(const float *x, const float *w, int64_t K,
                                                                  int lanes) {
    const int64_t ahead = floats_to_boundary(x), peel = ahead < K ? ahead : K;
    float acc[8] = {0};
    for (int64_t k = 0; k < peel; k++) acc[0] += x[k] * w[k];
    const int64_t end = peel + (K - peel) / lanes * lanes;
    for (int64_t k = peel; k < end; k += lanes)
        for (int l = 0; l < lanes; l++) acc[l] += x[k + l] * w[k + l];
    for (int half = lanes / 2; half >= 1; half /= 2)
        for (int l = 0; l < half; l++) acc[l] += acc[l + half];
    float sum = acc[0];
    for (int64_t k = end; k < K; k++) sum += x[k] * w[k];
    return sum;
}

/* Four of those dots, x against B's columns w, w + w_cs, ... of whole groups of 4 (4 lanes each: one SSE vector):
 * each column's order as avx2_small_dot's, the four chains interleaved -- one chain is bound by the add's latency,
 * four are not (the compiler's own vectors for this shuffled lanes: 2 x 1024 x 1024 took 3.8x torch's time, 1.1x so). */
static void avx2_small_dot4(const float *x, const float *w, int64_t w_cs, int64_t K, float out[4]) {
    const int64_t ahead = floats_to_boundary(x), peel = ahead < K ? ahead : K;
    __m128 acc[4];
    for (int c = 0; c < 4; c++) {
        float lane0 = 0.0f;
        for (int64_t k = 0; k < peel; k++) lane0 += x[k] * w[c * w_cs + k];
        acc[c] = _mm_set_ss(lane0);
    }
    const int64_t end = peel + (K - peel) / 4 * 4;
    for (int64_t k = peel; k < end; k += 4) {
        const __m128 xv = _mm_loadu_ps(x + k);
        for (int c = 0; c < 4; c++) acc[c] = _mm_add_ps(acc[c], _mm_mul_ps(xv, _mm_loadu_ps(w + c * w_cs + k)));
    }
    for (int c = 0; c < 4; c++) {
        const __m128 half = _mm_add_ps(acc[c], _mm_movehl_ps(acc[c], acc[c])); /* lanes l + 2, then l + 1 */
        float sum = _mm_cvtss_f32(_mm_add_ss(half, _mm_shuffle_ps(half, half, 1)));
        for (int64_t k = end; k < K; k++) sum += x[k] * w[c * w_cs + k];
        out[c] = sum;
    }
}

/* x's dots against B's columns [n0, n1) of N, into out[n - n0]: a column of C's whole groups of 4 takes 4
 * lanes, one after them 8 (the Note); four columns at a time where four of the first kind follow. */
static void avx2_small_dots(const float *x, const float *b, int64_t b_cs, int64_t K, int64_t n0, int64_t n1,
                            int64_t N, float *out) {
    const int64_t grouped = N / 4 * 4;
    int64_t n = n0;
    for (; n + 4 <= n1 && n + 4 <= grouped; n += 4) avx2_small_dot4(x, b + n * b_cs, b_cs, K, out + n - n0);
    for (; n < n1; n++) out[n - n0] = avx2_small_dot(x, b + n * b_cs, K, n < grouped ? 4 : 8);
}

typedef void (*dot_lanes)(const float *, const float *, int64_t, float *);

static dot_lanes dot_lanes_for_cpu(void) {
    return __builtin_cpu_supports("avx512f")                                      ? dot_lanes16
           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? dot_lanes8x2
                                                                              : dot_lanes_scalar;
}

/* C's row x (A's row m) against B's columns [n0, n1) of N into out[n - n0], on a non-blocked dot path (lanes:
 * the CPU's 16-lane dot products, for the skinny paths). */
static void skinny_dots(gemm_path path, dot_lanes lanes, const float *x, const float *b, int64_t b_cs, int64_t K,
                        int64_t n0, int64_t n1, int64_t N, float *out) {
    if (path == AVX2_SMALL) {
        avx2_small_dots(x, b, b_cs, K, n0, n1, N, out);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        float v[DOT_LANES];
        lanes(x, b + n * b_cs, K, v);
        out[n - n0] = dot_reduce16(path, v);
    }
}

/* [Note: MKL's AVX2 small sgemm by columns]
 * Its small path where B's rows are contiguous (torch.mm(a, b) of contiguous a and b: dX = dY.W; and with A
 * transposed: dW = dY^T.X, attention's P^T.dO), for C of 1..3 rows or 2..11 columns (measured as the Note above,
 * scripts/mkl_avx2_small.py: every C row of 1..9 and columns of 2..37, K 2..385, C's row one to three floats past
 * a 16-byte boundary), runs along C's rows, vectorized over its columns, each element a chain over k without FMA:
 * acc = acc + (alpha a[m,k]) b[k,n] from C (beta 1) or from 0. The columns before C's row reaches a 16-byte
 * boundary (0..3: the row's address decides), where 4 or more columns remain after them, take 8 k at a time: 4
 * products added one by one, then ((p4 + p5) + p6) + p7 added; the k % 8 left one by one. So C's row address
 * moves bits here: torch's outputs are fresh 64-byte aligned tensors, C's rows every N floats from there. */
static void avx2_peel_columns(const float *a, int64_t a_cs, const float *b, int64_t b_rs, int64_t K, int64_t peel,
                              float alpha, float *c) {
    for (int64_t n = 0; n < peel; n++) {
        float acc = c[n];
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            float p[8];
            for (int i = 0; i < 8; i++) p[i] = (alpha * a[(k + i) * a_cs]) * b[(k + i) * b_rs + n];
            acc = acc + p[0];
            acc = acc + p[1];
            acc = acc + p[2];
            acc = acc + p[3];
            acc = acc + (((p[4] + p[5]) + p[6]) + p[7]);
        }
        for (; k < K; k++) acc = acc + (alpha * a[k * a_cs]) * b[k * b_rs + n];
        c[n] = acc;
    }
}

/* One row's plain chains at C's columns [n0, n1), k outer (the compiler's vectors over n). */
static void avx2_chains(const float *a, int64_t a_cs, const float *b, int64_t b_rs, int64_t K, int64_t n0, int64_t n1,
                        float alpha, float *c) {
    for (int64_t k = 0; k < K; k++) {
        const float s = alpha * a[k * a_cs], *bk = b + k * b_rs;
        for (int64_t n = n0; n < n1; n++) c[n] = c[n] + s * bk[n];
    }
}

/* Four rows' plain chains at C's columns [0, 4) (c: the first row's, ldc apart) in SSE registers: one row's chains
 * wait on the add's latency every k, four rows' interleave (F.linear's fwd+bwd at 512 x 8 x 1024, 8 in-features:
 * dX and dW here, took 2.2x the time one row at a time). */
static void avx2_chains_4x4(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t K,
                            float alpha, float *c, int64_t ldc) {
    __m128 acc[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm_loadu_ps(c + r * ldc);
    for (int64_t k = 0; k < K; k++) {
        const __m128 bk = _mm_loadu_ps(b + k * b_rs);
        for (int r = 0; r < 4; r++)
            acc[r] = _mm_add_ps(acc[r], _mm_mul_ps(_mm_set1_ps(alpha * a[r * a_rs + k * a_cs]), bk));
    }
    for (int r = 0; r < 4; r++) _mm_storeu_ps(c + r * ldc, acc[r]);
}

/* C's rows [0, rows) (rows <= 4, ldc apart, holding each chain's start) on the by-columns path: each row's peel
 * columns, then its chains -- four rows' together in blocks of 4 columns from the widest peel on. */
static void avx2_columns_rows(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t K,
                              int64_t N, float alpha, float *c, int64_t ldc, int64_t rows) {
    int64_t peel[4], widest = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t ahead = floats_to_boundary(c + r * ldc);
        peel[r] = N - ahead >= 4 ? ahead : 0;
        widest = peel[r] > widest ? peel[r] : widest;
        avx2_peel_columns(a + r * a_rs, a_cs, b, b_rs, K, peel[r], alpha, c + r * ldc);
    }
    const int64_t from = rows == 4 ? widest : N, to = rows == 4 ? widest + (N - widest) / 4 * 4 : N;
    for (int64_t n = from; n < to; n += 4) avx2_chains_4x4(a, a_rs, a_cs, b + n, b_rs, K, alpha, c + n, ldc);
    for (int64_t r = 0; r < rows; r++) {
        avx2_chains(a + r * a_rs, a_cs, b, b_rs, K, peel[r], from, alpha, c + r * ldc);
        avx2_chains(a + r * a_rs, a_cs, b, b_rs, K, to, N, alpha, c + r * ldc);
    }
}

/* Its small path with both A and B transposed (A's columns and B's columns along K: y and dW of a column-major x),
 * measured as above (C of 2..9 rows against 2..37 columns, K 2..385, beta 0 and 1, alpha 1 and 0.3): each element
 * a chain over k without FMA from 0, times alpha, added to C (beta 1). Where C lies moves no bit here. */
static void avx2_chain_row(const float *a, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs, int64_t K,
                           int64_t N, float alpha, int accumulate, float *c) {
    for (int64_t n = 0; n < N; n++) {
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) sum = sum + a[k * a_cs] * b[k * b_rs + n * b_cs];
        c[n] = accumulate ? c[n] + alpha * sum : alpha * sum;
    }
}

/* [Note: MKL's AVX2 sgemv]
 * A whole GEMM of one row or one column whose operands lie along K (F.linear's y of one x row, or of one output:
 * a_cs = b_rs = 1) is MKL's gemv on its AVX2 branch (measured: torch 2.13, MKL 2024.2, an AMD EPYC without
 * AVX-512, one thread, by planting +-2^30 pairs, then random inputs: scripts/mkl_avx2_gemv.py). The vector is A's
 * row (one row; one element too) or B's column, the matrix's rows the others; each output the dot product of the
 * vector and its row, without FMA, in one of two orders by where the output lies:
 *   - the outputs in whole groups of 4: the first r terms a chain from 0 -- r = 4 - (the address of the group's
 *     fourth row mod 16) / 4, 1..4: the matrix's address and row stride move bits -- that goes on as lane 0 of 4
 *     lanes over the next floor((K - r) / 4) steps of 4 (term k in lane (k - r) mod 4), reduced (l0 + l2) +
 *     (l1 + l3), then the terms left added in order;
 *   - the 1..3 outputs after them: the first p terms a chain from 0 that goes on as lane 0 -- p = 4 - (the
 *     vector's address mod 16) / 4, 1..4: the vector's address moves bits -- then floor((K - p) / 8) steps of 8
 *     terms, the first and third such output over 8 lanes ((k - p) mod 8, reduced l + 4, l + 2, l + 1 into l), the
 *     second over 4 ((k - p) mod 4, reduced as above), then the terms left added in order.
 * alpha multiplies the rounded result, and C (beta 1) is added to that; a bias is added to the result.
 * One column whose vector (B's column) is strided or whose C is (ldc > 1: ATen's flash kernel's dQ with d = 1)
 * takes the groups' order as above, but the 1..3 outputs after them another: the first term, then 8 lanes over
 * steps of 8 (term k in lane (k - 1) mod 8), the lanes added in order l0 + l1 + ... + l7, then the terms left
 * in order (measured: torch 2.13, MKL 2024.2, an AMD EPYC Zen 5, one and two threads, planted pairs, then
 * random inputs: 23352 outputs of ldc 1..5, N 1..32, K 2..100, alpha 0.3 and beta 0/1, every placement).
 * Its other form sweeps A's columns (avx2_sweep): each element of one column whose A has its columns contiguous
 * (a_rs 1: linear's dW of one input feature, dY^T.X; the flash kernel's dV and dK with d = 1), and a single
 * product (M = N = 1) whose B is a contiguous column (b_cs 1: ATen hands it to MKL transposed), is a chain over
 * k without FMA from C's value (beta 1, a bias) or 0, each term alpha times B's element, then times A's. MKL
 * runs it over C's column in vectors from its first 16-byte boundary: where B's column and C's are contiguous
 * and 4 or more outputs follow the boundary, the 1..3 before it take K in blocks of 8 -- the block's first 4
 * terms added onto the output in turn, its last 4 a chain from 0 added after -- and the K mod 8 left in order
 * (measured as above: 14400 GEMMs of N 1..64, K 1..70, C 0..3 floats past a boundary, ldc and B's stride 1..3,
 * alpha 0.3, beta 0/1). */
static float avx2_gemv_dot(const float *v, int64_t vs, const float *row, int64_t K, int64_t ld, int64_t out,
                           int64_t outs, int64_t peel, int strided) {
    const int64_t tail = out - outs / 4 * 4; /* the output's place among those after the groups of 4 */
    /* the chain starts from its first term (-0 + p is p, every p) and the lanes from +0, reduced only where a
     * step ran: a sum of -0 products is -0 without a step, +0 with one (the sign shows in y = -0 + bias -0) */
    float acc[8] = {-0.0f};
    if (tail < 0) {
        const float *last = row + (3 - out % 4) * ld; /* the group's fourth row */
        const int64_t lead = 4 - (int64_t)(((uintptr_t)last & 15) >> 2);
        const int64_t r = lead < K ? lead : K, end = r + (K - r) / 4 * 4;
        for (int64_t k = 0; k < r; k++) acc[0] = acc[0] + v[k * vs] * row[k];
        for (int64_t k = r; k < end; k++) acc[(k - r) % 4] = acc[(k - r) % 4] + v[k * vs] * row[k];
        float sum = end == r ? acc[0] : (acc[0] + acc[2]) + (acc[1] + acc[3]);
        for (int64_t k = end; k < K; k++) sum = sum + v[k * vs] * row[k];
        return sum;
    }
    if (strided) { /* the first term, 8 lanes, added in order */
        const int64_t end = 1 + (K - 1) / 8 * 8;
        acc[0] = v[0] * row[0];
        for (int64_t k = 1; k < end; k++) acc[(k - 1) % 8] = acc[(k - 1) % 8] + v[k * vs] * row[k];
        float sum = acc[0];
        for (int64_t l = 1; l < 8; l++) sum = sum + acc[l];
        for (int64_t k = end; k < K; k++) sum = sum + v[k * vs] * row[k];
        return sum;
    }
    const int64_t lanes = tail == 1 ? 4 : 8, p = peel < K ? peel : K, end = p + (K - p) / 8 * 8;
    for (int64_t k = 0; k < p; k++) acc[0] = acc[0] + v[k] * row[k];
    for (int64_t k = p; k < end; k++) acc[(k - p) % lanes] = acc[(k - p) % lanes] + v[k] * row[k];
    if (lanes == 8 && end > p)
        for (int64_t half = 4; half >= 1; half /= 2)
            for (int64_t l = 0; l < half; l++) acc[l] = acc[l] + acc[l + half];
    float sum = lanes == 4 && end > p ? (acc[0] + acc[2]) + (acc[1] + acc[3]) : acc[0];
    for (int64_t k = end; k < K; k++) sum = sum + v[k] * row[k];
    return sum;
}

/* C (ldc) = alpha A.B, or C += alpha A.B with accumulate, for the GEMMs the Note covers: one row (M == 1, not
 * column) or one column (N == 1, column: the vector B's column, b_rs apart). */
static void avx2_gemv(const float *a, int64_t a_rs, const float *b, int64_t b_rs, int64_t b_cs, int64_t M, int64_t K,
                      int64_t N, int column, float alpha, int accumulate, float *c, int64_t ldc) {
    const float *v = column ? b : a;
    const int64_t outs = column ? M : N, vs = column ? b_rs : 1, peel = 4 - (int64_t)(((uintptr_t)v & 15) >> 2);
    const int strided = column && (b_rs != 1 || ldc != 1);
    for (int64_t i = 0; i < outs; i++) {
        const float dot = avx2_gemv_dot(v, vs, column ? a + i * a_rs : b + i * b_cs, K, column ? a_rs : b_cs, i, outs,
                                        peel, strided);
        float *at = column ? c + i * ldc : c + i;
        *at = accumulate ? *at + alpha * dot : alpha * (0.0f + dot); /* C written from +0 (beta 0): a -0 sum is +0 */
    }
}

/* C's one column (ldc) by MKL's gemv sweep (the Note above): from C (accumulate) or 0, each term alpha times B's
 * element, then times A's; the outputs before C's first 16-byte boundary in blocks of 8 where the Note says. */
static void avx2_sweep(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t M, int64_t K,
                       float alpha, int accumulate, float *c, int64_t ldc) {
    const int64_t ahead = (4 - (int64_t)(((uintptr_t)c & 15) >> 2)) % 4;
    const int64_t blocked = ldc == 1 && b_rs == 1 && M >= ahead + 4 ? ahead : 0, whole = K / 8 * 8;
    for (int64_t m = 0; m < M; m++) {
        const float *row = a + m * a_rs;
        float sum = accumulate ? c[m * ldc] : 0.0f;
        int64_t k = 0;
        for (; m < blocked && k < whole; k += 8) {
            for (int64_t j = k; j < k + 4; j++) sum = sum + (alpha * b[j * b_rs]) * row[j * a_cs];
            float late = 0.0f;
            for (int64_t j = k + 4; j < k + 8; j++) late = late + (alpha * b[j * b_rs]) * row[j * a_cs];
            sum = sum + late;
        }
        for (; k < K; k++) sum = sum + (alpha * b[k * b_rs]) * row[k * a_cs];
        c[m * ldc] = sum;
    }
}

/* C[m, n] = (bias[n] +) dot(A's row m, B's column n); the columns shared by the threads, SKINNY_COLS at a time. */
enum { SKINNY_COLS = 4 };
static void skinny_gemm(gemm_path path, const float *a, int64_t a_rs, const float *b, int64_t b_cs, int64_t M,
                        int64_t K, int64_t N, const float *bias, float *c, int team) {
    const dot_lanes lanes = dot_lanes_for_cpu();
#pragma omp parallel for schedule(static) num_threads(team)
    for (int64_t n0 = 0; n0 < N; n0 += SKINNY_COLS) {
        const int64_t n1 = n0 + SKINNY_COLS < N ? n0 + SKINNY_COLS : N;
        for (int64_t m = 0; m < M; m++) {
            float dots[SKINNY_COLS];
            skinny_dots(path, lanes, a + m * a_rs, b, b_cs, K, n0, n1, N, dots);
            for (int64_t n = n0; n < n1; n++) c[m * N + n] = bias != NULL ? bias[n] + dots[n - n0] : dots[n - n0];
        }
    }
}

/* Row block mb's tiles against every column panel in [p0, p1) (step dp) of one K block: A's rows packed in
 * panels (ap), or, with ap NULL, read where they lie (a: the block's first row at its K block's first k).
 * Each row panel (MR x the block's k: 18 KB at 384) against all the column panels in turn, so it stays in L1
 * while B's packed block (384 x NC: 768 KB) streams from L2 -- BLIS's order for AVX-512 with our operands'
 * roles swapped (measured against the column panel outside: 0.70 -> 0.85x MKL at 2048 x 4096 x 4096). */
static void row_block(const ckp_tiling *t, const float *ap, const float *a, int64_t a_rs, int64_t a_cs,
                      const float *bp, int64_t kb, int64_t m0, int64_t mc, int64_t n0, int64_t nc, int64_t p0,
                      int64_t p1, int64_t dp, float *c, int64_t N, int first) {
    for (int64_t q = 0; q < mc; q += t->mr)
        for (int64_t p = p0; p < p1; p += dp) {
            const int64_t nr = nc - p * t->nr < t->nr ? nc - p * t->nr : t->nr;
            const int64_t mr = mc - q < t->mr ? mc - q : t->mr;
            float *at = c + (m0 + q) * N + n0 + p * t->nr;
            if (ap != NULL)
                t->tile(kb, ap + q * kb, 1, t->mr, bp + p * t->nr * kb, t->nr, at, N, mr, nr, first);
            else
                t->tile(kb, a + q * a_rs, a_rs, a_cs, bp + p * t->nr * kb, t->nr, at, N, mr, nr, first);
        }
}

static ckp_status gemm_rows(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs,
                            int64_t M, int64_t K, int64_t N, const float *bias, int bias_after, float *c, int share);
CKP_CLONES static void gemm_serial_rows(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs,
                                        int64_t b_cs, int64_t M, int64_t K, int64_t N, float alpha, int accumulate,
                                        float *c, int64_t ldc, float *scratch, ckp_gemm_slot *slot, int share);

ckp_status ckp_gemm(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs,
                    int64_t M, int64_t K, int64_t N, const float *bias, int bias_after, float *c, int torch_threads) {
    if (a == NULL || b == NULL || c == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "a, b and c must not be NULL");
    if (M <= 0 || K <= 0 || N <= 0 || M > INT32_MAX || K > INT32_MAX || N > INT32_MAX ||
        M > INT64_MAX / 4 / N)
        return ckp_fail(CKP_ERR_BAD_SIZE, "M, K and N must be positive, got M=%lld K=%lld N=%lld", (long long)M,
                        (long long)K, (long long)N);
    if (a_rs < 0 || a_cs < 0 || b_rs < 0 || b_cs < 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "strides must not be negative");
    if (bias_after != 0 && bias_after != 1)
        return ckp_fail(CKP_ERR_BAD_OPTION, "bias_after must be 0 (the bias as C's start) or 1, got %d", bias_after);
    if (torch_threads < 1) return ckp_fail(CKP_ERR_BAD_OPTION, "torch_threads must be >= 1, got %d", torch_threads);
    size_t c_bytes = (size_t)(M * N) * sizeof(float);
    /* the extent each operand's strides reach: an output over any of it is refused */
    size_t a_bytes = (size_t)((M - 1) * a_rs + (K - 1) * a_cs + 1) * sizeof(float);
    size_t b_bytes = (size_t)((K - 1) * b_rs + (N - 1) * b_cs + 1) * sizeof(float);
    if (ckp_overlaps(c, c_bytes, a, a_bytes) || ckp_overlaps(c, c_bytes, b, b_bytes) ||
        (bias != NULL && ckp_overlaps(c, c_bytes, bias, (size_t)N * sizeof(float))))
        return ckp_fail(CKP_ERR_ALIASING, "c overlaps a, b or the bias");
    ckp_clear_error();
    const int64_t first = avx2_first_share(torch_threads, M, K, N);
    if (first == 0) return gemm_rows(a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, bias, bias_after, c, 0);
    const ckp_status st = gemm_rows(a, a_rs, a_cs, b, b_rs, b_cs, first, K, N, bias, bias_after, c, 1);
    if (st != CKP_OK) return st;
    return gemm_rows(a + first * a_rs, a_rs, a_cs, b, b_rs, b_cs, M - first, K, N, bias, bias_after, c + first * N, 1);
}

/* ckp_gemm's rows [0, M) of A and C, checked; share: as path_for's. */
static ckp_status gemm_rows(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs,
                            int64_t M, int64_t K, int64_t N, const float *bias, int bias_after, float *c, int share) {
    const int shared = (double)M * (double)N * (double)K >= 1 << 18; /* worth a team: below it, one thread */
    const int team_max = shared ? ckp_threads() : 1;
    const int added = strict_order() || avx2_order();
    if (K == 1) { /* a rank-1 update: each element one product, or one FMA onto the bias (strict and AVX2: added) */
        /* one row or one column on MKL's AVX2 branch is its gemv, whose sum starts at +0: a -0 product comes out
         * +0 there, -0 from the rank-1 update (measured: every layout, M and N 1..40) */
        const float zero = avx2_order() && (M == 1 || N == 1) ? 0.0f : -0.0f; /* -0 + p is p, every p */
#pragma omp parallel for schedule(static) num_threads(team_max)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                const float x = a[m * a_rs], y = b[n * b_cs];
                c[m * N + n] = bias == NULL ? zero + x * y : bias_after || added ? x * y + bias[n] : fmaf(x, y, bias[n]);
            }
        return CKP_OK;
    }
    const gemm_path path = path_for(a_rs, a_cs, b_rs, b_cs, M, K, N, share);
    if (path == AVX2_SWEEP) { /* one column: the chains from the bias (addmm's beta 1) or 0 */
        const int seeded = bias != NULL && !bias_after;
        for (int64_t m = 0; m < M && seeded; m++) c[m] = bias[0];
        avx2_sweep(a, a_rs, a_cs, b, b_rs, M, K, 1.0f, seeded, c, 1);
        if (bias != NULL && bias_after)
            for (int64_t m = 0; m < M; m++) c[m] += bias[0];
        return CKP_OK;
    }
    if (path == AVX2_GEMV) { /* the product added to the bias (addmm's beta 1 as well) */
        for (int64_t i = 0; i < M * N && bias != NULL; i++) c[i] = bias[i % N];
        avx2_gemv(a, a_rs, b, b_rs, b_cs, M, K, N, M != 1, 1.0f, bias != NULL, c, N);
        return CKP_OK;
    }
    if (path == AVX2_COLUMNS || path == AVX2_CHAIN) { /* C's rows from the bias (addmm's beta 1) or 0, over threads */
        const int seeded = bias != NULL && !bias_after;
#pragma omp parallel for schedule(static) num_threads(team_max < M ? team_max : (int)M)
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t rows = M - m0 < 4 ? M - m0 : 4;
            for (int64_t m = m0; m < m0 + rows; m++) {
                if (seeded) memcpy(c + m * N, bias, (size_t)N * sizeof(float));
                else if (path == AVX2_COLUMNS) memset(c + m * N, 0, (size_t)N * sizeof(float));
                if (path == AVX2_CHAIN) avx2_chain_row(a + m * a_rs, a_cs, b, b_rs, b_cs, K, N, 1.0f, seeded, c + m * N);
            }
            if (path == AVX2_COLUMNS) avx2_columns_rows(a + m0 * a_rs, a_rs, a_cs, b, b_rs, K, N, 1.0f, c + m0 * N, N, rows);
            if (bias != NULL && bias_after)
                for (int64_t m = m0; m < m0 + rows; m++)
                    for (int64_t n = 0; n < N; n++) c[m * N + n] += bias[n];
        }
        return CKP_OK;
    }
    if (path != BLOCKED) {
        skinny_gemm(path, a, a_rs, b, b_cs, M, K, N, bias, c, team_max);
        return CKP_OK;
    }
    if (!shared) {
        /* A product too small to share: one thread's GEMM (no team to start, B's contiguous panels read where
         * they lie) -- the same tiles and K blocks, so the same bits; at a twin's 8 x 64 x 64, 1.7 -> 1.0 us */
        float *scratch = malloc((size_t)ckp_gemm_serial_floats(M, K, N) * sizeof(float));
        if (scratch == NULL) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "gemm: no memory for the packed panels");
        if (bias != NULL && !bias_after)
            for (int64_t m = 0; m < M; m++) memcpy(c + m * N, bias, (size_t)N * sizeof(float));
        gemm_serial_rows(a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, 1.0f, bias != NULL && !bias_after, c, N, scratch, NULL,
                         share);
        free(scratch);
        if (bias != NULL && bias_after)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) c[m * N + n] += bias[n];
        return CKP_OK;
    }
    const ckp_tiling t = ckp_tiling_for_cpu();
    const int wide = remainder_alone(a_cs, b_rs, M, N);
    /* A's rows are read where they lie (the tiles broadcast them: no contiguity needed), unless A is transposed
     * and large: then each k is another cache line and page, and packing its panels pays (measured: direct
     * reads 1.2-1.3x faster at the twins' shapes, 1.5x slower at 1024 x 4096 x 1024 with A transposed). */
    const int pack = a_cs != 1 && M * K > PACK_A_FLOATS;
    /* the rows in blocks of at most MC, their count a multiple of the team where there are enough */
    int64_t mblocks = (M + MC - 1) / MC;
    if (mblocks >= team_max) mblocks = round_up(mblocks, team_max);
    const int64_t mc_rows = round_up((M + mblocks - 1) / mblocks, t.mr);
    mblocks = (M + mc_rows - 1) / mc_rows;
    /* With a column block (of at most NC) for every thread, the threads share out the column blocks: each packs
     * its own B block into its own cache and multiplies every row by it, no barrier (measured against sharing
     * the row blocks of one shared B block: 0.77 -> 0.85x MKL at 1024^3 on 2 threads). */
    int64_t nblocks = (N + NC - 1) / NC;
    const int by_columns = team_max > 1 && nblocks >= team_max;
    if (by_columns) nblocks = round_up(nblocks, team_max);
    const int64_t nc_cols = round_up((N + nblocks - 1) / nblocks, t.nr);
    const int64_t a_floats = round_up(KBLOCK * mc_rows, 16), b_floats = round_up(KBLOCK * nc_cols, 16);
    float *bp = aligned_alloc(64, (size_t)(by_columns ? team_max : 1) * (size_t)b_floats * 4);
    float *ap = pack ? aligned_alloc(64, (size_t)team_max * (size_t)a_floats * 4) : NULL;
    if (bp == NULL || (pack && ap == NULL)) {
        free(bp);
        free(ap);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "gemm: no memory for the packed panels");
    }
    const int seeded = bias != NULL && !bias_after;
    if (seeded)
        for (int64_t m = 0; m < M; m++) memcpy(c + m * N, bias, (size_t)N * sizeof(float));
    /* One team for the whole product: the column blocks shared out (above), or per (column block, K block)
     * B's panels packed by all (then a barrier) and the row blocks shared out -- or, with fewer row blocks than
     * threads, each row block's column panels. The K blocks stay in order for every tile: the thread split
     * moves no bit. */
#pragma omp parallel num_threads(team_max)
    {
        const int me = omp_get_thread_num(), team = omp_get_num_threads();
        float *mine = pack ? ap + (size_t)me * (size_t)a_floats : NULL;
        if (by_columns) {
            float *own = bp + (size_t)me * (size_t)b_floats;
#pragma omp for schedule(static)
            for (int64_t nb = 0; nb < nblocks; nb++) {
                const int64_t n0 = nb * nc_cols, nc = N - n0 < nc_cols ? N - n0 : nc_cols;
                const int64_t npanels = nc > 0 ? (nc + t.nr - 1) / t.nr : 0;
                for (int64_t blk = 0; blk < k_blocks(K) && npanels > 0; blk++) {
                    int64_t k0, kb;
                    k_block(K, wide, blk, &k0, &kb);
                    for (int64_t p = 0; p < npanels; p++) pack_b_panel(b, b_rs, b_cs, k0, kb, n0, nc, t.nr, p, 1.0f, own);
                    for (int64_t mb = 0; mb < mblocks; mb++) {
                        const int64_t m0 = mb * mc_rows, mc = M - m0 < mc_rows ? M - m0 : mc_rows;
                        if (pack) pack_a(a, a_rs, a_cs, m0, mc, k0, kb, t.mr, mine);
                        row_block(&t, pack ? mine : NULL, a + m0 * a_rs + k0 * a_cs, a_rs, a_cs, own, kb, m0, mc, n0,
                                  nc, 0, npanels, 1, c, N, blk == 0 && !seeded);
                    }
                }
            }
        }
        for (int64_t n0 = 0; n0 < N && !by_columns; n0 += nc_cols) {
            const int64_t nc = N - n0 < nc_cols ? N - n0 : nc_cols, npanels = (nc + t.nr - 1) / t.nr;
            for (int64_t blk = 0; blk < k_blocks(K); blk++) {
                int64_t k0, kb;
                k_block(K, wide, blk, &k0, &kb);
                const int first = blk == 0 && !seeded;
#pragma omp for schedule(static)
                for (int64_t p = 0; p < npanels; p++) pack_b_panel(b, b_rs, b_cs, k0, kb, n0, nc, t.nr, p, 1.0f, bp);
                if (mblocks >= team) {
#pragma omp for schedule(static)
                    for (int64_t mb = 0; mb < mblocks; mb++) {
                        const int64_t m0 = mb * mc_rows, mc = M - m0 < mc_rows ? M - m0 : mc_rows;
                        if (pack) pack_a(a, a_rs, a_cs, m0, mc, k0, kb, t.mr, mine);
                        row_block(&t, pack ? mine : NULL, a + m0 * a_rs + k0 * a_cs, a_rs, a_cs, bp, kb, m0, mc, n0,
                                  nc, 0, npanels, 1, c, N, first);
                    }
                } else {
                    for (int64_t mb = 0; mb < mblocks; mb++) { /* each thread its own copy of the few rows */
                        const int64_t m0 = mb * mc_rows, mc = M - m0 < mc_rows ? M - m0 : mc_rows;
                        if (pack) pack_a(a, a_rs, a_cs, m0, mc, k0, kb, t.mr, mine);
                        row_block(&t, pack ? mine : NULL, a + m0 * a_rs + k0 * a_cs, a_rs, a_cs, bp, kb, m0, mc, n0,
                                  nc, me, npanels, team, c, N, first);
                    }
#pragma omp barrier
                }
            }
        }
    }
    free(bp);
    free(ap);
    if (bias != NULL && bias_after)
#pragma omp parallel for schedule(static) num_threads(team_max)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) c[m * N + n] += bias[n];
    return CKP_OK;
}

/* ---- one thread's GEMM, as a kernel calls MKL inside its own parallel loop -------------------------- */
/* Where MKL applies sgemm's alpha to B as it packs it (each B[k, n] times alpha, rounded, then the chains)
 * rather than to the product: with A's rows and B's columns along K (q.k^T in attention), on the blocked
 * path, when C has 192 columns or more, or more columns than rows and at least max(12, min(K, 192))
 * (measured: K 2..200 against M 2..512, N 1..512; alpha 1 is exact either way); in MKL's strict order at every
 * shape and stride (measured as [Note: MKL's strict order]); in its AVX2 branch's own order wherever C has 12
 * columns or more (measured: every transpose of A and B, M 4..200, N 12..200, K 5..64, beta 0 and 1:
 * scripts/mkl_avx2_alpha.py). With
 * fewer, MKL's small-matrix path multiplies its rounded sum by alpha ([Note: MKL's AVX2 small sgemm]): alpha on
 * the product, as everywhere else. */
static int alpha_packed_with_b(int64_t a_cs, int64_t b_rs, int64_t M, int64_t K, int64_t N) {
    const int64_t least = K < 12 ? 12 : K > 192 ? 192 : K;
    if (avx2_order()) return N >= 12;
    return strict_order() || (a_cs == 1 && b_rs == 1 && (N >= 192 || (N > M && N >= least)));
}

/* Scratch floats ckp_gemm_serial needs for (M, K, N): B's packed block, one block's product. */
int64_t ckp_gemm_serial_floats(int64_t M, int64_t K, int64_t N) {
    const int64_t kb = K < KBLOCK ? K : KBLOCK;
    return kb * round_up(N, ckp_tiling_for_cpu().nr) + M * N;
}

int64_t ckp_gemm_slot_floats(int64_t K, int64_t N) { return K * round_up(N, ckp_tiling_for_cpu().nr); }

/* C (ldc) = alpha * A.B, or C += alpha * A.B with accumulate: cblas_sgemm's alpha and beta (0 or 1) as MKL
 * applies them on one thread (measured as the Note's order was): each K block's product rounded, times
 * alpha rounded, added to C in block order -- C = ((C + alpha acc0) + alpha acc1) ..., or alpha acc0 + ...
 * from beta 0 -- or with alpha in B's packing (alpha_packed_with_b). The skinny paths and K = 1 as
 * ckp_gemm's. On the calling thread; scratch holds ckp_gemm_serial_floats(M, K, N). ATen's flash attention
 * runs its GEMMs this way (csrc/attention.c).
 * mkl_threads: the threads MKL has for the call -- 1 inside a kernel's parallel loop, torch's count where the loop
 * had one item and so ran on the calling thread outside a parallel region ([Note: MKL's AVX2 sgemm on two threads]).
 * slot (or NULL): where B's packed panels are kept for the next call with the same B -- a kernel that
 * multiplies one block of K or V by many q blocks packs it once; the packing is a copy, so it moves no bit.
 * form: which operand the caller hands MKL transposed (ckp_mkl_form). On MKL's AVX2 branch it decides a one-column
 * product's path where the strides cannot (with d = 1 and a block of one key, every stride is 1): A transposed is
 * the sweep, neither the gemv whose vector is B's column ([Note: MKL's AVX2 sgemv]); B transposed as ckp_gemm. */
void ckp_gemm_serial(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs, int64_t M,
                     int64_t K, int64_t N, float alpha, int accumulate, float *c, int64_t ldc, float *scratch,
                     ckp_gemm_slot *slot, int mkl_threads, ckp_mkl_form form) {
    if (K == 1 && avx2_order() && form == CKP_MKL_B_TRANSPOSED && (M == 1 || N == 1)) {
        /* one row or column of a rank-1 product handed MKL as B^T: its gemv, alpha times each rounded product
         * (measured as the Note's: K = 1, alpha 0.3, m and n 1, 2, 5, 17 -- else alpha times A's element) */
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                float *at = c + m * ldc + n;
                *at = accumulate ? *at + alpha * (a[m * a_rs] * b[n * b_cs]) : alpha * (a[m * a_rs] * b[n * b_cs]);
            }
        return;
    }
    if (N == 1 && avx2_order() && form != CKP_MKL_B_TRANSPOSED) {
        /* cpublas::gemm hands MKL an ldc of 1 for one row of C (its normalize_last_dims: ldc = m where n is 1);
         * MKL takes the same order on torch's 2 threads (measured: the Note's GEMMs, and the flash kernel's
         * one-item backward up to T = 2049) */
        const int64_t ld = M == 1 ? 1 : ldc;
        if (form == CKP_MKL_A_TRANSPOSED) avx2_sweep(a, a_rs, a_cs, b, b_rs, M, K, alpha, accumulate, c, ld);
        else avx2_gemv(a, a_rs, b, b_rs, b_cs, M, K, N, 1, alpha, accumulate, c, ld);
        return;
    }
    const int64_t first = avx2_first_share(mkl_threads, M, K, N);
    if (first == 0) {
        gemm_serial_rows(a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, alpha, accumulate, c, ldc, scratch, slot, 0);
        return;
    }
    gemm_serial_rows(a, a_rs, a_cs, b, b_rs, b_cs, first, K, N, alpha, accumulate, c, ldc, scratch, slot, 1);
    gemm_serial_rows(a + first * a_rs, a_rs, a_cs, b, b_rs, b_cs, M - first, K, N, alpha, accumulate, c + first * ldc,
                     ldc, scratch, slot, 1);
}

CKP_CLONES static void gemm_serial_rows(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs,
                                        int64_t b_cs, int64_t M, int64_t K, int64_t N, float alpha, int accumulate,
                                        float *c, int64_t ldc, float *scratch, ckp_gemm_slot *slot, int share) {
#define CKP_STORE(m, n, product) \
    (c[(m) * ldc + (n)] = accumulate ? c[(m) * ldc + (n)] + alpha * (product) : alpha * (product))
    if (K == 1) {
        /* the strict order packs alpha with B here too; the AVX2 branch's own multiplies A's element by it
         * (measured: scripts/mkl_avx2_small.py's K = 1) */
        const float a_scale = avx2_order() ? alpha : 1.0f, b_scale = strict_order() ? alpha : 1.0f;
        if (a_scale != 1.0f || b_scale != 1.0f) alpha = 1.0f;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) CKP_STORE(m, n, (a[m * a_rs] * a_scale) * (b[n * b_cs] * b_scale));
        return;
    }
    const gemm_path path = path_for(a_rs, a_cs, b_rs, b_cs, M, K, N, share);
    if (path == AVX2_GEMV) {
        avx2_gemv(a, a_rs, b, b_rs, b_cs, M, K, N, M != 1, alpha, accumulate, c, ldc);
        return;
    }
    if (path == AVX2_SWEEP) {
        avx2_sweep(a, a_rs, a_cs, b, b_rs, M, K, alpha, accumulate, c, ldc);
        return;
    }
    if (path == AVX2_COLUMNS) { /* from C's value (beta 1) or 0, alpha on A's elements */
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t rows = M - m0 < 4 ? M - m0 : 4;
            if (!accumulate)
                for (int64_t m = m0; m < m0 + rows; m++) memset(c + m * ldc, 0, (size_t)N * sizeof(float));
            avx2_columns_rows(a + m0 * a_rs, a_rs, a_cs, b, b_rs, K, N, alpha, c + m0 * ldc, ldc, rows);
        }
        return;
    }
    if (path == AVX2_CHAIN) {
        for (int64_t m = 0; m < M; m++)
            avx2_chain_row(a + m * a_rs, a_cs, b, b_rs, b_cs, K, N, alpha, accumulate, c + m * ldc);
        return;
    }
    if (path != BLOCKED) {
        const dot_lanes lanes = dot_lanes_for_cpu();
        for (int64_t m = 0; m < M; m++)
            for (int64_t n0 = 0; n0 < N; n0 += SKINNY_COLS) {
                const int64_t n1 = n0 + SKINNY_COLS < N ? n0 + SKINNY_COLS : N;
                float dots[SKINNY_COLS];
                skinny_dots(path, lanes, a + m * a_rs, b, b_cs, K, n0, n1, N, dots);
                for (int64_t n = n0; n < n1; n++) CKP_STORE(m, n, dots[n - n0]);
            }
        return;
    }
    const ckp_tiling t = ckp_tiling_for_cpu();
    const int wide = remainder_alone(a_cs, b_rs, M, N);
    const int64_t kmax = K < KBLOCK ? K : KBLOCK, npanels = (N + t.nr - 1) / t.nr, rn = round_up(N, t.nr);
    const float b_scale = alpha_packed_with_b(a_cs, b_rs, M, K, N) ? alpha : 1.0f;
    if (b_scale != 1.0f) alpha = 1.0f; /* B took it */
    float *product = scratch + kmax * rn;
    const int kept = slot != NULL && slot->b == b && slot->b_rs == b_rs && slot->b_cs == b_cs && slot->K == K &&
                     slot->N == N && slot->scale == b_scale && slot->wide == wide;
    /* A is read where it lies, and so are B's whole panels where its columns are contiguous and nothing scales
     * it: a kernel's GEMMs are small, and packing them cost more than it saved. The rest of B is packed. */
    const int64_t direct = b_cs == 1 && b_scale == 1.0f ? N / t.nr : 0;
    for (int64_t blk = 0; blk < k_blocks(K); blk++) {
        int64_t k0, kb;
        k_block(K, wide, blk, &k0, &kb);
        float *bp = slot != NULL ? slot->packed + k0 * rn : scratch; /* the slot: every block at its k0 */
        if (!kept)
            for (int64_t p = direct; p < npanels; p++) pack_b_panel(b, b_rs, b_cs, k0, kb, 0, N, t.nr, p, b_scale, bp);
        float *out = alpha == 1.0f ? c : product; /* alpha 1: the tiles store into C, or add to it, themselves */
        const int64_t ldo = alpha == 1.0f ? ldc : N;
        const int first = alpha == 1.0f ? blk == 0 && !accumulate : 1;
        for (int64_t p = 0; p < npanels; p++) {
            const int64_t nr = N - p * t.nr < t.nr ? N - p * t.nr : t.nr;
            const float *bq = p < direct ? b + k0 * b_rs + p * t.nr : bp + p * t.nr * kb;
            for (int64_t q = 0; q < M; q += t.mr)
                t.tile(kb, a + q * a_rs + k0 * a_cs, a_rs, a_cs, bq, p < direct ? b_rs : t.nr, out + q * ldo + p * t.nr,
                       ldo, M - q < t.mr ? M - q : t.mr, nr, first);
        }
        if (alpha == 1.0f) continue;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                if (blk == 0) CKP_STORE(m, n, product[m * N + n]);
                else c[m * ldc + n] += alpha * product[m * N + n];
            }
    }
    if (slot != NULL && !kept)
        *slot = (ckp_gemm_slot){b, b_rs, b_cs, K, N, b_scale, wide, slot->packed};
#undef CKP_STORE
}

/* ---- the bias's gradient: dY summed over its rows, in torch.sum's order ------------------------- */
/* dY's column first + k at row i. */
typedef struct {
    const float *dy;      /* float32 values, or */
    const uint16_t *dy16; /* bf16 ones */
    int64_t N, first;
} dy_columns;

static float dy_at(const void *ctx, int64_t i, int64_t k) {
    const dy_columns *c = ctx;
    const int64_t at = i * c->N + c->first + k;
    return c->dy16 != NULL ? ckp_bf16_to_f(c->dy16[at]) : c->dy[at];
}

static float dy_inner(void *ctx, int64_t i) { return dy_at(ctx, i, 0); }

/* autograd's dbias is dY.sum(0) over a contiguous (M, N): ATen's outer sums ([Note: ATen's summation
 * order], aten_sum.h). cascade_sum takes vectorized_outer_sum from one Vectorized<scalar_t> of columns on -- 8
 * in float32, 16 in bf16 (measured: a bf16 dY of 8..15 columns summed as float32's differed) -- whose whole
 * blocks of 4 x 8 columns are one cascade per column over the rows; below that scalar_outer_sum's groups of 4
 * columns are; every other column is row_sum's interleaved accumulators. One column is a sum over contiguous
 * values (bf16's own vectors in bf16), split as torch splits it over its threads (as rms_norm's dweight,
 * csrc/rms_norm.c). Returns the float32 sums (torch rounds each once, to dY's dtype). */
static void dbias_sums(const float *dy, const uint16_t *dy16, int64_t M, int64_t N, float *dbias, int torch_threads) {
    const int64_t vector = dy16 != NULL ? 2 * CKP_VLANES : CKP_VLANES;
    const int64_t cascade_end = N == 1 ? 0 : N < vector ? N - N % CKP_SUM_ILP : N - N % (CKP_SUM_ILP * CKP_VLANES);
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
    for (int64_t j = 0; j < cascade_end; j += CKP_SUM_ILP) {
        dy_columns c = {dy, dy16, N, j};
        ckp_multi_row_sum(dy_at, &c, M, CKP_SUM_ILP, dbias + j);
    }
    for (int64_t j = cascade_end; j < N; j++) {
        dy_columns c = {dy, dy16, N, j};
        dbias[j] = N > 1 ? ckp_row_sum(dy_at, &c, M)
                 : dy16 != NULL ? ckp_aten_full_sum_bf16(dy_inner, &c, M, torch_threads)
                                : ckp_aten_full_sum(dy_inner, &c, M, torch_threads);
    }
}

static ckp_status dbias_checks(const void *dy, size_t dy_size, int64_t M, int64_t N, const void *dbias,
                               size_t dbias_size, int torch_threads) {
    if (dy == NULL || dbias == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "dy and dbias must not be NULL");
    if (M <= 0 || N <= 0 || M > INT64_MAX / N)
        return ckp_fail(CKP_ERR_BAD_SIZE, "M and N must be positive, got M=%lld N=%lld", (long long)M, (long long)N);
    if (torch_threads < 1) return ckp_fail(CKP_ERR_BAD_OPTION, "torch_threads must be >= 1, got %d", torch_threads);
    if (ckp_overlaps(dbias, (size_t)N * dbias_size, dy, (size_t)(M * N) * dy_size))
        return ckp_fail(CKP_ERR_ALIASING, "dbias overlaps dy");
    ckp_clear_error();
    return CKP_OK;
}

ckp_status ckp_linear_dbias(const float *dy, int64_t M, int64_t N, float *dbias, int torch_threads) {
    const ckp_status s = dbias_checks(dy, sizeof *dy, M, N, dbias, sizeof *dbias, torch_threads);
    if (s == CKP_OK) dbias_sums(dy, NULL, M, N, dbias, torch_threads);
    return s;
}

ckp_status ckp_linear_dbias_bf16(const uint16_t *dy, int64_t M, int64_t N, uint16_t *dbias, int torch_threads) {
    const ckp_status s = dbias_checks(dy, sizeof *dy, M, N, dbias, sizeof *dbias, torch_threads);
    if (s != CKP_OK) return s;
    float *sums = malloc((size_t)N * sizeof *sums);
    if (sums == NULL) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "linear_dbias_bf16: no memory for %lld sums", (long long)N);
    dbias_sums(NULL, dy, M, N, sums, torch_threads);
    for (int64_t j = 0; j < N; j++) dbias[j] = ckp_f_to_bf16(sums[j]);
    free(sums);
    return CKP_OK;
}
