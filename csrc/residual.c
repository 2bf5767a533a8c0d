/*
 * residual.c — the residual stream's add, out = x + y (torch.add, alpha 1).
 *
 * float32: one IEEE add per element, whatever the order, vector width or
 * thread split: bit-identical to torch at every capability and thread count.
 * bfloat16: torch's add on bf16 tensors computes in float and rounds the sum
 * once, out = bf16(float(x) + float(y)) (its x + alpha * y with alpha 1 is the
 * same value: the product by 1 is exact, and an fma of it rounds once). A
 * NaN's bits are not a result (torch's vector loop stores 0xFFFF, its tail
 * 0x7FC0; this stores 0x7FC0): a NaN matches any NaN, as in every claim.
 * The backward has no arithmetic: autograd hands both inputs the upstream
 * gradient, and its accumulation where the stream fans out stays autograd's
 * (ops/residual.py).
 * out may be x or y (in place, as x += y): each element is read before it is
 * written; a partial overlap is refused (a later load would read a sum).
 */
#include "ckp_internal.h"
#include "vec.h"

static ckp_status check_args(const void *x, const void *y, int64_t n, const void *out, size_t elem) {
    if (x == NULL || y == NULL || out == NULL) return ckp_fail(CKP_ERR_NULL_POINTER, "x, y and out must not be NULL");
    if (n <= 0 || n > INT64_MAX / 8) return ckp_fail(CKP_ERR_BAD_SIZE, "n must be positive, got n=%lld", (long long)n);
    size_t bytes = (size_t)n * elem;
    if ((out != x && ckp_overlaps(out, bytes, x, bytes)) || (out != y && ckp_overlaps(out, bytes, y, bytes)))
        return ckp_fail(CKP_ERR_ALIASING, "out overlaps x or y other than exactly (in place)");
    ckp_clear_error();
    return CKP_OK;
}

/* Elements [lo, hi): the compiler vectorizes both loops (one add, or widen-add-round, per element). */
CKP_CLONES static void add_f32(const float *x, const float *y, int64_t lo, int64_t hi, float *out) {
    for (int64_t i = lo; i < hi; i++) out[i] = x[i] + y[i];
}

CKP_CLONES static void add_bf16(const uint16_t *x, const uint16_t *y, int64_t lo, int64_t hi, uint16_t *out) {
    for (int64_t i = lo; i < hi; i++) out[i] = ckp_f_to_bf16(ckp_bf16_to_f(x[i]) + ckp_bf16_to_f(y[i]));
}

enum { CHUNK = 16384 }; /* elements a thread adds at a time: whole cache lines, any split gives the same bits */

static ckp_status add(const void *x, const void *y, int64_t n, void *out, size_t elem) {
    ckp_status s = check_args(x, y, n, out, elem);
    if (s != CKP_OK) return s;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (n >= 4 * CHUNK)
    for (int64_t c = 0; c < (n + CHUNK - 1) / CHUNK; c++) {
        int64_t lo = c * CHUNK, hi = lo + CHUNK < n ? lo + CHUNK : n;
        if (elem == sizeof(float))
            add_f32(x, y, lo, hi, out);
        else
            add_bf16(x, y, lo, hi, out);
    }
    return CKP_OK;
}

ckp_status ckp_residual_add(const float *x, const float *y, int64_t n, float *out) {
    return add(x, y, n, out, sizeof(float));
}

ckp_status ckp_residual_add_bf16(const uint16_t *x, const uint16_t *y, int64_t n, uint16_t *out) {
    return add(x, y, n, out, sizeof(uint16_t));
}
