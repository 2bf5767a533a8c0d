/*
 * ckp_internal.h — helpers shared by the kernel files; not part of the API.
 *
 * Determinism rule for every reduction in the library: work is split into
 * blocks whose boundaries depend on the problem size only (never on the
 * thread count), each block is reduced sequentially by one thread, and the
 * block results are combined in block order. The same inputs therefore give
 * the same bits for any number of threads.
 */
#ifndef CKP_INTERNAL_H
#define CKP_INTERNAL_H

#include "ckparity.h"
#include "mutants.h"

#include <stddef.h>
#include <stdint.h>

/* Hot loops are built for x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the
 * x86-64 baseline, picked at load time. Contraction is off and every sum has a
 * fixed lane structure, so every build gives the same bits; only the speed
 * differs. Built with -Dclones=false (meson option), the library has only the
 * baseline code: tests/test_clones.py compares that build's bits with this one's. */
#if defined(CKP_NO_CLONES) || !defined(__x86_64__)
#define CKP_CLONES
#else
#define CKP_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

/* Whether the bf16 elementwise loops run 16 lanes rather than 8: on an AVX512
 * capability, where torch's build runs 16 and an AVX-512 core runs them at
 * twice the rate of 8. Elsewhere 8: GCC 12 turns a 16-lane FMA lane loop for
 * AVX2 into scalar code (5x slower). An elementwise op's bits do not depend on
 * the lanes beside it, so the width is speed only (the bf16 ptref
 * cross-entropy rows, swiglu, AdamW's default path; vec.h's CKP_DEFINE_LANES). */
static inline int ckp_lanes16(void) { return ckp_get_capability() == CKP_CAPABILITY_AVX512; }

/* How torch's build at the running capability runs an elementwise op's
 * ATen loop (Loops.h's vectorized_loop: two vectors a step, the rest scalar):
 * vec_pair floats a step, 0 where DEFAULT runs every element scalar; fma
 * whether the build contracts a + b * c into one FMA (swiglu, gelu). */
typedef struct {
    int64_t vec_pair;
    int fma;
} ckp_aten_layout;

static inline ckp_aten_layout ckp_aten_layout_for_capability(void) {
    switch (ckp_get_capability()) {
    case CKP_CAPABILITY_AVX512: return (ckp_aten_layout){32, 1}; /* two 16-lane vectors */
    case CKP_CAPABILITY_AVX2: return (ckp_aten_layout){16, 1};   /* two 8-lane vectors */
    default: return (ckp_aten_layout){0, 0};
    }
}

/* Records a printf-style detail for ckp_last_error() and returns status. */
ckp_status ckp_fail(ckp_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears the detail at the start of a successful call path. */
void ckp_clear_error(void);

/* ATen's own erf GELU (gelu.c), for gelu_erf.c's ATEN form: n elements of float32 or bf16 (elem 4 or 2), torch's
 * pieces at torch_threads. */
ckp_status ckp_gelu_aten_erf_forward(const void *x, int64_t n, int torch_threads, void *y, size_t elem);
ckp_status ckp_gelu_aten_erf_backward(const void *dy, const void *x, int64_t n, int torch_threads, void *dx,
                                      size_t elem);

/* Number of threads a parallel region should use. */
int ckp_threads(void);

/* Fixed block count for reductions over n items: at most CKP_MAX_BLOCKS. */
enum { CKP_MAX_BLOCKS = 256 };
int64_t ckp_num_blocks(int64_t n);
/* Half-open range [*lo, *hi) of block b out of nblocks over n items. */
void ckp_block_range(int64_t n, int64_t nblocks, int64_t b, int64_t *lo, int64_t *hi);

/* True if [a, a+na) and [b, b+nb) (in bytes) overlap. */
int ckp_overlaps(const void *a, size_t na, const void *b, size_t nb);

/* An elementwise entry's buffers of n elements of elem bytes (gelu's): x, dy (with has_dy: a backward) and out
 * not NULL, n positive and not too large, out overlapping no input. */
ckp_status ckp_check_elementwise(const void *x, const void *dy, int has_dy, const void *out, int64_t n, size_t elem);

/* A buffer of a call: its address (NULL: absent) and size in bytes. */
typedef struct {
    const void *p;
    size_t bytes;
} ckp_span;

/* True if span out overlaps any of the n others (absent ones are skipped). */
int ckp_overlaps_any(ckp_span out, const ckp_span *others, int n);

/* A map from element index to value, for sums whose elements are computed
 * on the fly; ctx is the caller's. */
typedef float (*ckp_float_map)(void *ctx, int64_t j);

/* torch.sum over n contiguous float32 values in ATen's order (aten_sum.c);
 * map is called with ascending j. */
float ckp_aten_sum(ckp_float_map map, void *ctx, int64_t n);
/* torch.sum over all n elements of a contiguous tensor as ATen runs it on
 * `threads` threads: ckp_aten_sum below 32768 elements or on one thread,
 * else split into chunks summed apart and then added (aten_sum.c). */
float ckp_aten_full_sum(ckp_float_map map, void *ctx, int64_t n, int threads);
/* The same sums over bf16 values (map gives each one as a float) as torch.sum
 * runs them on a bf16 tensor: float accumulators fed 16 values per vector,
 * the total (and a split's every chunk) rounded to bf16, as torch stores it. */
float ckp_aten_sum_bf16(ckp_float_map map, void *ctx, int64_t n);
float ckp_aten_full_sum_bf16(ckp_float_map map, void *ctx, int64_t n, int threads);
/* The sum of the elements [begin, begin + n) of some sequence in ATen's inner-sum order (bf16
 * sums: rounded), the elements computed by the caller's vector code: one chunk of a split sum. */
typedef float (*ckp_range_sum)(const void *ctx, int64_t begin, int64_t n);
/* ckp_aten_full_sum's split with each chunk summed by `sum` (its bf16 form with bf16). */
float ckp_aten_split_sum(ckp_range_sum sum, const void *ctx, int64_t n, int threads, int bf16);
/* The full sums of n floats held in an array (bf16 values for the _bf16 form), on vectors. */
float ckp_aten_full_sum_array(const float *a, int64_t n, int threads);
float ckp_aten_full_sum_array_bf16(const float *a, int64_t n, int threads);
/* CKP_ERR_BAD_OPTION unless torch_threads >= 1 (the count ckp_aten_full_sum splits for). */
ckp_status ckp_check_torch_threads(int torch_threads);

/* A map from (row i, column k) to value, for sums over rows. */
typedef float (*ckp_float_map2)(const void *ctx, int64_t i, int64_t k);

/* ATen's multi_row_sum and row_sum in float ([Note: ATen's summation order]
 * in aten_sum.h): out[k] for k < nrows (<= 4) is the cascade over rows
 * i < size of map(ctx, i, k); ckp_row_sum is the sum of map(ctx, i, 0) over
 * i < n with 4 interleaved accumulators. */
void ckp_multi_row_sum(ckp_float_map2 map, const void *ctx, int64_t size, int nrows, float *out);
float ckp_row_sum(ckp_float_map2 map, const void *ctx, int64_t n);

/* ATen's utils::CeilLog2: 1 for x <= 2. */
int64_t ckp_ceil_log2(int64_t x);

/* The float32 GEMM's register tile (linear.c), the CPU's: C[i, j] (ldc) for i < mr, j < nr = (first ? 0 : C) +
 * the FMA chain from 0 over kb k of A[i, k] (a[i*a_rs + k*a_cs]) times B's packed panel b[k*ldb + j], which
 * must hold `nr` (the tiling's) readable columns; rows past mr are computed and not stored. */
typedef void (*ckp_tile_fn)(int64_t kb, const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t ldb,
                            float *c, int64_t ldc, int64_t mr, int64_t nr, int first);
typedef struct {
    ckp_tile_fn tile;
    int64_t mr, nr; /* the most rows and columns one call computes */
} ckp_tiling;
ckp_tiling ckp_tiling_for_cpu(void);

/* One thread's float32 GEMM in MKL's order, with sgemm's alpha and beta 0/1 (linear.c). A slot keeps one
 * B's packed panels (its `packed` holds ckp_gemm_slot_floats(K, N)) for calls with the same B; valid
 * within one call of the caller's kernel only (the values behind b may change between calls). */
typedef struct {
    const float *b;
    int64_t b_rs, b_cs, K, N;
    float scale;
    int wide;
    float *packed;
} ckp_gemm_slot;
/* Which operand of C = A.B (row-major) a caller hands MKL transposed: ATen's cpublas::gemm(transa, transb) is
 * column-major, so its transa is B's and its transb A's (the flash kernel: Q.K^T and dO.V^T give B transposed,
 * P.V and dS.K neither, P^T.dO and dS^T.Q give A transposed). */
typedef enum { CKP_MKL_B_TRANSPOSED, CKP_MKL_NEITHER_TRANSPOSED, CKP_MKL_A_TRANSPOSED } ckp_mkl_form;
int64_t ckp_gemm_serial_floats(int64_t M, int64_t K, int64_t N);
int64_t ckp_gemm_slot_floats(int64_t K, int64_t N);
void ckp_gemm_serial(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs,
                     int64_t M, int64_t K, int64_t N, float alpha, int accumulate, float *c, int64_t ldc,
                     float *scratch, ckp_gemm_slot *slot, int mkl_threads, ckp_mkl_form form);
/* C (M x N, float holding bf16 values, ldc apart) += alpha A . B in ATen's bf16 GEMM's pairs or chain form
 * (csrc/linear_bf16_aten.c), A and B float holding bf16 values, by their strides (the chain: B's columns
 * contiguous), each output rounded to bf16 after: the flash kernel's bf16 backward accumulating its gradients. */
void ckp_aten_bf16_accumulate(int form, float alpha, const float *a, int64_t a_rs, int64_t a_cs, const float *b,
                              int64_t b_rs, int64_t b_cs, int64_t M, int64_t K, int64_t N, float *c, int64_t ldc);
/* The same where the GEMM is oneDNN's AVX-512 bf16 brgemm ([Note: oneDNN's AVX-512 bf16 order], csrc/linear_bf16.c):
 * each output's chain over K's pairs (K of one chunk: up to 512), then C = bf16(alpha * sum + C) -- the src scale,
 * then the sum post-op. B's rows are contiguous (B[k,n] is b[k*b_rs + n]), as the flash backward's are. By
 * VDPBF16PS itself where the CPU has it (as ckp_gemm_bf16_tiles' width 0), else its emulation. */
void ckp_onednn_bf16_accumulate(float alpha, const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs,
                                int64_t M, int64_t K, int64_t N, float *c, int64_t ldc, float *scratch);
/* The scratch floats ckp_onednn_bf16_accumulate needs for (M, K, N): A and B widened and one tile's sums, or A and B
 * packed as VDPBF16PS's pairs, whichever is more. */
int64_t ckp_onednn_bf16_accumulate_floats(int64_t M, int64_t K, int64_t N);
#endif /* CKP_INTERNAL_H */
