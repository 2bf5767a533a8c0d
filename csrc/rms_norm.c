/*
 * rms_norm.c — F.rms_norm(x, (D,), weight, eps) forward and backward,
 * following torch's own float operations so that results match it bit for
 * bit where torch's order of operations can be reproduced.
 *
 * torch 2.13 evaluates rms_norm on the CPU as a composite (layer_norm.cpp):
 *   rstd = rsqrt(pow(x, 2).mean(-1, keepdim) + eps);  y = (x * rstd) * weight
 * with mean = sum / D (sum in ATen's order, aten_sum.c) and rsqrt = 1 / sqrt.
 * Backward is autograd's chain through that composite, per row with
 * a = x * rstd and g_a = dy * weight:
 *   g_rstd = sum_j g_a_j * x_j                       (mul backward, summed to (N, 1))
 *   g_mean = (-0.5 * g_rstd) * (rstd * rstd * rstd)  (rsqrt backward)
 *   dx_j   = g_a_j * rstd + (g_mean / D) * (2 * x_j) (mul backward + mean and pow backward)
 *   dweight_j = sum_i dy_ij * a_ij                   (summed over rows in ATen's outer-sum order)
 * Every row and every column is reduced by one thread in a fixed order, so the
 * bits never depend on the thread count. Where torch's own bits depend on its
 * thread count -- a sum reducing to one value of >= 32768 elements (a
 * one-row input's row, dweight's column at D = 1), split by its two-pass
 * reduction -- the caller passes that count (torch_threads) and the sum is
 * split the same way. The loops run on 8-lane vectors
 * (vec.h) that do each element's float operations as written: the same bits
 * as scalar code, in every target_clones build.
 *
 * bfloat16: torch's composite computes in float (opmath) and rounds once at
 * the end, in forward and backward alike (dx's two terms are added in float
 * before the cast back): every bf16 result is the float32 result of the same
 * values, rounded. The _bf16 entry points run the float32 code above on the
 * widened values and round -- float32's bits, so torch's bf16 bits
 * (tests/test_bf16.py sweeps it at every capability): the row loops and
 * dweight's column sums read the bf16 arrays in place, widening as they load,
 * and round each result as they store it. (Widening whole arrays into fresh
 * float copies cost more in page faults than the arithmetic: 220 ms for
 * (8192, 4096) forward and backward; widening a row at a time into each
 * thread's float rows, then rounding y or dx out of another, cost the forward
 * and the backward's C calls about a fifth more than reading in place.)
 */
#include "aten_sum.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static ckp_status check_sizes(int64_t N, int64_t D) {
    if (N <= 0 || D <= 0)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N and D must be positive, got N=%lld D=%lld",
                        (long long)N, (long long)D);
    if (N > INT64_MAX / D)
        return ckp_fail(CKP_ERR_BAD_SIZE, "N*D overflows: N=%lld D=%lld", (long long)N, (long long)D);
    return CKP_OK;
}

/* A row's sum of squares in torch.sum's order, of elements ELEM (float32, bf16 or float16: the
 * values widened as they load), defined per format by RMS_DEFINE_SQUARES; square_at<suffix> is its
 * element map for a split sum (ckp_aten_full_sum). */
#define RMS_DEFINE_SQUARES(suffix, ELEM)                                                                      \
    static inline __attribute__((always_inline)) ckp_v8f square8##suffix(const void *row, int64_t j) {       \
        ckp_v8f v = ckp_elem_load8(row, j, ELEM);                                                             \
        return v * v;                                                                                         \
    }                                                                                                         \
    static inline __attribute__((always_inline)) float square1##suffix(const void *row, int64_t j) {         \
        float v = ckp_elem_load(row, j, ELEM);                                                                \
        return v * v;                                                                                         \
    }                                                                                                         \
    CKP_DEFINE_ATEN_SUM(sum_of_squares##suffix, square8##suffix, square1##suffix, CKP_VLANES)                 \
    static float square_at##suffix(void *ctx, int64_t j) { return square1##suffix(ctx, j); }

RMS_DEFINE_SQUARES(, sizeof(float))
RMS_DEFINE_SQUARES(_bf16, sizeof(uint16_t))
RMS_DEFINE_SQUARES(_f16, CKP_ELEM_F16)

/* torch reduces a row of one-row input to one value: from 32768 elements on,
 * on more than one thread, split as its two-pass reduction splits it
 * (ckp_aten_full_sum); any other row is one thread's, whole. */
static inline int split_row(int64_t D, int split_threads) {
    return split_threads > 1 && D >= CKP_ATEN_GRAIN_SIZE;
}

/* The elementwise ends of a row, N lanes a vector from column j while a whole vector fits; return
 * the column they stop at. Elementwise: 16 lanes (ckp_lanes16) or 8 give the same bits. The forward's
 * y = x * r (* weight); the backward's dx = dy (* weight) * r + grad_mean * 2x, its two terms apart
 * in dx and dx_rstd when dx_rstd is given (float32). ahead: where the next row starts, in elements
 * from this one (0: none), brought into the cache meanwhile -- the row's sum then finds it there
 * instead of waiting on memory while this loop's arithmetic leaves the memory idle. bf16 rows only:
 * C calls at (8192, 4096) forward 3.8 -> 3.1-3.4 ms, backward without dweight 5.7 -> 3.6-5.0; float32
 * rows move twice the bytes for the same arithmetic, already at the memory's speed, and its forward
 * went 4.5 -> 5.0 with it. */
#define RMS_DEFINE_ELEMENTWISE(N)                                                                              \
    static inline __attribute__((always_inline)) int64_t forward_vectors##N(                                  \
        const void *x, const float *weight, float r, int64_t j, int64_t D, void *y, size_t elem,              \
        int64_t ahead) {                                                                                      \
        for (; j + N <= D; j += N) {                                                                          \
            if (ahead) __builtin_prefetch((const char *)x + (j + ahead) * (int64_t)ckp_elem_bytes(elem));                     \
            ckp_v##N##f normalized = ckp_elem_load##N(x, j, elem) * r;                                        \
            ckp_elem_store##N(y, j, weight ? normalized * ckp_elem_load##N(weight, j, sizeof(float)) : normalized, elem); \
        }                                                                                                     \
        return j;                                                                                             \
    }                                                                                                         \
    static inline __attribute__((always_inline)) int64_t backward_vectors##N(                                 \
        const void *dy, const void *x, const float *weight, float r, float grad_mean, int64_t j, int64_t D,  \
        void *dx, float *dx_rstd, size_t elem, int64_t ahead) {                                               \
        for (; j + N <= D; j += N) {                                                                          \
            if (ahead) {                                                                                      \
                __builtin_prefetch((const char *)dy + (j + ahead) * (int64_t)ckp_elem_bytes(elem));                           \
                __builtin_prefetch((const char *)x + (j + ahead) * (int64_t)ckp_elem_bytes(elem));                            \
            }                                                                                                 \
            ckp_v##N##f g = ckp_elem_load##N(dy, j, elem);                                                    \
            if (weight) g = g * ckp_elem_load##N(weight, j, sizeof(float));                                   \
            ckp_v##N##f normalized = g * r, through_rstd = grad_mean * (2.0f * ckp_elem_load##N(x, j, elem)); \
            if (dx_rstd) {                                                                                    \
                ckp_elem_store##N(dx, j, normalized, elem);                                                   \
                ckp_elem_store##N(dx_rstd, j, through_rstd, sizeof(float));                                   \
            } else {                                                                                          \
                ckp_elem_store##N(dx, j, normalized + through_rstd, elem);                                    \
            }                                                                                                 \
        }                                                                                                     \
        return j;                                                                                             \
    }

RMS_DEFINE_ELEMENTWISE(8)
RMS_DEFINE_ELEMENTWISE(16)

/* One row of the forward on x and y of elem bytes a value; returns rstd. split_threads: torch's
 * thread count for a one-row input, else 1. bf16: the float32 row's arithmetic on the widened values
 * (the sum of squares is a float32 tensor's sum in torch's composite), y rounded once. */
static inline __attribute__((always_inline)) float forward_row_of(const void *x, const float *weight, int64_t D,
                                                                  float eps, int split_threads, void *y, size_t elem,
                                                                  int64_t ahead) {
    const int f16 = elem == CKP_ELEM_F16, bf16 = elem == sizeof(uint16_t);
    float squares = split_row(D, split_threads)
                        ? ckp_aten_full_sum(f16 ? square_at_f16 : bf16 ? square_at_bf16 : square_at, (void *)x, D,
                                            split_threads)
                        : f16 ? sum_of_squares_f16(x, D) : bf16 ? sum_of_squares_bf16(x, D) : sum_of_squares(x, D);
    if (CKP_MUTANT(RMS_SUM_REVERSED)) {
        squares = 0.0f;
        for (int64_t j = D - 1; j >= 0; j--) squares += ckp_elem_load(x, j, elem) * ckp_elem_load(x, j, elem);
    }
    float mean = squares / (float)D;
    float r = CKP_MUTANT(RMS_EPS_OUTSIDE_SQRT) ? 1.0f / (sqrtf(mean) + eps) : 1.0f / sqrtf(mean + eps);
    int64_t j = ckp_lanes16() ? forward_vectors16(x, weight, r, 0, D, y, elem, ahead) : 0;
    j = forward_vectors8(x, weight, r, j, D, y, elem, ahead);
    for (; j < D; j++) {
        float normalized = ckp_elem_load(x, j, elem) * r;
        ckp_elem_store(y, j, weight ? normalized * weight[j] : normalized, elem);
    }
    return r;
}

CKP_CLONES static float forward_row(const float *x, const float *weight, int64_t D, float eps, int split_threads,
                                    float *y) {
    return forward_row_of(x, weight, D, eps, split_threads, y, sizeof(float), 0);
}

CKP_CLONES static float forward_row_bf16(const uint16_t *x, const float *weight, int64_t D, float eps,
                                         int split_threads, uint16_t *y, int64_t ahead) {
    return forward_row_of(x, weight, D, eps, split_threads, y, sizeof(uint16_t), ahead);
}

CKP_CLONES static float forward_row_f16(const uint16_t *x, const float *weight, int64_t D, float eps,
                                        int split_threads, uint16_t *y, int64_t ahead) {
    return forward_row_of(x, weight, D, eps, split_threads, y, CKP_ELEM_F16, ahead);
}

ckp_status ckp_rms_norm_forward(const float *x, const float *weight, int64_t N, int64_t D,
                                double eps, float *y, float *rstd, int torch_threads) {
    if (x == NULL || y == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, y and rstd must not be NULL");
    ckp_status s = check_sizes(N, D);
    if (s == CKP_OK) s = ckp_check_torch_threads(torch_threads);
    if (s != CKP_OK) return s;
    if (!(eps >= 0.0 && isfinite(eps)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "eps must be finite and >= 0, got %g", eps);
    const ckp_span x_s = {x, (size_t)(N * D) * sizeof(float)}, w_s = {weight, (size_t)D * sizeof(float)};
    const ckp_span y_s = {y, x_s.bytes}, rstd_s = {rstd, (size_t)N * sizeof(float)};
    /* a row's y is written while other rows' x are still to be read (threads) */
    if (ckp_overlaps_any(y_s, (ckp_span[]){x_s, w_s, rstd_s}, 3) || ckp_overlaps_any(rstd_s, (ckp_span[]){x_s, w_s}, 2))
        return ckp_fail(CKP_ERR_ALIASING, "y and rstd must not overlap x, weight or each other");
    ckp_clear_error();
    const float eps_f = (float)eps;

    /* x (N, D), weight (D), y (N, D), rstd (N) */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * D >= 32768)
    for (int64_t i = 0; i < N; i++)
        rstd[i] = forward_row(x + i * D, weight, D, eps_f, N == 1 ? torch_threads : 1, y + i * D);
    return CKP_OK;
}


/* dweight's terms dy_ij * (x_ij * rstd_i): row i, column first + k. */
typedef struct {
    const void *dy, *x;
    const float *rstd;
    int64_t D, first;
    size_t elem;
} column_terms;

static float column_term(const void *ctx, int64_t i, int64_t k) {
    const column_terms *c = ctx;
    int64_t at = i * c->D + c->first + k;
    float dy = ckp_elem_load(c->dy, at, c->elem), x = ckp_elem_load(c->x, at, c->elem);
    return CKP_MUTANT(RMS_DWEIGHT_ASSOCIATION) ? (dy * x) * c->rstd[i] : dy * (x * c->rstd[i]);
}

/* D == 1: the N terms are contiguous and torch reduces them as an inner sum. */
static float column_term_inner(void *ctx, int64_t i) { return column_term(ctx, i, 0); }

/* The columns ATen sums over the rows as one cascade each (multi_row_sum); the
 * rest go through row_sum's 4 interleaved accumulators ([Note: ATen's
 * summation order], aten_sum.h: vectorized_outer_sum from 8 columns on,
 * scalar_outer_sum below). */
static int64_t cascade_columns(int64_t D) {
    if (D == 1) return 0;
    return D < CKP_VLANES ? D - D % CKP_SUM_ILP : D - D % (CKP_SUM_ILP * CKP_VLANES);
}

/* dweight for the cascade columns from D >= 8 on (ATen's vectorized_outer_sum
 * over blocks of 4 vectors: one cascade per column over the rows). Here one
 * lane per column, up to VECS vectors (1024 columns) at a time: the
 * accumulators (16 KB) stay in L1 and each row is read in runs of up to 4 KB
 * (bf16: 2 KB). The walk down the rows is what costs: with 16 columns at a
 * time every row's read was a TLB miss (dweight took 130 ms instead of 35 ms
 * at N=8192, D=4096); 1024 columns took a fifth less time than 256. Each
 * column is its own cascade, so the grouping never changes a bit. */
enum { VECS = 128, MIN_VECS = 32 };

/* One group's cascades over rows [i0, i1), their state in acc (zeroed before row 0), defined at N
 * lanes by RMS_DEFINE_COLUMNS: a lane is a column, its own cascade, so 8 or 16 columns a vector
 * (16 where torch runs AVX512: ckp_lanes16) give the same bits; the state is the same bytes either
 * way (VECS 8-lane vectors a level). i0 is a multiple of the level step and so is i1 unless it is
 * N: every level's flush falls on the row it falls on in one walk over all N rows, and the rows
 * after the last whole step come last, so a walk block by block does the same additions in the
 * same order. At N, the levels are added up and stored in dweight. */
#define RMS_DEFINE_COLUMNS(N)                                                                                \
    static inline __attribute__((always_inline)) ckp_v##N##f column_terms##N(const void *dy, const void *x,   \
                                                                             const float *rstd, int64_t k,   \
                                                                             int64_t i, size_t elem) {       \
        return ckp_elem_load##N(dy, k, elem) * (ckp_elem_load##N(x, k, elem) * rstd[i]);                             \
    }                                                                                                        \
    static inline __attribute__((always_inline)) void dweight_columns_of##N(                                 \
        const void *dy, const void *x, const float *rstd, int64_t N_rows, int64_t D, int64_t j, int nvec,    \
        int64_t i0, int64_t i1, ckp_v##N##f (*acc)[VECS * CKP_VLANES / N], float *dweight, size_t elem) {    \
        int64_t level_power = ckp_cascade_power(N_rows);                                                     \
        int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;                         \
        int64_t i = i0;                                                                                      \
        while (i + level_step <= i1) {                                                                       \
            for (int64_t s = 0; s < level_step; s++, i++)                                                    \
                for (int v = 0; v < nvec; v++) acc[0][v] += column_terms##N(dy, x, rstd, i * D + j + v * N, i, elem); \
            for (int l = 1; l < CKP_SUM_LEVELS; l++) {                                                       \
                for (int v = 0; v < nvec; v++) {                                                             \
                    acc[l][v] += acc[l - 1][v];                                                              \
                    acc[l - 1][v] = ckp_splat##N(0.0f);                                                      \
                }                                                                                            \
                if ((i & (level_mask << (l * level_power))) != 0) break;                                     \
            }                                                                                                \
        }                                                                                                    \
        if (i1 < N_rows) return;                                                                             \
        for (; i < N_rows; i++)                                                                              \
            for (int v = 0; v < nvec; v++) acc[0][v] += column_terms##N(dy, x, rstd, i * D + j + v * N, i, elem); \
        for (int l = 1; l < CKP_SUM_LEVELS; l++)                                                             \
            for (int v = 0; v < nvec; v++) acc[0][v] += acc[l][v];                                           \
        for (int v = 0; v < nvec; v++) memcpy(dweight + j + v * N, &acc[0][v], sizeof acc[0][v]);            \
    }

RMS_DEFINE_COLUMNS(8)
RMS_DEFINE_COLUMNS(16)

/* nvec 8-lane vectors of columns from j; 16 lanes take them in pairs (nvec is even: the groups are). */
CKP_CLONES static void dweight_columns(const void *dy, const void *x, const float *rstd, int64_t N, int64_t D,
                                       int64_t j, int nvec, int64_t i0, int64_t i1, ckp_v8f (*acc)[VECS],
                                       float *dweight, size_t elem) {
    if (ckp_lanes16()) { /* elem a constant in each call: the loads inline */
        ckp_v16f (*acc16)[VECS / 2] = (ckp_v16f (*)[VECS / 2])acc;
        if (elem == CKP_ELEM_F16)
            dweight_columns_of16(dy, x, rstd, N, D, j, nvec / 2, i0, i1, acc16, dweight, CKP_ELEM_F16);
        else if (elem == sizeof(uint16_t))
            dweight_columns_of16(dy, x, rstd, N, D, j, nvec / 2, i0, i1, acc16, dweight, sizeof(uint16_t));
        else
            dweight_columns_of16(dy, x, rstd, N, D, j, nvec / 2, i0, i1, acc16, dweight, sizeof(float));
    } else if (elem == CKP_ELEM_F16) {
        dweight_columns_of8(dy, x, rstd, N, D, j, nvec, i0, i1, acc, dweight, CKP_ELEM_F16);
    } else if (elem == sizeof(uint16_t)) {
        dweight_columns_of8(dy, x, rstd, N, D, j, nvec, i0, i1, acc, dweight, sizeof(uint16_t));
    } else {
        dweight_columns_of8(dy, x, rstd, N, D, j, nvec, i0, i1, acc, dweight, sizeof(float));
    }
}

/* dweight's columns that are not a vector cascade (D < 8, and the columns past the last whole
 * block of 32): ATen's scalar sums, over all rows at once (a few columns: no blocking). */
static void dweight_other_columns(const void *dy, const void *x, const float *rstd, int64_t N, int64_t D,
                                  int torch_threads, size_t elem, float *dweight) {
    int64_t cascade_end = cascade_columns(D);
    if (D < CKP_VLANES)
        for (int64_t j = 0; j < cascade_end; j += CKP_SUM_ILP) {
            column_terms c = {dy, x, rstd, D, j, elem};
            ckp_multi_row_sum(column_term, &c, N, CKP_SUM_ILP, dweight + j);
        }
    for (int64_t j = cascade_end; j < D; j++) {
        column_terms c = {dy, x, rstd, D, j, elem};
        /* D == 1: one sum over the N rows, which torch splits across its threads */
        dweight[j] = D == 1 ? ckp_aten_full_sum(column_term_inner, &c, N, torch_threads)
                            : ckp_row_sum(column_term, &c, N);
    }
}

/* One row of dx: backward_row on the row's own inputs (bf16: widened into the thread's float rows). */
typedef void (*dx_row_fn)(const void *ctx, int64_t i, int thread);

/* [Note: the backward's blocks of rows]
 * The backward walks dy and x twice: dweight's cascades down the columns (ATen's order, which
 * pins dweight's bits) and each row's dx. Done one after the other, both read dy and x from
 * memory: at (8192, 4096) the column walk cost more than the rows. Here both go a block of rows at
 * a time -- each thread some of the block's dx rows, then the block's cascades (each thread a group
 * of columns) -- so the second walk finds the block in cache. The rows go first: they read dy and x
 * front to back, which the prefetcher follows, where the cascades' runs of 2-4 KB a row stalled on
 * every row's first line (in the bf16 backward at (8192, 4096) on 2 threads, 10.2 -> 8.5 ms with the
 * rows first; float32, whose two outputs make it memory-bound, the same either way). When dx
 * overwrites dy (float32 in place) the cascades go first, since they read dy. The cascades' state
 * waits in memory between blocks; a block is a whole number of the cascade's level steps (about 2
 * MB of dy and x: the shared L3 holds it; 1 and 4 MB measured slower), so the additions are those
 * of one walk (dweight_columns_of). At (8192, 4096) on 2 threads the blocks took the C backward
 * 18 -> 14-15 ms in bf16 and 23 -> 17-19 ms in float32. Without a weight there is no cascade: one
 * walk, no blocks. */
static ckp_status backward_blocks(const void *dy, const void *x, const float *rstd, int64_t N, int64_t D,
                                  int torch_threads, size_t elem, float *dweight, dx_row_fn dx_row, const void *ctx,
                                  int dx_first) {
    const int threads = ckp_threads();
    int64_t vecs = 0, per = 1, groups = 0;
    ckp_v8f (*state)[CKP_SUM_LEVELS][VECS] = NULL;
    if (dweight != NULL && D >= CKP_VLANES) {
        /* groups as wide as VECS allows while every thread has one (not under MIN_VECS vectors) */
        vecs = cascade_columns(D) / CKP_VLANES;
        per = (vecs + threads - 1) / threads;
        per = per > VECS ? VECS : per < MIN_VECS ? MIN_VECS : (per + 1) & ~(int64_t)1; /* even: 16 lanes pair them */
        groups = (vecs + per - 1) / per; /* 0 below 32 columns: all of them are other columns */
    }
    if (groups) {
        state = aligned_alloc(64, (size_t)groups * sizeof *state);
        if (state == NULL)
            return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for dweight's cascades (D=%lld)", (long long)D);
        memset(state, 0, (size_t)groups * sizeof *state);
    }
    if (dweight != NULL) dweight_other_columns(dy, x, rstd, N, D, torch_threads, elem, dweight);
    int64_t level_step = (int64_t)1 << ckp_cascade_power(N);
    int64_t fit = ((int64_t)1 << 21) / (2 * D * (int64_t)ckp_elem_bytes(elem)) / level_step; /* level steps in ~2 MB */
    int64_t block = groups == 0 ? N : (fit > 1 ? fit : 1) * level_step; /* no cascades: one walk */
#pragma omp parallel num_threads(threads) if (N * D >= 32768)
    for (int64_t i0 = 0; i0 < N; i0 += block) {
        int64_t i1 = N - i0 > block ? i0 + block : N;
        if (dx_first) {
#pragma omp for schedule(static)
            for (int64_t i = i0; i < i1; i++) dx_row(ctx, i, omp_get_thread_num());
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < groups; b++) {
            int64_t j = b * per * CKP_VLANES, left = vecs - b * per;
            dweight_columns(dy, x, rstd, N, D, j, (int)(left < per ? left : per), i0, i1, state[b], dweight, elem);
        }
        if (!dx_first) {
#pragma omp for schedule(static)
            for (int64_t i = i0; i < i1; i++) dx_row(ctx, i, omp_get_thread_num());
        }
    }
    free(state);
    return CKP_OK;
}

/* g_a_j * x_j (g_a = dy * weight) for the g_rstd sum of one row: dy and x float32, or bf16 (the _bf16
 * maps, widening as they load) */
typedef struct {
    const void *dy, *x;
    const float *weight;
} row_terms;

#define RMS_DEFINE_GRAD_TERMS(suffix, ELEM)                                                                   \
    static inline __attribute__((always_inline)) ckp_v8f grad_a_times_x8##suffix(const void *ctx, int64_t j) { \
        const row_terms *r = ctx;                                                                         \
        ckp_v8f g = ckp_elem_load8(r->dy, j, ELEM);                                                            \
        if (r->weight) g = g * ckp_load8(r->weight + j);                                                  \
        return g * ckp_elem_load8(r->x, j, ELEM);                                                              \
    }                                                                                                     \
    static inline __attribute__((always_inline)) float grad_a_times_x1##suffix(const void *ctx, int64_t j) { \
        const row_terms *r = ctx;                                                                         \
        float g = r->weight ? ckp_elem_load(r->dy, j, ELEM) * r->weight[j] : ckp_elem_load(r->dy, j, ELEM);          \
        return g * ckp_elem_load(r->x, j, ELEM);                                                                \
    }                                                                                                     \
    CKP_DEFINE_ATEN_SUM(sum_grad_a_times_x##suffix, grad_a_times_x8##suffix, grad_a_times_x1##suffix, CKP_VLANES) \
    static float grad_a_times_x_at##suffix(void *ctx, int64_t j) { return grad_a_times_x1##suffix(ctx, j); }

RMS_DEFINE_GRAD_TERMS(, sizeof(float))
RMS_DEFINE_GRAD_TERMS(_bf16, sizeof(uint16_t))
RMS_DEFINE_GRAD_TERMS(_f16, CKP_ELEM_F16)

/* One row of dx on dy, x and dx of elem bytes a value (dx may be dy: each dy_j is read before dx_j is
 * written); with dx_rstd (float32 only), dx gets the first term and dx_rstd the second, unadded.
 * bf16: float32's arithmetic on the widened values, the two terms added in float and rounded once.
 * split_threads as forward_row's. */
static inline __attribute__((always_inline)) void backward_row_of(const void *dy, const void *x, const float *weight,
                                                                  float r, int64_t D, int split_threads, void *dx,
                                                                  float *dx_rstd, size_t elem, int64_t ahead) {
    const int f16 = elem == CKP_ELEM_F16, bf16 = elem == sizeof(uint16_t);
    row_terms terms = {dy, x, weight};
    ckp_float_map term = f16 ? grad_a_times_x_at_f16 : bf16 ? grad_a_times_x_at_bf16 : grad_a_times_x_at;
    /* D = 1: autograd's sum_to_size of one column is no sum, so a -0 term stays -0 (0 + -0 is +0: dx's sign) */
    float grad_rstd = D == 1 ? term(&terms, 0)
                    : split_row(D, split_threads)
                          ? ckp_aten_full_sum(term, &terms, D, split_threads)
                          : f16 ? sum_grad_a_times_x_f16(&terms, D)
                          : bf16 ? sum_grad_a_times_x_bf16(&terms, D) : sum_grad_a_times_x(&terms, D);
    float grad_mean = (-0.5f * grad_rstd) * (r * r * r) / (float)(CKP_MUTANT(RMS_BACKWARD_MEAN_OFF_BY_ONE) && D > 1 ? D - 1 : D);
    if (CKP_MUTANT(RMS_BACKWARD_NO_RSTD_TERM)) grad_mean = 0.0f;
    int64_t j = ckp_lanes16() ? backward_vectors16(dy, x, weight, r, grad_mean, 0, D, dx, dx_rstd, elem, ahead) : 0;
    j = backward_vectors8(dy, x, weight, r, grad_mean, j, D, dx, dx_rstd, elem, ahead);
    for (; j < D; j++) {
        float g = weight ? ckp_elem_load(dy, j, elem) * weight[j] : ckp_elem_load(dy, j, elem);
        float normalized = g * r, through_rstd = grad_mean * (2.0f * ckp_elem_load(x, j, elem));
        if (dx_rstd) {
            ckp_elem_store(dx, j, normalized, elem);
            dx_rstd[j] = through_rstd;
        } else {
            ckp_elem_store(dx, j, normalized + through_rstd, elem);
        }
    }
}

CKP_CLONES static void backward_row(const float *dy, const float *x, const float *weight, float r, int64_t D,
                                    int split_threads, float *dx, float *dx_rstd) {
    backward_row_of(dy, x, weight, r, D, split_threads, dx, dx_rstd, sizeof(float), 0);
}

CKP_CLONES static void backward_row_bf16(const uint16_t *dy, const uint16_t *x, const float *weight, float r,
                                         int64_t D, int split_threads, uint16_t *dx, int64_t ahead) {
    backward_row_of(dy, x, weight, r, D, split_threads, dx, NULL, sizeof(uint16_t), ahead);
}

CKP_CLONES static void backward_row_f16(const uint16_t *dy, const uint16_t *x, const float *weight, float r,
                                        int64_t D, int split_threads, uint16_t *dx, int64_t ahead) {
    backward_row_of(dy, x, weight, r, D, split_threads, dx, NULL, CKP_ELEM_F16, ahead);
}

/* The rows' inputs and outputs for dx_row (float32) and dx_row_bf16. */
typedef struct {
    const void *dy, *x;
    const float *weight, *rstd; /* bf16: the weight widened */
    int64_t N, D;
    int torch_threads;
    void *dx;
    float *dx_rstd; /* float32: the second term apart, or NULL */
} backward_rows;

static void dx_row_f32(const void *ctx, int64_t i, int thread) {
    (void)thread;
    const backward_rows *r = ctx;
    const int64_t D = r->D;
    backward_row((const float *)r->dy + i * D, (const float *)r->x + i * D, r->weight, r->rstd[i], D,
                 r->N == 1 ? r->torch_threads : 1, (float *)r->dx + i * D, r->dx_rstd ? r->dx_rstd + i * D : NULL);
}

static ckp_status backward(const float *dy, const float *x, const float *weight, const float *rstd, int64_t N,
                           int64_t D, float *dx, float *dx_rstd, float *dweight, int torch_threads) {
    if (dy == NULL || x == NULL || rstd == NULL || dx == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dy, x, rstd and dx must not be NULL");
    if (weight == NULL && dweight != NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dweight is given but weight is NULL (no weight: no dweight)");
    ckp_status s = check_sizes(N, D);
    if (s == CKP_OK) s = ckp_check_torch_threads(torch_threads);
    if (s != CKP_OK) return s;
    size_t bytes = (size_t)(N * D) * sizeof(float);
    if (dx != dy && ckp_overlaps(dx, bytes, dy, bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dx partially overlaps dy");
    if (ckp_overlaps(dx, bytes, x, bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dx overlaps x");
    if (dx_rstd != NULL && (ckp_overlaps(dx_rstd, bytes, dx, bytes) || ckp_overlaps(dx_rstd, bytes, dy, bytes) ||
                            ckp_overlaps(dx_rstd, bytes, x, bytes)))
        return ckp_fail(CKP_ERR_ALIASING, "dx_rstd overlaps dx, dy or x");
    size_t dweight_bytes = (size_t)D * sizeof(float);
    if (dweight != NULL && (ckp_overlaps(dweight, dweight_bytes, dx, bytes) || ckp_overlaps(dweight, dweight_bytes, dy, bytes) ||
                            ckp_overlaps(dweight, dweight_bytes, x, bytes) ||
                            (dx_rstd != NULL && ckp_overlaps(dweight, dweight_bytes, dx_rstd, bytes))))
        return ckp_fail(CKP_ERR_ALIASING, "dweight overlaps dy, x or an output");
    /* rstd and weight are read by every row while other rows' outputs are written (threads) */
    const ckp_span read_by_all[] = {{rstd, (size_t)N * sizeof(float)}, {weight, dweight_bytes}};
    if (ckp_overlaps_any((ckp_span){dx, bytes}, read_by_all, 2) ||
        ckp_overlaps_any((ckp_span){dx_rstd, bytes}, read_by_all, 2) ||
        ckp_overlaps_any((ckp_span){dweight, dweight_bytes}, read_by_all, 2))
        return ckp_fail(CKP_ERR_ALIASING, "dx, dx_rstd and dweight must not overlap rstd or weight");
    ckp_clear_error();
    const backward_rows rows = {dy, x, weight, rstd, N, D, torch_threads, dx, dx_rstd};
    /* dx in place of dy: the cascades read the block's dy first */
    return backward_blocks(dy, x, rstd, N, D, torch_threads, sizeof(float), dweight, dx_row_f32, &rows, dx != dy);
}

ckp_status ckp_rms_norm_backward(const float *dy, const float *x, const float *weight, const float *rstd,
                                 int64_t N, int64_t D, float *dx, float *dweight, int torch_threads) {
    return backward(dy, x, weight, rstd, N, D, dx, NULL, dweight, torch_threads);
}

ckp_status ckp_rms_norm_backward_terms(const float *dy, const float *x, const float *weight, const float *rstd,
                                       int64_t N, int64_t D, float *dx_normalized, float *dx_rstd, float *dweight,
                                       int torch_threads) {
    if (dx_rstd == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "dx_rstd must not be NULL");
    return backward(dy, x, weight, rstd, N, D, dx_normalized, dx_rstd, dweight, torch_threads);
}

/* ---- bfloat16 and float16 ------------------------------------------------------ */

static ckp_status out_of_memory(int64_t D) {
    return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "no memory for the weight's float rows in a 16-bit rms_norm (D=%lld)",
                    (long long)D);
}

/* count float rows of D (the weight, dweight's sums); NULL when out of memory. */
static float *float_rows(int64_t D, int count) {
    return malloc((size_t)count * (size_t)D * sizeof(float));
}

/* weight (D) of w_elem (bf16, float16 or float32) into D floats */
static void weight_as_float(const void *weight, size_t w_elem, int64_t D, float *wf) {
    for (int64_t j = 0; j < D; j++) wf[j] = ckp_elem_load(weight, j, w_elem);
}

/* The 16-bit forward: x and y of elem (bf16 or CKP_ELEM_F16), a weight of x's format or float32
 * (w_elem). */
static ckp_status forward_half(const uint16_t *x, const void *weight, size_t w_elem, int64_t N, int64_t D,
                               double eps, uint16_t *y, float *rstd, int torch_threads, size_t elem) {
    if (x == NULL || y == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, y and rstd must not be NULL");
    ckp_status s = check_sizes(N, D);
    if (s == CKP_OK) s = ckp_check_torch_threads(torch_threads);
    if (s != CKP_OK) return s;
    if (!(eps >= 0.0 && isfinite(eps)))
        return ckp_fail(CKP_ERR_BAD_OPTION, "eps must be finite and >= 0, got %g", eps);
    const ckp_span x_s = {x, (size_t)(N * D) * 2}, w_s = {weight, (size_t)D * ckp_elem_bytes(w_elem)};
    const ckp_span y_s = {y, x_s.bytes}, rstd_s = {rstd, (size_t)N * sizeof(float)};
    if (ckp_overlaps_any(y_s, (ckp_span[]){x_s, w_s, rstd_s}, 3) || ckp_overlaps_any(rstd_s, (ckp_span[]){x_s, w_s}, 2))
        return ckp_fail(CKP_ERR_ALIASING, "y and rstd must not overlap x, weight or each other");
    float *wf = weight ? float_rows(D, 1) : NULL; /* the weight as floats */
    if (weight && wf == NULL) return out_of_memory(D);
    ckp_clear_error();
    if (wf) weight_as_float(weight, w_elem, D, wf);
    const float eps_f = (float)eps;
    float (*row)(const uint16_t *, const float *, int64_t, float, int, uint16_t *, int64_t) =
        elem == CKP_ELEM_F16 ? forward_row_f16 : forward_row_bf16;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (N * D >= 32768)
    for (int64_t i = 0; i < N; i++)
        rstd[i] = row(x + i * D, wf, D, eps_f, N == 1 ? torch_threads : 1, y + i * D, i + 1 < N ? D : 0);
    free(wf);
    return CKP_OK;
}

ckp_status ckp_rms_norm_forward_bf16(const uint16_t *x, const uint16_t *weight, int64_t N, int64_t D,
                                     double eps, uint16_t *y, float *rstd, int torch_threads) {
    return forward_half(x, weight, sizeof(uint16_t), N, D, eps, y, rstd, torch_threads, sizeof(uint16_t));
}

ckp_status ckp_rms_norm_forward_bf16_f32w(const uint16_t *x, const float *weight, int64_t N, int64_t D,
                                          double eps, uint16_t *y, float *rstd, int torch_threads) {
    return forward_half(x, weight, sizeof(float), N, D, eps, y, rstd, torch_threads, sizeof(uint16_t));
}

ckp_status ckp_rms_norm_forward_f16(const uint16_t *x, const uint16_t *weight, int64_t N, int64_t D,
                                    double eps, uint16_t *y, float *rstd, int torch_threads) {
    return forward_half(x, weight, CKP_ELEM_F16, N, D, eps, y, rstd, torch_threads, CKP_ELEM_F16);
}

ckp_status ckp_rms_norm_forward_f16_f32w(const uint16_t *x, const float *weight, int64_t N, int64_t D,
                                         double eps, uint16_t *y, float *rstd, int torch_threads) {
    return forward_half(x, weight, sizeof(float), N, D, eps, y, rstd, torch_threads, CKP_ELEM_F16);
}

#define RMS_DEFINE_DX_ROW(F)                                                                                  \
    static void dx_row_##F(const void *ctx, int64_t i, int thread) {                                          \
        (void)thread;                                                                                         \
        const backward_rows *r = ctx;                                                                         \
        const int64_t D = r->D;                                                                               \
        backward_row_##F((const uint16_t *)r->dy + i * D, (const uint16_t *)r->x + i * D, r->weight,          \
                         r->rstd[i], D, r->N == 1 ? r->torch_threads : 1, (uint16_t *)r->dx + i * D,         \
                         i + 1 < r->N ? D : 0);                                                               \
    }

RMS_DEFINE_DX_ROW(bf16)
RMS_DEFINE_DX_ROW(f16)

/* The 16-bit backward (elem as forward_half's), dweight of the weight's format (w_elem). */
static ckp_status backward_half(const uint16_t *dy, const uint16_t *x, const void *weight, size_t w_elem,
                                const float *rstd, int64_t N, int64_t D, uint16_t *dx, void *dweight,
                                int torch_threads, size_t elem) {
    if (dy == NULL || x == NULL || rstd == NULL || dx == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dy, x, rstd and dx must not be NULL");
    if (weight == NULL && dweight != NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dweight is given but weight is NULL (no weight: no dweight)");
    ckp_status s = check_sizes(N, D);
    if (s == CKP_OK) s = ckp_check_torch_threads(torch_threads);
    if (s != CKP_OK) return s;
    size_t bytes = (size_t)(N * D) * 2, w_bytes = (size_t)D * ckp_elem_bytes(w_elem);
    const ckp_span inputs[] = {{dy, bytes}, {x, bytes}, {weight, w_bytes}, {rstd, (size_t)N * sizeof(float)}};
    if (ckp_overlaps_any((ckp_span){dx, bytes}, inputs, 4) || ckp_overlaps_any((ckp_span){dweight, w_bytes}, inputs, 4) ||
        ckp_overlaps(dx, bytes, dweight, w_bytes))
        return ckp_fail(CKP_ERR_ALIASING, "dx and dweight must not overlap the inputs or each other");
    float *rows = weight ? float_rows(D, dweight ? 2 : 1) : NULL; /* the weight as floats, then dweight's float sums */
    if (weight && rows == NULL) return out_of_memory(D);
    ckp_clear_error();
    float *wf = weight ? rows : NULL, *sums = dweight ? wf + D : NULL;
    if (wf) weight_as_float(weight, w_elem, D, wf);
    const backward_rows r = {dy, x, wf, rstd, N, D, torch_threads, dx, NULL};
    s = backward_blocks(dy, x, rstd, N, D, torch_threads, elem, sums, elem == CKP_ELEM_F16 ? dx_row_f16 : dx_row_bf16,
                        &r, 1);
    if (s == CKP_OK && sums) {
        for (int64_t j = 0; j < D; j++) ckp_elem_store(dweight, j, sums[j], w_elem);
    }
    free(rows);
    return s;
}

ckp_status ckp_rms_norm_backward_bf16(const uint16_t *dy, const uint16_t *x, const uint16_t *weight,
                                      const float *rstd, int64_t N, int64_t D, uint16_t *dx, uint16_t *dweight,
                                      int torch_threads) {
    return backward_half(dy, x, weight, sizeof(uint16_t), rstd, N, D, dx, dweight, torch_threads, sizeof(uint16_t));
}

ckp_status ckp_rms_norm_backward_bf16_f32w(const uint16_t *dy, const uint16_t *x, const float *weight,
                                           const float *rstd, int64_t N, int64_t D, uint16_t *dx, float *dweight,
                                           int torch_threads) {
    return backward_half(dy, x, weight, sizeof(float), rstd, N, D, dx, dweight, torch_threads, sizeof(uint16_t));
}

ckp_status ckp_rms_norm_backward_f16(const uint16_t *dy, const uint16_t *x, const uint16_t *weight,
                                     const float *rstd, int64_t N, int64_t D, uint16_t *dx, uint16_t *dweight,
                                     int torch_threads) {
    return backward_half(dy, x, weight, CKP_ELEM_F16, rstd, N, D, dx, dweight, torch_threads, CKP_ELEM_F16);
}

ckp_status ckp_rms_norm_backward_f16_f32w(const uint16_t *dy, const uint16_t *x, const float *weight,
                                          const float *rstd, int64_t N, int64_t D, uint16_t *dx, float *dweight,
                                          int torch_threads) {
    return backward_half(dy, x, weight, sizeof(float), rstd, N, D, dx, dweight, torch_threads, CKP_ELEM_F16);
}
