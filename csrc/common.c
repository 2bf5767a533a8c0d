/*
 * common.c — status codes, the per-thread error detail, the thread count, the
 * torch CPU capability the kernels follow, and the fixed-block partition that
 * every deterministic reduction uses.
 */
#include "ckp_internal.h"

#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CKP_VERSION
#define CKP_VERSION "unknown"
#endif
#ifndef CKP_BUILD_INFO
#define CKP_BUILD_INFO "unknown"
#endif

static _Thread_local char last_error[512];

const char *ckp_status_str(ckp_status status) {
    switch (status) {
    case CKP_OK: return "CKP_OK";
    case CKP_ERR_NULL_POINTER: return "CKP_ERR_NULL_POINTER";
    case CKP_ERR_BAD_SIZE: return "CKP_ERR_BAD_SIZE";
    case CKP_ERR_TARGET_OUT_OF_RANGE: return "CKP_ERR_TARGET_OUT_OF_RANGE";
    case CKP_ERR_BAD_OPTION: return "CKP_ERR_BAD_OPTION";
    case CKP_ERR_ALIASING: return "CKP_ERR_ALIASING";
    case CKP_ERR_OUT_OF_MEMORY: return "CKP_ERR_OUT_OF_MEMORY";
    }
    return "CKP_ERR_UNKNOWN_STATUS";
}

const char *ckp_last_error(void) { return last_error; }

ckp_status ckp_fail(ckp_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}

void ckp_clear_error(void) { last_error[0] = '\0'; }

const char *ckp_version(void) { return CKP_VERSION; }
const char *ckp_build_info(void) { return CKP_BUILD_INFO; }

const char *ckp_isa(void) {
#if defined(CKP_NO_CLONES) || !defined(__x86_64__)
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
    return "x86-64-v4";
#elif defined(__AVX2__) && defined(__FMA__)
    return "x86-64-v3";
#else
    return "baseline";
#endif
#else
    /* the test target_clones' resolver makes (GCC 12: the levels are __builtin_cpu_supports names) */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
    return "baseline";
#endif
}

/* 0 means "not set yet": resolved from the environment on first use. */
static int num_threads = 0;

static int threads_from_env(const char *name) {
    const char *value = getenv(name);
    if (value == NULL || *value == '\0') return 0;
    char *end = NULL;
    long n = strtol(value, &end, 10);
    if (*end != '\0' || n < 1 || n > 4096) return 0;
    return (int)n;
}

int ckp_get_num_threads(void) {
    if (num_threads == 0) {
        int n = threads_from_env("CKP_NUM_THREADS");
        if (n == 0) n = threads_from_env("CK_NUM_THREADS");
        if (n == 0) n = omp_get_num_procs();
        num_threads = n;
    }
    return num_threads;
}

ckp_status ckp_set_num_threads(int n) {
    if (n < 1) return ckp_fail(CKP_ERR_BAD_OPTION, "num_threads must be >= 1, got %d", n);
    num_threads = n;
    ckp_clear_error();
    return CKP_OK;
}

int ckp_threads(void) { return ckp_get_num_threads(); }

/* What torch's DispatchStub picks on this CPU (compute_cpu_capability):
 * AVX512 needs AVX-512 F, BW, VL and DQ; AVX2 needs AVX2 and FMA. */
static int detected_capability(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma"))
        return CKP_CAPABILITY_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CKP_CAPABILITY_AVX2;
#endif
    return CKP_CAPABILITY_DEFAULT;
}

/* ATEN_CPU_CAPABILITY only lowers the capability, as in torch. */
static int capability_from_env(int detected) {
    const char *value = getenv("ATEN_CPU_CAPABILITY");
    if (value == NULL) return detected;
    int asked = strcasecmp(value, "default") == 0  ? CKP_CAPABILITY_DEFAULT
                : strcasecmp(value, "avx2") == 0   ? CKP_CAPABILITY_AVX2
                : strcasecmp(value, "avx512") == 0 ? CKP_CAPABILITY_AVX512
                                                   : detected;
    return asked < detected ? asked : detected;
}

/* -1 means "not set yet": resolved on first use. */
static int capability = -1;

int ckp_get_capability(void) {
    if (capability < 0) capability = capability_from_env(detected_capability());
    return capability;
}

ckp_status ckp_set_capability(int value) {
    if (value < CKP_CAPABILITY_DEFAULT || value > CKP_CAPABILITY_AVX512)
        return ckp_fail(CKP_ERR_BAD_OPTION, "capability must be 0 (DEFAULT), 1 (AVX2) or 2 (AVX512), got %d", value);
    capability = value;
    ckp_clear_error();
    return CKP_OK;
}

int64_t ckp_num_blocks(int64_t n) { return n < CKP_MAX_BLOCKS ? n : CKP_MAX_BLOCKS; }

void ckp_block_range(int64_t n, int64_t nblocks, int64_t b, int64_t *lo, int64_t *hi) {
    int64_t base = n / nblocks, extra = n % nblocks;
    *lo = b * base + (b < extra ? b : extra);
    *hi = *lo + base + (b < extra ? 1 : 0);
}

int ckp_overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a0 < b0 + nb && b0 < a0 + na;
}

ckp_status ckp_check_elementwise(const void *x, const void *dy, int has_dy, const void *out, int64_t n, size_t elem) {
    if (x == NULL || out == NULL || (has_dy && dy == NULL))
        return ckp_fail(CKP_ERR_NULL_POINTER, "a tensor argument is NULL");
    if (n <= 0) return ckp_fail(CKP_ERR_BAD_SIZE, "n must be positive, got %lld", (long long)n);
    if (n > INT64_MAX / (int64_t)sizeof(float)) return ckp_fail(CKP_ERR_BAD_SIZE, "n is too large: %lld", (long long)n);
    const size_t bytes = (size_t)n * elem;
    if (ckp_overlaps(out, bytes, x, bytes) || (has_dy && ckp_overlaps(out, bytes, dy, bytes)))
        return ckp_fail(CKP_ERR_ALIASING, has_dy ? "dx overlaps x or dy" : "y overlaps x");
    return CKP_OK;
}

int ckp_overlaps_any(ckp_span out, const ckp_span *others, int n) {
    if (out.p == NULL) return 0;
    for (int k = 0; k < n; k++)
        if (others[k].p != NULL && ckp_overlaps(out.p, out.bytes, others[k].p, others[k].bytes)) return 1;
    return 0;
}
