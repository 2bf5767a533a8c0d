/*
 * aten_sum.c — torch.sum's order ([Note: ATen's summation order] in
 * aten_sum.h) over any element map: ckp_aten_sum, the inner sum, for the
 * reductions of cross_entropy's ptref variant whose elements are computed on
 * the fly, and ckp_aten_full_sum, the same split as torch splits it across
 * threads (ckp_aten_split_sum: any inner sum per chunk, e.g. the caller's
 * vector code; ckp_aten_full_sum_array: over an array of floats, on vectors);
 * ckp_multi_row_sum and ckp_row_sum, the scalar sums over rows.
 */
#include "aten_sum.h"

int64_t ckp_ceil_log2(int64_t x) {
    if (x <= 2) return 1;
    int64_t bits = 0;
    for (uint64_t v = (uint64_t)x - 1; v; v >>= 1) bits++;
    return bits;
}

typedef struct {
    ckp_float_map map;
    void *ctx;
} any_map;

static inline __attribute__((always_inline)) ckp_v8f any_map8(const void *ctx, int64_t j) {
    const any_map *m = ctx;
    ckp_v8f v;
    for (int l = 0; l < CKP_VLANES; l++) v[l] = m->map(m->ctx, j + l);
    return v;
}

static inline __attribute__((always_inline)) float any_map1(const void *ctx, int64_t j) {
    const any_map *m = ctx;
    return m->map(m->ctx, j);
}

CKP_DEFINE_ATEN_SUM(any_map_sum, any_map8, any_map1, CKP_VLANES)

float ckp_aten_sum(ckp_float_map map, void *ctx, int64_t n) {
    any_map m = {map, ctx};
    return any_map_sum(&m, n);
}

/* one Vectorized<BFloat16> load of 16 values, as 8 floats: its two halves added lane by lane */
static inline __attribute__((always_inline)) ckp_v8f any_map8_bf16(const void *ctx, int64_t j) {
    return any_map8(ctx, j) + any_map8(ctx, j + CKP_VLANES);
}

CKP_DEFINE_ATEN_SUM(any_map_sum_bf16, any_map8_bf16, any_map1, 2 * CKP_VLANES)

float ckp_aten_sum_bf16(ckp_float_map map, void *ctx, int64_t n) {
    any_map m = {map, ctx};
    return ckp_bf16_round(any_map_sum_bf16(&m, n));
}

/* The two-pass reduction's buffer: slot t is chunk t's sum, added to the
 * slot's 0 (-0.0 becomes +0.0, as there); the slots past the last chunk stay
 * 0. Computed when the final sum asks for it: each slot is read once. */
typedef struct {
    ckp_range_sum sum;
    const void *ctx;
    int64_t n, chunk;
} split_sum;

static float split_slot(void *ctx, int64_t t) {
    const split_sum *s = ctx;
    if (t * s->chunk >= s->n) return 0.0f;
    int64_t begin = t * s->chunk;
    return 0.0f + s->sum(s->ctx, begin, s->n - begin < s->chunk ? s->n - begin : s->chunk);
}

/* TensorIteratorReduce.cpp, parallel_reduce: a reduction to one value of at
 * least GRAIN_SIZE elements on more than one thread is two_pass_reduction.
 * Its at::parallel_for (OpenMP) splits [0, n) into
 * nt = min(threads, ceil(n / GRAIN_SIZE)) chunks of ceil(n / nt) elements;
 * chunk t is summed on its own (cascade_sum's inner sum over that range)
 * into slot t of a buffer of `threads` zeros, and the buffer is then summed
 * the same way. The bits depend on `threads`, not on the threads this runs
 * on (one). In bf16 the buffer is bf16: each slot is rounded. */
float ckp_aten_split_sum(ckp_range_sum sum, const void *ctx, int64_t n, int threads, int bf16) {
    if (n < CKP_ATEN_GRAIN_SIZE || threads <= 1 || CKP_MUTANT(PTREF_FULL_SUM_UNSPLIT)) return sum(ctx, 0, n);
    int64_t chunks = (n + CKP_ATEN_GRAIN_SIZE - 1) / CKP_ATEN_GRAIN_SIZE;
    if (chunks > threads) chunks = threads;
    split_sum s = {sum, ctx, n, (n + chunks - 1) / chunks};
    return (bf16 ? ckp_aten_sum_bf16 : ckp_aten_sum)(split_slot, &s, threads);
}

/* A map's elements from an offset, summed by ckp_aten_sum or ckp_aten_sum_bf16. */
typedef struct {
    ckp_float_map map;
    void *ctx;
    int64_t begin;
    float (*inner)(ckp_float_map, void *, int64_t);
} offset_map;

static float offset_element(void *ctx, int64_t j) {
    const offset_map *o = ctx;
    return o->map(o->ctx, o->begin + j);
}

static float map_range(const void *ctx, int64_t begin, int64_t n) {
    offset_map o = *(const offset_map *)ctx;
    if (begin == 0) return o.inner(o.map, o.ctx, n); /* unsplit: the map itself */
    o.begin = begin;
    return o.inner(offset_element, &o, n);
}

float ckp_aten_full_sum(ckp_float_map map, void *ctx, int64_t n, int threads) {
    offset_map o = {map, ctx, 0, ckp_aten_sum};
    return ckp_aten_split_sum(map_range, &o, n, threads, 0);
}

float ckp_aten_full_sum_bf16(ckp_float_map map, void *ctx, int64_t n, int threads) {
    offset_map o = {map, ctx, 0, ckp_aten_sum_bf16};
    return ckp_aten_split_sum(map_range, &o, n, threads, 1);
}

/* Arrays of floats: the inner sums on vectors loaded from them (a bf16 vector's 16 values as its two
 * halves, as any_map8_bf16 takes them). */
static inline __attribute__((always_inline)) ckp_v8f array8(const void *ctx, int64_t j) {
    return ckp_load8((const float *)ctx + j);
}
static inline __attribute__((always_inline)) float array1(const void *ctx, int64_t j) {
    return ((const float *)ctx)[j];
}
static inline __attribute__((always_inline)) ckp_v8f array8_bf16(const void *ctx, int64_t j) {
    return array8(ctx, j) + array8(ctx, j + CKP_VLANES);
}

CKP_DEFINE_ATEN_SUM(array_sum, array8, array1, CKP_VLANES)
CKP_DEFINE_ATEN_SUM(array_sum_bf16, array8_bf16, array1, 2 * CKP_VLANES)

CKP_CLONES static float array_range(const void *ctx, int64_t begin, int64_t n) {
    return array_sum((const float *)ctx + begin, n);
}

CKP_CLONES static float array_range_bf16(const void *ctx, int64_t begin, int64_t n) {
    return ckp_bf16_round(array_sum_bf16((const float *)ctx + begin, n));
}

float ckp_aten_full_sum_array(const float *a, int64_t n, int threads) {
    return ckp_aten_split_sum(array_range, a, n, threads, 0);
}

float ckp_aten_full_sum_array_bf16(const float *a, int64_t n, int threads) {
    return ckp_aten_split_sum(array_range_bf16, a, n, threads, 1);
}

void ckp_multi_row_sum(ckp_float_map2 map, const void *ctx, int64_t size, int nrows, float *out) {
    int64_t level_power = ckp_cascade_power(size);
    int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;
    float acc[CKP_SUM_LEVELS][CKP_SUM_ILP] = {{0}};
    int64_t i = 0;
    while (i + level_step <= size) {
        for (int64_t s = 0; s < level_step; s++, i++)
            for (int k = 0; k < nrows; k++) acc[0][k] += map(ctx, i, k);
        for (int l = 1; l < CKP_SUM_LEVELS; l++) {
            for (int k = 0; k < nrows; k++) {
                acc[l][k] += acc[l - 1][k];
                acc[l - 1][k] = 0.0f;
            }
            if ((i & (level_mask << (l * level_power))) != 0) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < nrows; k++) acc[0][k] += map(ctx, i, k);
    for (int l = 1; l < CKP_SUM_LEVELS; l++)
        for (int k = 0; k < nrows; k++) acc[0][k] += acc[l][k];
    for (int k = 0; k < nrows; k++) out[k] = acc[0][k];
}

/* row_sum's view of the n values as (n / 4, 4): row i, column k is value i * 4 + k */
typedef struct {
    ckp_float_map2 map;
    const void *ctx;
} interleaved;

static float interleaved_value(const void *ctx, int64_t i, int64_t k) {
    const interleaved *v = ctx;
    return v->map(v->ctx, i * CKP_SUM_ILP + k, 0);
}

float ckp_row_sum(ckp_float_map2 map, const void *ctx, int64_t n) {
    float partial[CKP_SUM_ILP];
    int64_t size_ilp = n / CKP_SUM_ILP;
    interleaved view = {map, ctx};
    ckp_multi_row_sum(interleaved_value, &view, size_ilp, CKP_SUM_ILP, partial);
    for (int64_t i = size_ilp * CKP_SUM_ILP; i < n; i++) partial[0] += map(ctx, i, 0);
    for (int k = 1; k < CKP_SUM_ILP; k++) partial[0] += partial[k];
    return partial[0];
}

ckp_status ckp_check_torch_threads(int torch_threads) {
    if (torch_threads < 1)
        return ckp_fail(CKP_ERR_BAD_OPTION, "torch_threads must be >= 1, got %d", torch_threads);
    return CKP_OK;
}
