/*
 * linear_bf16.c — C (M x N, bf16) = A (M x K, bf16) . B (K x N, bf16) in the order oneDNN's AMX brgemm
 * matmul sums it ([Note: oneDNN's AMX bf16 order]).
 *
 * [Note: oneDNN's AMX bf16 order]
 * Measured (torch 2.13's oneDNN 3.12, brg_matmul:avx10_1_512_amx, Intel Xeon; scripts/onednn_bf16_order.py
 * plants +-2^30 pairs among ones and reads which terms each pair swallowed):
 *   - K is cut into chunks (where: oneDNN's choice by M, N, K and its threads; the caller says) whose sums
 *     start from 0 and are added in order: C = ((chunk0 + chunk1) + chunk2) ...;
 *   - a chunk is cut into tiles of `width` terms from its start (32, the AMX tile's depth, or another even
 *     width where K asks for it: 30 at K = 300); in a tile the terms at even places are one float32 chain
 *     and those at odd places another, each from 0, and the chunk's running sum takes (even + odd);
 *   - every product of two bf16 values is exact in float32, so each chain step is one rounding (an FMA
 *     here); TDPBF16PS flushes denormal inputs and results (DAZ, FTZ), so do these steps;
 *   - the result is rounded to bf16 once (to nearest even).
 * A[m,k] is a[m*a_rs + k*a_cs], B[k,n] is b[k*b_rs + n*b_cs]. Both are widened to float32 once; each panel
 * of C takes every tile's two chains from the float32 GEMM's register tile (linear.c) reading every other k,
 * under the thread's FTZ and DAZ for the call. Every element is its own sum, so the panels and the threads
 * change no bit.
 *
 * [Note: oneDNN's AVX-512 bf16 order]
 * Where oneDNN has no AMX but AVX-512's bf16 instructions (brg_matmul:avx512_core_bf16; measured: torch 2.13's
 * oneDNN, an AMD EPYC Zen 5, by planted +-2^30 pairs), a chunk is not tiles but one float32 chain over K's pairs
 * from 0: VDPBF16PS adds a pair's odd-placed product, rounds, then its even-placed one, rounds (so
 * ((acc + p1) + p0) + p3) + p2 ...: the pairs (2^30, 0), (1, -2^30) give 1, and (1, 0), (2^30, -2^30) give 0,
 * neither an even-first nor a fused pair sum), denormals flushed. An odd K's last pair is padded with a zero,
 * added first. The chunks (which start at even k) are oneDNN's, measured as the AMX ones are; ckparity takes
 * this form for width 0: where the CPU has VDPBF16PS (every CPU whose oneDNN takes this form) by the instruction
 * itself on A and B packed as pairs; elsewhere (or under CKP_BF16_EMULATE) A and B are widened with each pair's
 * two terms swapped, and each chunk is one run of the float32 register tile over it in that order, an FMA per term
 * under DAZ and FTZ (the SDM's "FP32 FMA with DAZ in, FTZ out"). The two give the same bits
 * (tests/test_linear.py).
 * torch's bf16 flash attention adds its dQ, dK and dV blocks into bf16 tensors through this brgemm (a GEMM of
 * more than 16^3 multiply-adds: ATen sends smaller ones to its own loops) with alpha as a src scale and beta 1 as
 * a sum post-op: C = bf16(alpha * sum + C), the scaled sum rounded to float32 before C is added (measured against
 * the FMA of the two, which 228 of 2043 of the bf16 attention sweep's dK cases tell apart): ckp_onednn_bf16_accumulate.
 * F.linear's bias (addmm's) is added to the float32 sum, then rounded once (measured: 45568 outputs of five shapes, 0
 * differing; the bias as the chain's start 2, the sum rounded before the bias 13181).
 */
#include "ckp_internal.h"
#include "vec.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

enum { MR_MAX = 12, NR_MAX = 32, MXCSR_FTZ_DAZ = 0x8040 };

/* sum += (even + odd) over a tile's rows x nr: the chunk's running sum takes the tile's two chains. */
CKP_CLONES static void add_tile(float *restrict sum, const float *restrict even, const float *restrict odd, int64_t n) {
    for (int64_t i = 0; i < n; i++) sum[i] += even[i] + odd[i];
}

/* total += chunk: the chunks' sums added in order. */
CKP_CLONES static void add_chunk(float *restrict total, const float *restrict chunk, int64_t n) {
    for (int64_t i = 0; i < n; i++) total[i] += chunk[i];
}

/* One panel of C (rows x cols at m0, n0): every chunk's tiles, each tile's even and odd chains by the float32
 * GEMM's register tile (every other k: A's column stride 2, B's row stride twice its own), under FTZ/DAZ. */
static void panel(const ckp_tiling *t, const float *aw, const float *bw, int64_t ldb, int64_t K, int64_t N,
                  int64_t m0, int64_t rows, int64_t n0, int64_t cols, int64_t width, const int64_t *starts,
                  int64_t chunks, const uint16_t *bias, uint16_t *c) {
    float even[MR_MAX * NR_MAX], odd[MR_MAX * NR_MAX], chunk[MR_MAX * NR_MAX], total[MR_MAX * NR_MAX];
    const int64_t n = t->mr * t->nr;
    for (int64_t ch = 0; ch <= chunks; ch++) {
        const int64_t c0 = ch == 0 ? 0 : starts[ch - 1], c1 = ch == chunks ? K : starts[ch];
        memset(chunk, 0, sizeof chunk);
        if (width == 0) /* the pairs' chain: K here is the padded (even) K, each pair swapped as widened */
            t->tile(c1 - c0, aw + m0 * K + c0, K, 1, bw + c0 * ldb + n0, ldb, chunk, t->nr, rows, t->nr, 1);
        for (int64_t t0 = c0; t0 < c1 && width > 0; t0 += width) {
            const int64_t len = (t0 + width < c1 ? t0 + width : c1) - t0;
            const float *a = aw + m0 * K + t0, *b = bw + t0 * ldb + n0;
            t->tile((len + 1) / 2, a, K, 2, b, 2 * ldb, even, t->nr, rows, t->nr, 1);
            t->tile(len / 2, a + 1, K, 2, b + ldb, 2 * ldb, odd, t->nr, rows, t->nr, 1);
            add_tile(chunk, even, odd, n);
        }
        if (ch == 0) memcpy(total, chunk, sizeof total);
        else add_chunk(total, chunk, n);
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const float sum = total[i * t->nr + j];
            c[(m0 + i) * N + n0 + j] = ckp_f_to_bf16(bias != NULL ? sum + ckp_bf16_to_f(bias[n0 + j]) : sum);
        }
}

/* The pairs' chain (width 0) on a CPU with VDPBF16PS itself -- every CPU whose oneDNN takes that form, since it is
 * avx512_core_bf16's brgemm: the instruction oneDNN runs, so its rounding, DAZ and FTZ are the hardware's own. A and B
 * are packed as pairs (the low half the even-placed term: VDPBF16PS adds the odd-placed product first), an odd K's
 * pad a zero; each panel of 8 rows x 32 columns sums each chunk from 0, adds the chunks in order and the bias as
 * panel() does (under the thread's DAZ and FTZ), and rounds once. */
enum { NATIVE_MR = 8, NATIVE_NR = 32 };
#define CKP_NATIVE_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
/* The u32s between panels of 8 rows of A's pairs: 64 bytes past the panel, so that a column's stores (one per
 * panel) are not all 4 KB apart -- they were for 256 q rows, and the packing ran at half the speed. */
static int64_t panel_stride(int64_t pairs) { return NATIVE_MR * pairs + 16; }

/* Where B's pair q of column n is in its packed form: in panels of NATIVE_NR columns, each panel's pairs one after
 * another (a panel's chain reads one contiguous stream; rows of the whole width apart, 16 KB at N = 4096, every
 * pair mapped to one L1 set and the panels ran at half the speed). */
static inline int64_t b_at(int64_t pairs, int64_t q, int64_t n) {
    return n / NATIVE_NR * pairs * NATIVE_NR + q * NATIVE_NR + n % NATIVE_NR;
}

/* A's packed layout: panels of 8 rows panel_stride apart where its columns are contiguous and its rows are not (a
 * transposed A), else row by row (0: native_sums' two layouts). */
static int64_t a_panel(int64_t a_rs, int64_t a_cs, int64_t pairs) {
    return a_rs == 1 && a_cs != 1 ? panel_stride(pairs) : 0;
}

/* native_sums' chains, rows past `rows` repeating the panel's first (computed, not used). `full` (all 8 rows, the
 * common case) is a constant in each copy: the rows' offsets then need no test in the loop (with one, the loop
 * branched on `rows` at every row and ran a fifth slower). */
CKP_NATIVE_BF16 static inline __attribute__((always_inline)) void native_chains(
    const uint32_t *a0, int64_t a_rs, int64_t a_qs, const uint32_t *b0, int64_t pairs, int full, int64_t rows,
    const int64_t *starts, int64_t chunks, float out[NATIVE_MR][NATIVE_NR]) {
    __m512 total[NATIVE_MR][2];
    for (int64_t ch = 0; ch <= chunks; ch++) {
        const int64_t p0 = ch == 0 ? 0 : starts[ch - 1] / 2, p1 = ch == chunks ? pairs : starts[ch] / 2;
        __m512 acc[NATIVE_MR][2];
#pragma GCC unroll 8
        for (int i = 0; i < NATIVE_MR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
        for (int64_t q = p0; q < p1; q++) {
            const __m512bh bl = (__m512bh)_mm512_loadu_si512(b0 + q * NATIVE_NR),
                           bh = (__m512bh)_mm512_loadu_si512(b0 + q * NATIVE_NR + 16);
#pragma GCC unroll 8
            for (int i = 0; i < NATIVE_MR; i++) {
                const int64_t row = full || i < rows ? i : 0;
                const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a0[row * a_rs + q * a_qs]);
                acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, bl), acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, bh);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < NATIVE_MR; i++)
            for (int h = 0; h < 2; h++) total[i][h] = ch == 0 ? acc[i][h] : _mm512_add_ps(total[i][h], acc[i][h]);
    }
    for (int i = 0; i < NATIVE_MR; i++) _mm512_storeu_ps(out[i], total[i][0]), _mm512_storeu_ps(out[i] + 16, total[i][1]);
}

/* The float32 sums of an 8 x 32 panel at (m0, n0): each chunk's VDPBF16PS chain from 0, the chunks added in order
 * (under the caller's MXCSR). A's pair q of row m is ap[m * lda + q], or in panels of 8 rows `panel` apart
 * ap[m / 8 * panel + q * 8 + m % 8]; B's at bp + b_at(pairs, q, n). */
CKP_NATIVE_BF16 static void native_sums(const uint32_t *ap, int64_t panel, int64_t lda, const uint32_t *bp,
                                        int64_t pairs, int64_t m0, int64_t rows, int64_t n0, const int64_t *starts,
                                        int64_t chunks, float out[NATIVE_MR][NATIVE_NR]) {
    const uint32_t *a0 = panel ? ap + m0 / NATIVE_MR * panel : ap + m0 * lda; /* the panel's, or row m0's */
    const int64_t a_rs = panel ? 1 : lda, a_qs = panel ? NATIVE_MR : 1;
    const uint32_t *b0 = bp + b_at(pairs, 0, n0);
    if (rows == NATIVE_MR)
        native_chains(a0, a_rs, a_qs, b0, pairs, 1, rows, starts, chunks, out);
    else
        native_chains(a0, a_rs, a_qs, b0, pairs, 0, rows, starts, chunks, out);
}

/* One panel of C: native_sums, the bias added, rounded once -- 16 columns at a time where the panel has all 32 (one
 * at a time, a panel's 256 roundings had cost as much as its sums at K = 64, a tenth at K = 256). */
CKP_NATIVE_BF16 static void native_panel(const uint32_t *ap, int64_t panel, int64_t lda, const uint32_t *bp,
                                         int64_t pairs, int64_t N, int64_t m0, int64_t rows, int64_t n0, int64_t cols,
                                         const int64_t *starts, int64_t chunks, const uint16_t *bias, uint16_t *c) {
    float sum[NATIVE_MR][NATIVE_NR];
    native_sums(ap, panel, lda, bp, pairs, m0, rows, n0, starts, chunks, sum);
    if (cols == NATIVE_NR) {
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < NATIVE_NR; j += 16) {
                ckp_v16f v;
                memcpy(&v, &sum[i][j], sizeof v);
                ckp_bf16_store16(c + (m0 + i) * N + n0 + j, bias != NULL ? v + ckp_bf16_load16(bias + n0 + j) : v);
            }
        return;
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            c[(m0 + i) * N + n0 + j] = ckp_f_to_bf16(bias != NULL ? sum[i][j] + ckp_bf16_to_f(bias[n0 + j]) : sum[i][j]);
}

/* The threads a bf16 GEMM of M x K x N takes: one for a small product (a team costs more than it saves). */
static int team_for(int64_t M, int64_t K, int64_t N) {
    return (double)M * (double)N * (double)K >= 1 << 18 ? ckp_threads() : 1;
}

/* Terms 2q and 2q + 1 (s apart; past K a zero) of a row as VDPBF16PS's pair: the even-placed in the low half. */
static inline uint32_t pair_at(const uint16_t *x, int64_t s, int64_t q, int64_t K) {
    return x[2 * q * s] | (2 * q + 1 < K ? (uint32_t)x[(2 * q + 1) * s] << 16 : 0u);
}

/* Rows m0..m0 + 31 of A (bf16) as pairs: a row-major A's are its own 32-bit words (row m's at ap + m * pairs); a
 * transposed A's (columns contiguous) two columns' 16 halves zero-extended and joined, into panels of 8 rows
 * (`panel` apart: native_sums' panels), 32 rows per pair -- a column's whole 64 bytes, where 16 read each line twice
 * in calls far apart (its columns 4 KB apart at 1024 rows); else one by one, row-major. */
CKP_NATIVE_BF16 static void pack_a32(const uint16_t *a, int64_t a_rs, int64_t a_cs, int64_t m0, int64_t M, int64_t K,
                                     int64_t panel, uint32_t *ap) {
    const int64_t pairs = (K + 1) / 2, end = m0 + 32 < M ? m0 + 32 : M, whole = K / 2; /* pairs without the pad */
    if (panel) {
        for (int64_t q = 0; q < pairs; q++)
            for (int64_t h = m0; h < end; h += 16) {
                if (h == m0 && q + 8 < whole) { /* the columns 8 pairs on, 4 KB apart at 1024 rows: fetched ahead */
                    _mm_prefetch((const char *)(a + h + 2 * (q + 8) * a_cs), _MM_HINT_T0);
                    _mm_prefetch((const char *)(a + h + (2 * (q + 8) + 1) * a_cs), _MM_HINT_T0);
                }
                const __mmask16 live = (__mmask16)(end - h >= 16 ? 0xffff : (1u << (end - h)) - 1);
                const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, a + h + 2 * q * a_cs));
                const __m512i hi = q < whole ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, a + h + (2 * q + 1) * a_cs))
                                             : _mm512_setzero_si512();
                const __m512i w = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
                uint32_t *lo8 = ap + h / 8 * panel + q * 8;
                if (end - h >= 16) { /* plain stores: a masked store is slow on AMD's cores */
                    _mm256_storeu_si256((__m256i *)lo8, _mm512_castsi512_si256(w));
                    _mm256_storeu_si256((__m256i *)(lo8 + panel), _mm512_extracti64x4_epi64(w, 1));
                    continue;
                }
                _mm256_mask_storeu_epi32(lo8, (__mmask8)live, _mm512_castsi512_si256(w));
                if (end - h > 8) _mm256_mask_storeu_epi32(lo8 + panel, (__mmask8)(live >> 8), _mm512_extracti64x4_epi64(w, 1));
            }
        return;
    }
    for (int64_t m = m0; m < end; m++) {
        int64_t q = 0;
        if (a_cs == 1) /* two bf16s in a row are the pair, little-endian */
            for (; q + 16 <= whole; q += 16) _mm512_storeu_si512(ap + m * pairs + q, _mm512_loadu_si512(a + m * a_rs + 2 * q));
        for (; q < pairs; q++) ap[m * pairs + q] = pair_at(a + m * a_rs, a_cs, q, K);
    }
}

/* r[i] (16 32-bit words each) becomes the matrix's column i: unpacks of 32- and 64-bit lanes, then of 128-bit ones. */
CKP_NATIVE_BF16 static inline void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; j++) {
            t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
            t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
    }
}

/* Columns n0..n0 + 15 of B (bf16) as pairs, pair q's at bp + b_at(pairs, q, n0) (zero past N): two rows' halves
 * zero-extended and joined where B's rows are contiguous, each column's own 32-bit words transposed (16 pairs at a
 * time, the rest gathered) where its columns are, else one by one. */
CKP_NATIVE_BF16 static void pack_b16(const uint16_t *b, int64_t b_rs, int64_t b_cs, int64_t n0, int64_t N, int64_t K,
                                     uint32_t *bp) {
    const int64_t pairs = (K + 1) / 2, whole = K / 2, end = n0 + 16 < N ? n0 + 16 : N;
    const __mmask16 live = (__mmask16)(end - n0 >= 16 ? 0xffff : (1u << (end - n0)) - 1);
    int64_t q = 0;
    if (b_cs == 1) {
        for (; q < pairs; q++) {
            if (q + 8 < whole) { /* the rows 8 pairs on (8 KB apart at N = 4096): fetched ahead, as pack_a32's */
                _mm_prefetch((const char *)(b + 2 * (q + 8) * b_rs + n0), _MM_HINT_T0);
                _mm_prefetch((const char *)(b + (2 * (q + 8) + 1) * b_rs + n0), _MM_HINT_T0);
            }
            const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, b + 2 * q * b_rs + n0));
            const __m512i hi = q < whole ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, b + (2 * q + 1) * b_rs + n0))
                                         : _mm512_setzero_si512();
            _mm512_storeu_si512(bp + b_at(pairs, q, n0), _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
        return;
    }
    if (b_rs == 1) { /* column n's pair q is the 32-bit word at its 2q-th half: 16 pairs of 16 columns transposed */
        for (; q + 16 <= whole; q += 16) {
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = n0 + j < end ? _mm512_loadu_si512(b + (n0 + j) * b_cs + 2 * q) : _mm512_setzero_si512();
            transpose16(r);
            for (int j = 0; j < 16; j++) _mm512_storeu_si512(bp + b_at(pairs, q + j, n0), r[j]);
        }
        const __m512i cols = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32((int)b_cs));
        for (; q < whole; q++)
            _mm512_storeu_si512(bp + b_at(pairs, q, n0), _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, cols,
                                                                              b + n0 * b_cs + 2 * q, 2));
    }
    for (; q < pairs; q++)
        for (int64_t n = n0; n < end; n++) bp[b_at(pairs, q, n)] = pair_at(b + n * b_cs, b_rs, q, K);
}

/* ckp_gemm_bf16_tiles' width 0 where the CPU has VDPBF16PS; CKP_ERR_OUT_OF_MEMORY without memory. */
static ckp_status native_pairs_gemm(const uint16_t *a, int64_t a_rs, int64_t a_cs, const uint16_t *b, int64_t b_rs,
                                    int64_t b_cs, int64_t M, int64_t K, int64_t N, const int64_t *starts, int64_t chunks,
                                    const uint16_t *bias, uint16_t *c) {
    const int64_t pairs = (K + 1) / 2, ldb = (N + NATIVE_NR - 1) / NATIVE_NR * NATIVE_NR;
    const int64_t panel = a_panel(a_rs, a_cs, pairs);
    /* a row-major A of even K and row stride on a 4-byte boundary: its pairs are its own 32-bit words, read in place */
    const int direct = !panel && a_cs == 1 && K % 2 == 0 && a_rs % 2 == 0 && (uintptr_t)a % 4 == 0;
    const int64_t a_words = direct ? 1 : panel ? (M + NATIVE_MR - 1) / NATIVE_MR * panel : M * pairs;
    const int64_t lda = direct ? a_rs / 2 : pairs;
    uint32_t *packed = malloc((size_t)a_words * sizeof *packed), *bp = calloc((size_t)(pairs * ldb), sizeof *bp);
    const uint32_t *ap = direct ? (const uint32_t *)a : packed;
    if (packed == NULL || bp == NULL) {
        free(packed);
        free(bp);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "gemm_bf16_tiles: no memory for the packed operands");
    }
    ckp_clear_error();
    const int team = team_for(M, K, N);
    const int64_t row_panels = (M + NATIVE_MR - 1) / NATIVE_MR, col_panels = ldb / NATIVE_NR;
#pragma omp parallel num_threads(team)
    {
        const unsigned csr = _mm_getcsr(); /* the chunks' and the bias's adds under DAZ and FTZ, as panel()'s */
        _mm_setcsr(csr | MXCSR_FTZ_DAZ);
        /* packed 32 rows and 16 columns at a time */
        if (!direct) { /* every thread takes the same branch */
#pragma omp for schedule(static)
            for (int64_t m0 = 0; m0 < M; m0 += 32) pack_a32(a, a_rs, a_cs, m0, M, K, panel, packed);
        }
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < N; n0 += 16) pack_b16(b, b_rs, b_cs, n0, N, K, bp);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < row_panels * col_panels; p++) {
            const int64_t m0 = p % row_panels * NATIVE_MR, n0 = p / row_panels * NATIVE_NR;
            native_panel(ap, panel, lda, bp, pairs, N, m0, M - m0 < NATIVE_MR ? M - m0 : NATIVE_MR, n0,
                         N - n0 < NATIVE_NR ? N - n0 : NATIVE_NR, starts, chunks, bias, c);
        }
        _mm_setcsr(csr);
    }
    free(packed);
    free(bp);
    return CKP_OK;
}

/* Whether width 0 runs VDPBF16PS itself: where the CPU has it, unless CKP_BF16_EMULATE asks for the emulation. Read
 * once (the flash backward asks per block). */
static int native_pairs(void) {
    static int native = -1; /* the attention's threads may ask at once: each would store the same value */
    int now = __atomic_load_n(&native, __ATOMIC_RELAXED);
    if (now < 0) {
        now = getenv("CKP_BF16_EMULATE") == NULL && __builtin_cpu_supports("avx512bf16");
        __atomic_store_n(&native, now, __ATOMIC_RELAXED);
    }
    return now;
}

/* The bf16 bits of a float holding a bf16 value (exact: its low half is zero). */
static inline uint32_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u >> 16;
}

/* Sixteen VDPBF16PS pairs from floats holding bf16 values: each lo's bf16 in the low half, hi's in the high. */
CKP_NATIVE_BF16 static inline __m512i pairs16(__m512 lo, __m512 hi) {
    return _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(lo), 16),
                           _mm512_and_si512(_mm512_castps_si512(hi), _mm512_set1_epi32((int)0xffff0000u)));
}

/* A (M x K, floats holding bf16 values) as pairs (past K a zero), in a_panel's layout: a transposed A (dS^T and P^T)
 * in panels of 8 rows `panel` apart, sixteen at a time; else row m's at ap + m * pairs, sixteen at a time where A's
 * rows are contiguous (the flash backward's dS), one by one where neither is. */
CKP_NATIVE_BF16 static void pack_a_pairs(const float *a, int64_t a_rs, int64_t a_cs, int64_t M, int64_t K,
                                         int64_t panel, uint32_t *ap) {
    const int64_t pairs = (K + 1) / 2;
    if (panel) { /* 16 rows' pair q from two contiguous columns, into two panels of 8 */
        for (int64_t q = 0; q < pairs; q++)
            for (int64_t m0 = 0; m0 < M; m0 += 16) {
                const int64_t left = M - m0;
                const __mmask16 live = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
                const __m512 lo = _mm512_maskz_loadu_ps(live, a + m0 + 2 * q * a_cs),
                             hi = 2 * q + 1 < K ? _mm512_maskz_loadu_ps(live, a + m0 + (2 * q + 1) * a_cs)
                                                : _mm512_setzero_ps();
                const __m512i w = pairs16(lo, hi);
                uint32_t *lo8 = ap + m0 / 8 * panel + q * 8, *hi8 = lo8 + panel;
                if (left >= 16) { /* plain stores: a masked store is slow on AMD's cores */
                    _mm256_storeu_si256((__m256i *)lo8, _mm512_castsi512_si256(w));
                    _mm256_storeu_si256((__m256i *)hi8, _mm512_extracti64x4_epi64(w, 1));
                    continue;
                }
                _mm256_mask_storeu_epi32(lo8, (__mmask8)live, _mm512_castsi512_si256(w));
                if (left > 8) _mm256_mask_storeu_epi32(hi8, (__mmask8)(live >> 8), _mm512_extracti64x4_epi64(w, 1));
            }
        return;
    }
    if (a_cs == 1) { /* a row's 32 floats' high halves in order are its 16 pairs */
        for (int64_t m = 0; m < M; m++)
            for (int64_t q0 = 0; q0 < pairs; q0 += 16) {
                const int64_t k0 = 2 * q0, left = K - k0 < 32 ? K - k0 : 32, n = pairs - q0 < 16 ? pairs - q0 : 16;
                const __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1),
                                hi = (__mmask16)(left >= 32 ? 0xffff : left <= 16 ? 0 : (1u << (left - 16)) - 1);
                const __m512i x0 = _mm512_srli_epi32(_mm512_castps_si512(_mm512_maskz_loadu_ps(lo, a + m * a_rs + k0)), 16),
                              x1 = _mm512_srli_epi32(_mm512_castps_si512(_mm512_maskz_loadu_ps(hi, a + m * a_rs + k0 + 16)), 16);
                const __m512i packed = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(x0)),
                                                          _mm512_cvtepi32_epi16(x1), 1);
                if (n == 16) _mm512_storeu_si512(ap + m * pairs + q0, packed);
                else _mm512_mask_storeu_epi32(ap + m * pairs + q0, (__mmask16)((1u << n) - 1), packed);
            }
        return;
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t q = 0; q < pairs; q++) {
            const float *x = a + m * a_rs + 2 * q * a_cs;
            ap[m * pairs + q] = bf16_bits(x[0]) | (2 * q + 1 < K ? bf16_bits(x[a_cs]) << 16 : 0u);
        }
}

/* B (K x N, rows b_rs apart and contiguous) as pairs, pair q's of column n at bp + b_at(pairs, q, n), zero past K
 * and N (to ldb columns). */
CKP_NATIVE_BF16 static void pack_b_pairs(const float *b, int64_t b_rs, int64_t K, int64_t N, int64_t ldb,
                                         uint32_t *bp) {
    const int64_t pairs = (K + 1) / 2;
    for (int64_t q = 0; q < pairs; q++)
        for (int64_t n0 = 0; n0 < ldb; n0 += 16) {
            const __mmask16 live = (__mmask16)(N - n0 >= 16 ? 0xffff : N <= n0 ? 0 : (1u << (N - n0)) - 1);
            const __m512 lo = _mm512_maskz_loadu_ps(live, b + 2 * q * b_rs + n0),
                         hi = 2 * q + 1 < K ? _mm512_maskz_loadu_ps(live, b + (2 * q + 1) * b_rs + n0) : _mm512_setzero_ps();
            _mm512_storeu_si512(bp + b_at(pairs, q, n0), pairs16(lo, hi));
        }
}

/* ckp_onednn_bf16_accumulate by VDPBF16PS: A and B (floats holding bf16 values) packed as pairs in scratch (counted
 * by ckp_onednn_bf16_accumulate_floats), each 8 x 32 panel's chain from 0, then C = bf16(alpha * sum + C). */
static void native_accumulate(float alpha, const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs,
                              int64_t M, int64_t K, int64_t N, float *c, int64_t ldc, uint32_t *scratch) {
    const int64_t pairs = (K + 1) / 2, ldb = (N + NATIVE_NR - 1) / NATIVE_NR * NATIVE_NR;
    const int64_t panel = a_panel(a_rs, a_cs, pairs);
    uint32_t *ap = scratch, *bp = ap + (M + NATIVE_MR - 1) / NATIVE_MR * panel_stride(pairs);
    pack_a_pairs(a, a_rs, a_cs, M, K, panel, ap);
    pack_b_pairs(b, b_rs, K, N, ldb, bp);
    float sum[NATIVE_MR][NATIVE_NR];
    for (int64_t n0 = 0; n0 < N; n0 += NATIVE_NR)
        for (int64_t m0 = 0; m0 < M; m0 += NATIVE_MR) {
            const int64_t rows = M - m0 < NATIVE_MR ? M - m0 : NATIVE_MR, cols = N - n0 < NATIVE_NR ? N - n0 : NATIVE_NR;
            native_sums(ap, panel, pairs, bp, pairs, m0, rows, n0, NULL, 0, sum);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++) {
                    float *at = c + (m0 + i) * ldc + n0 + j;
                    *at = ckp_bf16_round(alpha * sum[i][j] + *at);
                }
        }
}

int64_t ckp_onednn_bf16_accumulate_floats(int64_t M, int64_t K, int64_t N) {
    const ckp_tiling t = ckp_tiling_for_cpu();
    const int64_t kw = K + K % 2, pairs = kw / 2;
    const int64_t emulated = M * kw + kw * ((N + t.nr - 1) / t.nr * t.nr) + t.mr * t.nr;
    const int64_t native = (M + NATIVE_MR - 1) / NATIVE_MR * panel_stride(pairs) +
                           pairs * ((N + NATIVE_NR - 1) / NATIVE_NR * NATIVE_NR); /* native_accumulate's pairs */
    return emulated > native ? emulated : native;
}

void ckp_onednn_bf16_accumulate(float alpha, const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs,
                                int64_t M, int64_t K, int64_t N, float *c, int64_t ldc, float *scratch) {
    /* VDPBF16PS's chain ("FP32 FMA with DAZ in, FTZ out", Intel's SDM), each pair's odd-placed product first: the
     * float32 GEMM's register tile over A and B widened with each pair swapped (an odd K padded with a zero, added
     * first: a chain from +0 is never -0, so it moves no bit), as ckp_gemm_bf16_tiles' width 0 runs it, under
     * DAZ and FTZ; then C = bf16(alpha * sum + C) without them. */
    if (native_pairs()) { /* the same bits (tests/test_linear.py's check of the two forms), the instruction itself */
        native_accumulate(alpha, a, a_rs, a_cs, b, b_rs, M, K, N, c, ldc, (uint32_t *)scratch);
        return;
    }
    const ckp_tiling t = ckp_tiling_for_cpu();
    const int64_t kw = K + K % 2, ldb = (N + t.nr - 1) / t.nr * t.nr;
    float *aw = scratch, *bw = aw + M * kw, *sum = bw + kw * ldb;
    enum { BLOCK = 16 }; /* A transposed (dK's dS^T, dV's P^T) is read in blocks: along its rows in each */
    for (int64_t m0 = 0; m0 < M; m0 += BLOCK)
        for (int64_t k0 = 0; k0 < K; k0 += BLOCK)
            for (int64_t k = k0; k < K && k < k0 + BLOCK; k++)
                for (int64_t m = m0; m < M && m < m0 + BLOCK; m++) aw[m * kw + (k ^ 1)] = a[m * a_rs + k * a_cs];
    for (int64_t m = 0; m < M && K % 2; m++) aw[m * kw + K - 1] = 0.0f;
    for (int64_t k = 0; k < kw; k++) {
        float *row = bw + (k ^ 1) * ldb;
        if (k < K) memcpy(row, b + k * b_rs, (size_t)N * sizeof(float));
        memset(row + (k < K ? N : 0), 0, (size_t)(ldb - (k < K ? N : 0)) * sizeof(float));
    }
    const unsigned csr = _mm_getcsr();
    for (int64_t n0 = 0; n0 < N; n0 += t.nr)
        for (int64_t m0 = 0; m0 < M; m0 += t.mr) {
            const int64_t rows = M - m0 < t.mr ? M - m0 : t.mr, cols = N - n0 < t.nr ? N - n0 : t.nr;
            _mm_setcsr(csr | MXCSR_FTZ_DAZ);
            t.tile(kw, aw + m0 * kw, kw, 1, bw + n0, ldb, sum, t.nr, rows, t.nr, 1);
            _mm_setcsr(csr);
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < cols; j++) {
                    float *at = c + (m0 + i) * ldc + n0 + j;
                    *at = ckp_bf16_round(alpha * sum[i * t.nr + j] + *at);
                }
        }
}

ckp_status ckp_gemm_bf16_tiles(const uint16_t *a, int64_t a_rs, int64_t a_cs, const uint16_t *b, int64_t b_rs,
                               int64_t b_cs, int64_t M, int64_t K, int64_t N, int64_t width,
                               const int64_t *chunk_starts, int64_t chunks, const uint16_t *bias, uint16_t *c) {
    if (a == NULL || b == NULL || c == NULL || (chunks > 0 && chunk_starts == NULL))
        return ckp_fail(CKP_ERR_NULL_POINTER, "a, b, c (and chunk_starts, with chunks) must not be NULL");
    if (M <= 0 || K <= 0 || N <= 0 || M > INT32_MAX || K > INT32_MAX || N > INT32_MAX)
        return ckp_fail(CKP_ERR_BAD_SIZE, "M, K and N must be positive, got M=%lld K=%lld N=%lld", (long long)M,
                        (long long)K, (long long)N);
    if (a_rs < 0 || a_cs < 0 || b_rs < 0 || b_cs < 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "strides must not be negative");
    if (width < 0 || width == 1 || width % 2 != 0)
        return ckp_fail(CKP_ERR_BAD_OPTION, "width must be an even number of terms >= 2 (AMX tiles) or 0 (the "
                                            "pairs' chain), got %lld", (long long)width);
    if (chunks < 0) return ckp_fail(CKP_ERR_BAD_OPTION, "chunks must be >= 0, got %lld", (long long)chunks);
    for (int64_t i = 0; i < chunks; i++)
        if (chunk_starts[i] <= (i == 0 ? 0 : chunk_starts[i - 1]) || chunk_starts[i] >= K)
            return ckp_fail(CKP_ERR_BAD_OPTION, "chunk_starts must rise strictly within (0, K)");
    const size_t c_bytes = (size_t)(M * N) * sizeof(uint16_t);
    const size_t a_bytes = (size_t)((M - 1) * a_rs + (K - 1) * a_cs + 1) * sizeof(uint16_t);
    const size_t b_bytes = (size_t)((K - 1) * b_rs + (N - 1) * b_cs + 1) * sizeof(uint16_t);
    if (ckp_overlaps(c, c_bytes, a, a_bytes) || ckp_overlaps(c, c_bytes, b, b_bytes) ||
        (chunks > 0 && ckp_overlaps(c, c_bytes, chunk_starts, (size_t)chunks * sizeof(int64_t))) ||
        (bias != NULL && ckp_overlaps(c, c_bytes, bias, (size_t)N * sizeof(uint16_t))))
        return ckp_fail(CKP_ERR_ALIASING, "c overlaps a, b, chunk_starts or the bias");
    if (width == 0 && native_pairs())
        return native_pairs_gemm(a, a_rs, a_cs, b, b_rs, b_cs, M, K, N, chunk_starts, chunks, bias, c);
    const ckp_tiling t = ckp_tiling_for_cpu();
    const int64_t ldb = (N + t.nr - 1) / t.nr * t.nr; /* B widened, its last panel padded with zeros */
    /* the pairs' chain: K padded to even (the pad a zero), and term k widened to place k ^ 1 */
    const int64_t kw = width == 0 ? K + K % 2 : K, swap = width == 0;
    float *aw = calloc((size_t)(M * kw), sizeof(float)), *bw = calloc((size_t)(kw * ldb), sizeof(float));
    if (aw == NULL || bw == NULL) {
        free(aw);
        free(bw);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "gemm_bf16_tiles: no memory for the widened operands");
    }
    ckp_clear_error();
    const int team = team_for(M, K, N);
    const int64_t row_panels = (M + t.mr - 1) / t.mr, col_panels = ldb / t.nr;
#pragma omp parallel num_threads(team)
    {
        const unsigned csr = _mm_getcsr(); /* TDPBF16PS's DAZ and FTZ, in this thread for this call */
        _mm_setcsr(csr | MXCSR_FTZ_DAZ);
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) aw[m * kw + (k ^ swap)] = ckp_bf16_to_f(a[m * a_rs + k * a_cs]);
#pragma omp for schedule(static)
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) bw[(k ^ swap) * ldb + n] = ckp_bf16_to_f(b[k * b_rs + n * b_cs]);
#pragma omp for schedule(static)
        for (int64_t p = 0; p < row_panels * col_panels; p++) {
            /* a column panel of B (K x nr: 128 KB at K 1024) stays in cache for every row panel in turn */
            const int64_t m0 = p % row_panels * t.mr, n0 = p / row_panels * t.nr;
            panel(&t, aw, bw, ldb, kw, N, m0, M - m0 < t.mr ? M - m0 : t.mr, n0, N - n0 < t.nr ? N - n0 : t.nr, width,
                  chunk_starts, chunks, bias, c);
        }
        _mm_setcsr(csr);
    }
    free(aw);
    free(bw);
    return CKP_OK;
}
