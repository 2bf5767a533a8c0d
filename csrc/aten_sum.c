/*
 * aten_sum.c — ckp_aten_sum: torch.sum's order (aten_sum.h) over any element
 * map, for the reductions of cross_entropy's ptref variant whose elements are
 * computed on the fly.
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

static ckp_v8f any_map8(const void *ctx, int64_t j) {
    const any_map *m = ctx;
    ckp_v8f v;
    for (int l = 0; l < CKP_VLANES; l++) v[l] = m->map(m->ctx, j + l);
    return v;
}

static float any_map1(const void *ctx, int64_t j) {
    const any_map *m = ctx;
    return m->map(m->ctx, j);
}

float ckp_aten_sum(ckp_float_map map, void *ctx, int64_t n) {
    any_map m = {map, ctx};
    return ckp_aten_sum_inline(any_map8, any_map1, &m, n);
}
