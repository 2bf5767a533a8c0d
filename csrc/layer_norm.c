/*
 * layer_norm.c — LayerNorm, F.layer_norm over the last N elements of each of M rows, float32, as ATen's
 * LayerNormKernelImpl and LayerNormBackwardKernelImpl compute it (layer_norm_kernel.cpp, moments_utils.h):
 *
 * Forward, per row: mean and variance by RowwiseMoments -- Welford over 8 lanes (x[8k + l] in lane l), the
 * row's whole vectors in chunks of 16 (lane update m1 += (1/(j+1)) (x - m1), m2 += (x - m1_old)(x - m1_new),
 * both FMAs), each chunk's moments merged into a cascade of depth ceil(log2(chunks)) (AddMomentsVec: a carry
 * at every even chunk count, as a binary counter), the cascade folded into level 0, then the row's last
 * N % 8 elements by plain Welford, then the 8 lanes merged into that one by one (AddMoments, scalar: its
 * m1 += c * delta and m2_add + delta^2 c m0 contracted); var = m2 / N; rstd = 1 / sqrt(var + eps);
 *   y = (x - mean) * rstd * w + b   (one FMA: ((x - mean) * rstd) * w + b).
 * Backward, per row i (a = rstd, scale = 1/N):
 *   ds = sum dy * x * w, db = sum dy * w (map_reduce_all: 8 lanes from the first vector, the middle vectors
 *   added unfused, the last partial vector with an FMA, then the lanes by AVX2's shuffle tree
 *   ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)); a row under 8 long, lane 0 plus each other in turn)
 *   b_i = fma(db, mean, -ds) a^3 scale,  c_i = fma(-b_i, mean, -(db a scale))
 *   dx = fma(b_i, x, a dy w) + c_i
 *   dw_j, db_j: one buffer per torch thread (the rows of at::parallel_for's chunk of that thread, in order:
 *   buf += dy * fma(a, x, -a * mean), and += dy), then summed from 0 over the torch threads in order.
 * Measured against torch 2.13: at AVX2 and AVX512 (its layer norm runs 8 float lanes at both) with the FMAs
 * above; at DEFAULT the same with no FMA and the lanes added in order (the generic vec_reduce_all). Every
 * element of every row is torch's bits at its thread count (torch_threads: the dw/db buffers' split);
 * this library's own threads split rows and columns and change nothing.
 */
#include "ckp_internal.h"
#include "vec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8  /* Vectorized<float>::size() where torch's layer norm is built (AVX2's width at AVX512 too) */
#define CHUNK 16 /* moments_utils.h's kChunkSize */

static int with_fma(void) { return ckp_get_capability() != CKP_CAPABILITY_DEFAULT; }

static inline __attribute__((always_inline)) float fm(float a, float b, float c, int fma) { return fma ? fmaf(a, b, c) : a * b + c; }

static int64_t ceil_log2(int64_t x) { return x <= 2 ? 1 : 64 - __builtin_clzll((uint64_t)x - 1); }

/* AddMomentsVec: the moments (m0_add, m1a, m2a) merged into (m0, m1, m2), lane by lane. */
static inline __attribute__((always_inline)) void add_moments_vec(int64_t m0_add, const float *m1a, const float *m2a, int64_t *m0, float *m1, float *m2,
                            int fma) {
    const int64_t n = *m0 + m0_add;
    const float c = n == 0 ? 0.0f : (float)m0_add / (float)n, m0f = (float)*m0;
    for (int l = 0; l < LANES; l++) {
        const float delta = m1a[l] - m1[l], m2_tmp = m2[l] + m2a[l], c_delta = c * delta;
        m1[l] = m1[l] + c_delta;
        m2[l] = fm(delta * m0f, c_delta, m2_tmp, fma);
    }
    *m0 = n;
}

/* 1 / (j + 1) in float for the chunk's steps j (moments_utils.h's table of them, the same divisions). */
static const float RECIPROCALS[CHUNK] = {1.0f / 1,  1.0f / 2,  1.0f / 3,  1.0f / 4,  1.0f / 5,  1.0f / 6,
                                         1.0f / 7,  1.0f / 8,  1.0f / 9,  1.0f / 10, 1.0f / 11, 1.0f / 12,
                                         1.0f / 13, 1.0f / 14, 1.0f / 15, 1.0f / 16};

/* RowwiseMoments(X, N): the mean and the biased variance, of float32 x, or (bf16) of bfloat16 x, whose
 * 16-element vectors are widened to two 8-lane float halves that keep their own Welford chains within a
 * chunk and are merged in turn (moments_utils.h's reduced-type UpdateMomentsVec); the lanes then hold
 * 2n elements each. */
static inline __attribute__((always_inline)) void row_moments(const void *const *xvs, int rows, int64_t N, int bf16,
                                                              int fma, float *mean, float *var) {
    /* `rows` (1, 2 or 4, a constant at each call) rows at once: each row's chains are its own and run in its own
     * order; rows interleaved give the core independent chains where one waits on each step's FMA */
#define X(r, i) (bf16 ? ckp_bf16_to_f(((const uint16_t *)xvs[r])[i]) : ((const float *)xvs[r])[i])
    const int halves = bf16 ? 2 : 1, vec = halves * LANES; /* Vectorized<T>::size() */
    const int64_t n = N / vec, chunks = (n + CHUNK - 1) / CHUNK, depth = ceil_log2(chunks);
    int64_t m0s[4][64] = {{0}};
    float m1s[4][64][LANES], m2s[4][64][LANES];
    memset(m1s, 0, sizeof m1s);
    memset(m2s, 0, sizeof m2s);
    for (int64_t i = 0; i < chunks; i++) {
        const int64_t base = i * CHUNK * vec, m0 = n - i * CHUNK < CHUNK ? n - i * CHUNK : CHUNK;
        /* each (row, half) one 8-lane chain in registers: through memory, every step had waited on a store */
        ckp_v8f m1c[4][2] = {{{0}}}, m2c[4][2] = {{{0}}};
        for (int64_t j = 0; j < m0; j++) {
            const ckp_v8f c = ckp_splat8(RECIPROCALS[j]);
#pragma GCC unroll 4
            for (int r = 0; r < rows; r++)
#pragma GCC unroll 2
                for (int h = 0; h < halves; h++) {
                    const int64_t at = base + j * vec + h * LANES;
                    const ckp_v8f v = bf16 ? ckp_bf16_load8((const uint16_t *)xvs[r] + at)
                                           : ckp_load8((const float *)xvs[r] + at);
                    const ckp_v8f delta = v - m1c[r][h];
                    m1c[r][h] = fma ? ckp_fma8(c, delta, m1c[r][h]) : c * delta + m1c[r][h];
                    m2c[r][h] = fma ? ckp_fma8(delta, v - m1c[r][h], m2c[r][h]) : delta * (v - m1c[r][h]) + m2c[r][h];
                }
        }
        for (int r = 0; r < rows; r++) {
            for (int h = 0; h < halves; h++) {
                float m1v[LANES], m2v[LANES];
                memcpy(m1v, &m1c[r][h], sizeof m1v);
                memcpy(m2v, &m2c[r][h], sizeof m2v);
                add_moments_vec(m0, m1v, m2v, &m0s[r][0], m1s[r][0], m2s[r][0], fma);
            }
            for (int64_t j = 1, mask = i + 1; j < depth && (mask & 1) == 0; ++j, mask >>= 1) {
                add_moments_vec(m0s[r][j - 1], m1s[r][j - 1], m2s[r][j - 1], &m0s[r][j], m1s[r][j], m2s[r][j], fma);
                m0s[r][j - 1] = 0;
                memset(m1s[r][j - 1], 0, sizeof m1s[0][0]);
                memset(m2s[r][j - 1], 0, sizeof m2s[0][0]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        for (int64_t j = 1; j < depth; j++)
            add_moments_vec(m0s[r][j], m1s[r][j], m2s[r][j], &m0s[r][0], m1s[r][0], m2s[r][0], fma);
        int64_t m0 = 0;
        float m1 = 0.0f, m2 = 0.0f;
        for (int64_t i = n * vec; i < N; i++) { /* the tail: not contracted in torch's build (measured) */
            const float v = X(r, i), delta = v - m1;
            ++m0;
            m1 += delta / (float)m0;
            m2 = m2 + delta * (v - m1);
        }
        const int64_t m0_add = n * halves;
        for (int l = 0; l < LANES; l++) { /* AddMoments of each lane */
            const int64_t total = m0 + m0_add;
            const float c = total == 0 ? 0.0f : (float)m0_add / (float)total, delta = m1s[r][0][l] - m1;
            m1 = fm(c, delta, m1, fma);
            m2 = m2 + fm(delta * delta * c, (float)m0, m2s[r][0][l], fma);
            m0 = total;
        }
        mean[r] = m1;
        var[r] = m2 / (float)N;
    }
#undef X
}

/* vec_reduce_all of 8 float lanes: AVX2's shuffle tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), or
 * (DEFAULT, no FMA) the lanes in order. */
static inline __attribute__((always_inline)) float sum_lanes(const float acc[LANES], int fma) {
    if (!fma) {
        float sum = acc[0];
        for (int l = 1; l < LANES; l++) sum = sum + acc[l];
        return sum;
    }
    float v[LANES], w[LANES];
    for (int l = 0; l < LANES; l++) v[l] = acc[l] + acc[l ^ 4];
    for (int l = 0; l < LANES; l++) w[l] = v[l] + v[l ^ 2];
    return w[0] + w[1];
}

/* ATen's map_reduce_all of the product of p, q and r (q or r NULL: fewer factors) over N, 8 lanes, as
 * vec/functional_base.h reduces it in torch's build: a row under 8 long is one partial vector whose lanes are
 * added to lane 0 in turn; otherwise the lanes start at the first vector's products, the middle vectors are
 * added (not contracted), the last partial vector is added with an FMA of its last factor (contracted), and
 * the lanes are summed by AVX2's shuffle tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) -- or, at
 * DEFAULT (no FMA), in order. */
static inline __attribute__((always_inline)) float reduce_all(const float *p, const float *q, const float *r, int64_t N, int fma) {
#define HEAD(j) (r ? p[j] * q[j] : p[j])  /* the product but its last factor */
#define LAST(j) (r ? r[j] : q[j])
#define TERM(j) (q ? HEAD(j) * LAST(j) : p[j])
    if (N < LANES) {
        float sum = TERM(0);
        for (int64_t l = 1; l < N; l++) sum = sum + TERM(l);
        return sum;
    }
    /* the whole vectors on 8-lane vectors, which factors there are decided outside the loops (a test of them in
     * the loop had kept it scalar: the dx rows ran at half torch's speed) */
#define VTERM(j) (q == NULL ? ckp_load8(p + (j)) : r == NULL ? ckp_load8(p + (j)) * ckp_load8(q + (j)) \
                                                    : (ckp_load8(p + (j)) * ckp_load8(q + (j))) * ckp_load8(r + (j)))
    ckp_v8f sum = VTERM(0);
    int64_t d = LANES;
    const int64_t whole = N - N % LANES;
    if (q == NULL)
        for (; d < whole; d += LANES) sum = sum + ckp_load8(p + d);
    else if (r == NULL)
        for (; d < whole; d += LANES) sum = sum + ckp_load8(p + d) * ckp_load8(q + d);
    else
        for (; d < whole; d += LANES) sum = sum + (ckp_load8(p + d) * ckp_load8(q + d)) * ckp_load8(r + d);
#undef VTERM
    float acc[LANES];
    memcpy(acc, &sum, sizeof acc);
    for (int l = 0; d + l < N; l++) acc[l] = q ? fm(HEAD(d + l), LAST(d + l), acc[l], fma) : acc[l] + p[d + l];
#undef HEAD
#undef LAST
#undef TERM
    return sum_lanes(acc, fma);
}

/* One row of the forward: its moments, then y. Without a weight torch's loop multiplies by a constant 1,
 * which its compiler drops: one FMA of (x - mean) by rstd (measured). (The clones give the compiler FMA and
 * wider vectors; fm's FMA is the same single rounding in every clone.) */
CKP_CLONES
static void forward_rows(const float *x, int rows, const float *weight, const float *bias, int64_t N, float eps,
                         int fma, float *y, float *mean, float *rstd) {
    /* rows x + k N: four at once for row_moments (rows and fma constants in each call), else one by one */
    const void *xs[4] = {x, x + N, x + 2 * N, x + 3 * N};
    float mu[4], var[4];
    if (rows == 4 && fma) row_moments(xs, 4, N, 0, 1, mu, var);
    else if (rows == 4) row_moments(xs, 4, N, 0, 0, mu, var);
    for (int k = 0; k < rows && rows < 4; k++) {
        if (fma) row_moments(xs + k, 1, N, 0, 1, mu + k, var + k);
        else row_moments(xs + k, 1, N, 0, 0, mu + k, var + k);
    }
    for (int k = 0; k < rows; k++) {
        const float m = mu[k], r = 1.0f / sqrtf(var[k] + eps);
        const float *xk = x + k * N;
        float *yk = y + k * N;
        mean[k] = m;
        rstd[k] = r;
        for (int64_t j = 0; j < N; j++)
            yk[j] = weight ? fm((xk[j] + -m) * r, weight[j], bias ? bias[j] : 0.0f, fma)
                           : fm(xk[j] + -m, r, bias ? bias[j] : 0.0f, fma);
    }
}

/* dweight and dbias of columns [lo, hi): each torch thread's buffer over the rows of its chunk (rows i of
 * thread i / chunk), then the buffers added from 0 in thread order. */
CKP_CLONES
static void param_grads_block(const float *dy, const float *x, const float *mean, const float *rstd, int64_t M,
                              int64_t N, int64_t lo, int64_t hi, int64_t chunk, int torch_threads, int fma,
                              float *buf, float *dweight, float *dbias) {
    for (int64_t i = 0; i < M; i++) {
        const int64_t tid = i / chunk;
        float *wb = buf + tid * N, *bb = buf + (torch_threads + tid) * N;
        const float *dyr = dy + i * N, *xr = x + i * N, a = rstd[i], b = -a * mean[i];
        for (int64_t j = lo; j < hi; j++) {
            wb[j] = fm(dyr[j], fm(a, xr[j], b, fma), wb[j], fma);
            bb[j] = bb[j] + dyr[j];
        }
    }
    for (int64_t j = lo; j < hi; j++) {
        float w = 0.0f, b = 0.0f;
        for (int t = 0; t < torch_threads; t++) {
            w = w + buf[t * N + j];
            b = b + buf[(torch_threads + t) * N + j];
        }
        if (dweight) dweight[j] = w;
        if (dbias) dbias[j] = b;
    }
}

/* One row of dx. ds = sum dy * x * w, db = sum dy * w (without a weight: dy * x, and dy). */
CKP_CLONES
static void dx_row(const float *dy, const float *x, const float *weight, int64_t N, float mu, float a, int fma,
                   float *dx) {
    const float scale = 1.0f / (float)N;
    const float ds = reduce_all(dy, x, weight, N, fma), db = reduce_all(dy, weight, NULL, N, fma);
    const float b = (fma ? fmaf(db, mu, -ds) : db * mu - ds) * a * a * a * scale;
    const float c = fma ? fmaf(-b, mu, -(db * a * scale)) : -b * mu - db * a * scale;
    if (fma && weight != NULL) /* the loop below with its tests decided outside it */
        for (int64_t j = 0; j < N; j++) dx[j] = fmaf(b, x[j], a * dy[j] * weight[j]) + c;
    else if (fma)
        for (int64_t j = 0; j < N; j++) dx[j] = fmaf(b, x[j], a * dy[j] * 1.0f) + c;
    else
        for (int64_t j = 0; j < N; j++) dx[j] = fm(b, x[j], a * dy[j] * (weight ? weight[j] : 1.0f), fma) + c;
}

/* The rows of each torch thread's chunk of at::parallel_for(0, M, 1): dweight's and dbias's buffers follow it. */
static int64_t torch_chunk(int64_t M, int torch_threads) {
    const int64_t used = M < 2 ? 1 : (torch_threads < M ? torch_threads : M);
    return M == 0 ? 1 : (M + used - 1) / used;
}

static ckp_status check_sizes(int64_t M, int64_t N) {
    if (M < 0 || N <= 0) return ckp_fail(CKP_ERR_BAD_SIZE, "M must be >= 0 and N > 0, got M=%lld N=%lld",
                                         (long long)M, (long long)N);
    if (M > INT64_MAX / N / (int64_t)sizeof(float))
        return ckp_fail(CKP_ERR_BAD_SIZE, "M*N overflows: M=%lld N=%lld", (long long)M, (long long)N);
    return CKP_OK;
}

/* CKP_ERR_ALIASING where an output (non-NULL) overlaps an input or another output. */
static ckp_status refuse_overlaps(const void *const *inputs, const size_t *in_bytes, int n_in, float *const *outputs,
                                  const size_t *out_bytes, int n_out) {
    for (int o = 0; o < n_out; o++) {
        if (outputs[o] == NULL) continue;
        for (int k = 0; k < n_in; k++)
            if (inputs[k] && ckp_overlaps(outputs[o], out_bytes[o], inputs[k], in_bytes[k]))
                return ckp_fail(CKP_ERR_ALIASING, "an output overlaps an input");
        for (int p = o + 1; p < n_out; p++)
            if (outputs[p] && ckp_overlaps(outputs[o], out_bytes[o], outputs[p], out_bytes[p]))
                return ckp_fail(CKP_ERR_ALIASING, "two outputs overlap");
    }
    return CKP_OK;
}

ckp_status ckp_layer_norm_forward(const float *x, const float *weight, const float *bias, int64_t M, int64_t N,
                                  double eps, float *y, float *mean, float *rstd) {
    if (x == NULL || y == NULL || mean == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, y, mean and rstd must not be NULL");
    ckp_status s = check_sizes(M, N);
    if (s != CKP_OK) return s;
    const size_t bytes = (size_t)(M * N) * sizeof(float), pbytes = (size_t)N * sizeof(float);
    const void *inputs[] = {x, weight, bias};
    const size_t in_bytes[] = {bytes, pbytes, pbytes};
    float *outputs[] = {y, mean, rstd};
    const size_t out_bytes[] = {bytes, (size_t)M * sizeof(float), (size_t)M * sizeof(float)};
    s = refuse_overlaps(inputs, in_bytes, 3, outputs, out_bytes, 3);
    if (s != CKP_OK) return s;
    ckp_clear_error();
    const int fma = with_fma();
    const float eps_f = (float)eps; /* LayerNormKernelImpl: static_cast<scalar_t>(eps); any value, as torch takes it */
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
    for (int64_t i = 0; i < M; i += 4) /* rows in fours (forward_rows) */
        forward_rows(x + i * N, M - i < 4 ? (int)(M - i) : 4, weight, bias, N, eps_f, fma, y + i * N, mean + i, rstd + i);
    return CKP_OK;
}

ckp_status ckp_layer_norm_backward(const float *dy, const float *x, const float *mean, const float *rstd,
                                   const float *weight, int64_t M, int64_t N, int torch_threads, float *dx,
                                   float *dweight, float *dbias) {
    if (dy == NULL || x == NULL || mean == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dy, x, mean and rstd must not be NULL");
    ckp_status s = check_sizes(M, N);
    if (s != CKP_OK) return s;
    if (torch_threads < 1) return ckp_fail(CKP_ERR_BAD_SIZE, "torch_threads must be >= 1, got %d", torch_threads);
    const size_t bytes = (size_t)(M * N) * sizeof(float), pbytes = (size_t)N * sizeof(float);
    const void *inputs[] = {dy, x, mean, rstd, weight};
    const size_t in_bytes[] = {bytes, bytes, (size_t)M * sizeof(float), (size_t)M * sizeof(float), pbytes};
    float *outputs[] = {dx, dweight, dbias};
    const size_t out_bytes[] = {bytes, pbytes, pbytes};
    s = refuse_overlaps(inputs, in_bytes, 5, outputs, out_bytes, 3);
    if (s != CKP_OK) return s;
    const int fma = with_fma();
    const int64_t chunk = torch_chunk(M, torch_threads);
    if (dweight || dbias) {
        float *buf = calloc((size_t)torch_threads * 2, pbytes); /* [dw buffers | db buffers], torch's order */
        if (buf == NULL) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "cannot allocate %d x 2 x %lld floats",
                                         torch_threads, (long long)N);
        enum { COLUMNS = 256 };
        const int64_t blocks = (N + COLUMNS - 1) / COLUMNS;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
        for (int64_t k = 0; k < blocks; k++) { /* each column's sums are its own: split by column blocks */
            const int64_t lo = k * COLUMNS, hi = N - lo < COLUMNS ? N : lo + COLUMNS;
            param_grads_block(dy, x, mean, rstd, M, N, lo, hi, chunk, torch_threads, fma, buf, dweight, dbias);
        }
        free(buf);
    }
    ckp_clear_error();
    if (dx == NULL) return CKP_OK;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
    for (int64_t i = 0; i < M; i++) dx_row(dy + i * N, x + i * N, weight, N, mean[i], rstd[i], fma, dx + i * N);
    return CKP_OK;
}

/* ---- bfloat16 ([Note: ATen's bf16 LayerNorm]) ------------------------------------------------------
 * x, weight, bias, y bf16; mean and rstd bf16 (torch's layer_norm_kernel_mixed_type<T, T>: the params'
 * dtype). The moments in float over 16-element bf16 vectors, each widened to two 8-lane float vectors that
 * keep their own Welford chains within a chunk and are merged in turn (moments_utils.h's reduced-type
 * UpdateMomentsVec), the lanes merged with 2n elements each; y = ((x * rstd + (-rstd * mean)) * w + b)
 * in float (two FMAs where the build has them), rounded once. Backward: dweight and dbias buffers of bf16
 * per torch thread (each row's update rounded), summed in float over the threads; ds and db by
 * functional_bfloat16.h's reductions (two 8-lane accumulators, the halves of each 16-element vector,
 * added at the end); dx as float's, rounded once.
 * Mixed (`mixed`: a bf16 x with float32 weight and bias, torch's layer_norm_kernel_mixed_type<T, float>): the
 * same code with the params read as floats, mean and rstd kept as floats (not rounded), dweight and dbias the
 * float sums of the same bf16 buffers (not rounded); and, with a weight, ds and db by the mixed frame's own
 * loop (layer_norm_backward_frame<T, float>): db's terms dy * w rounded, ds's x * (dy * w) -- contracted into
 * the accumulator where the build has FMA --, two 8-lane accumulators over each 16-element vector's halves, a
 * last partial vector into the lanes it fills; a row under 16 one vector: under 9 its lanes added in order,
 * else the upper half's products added into the lower's first N - 8 lanes and all 8 lanes reduced by the tree. */
enum { BVEC = 16 }; /* Vectorized<BFloat16>::size() where torch's layer norm is built */

static inline __attribute__((always_inline)) float bf(const uint16_t *p, int64_t i) { return ckp_bf16_to_f(p[i]); }

/* A parameter or statistic of the bf16 path: a float (mixed) or a bf16 value, as a float. */
static inline __attribute__((always_inline)) float pv(const void *p, int64_t i, int mixed) {
    return mixed ? ((const float *)p)[i] : bf((const uint16_t *)p, i);
}

static inline __attribute__((always_inline)) void put(void *p, int64_t i, float v, int mixed) {
    if (mixed) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = ckp_f_to_bf16(v);
}

CKP_CLONES
static void forward_rows_bf16(const uint16_t *x, int rows, const void *weight, const void *bias, int64_t N, float eps,
                              int fma, int mixed, uint16_t *y, void *mean, void *rstd, int64_t i) {
    const void *xs[2] = {x, x + N}; /* rows (1 or 2) as forward_rows' */
    float mu[2], var[2];
    if (rows == 2 && fma) row_moments(xs, 2, N, 1, 1, mu, var);
    else if (rows == 2) row_moments(xs, 2, N, 1, 0, mu, var);
    else if (fma) row_moments(xs, 1, N, 1, 1, mu, var);
    else row_moments(xs, 1, N, 1, 0, mu, var);
    for (int k = 0; k < rows; k++) {
        const float r = 1.0f / sqrtf(var[k] + eps), shift = -r * mu[k];
        const uint16_t *xk = x + k * N;
        uint16_t *yk = y + k * N;
        int64_t j = 0;
        for (; fma && j + 16 <= N; j += 16) { /* the loop below, 16 at a time (one at a time: 0.2x torch's) */
            const ckp_v16f t = ckp_fma16(ckp_bf16_load16(xk + j), ckp_splat16(r), ckp_splat16(shift));
            const ckp_v16f w = weight == NULL ? ckp_splat16(1.0f) : ckp_elem_load16(weight, j, mixed ? 4 : 2);
            const ckp_v16f b = bias == NULL ? ckp_splat16(0.0f) : ckp_elem_load16(bias, j, mixed ? 4 : 2);
            ckp_bf16_store16(yk + j, ckp_fma16(t, w, b));
        }
        for (; j < N; j++) {
            const float t = fm(bf(xk, j), r, shift, fma);
            yk[j] = ckp_f_to_bf16(fm(t, weight ? pv(weight, j, mixed) : 1.0f, bias ? pv(bias, j, mixed) : 0.0f, fma));
        }
        put(mean, i + k, mu[k], mixed);
        put(rstd, i + k, r, mixed);
    }
}

static ckp_status forward_bf16(const uint16_t *x, const void *weight, const void *bias, int64_t M, int64_t N,
                               double eps, int mixed, uint16_t *y, void *mean, void *rstd) {
    if (x == NULL || y == NULL || mean == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "x, y, mean and rstd must not be NULL");
    ckp_status s = check_sizes(M, N);
    if (s != CKP_OK) return s;
    const size_t p = mixed ? sizeof(float) : 2, bytes = (size_t)(M * N) * 2, pbytes = (size_t)N * p;
    const void *inputs[] = {x, weight, bias};
    const size_t in_bytes[] = {bytes, pbytes, pbytes};
    float *outputs[] = {(float *)y, (float *)mean, (float *)rstd};
    const size_t out_bytes[] = {bytes, (size_t)M * p, (size_t)M * p};
    s = refuse_overlaps(inputs, in_bytes, 3, outputs, out_bytes, 3);
    if (s != CKP_OK) return s;
    ckp_clear_error();
    const int fma = with_fma();
    const float eps_f = (float)eps;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
    for (int64_t i = 0; i < M; i += 2) /* rows in pairs (forward_rows) */
        forward_rows_bf16(x + i * N, M - i < 2 ? 1 : 2, weight, bias, N, eps_f, fma, mixed, y + i * N, mean, rstd, i);
    return CKP_OK;
}

ckp_status ckp_layer_norm_forward_bf16(const uint16_t *x, const uint16_t *weight, const uint16_t *bias, int64_t M,
                                       int64_t N, double eps, uint16_t *y, uint16_t *mean, uint16_t *rstd) {
    return forward_bf16(x, weight, bias, M, N, eps, 0, y, mean, rstd);
}

ckp_status ckp_layer_norm_forward_bf16_mixed(const uint16_t *x, const float *weight, const float *bias, int64_t M,
                                             int64_t N, double eps, uint16_t *y, float *mean, float *rstd) {
    return forward_bf16(x, weight, bias, M, N, eps, 1, y, mean, rstd);
}

/* functional_bfloat16.h's reductions of the product of p, q and r (q or r NULL: fewer factors) over N:
 * two 8-lane float accumulators over the halves of each 16-element vector, the last partial vector into
 * the lanes it fills, then acc0 + acc1 and the AVX2 shuffle tree (in order at DEFAULT); under 16
 * elements one vector, its upper half added into the lower, the lanes in order. The products: mul_fused
 * says whether the accumulation contracts with the last factor. */
static inline __attribute__((always_inline)) float reduce_all_bf16(const uint16_t *p, const uint16_t *q,
                                                                   const uint16_t *r, int64_t N, int fma) {
#define TERM(j) (q ? (r ? (bf(p, j) * bf(q, j)) * bf(r, j) : bf(p, j) * bf(q, j)) : bf(p, j))
#define ACC(acc, j) (acc) = (acc) + TERM(j)
    if (N < BVEC) {
        float v[LANES];
        for (int l = 0; l < LANES; l++) v[l] = l < N ? TERM(l) : 0.0f;
        for (int l = 0; l + LANES < N; l++) v[l] = v[l] + TERM(l + LANES);
        const int64_t lanes = N > LANES ? LANES : N;
        float sum = v[0];
        for (int64_t l = 1; l < lanes; l++) sum = sum + v[l];
        return sum;
    }
    float a0[LANES], a1[LANES];
    for (int l = 0; l < LANES; l++) a0[l] = TERM(l), a1[l] = TERM(LANES + l);
    int64_t d = BVEC;
    for (; d < N - N % BVEC; d += BVEC)
        for (int l = 0; l < LANES; l++) ACC(a0[l], d + l), ACC(a1[l], d + LANES + l);
    for (int64_t l = 0; d + l < N; l++) {
        if (l < LANES) ACC(a0[l], d + l);
        else ACC(a1[l - LANES], d + l);
    }
#undef ACC
#undef TERM
    for (int l = 0; l < LANES; l++) a0[l] = a0[l] + a1[l];
    return sum_lanes(a0, fma);
}

/* The mixed frame's ds = sum x * (dy * w) and db = sum dy * w (the Note above), w float. */
static inline __attribute__((always_inline)) void reduce_mixed(const uint16_t *dy, const uint16_t *x, const float *w,
                                                               int64_t N, int fma, float *ds, float *db) {
#define DB(j) (bf(dy, j) * w[j])
    float s0[LANES], b0[LANES], s1[LANES], b1[LANES];
    if (N < BVEC) {
        for (int l = 0; l < LANES; l++) {
            b0[l] = l < N ? DB(l) : 0.0f;
            s0[l] = (l < N ? bf(x, l) : 0.0f) * b0[l];
        }
        if (N <= LANES) {
            float s = s0[0], b = b0[0];
            for (int64_t l = 1; l < N; l++) s = s + s0[l], b = b + b0[l];
            *ds = s, *db = b;
            return;
        }
        for (int64_t l = 0; l + LANES < N; l++) {
            const float t = DB(l + LANES);
            s0[l] = fm(bf(x, l + LANES), t, s0[l], fma);
            b0[l] = b0[l] + t;
        }
        *ds = sum_lanes(s0, fma), *db = sum_lanes(b0, fma);
        return;
    }
    for (int l = 0; l < LANES; l++) {
        b0[l] = DB(l), b1[l] = DB(LANES + l);
        s0[l] = bf(x, l) * b0[l], s1[l] = bf(x, LANES + l) * b1[l];
    }
    int64_t d = BVEC;
    for (; d < N - N % BVEC; d += BVEC)
        for (int l = 0; l < LANES; l++) {
            const float t0 = DB(d + l), t1 = DB(d + LANES + l);
            s0[l] = fm(bf(x, d + l), t0, s0[l], fma), b0[l] = b0[l] + t0;
            s1[l] = fm(bf(x, d + LANES + l), t1, s1[l], fma), b1[l] = b1[l] + t1;
        }
    for (int64_t l = 0; d + l < N; l++) {
        const float t = DB(d + l);
        float *s = l < LANES ? s0 : s1, *b = l < LANES ? b0 : b1;
        s[l % LANES] = fm(bf(x, d + l), t, s[l % LANES], fma), b[l % LANES] = b[l % LANES] + t;
    }
#undef DB
    for (int l = 0; l < LANES; l++) s0[l] = s0[l] + s1[l], b0[l] = b0[l] + b1[l];
    *ds = sum_lanes(s0, fma), *db = sum_lanes(b0, fma);
}

CKP_CLONES
static void param_grads_block_bf16(const uint16_t *dy, const uint16_t *x, const void *mean, const void *rstd,
                                   int64_t M, int64_t N, int64_t lo, int64_t hi, int64_t chunk, int torch_threads,
                                   int fma, int mixed, float *buf, void *dweight, void *dbias) {
    for (int64_t i = 0; i < M; i++) {
        const int64_t tid = i / chunk;
        float *wb = buf + tid * N, *bb = buf + (torch_threads + tid) * N;
        const uint16_t *dyr = dy + i * N, *xr = x + i * N;
        const float a = pv(rstd, i, mixed), b = -a * pv(mean, i, mixed);
        for (int64_t j = lo; j < hi; j++) {
            wb[j] = ckp_bf16_round(fm(bf(dyr, j), fm(a, bf(xr, j), b, fma), wb[j], fma));
            bb[j] = ckp_bf16_round(bb[j] + bf(dyr, j));
        }
    }
    for (int64_t j = lo; j < hi; j++) {
        float w = 0.0f, b = 0.0f;
        for (int t = 0; t < torch_threads; t++) {
            w = w + buf[t * N + j];
            b = b + buf[(torch_threads + t) * N + j];
        }
        if (dweight) put(dweight, j, w, mixed);
        if (dbias) put(dbias, j, b, mixed);
    }
}

CKP_CLONES
static void dx_row_bf16(const uint16_t *dy, const uint16_t *x, const void *weight, int64_t N, float mu, float a,
                        int fma, int mixed, uint16_t *dx) {
    const float scale = 1.0f / (float)N;
    float ds, db;
    if (mixed && weight) {
        reduce_mixed(dy, x, weight, N, fma, &ds, &db);
    } else {
        ds = reduce_all_bf16(dy, x, weight, N, fma), db = reduce_all_bf16(dy, weight, NULL, N, fma);
    }
    const float b = (fma ? fmaf(db, mu, -ds) : db * mu - ds) * a * a * a * scale;
    const float c = fma ? fmaf(-b, mu, -(db * a * scale)) : -b * mu - db * a * scale;
    for (int64_t j = 0; j < N; j++)
        dx[j] = ckp_f_to_bf16(fm(b, bf(x, j), a * bf(dy, j) * (weight ? pv(weight, j, mixed) : 1.0f), fma) + c);
}

static ckp_status backward_bf16(const uint16_t *dy, const uint16_t *x, const void *mean, const void *rstd,
                                const void *weight, int64_t M, int64_t N, int torch_threads, int mixed, uint16_t *dx,
                                void *dweight, void *dbias) {
    if (dy == NULL || x == NULL || mean == NULL || rstd == NULL)
        return ckp_fail(CKP_ERR_NULL_POINTER, "dy, x, mean and rstd must not be NULL");
    ckp_status s = check_sizes(M, N);
    if (s != CKP_OK) return s;
    if (torch_threads < 1) return ckp_fail(CKP_ERR_BAD_SIZE, "torch_threads must be >= 1, got %d", torch_threads);
    const size_t p = mixed ? sizeof(float) : 2, bytes = (size_t)(M * N) * 2, pbytes = (size_t)N * p;
    const void *inputs[] = {dy, x, mean, rstd, weight};
    const size_t in_bytes[] = {bytes, bytes, (size_t)M * p, (size_t)M * p, pbytes};
    float *outputs[] = {(float *)dx, (float *)dweight, (float *)dbias};
    const size_t out_bytes[] = {bytes, pbytes, pbytes};
    s = refuse_overlaps(inputs, in_bytes, 5, outputs, out_bytes, 3);
    if (s != CKP_OK) return s;
    const int fma = with_fma();
    const int64_t chunk = torch_chunk(M, torch_threads);
    if (dweight || dbias) {
        float *buf = calloc((size_t)torch_threads * 2, (size_t)N * sizeof(float)); /* bf16 values, as floats */
        if (buf == NULL) return ckp_fail(CKP_ERR_OUT_OF_MEMORY, "cannot allocate %d x 2 x %lld floats",
                                         torch_threads, (long long)N);
        enum { COLUMNS = 256 };
        const int64_t blocks = (N + COLUMNS - 1) / COLUMNS;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
        for (int64_t k = 0; k < blocks; k++) {
            const int64_t lo = k * COLUMNS, hi = N - lo < COLUMNS ? N : lo + COLUMNS;
            param_grads_block_bf16(dy, x, mean, rstd, M, N, lo, hi, chunk, torch_threads, fma, mixed, buf, dweight,
                                   dbias);
        }
        free(buf);
    }
    ckp_clear_error();
    if (dx == NULL) return CKP_OK;
#pragma omp parallel for schedule(static) num_threads(ckp_threads()) if (M * N >= 32768)
    for (int64_t i = 0; i < M; i++)
        dx_row_bf16(dy + i * N, x + i * N, weight, N, pv(mean, i, mixed), pv(rstd, i, mixed), fma, mixed, dx + i * N);
    return CKP_OK;
}

ckp_status ckp_layer_norm_backward_bf16(const uint16_t *dy, const uint16_t *x, const uint16_t *mean,
                                        const uint16_t *rstd, const uint16_t *weight, int64_t M, int64_t N,
                                        int torch_threads, uint16_t *dx, uint16_t *dweight, uint16_t *dbias) {
    return backward_bf16(dy, x, mean, rstd, weight, M, N, torch_threads, 0, dx, dweight, dbias);
}

ckp_status ckp_layer_norm_backward_bf16_mixed(const uint16_t *dy, const uint16_t *x, const float *mean,
                                              const float *rstd, const float *weight, int64_t M, int64_t N,
                                              int torch_threads, uint16_t *dx, float *dweight, float *dbias) {
    return backward_bf16(dy, x, mean, rstd, weight, M, N, torch_threads, 1, dx, dweight, dbias);
}
