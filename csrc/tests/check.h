/* check.h — the few assertions the C tests share: count failures, keep going. */
#ifndef CKP_TEST_CHECK_H
#define CKP_TEST_CHECK_H

#include <stdio.h>

static int check_failures = 0;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            check_failures++;                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
        }                                                                 \
    } while (0)

static int check_report(const char *name) {
    if (check_failures) fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
    else printf("%s: all checks passed\n", name);
    return check_failures ? 1 : 0;
}

/* Deterministic pseudo-random floats in [-scale, scale) (xorshift64). */
static unsigned long long check_rng_state = 0x9E3779B97F4A7C15ull;
static float check_uniform(float scale) {
    check_rng_state ^= check_rng_state << 13;
    check_rng_state ^= check_rng_state >> 7;
    check_rng_state ^= check_rng_state << 17;
    return scale * (2.0f * (float)((check_rng_state >> 40) / 16777216.0) - 1.0f);
}

#endif
