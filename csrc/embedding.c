/*
 * embedding.c — F.embedding's lookup and its weight gradient, as ATen runs them on the CPU
 * (Embedding.cpp):
 *   forward: out[i] = weight[idx[i]] (index_select: a copy, any dtype's bits);
 *   backward (embedding_dense_backward_cpu): dweight starts at zeros and, for i in index order,
 *     dweight[idx[i]] += dout[i] (add_stub with alpha 1: one add per element, in bfloat16 the sum
 *     in float rounded to bf16 each time, as a bf16 tensor holds it); a row of padding_idx gets no
 *     gradient; rows no index names stay +0.
 * Each weight row's sum runs over its own indices in their order, so splitting the rows over threads
 * (ATen splits them too, by 1000 rows) changes no bit: bit-identical at every capability and thread
 * count. The indices are grouped by row first (a stable counting sort), so the backward reads each
 * gradient row once instead of once per weight row range.
 */
#include "ckp_internal.h"
#include "vec.h"

#include <stdlib.h>
#include <string.h>

static ckp_status check_indices(const int64_t *idx, int64_t n, int64_t V) {
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= V)
            return ckp_fail(CKP_ERR_TARGET_OUT_OF_RANGE, "index %lld at position %lld is out of range [0, %lld)",
                            (long long)idx[i], (long long)i, (long long)V);
    return CKP_OK;
}

static ckp_status check_sizes(const void *a, const void *b, const void *c, int64_t n, int64_t V, int64_t D) {
    if (a == NULL || b == NULL || c == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "a tensor argument is NULL");
    if (n <= 0 || V <= 0 || D <= 0 || n > INT64_MAX / 8 / D || V > INT64_MAX / 8 / D)
        return ckp_fail(CKP_ERR_BAD_SIZE, "n, V and D must be positive, got n=%lld V=%lld D=%lld", (long long)n,
                        (long long)V, (long long)D);
    return CKP_OK;
}

static ckp_status forward(const int64_t *idx, int64_t n, const void *weight, int64_t V, int64_t D, void *out,
                          size_t elem) {
    ckp_status s = check_sizes(idx, weight, out, n, V, D);
    if (s != CKP_OK) return s;
    if (ckp_overlaps(out, (size_t)(n * D) * elem, weight, (size_t)(V * D) * elem) ||
        ckp_overlaps(out, (size_t)(n * D) * elem, idx, (size_t)n * sizeof(int64_t)))
        return ckp_fail(CKP_ERR_ALIASING, "out overlaps the weight or the indices");
    if ((s = check_indices(idx, n, V)) != CKP_OK) return s;
    ckp_clear_error();
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (n * D >= 65536)
    for (int64_t i = 0; i < n; i++)
        memcpy((char *)out + (size_t)(i * D) * elem, (const char *)weight + (size_t)(idx[i] * D) * elem,
               (size_t)D * elem);
    return CKP_OK;
}

CKP_CLONES static void add_row_f32(float *acc, const float *g, int64_t D) {
    for (int64_t j = 0; j < D; j++) acc[j] += g[j];
}

CKP_CLONES static void add_row_bf16(uint16_t *acc, const uint16_t *g, int64_t D) {
    int64_t j = 0;
    for (; j + 16 <= D; j += 16) /* the loop below, 16 at a time (one at a time it was 0.7x torch's backward) */
        ckp_bf16_store16(acc + j, ckp_bf16_load16(acc + j) + ckp_bf16_load16(g + j));
    for (; j < D; j++) acc[j] = ckp_f_to_bf16(ckp_bf16_to_f(acc[j]) + ckp_bf16_to_f(g[j]));
}

static ckp_status backward(const void *dout, const int64_t *idx, int64_t n, int64_t V, int64_t D,
                           int64_t padding_idx, void *dweight, size_t elem) {
    ckp_status s = check_sizes(dout, idx, dweight, n, V, D);
    if (s != CKP_OK) return s;
    if (padding_idx < -1 || padding_idx >= V)
        return ckp_fail(CKP_ERR_BAD_OPTION, "padding_idx must be -1 (none) or in [0, %lld), got %lld", (long long)V,
                        (long long)padding_idx);
    const size_t w_bytes = (size_t)(V * D) * elem;
    if (ckp_overlaps(dweight, w_bytes, dout, (size_t)(n * D) * elem) ||
        ckp_overlaps(dweight, w_bytes, idx, (size_t)n * sizeof(int64_t)))
        return ckp_fail(CKP_ERR_ALIASING, "dweight overlaps dout or the indices");
    if ((s = check_indices(idx, n, V)) != CKP_OK) return s;
    /* the positions of each row's indices, in index order: start[v] .. start[v + 1] of order */
    int64_t *start = calloc((size_t)V + 1, sizeof(int64_t)), *order = malloc((size_t)n * sizeof(int64_t));
    if (start == NULL || order == NULL) {
        free(start);
        free(order);
        return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "embedding backward: no memory for the index groups");
    }
    ckp_clear_error();
    for (int64_t i = 0; i < n; i++) start[idx[i] + 1]++;
    for (int64_t v = 0; v < V; v++) start[v + 1] += start[v];
    for (int64_t i = 0, *next = start; i < n; i++) order[next[idx[i]]++] = i; /* next[v]: start[v + 1] after */
    for (int64_t v = V; v > 0; v--) start[v] = start[v - 1];                 /* back to each row's start */
    start[0] = 0;
    memset(dweight, 0, w_bytes);
#pragma omp parallel for schedule(dynamic, 64) num_threads(ckp_threads()) if (n * D >= 65536)
    for (int64_t v = 0; v < V; v++) {
        if (v == padding_idx) continue;
        for (int64_t p = start[v]; p < start[v + 1]; p++) {
            int64_t i = order[p];
            if (elem == sizeof(float))
                add_row_f32((float *)dweight + v * D, (const float *)dout + i * D, D);
            else
                add_row_bf16((uint16_t *)dweight + v * D, (const uint16_t *)dout + i * D, D);
        }
    }
    free(start);
    free(order);
    return CKP_OK;
}

ckp_status ckp_embedding_forward(const int64_t *idx, int64_t n, const float *weight, int64_t V, int64_t D,
                                 float *out) {
    return forward(idx, n, weight, V, D, out, sizeof(float));
}

ckp_status ckp_embedding_forward_bf16(const int64_t *idx, int64_t n, const uint16_t *weight, int64_t V, int64_t D,
                                      uint16_t *out) {
    return forward(idx, n, weight, V, D, out, sizeof(uint16_t));
}

ckp_status ckp_embedding_backward(const float *dout, const int64_t *idx, int64_t n, int64_t V, int64_t D,
                                  int64_t padding_idx, float *dweight) {
    return backward(dout, idx, n, V, D, padding_idx, dweight, sizeof(float));
}

ckp_status ckp_embedding_backward_bf16(const uint16_t *dout, const int64_t *idx, int64_t n, int64_t V, int64_t D,
                                       int64_t padding_idx, uint16_t *dweight) {
    return backward(dout, idx, n, V, D, padding_idx, dweight, sizeof(uint16_t));
}
