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

CKP_DEFINE_ATEN_SUM(any_map_sum, any_map8, any_map1)

float ckp_aten_sum(ckp_float_map map, void *ctx, int64_t n) {
    any_map m = {map, ctx};
    return any_map_sum(&m, n);
}
