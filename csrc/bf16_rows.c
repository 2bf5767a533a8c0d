/*
 * bf16_rows.c — an array of bfloat16 values widened into floats, and floats rounded into bfloat16
 * (rms_norm's weight and dweight sums; the hot loops widen and round as they load and store).
 */
#include "ckp_internal.h"
#include "vec.h"

CKP_CLONES void ckp_widen_bf16(const uint16_t *h, int64_t n, float *f) {
    for (int64_t i = 0; i < n; i++) f[i] = ckp_bf16_to_f(h[i]); /* the compiler's own vector loop */
}

CKP_CLONES void ckp_narrow_bf16(const float *f, int64_t n, uint16_t *h) {
    int64_t i = 0;
    if (ckp_lanes16())
        for (; i + 16 <= n; i += 16) {
            ckp_v16f v;
            memcpy(&v, f + i, sizeof v);
            ckp_bf16_store16(h + i, v);
        }
    for (; i + CKP_VLANES <= n; i += CKP_VLANES) ckp_bf16_store8(h + i, ckp_load8(f + i));
    for (; i < n; i++) h[i] = ckp_f_to_bf16(f[i]);
}
