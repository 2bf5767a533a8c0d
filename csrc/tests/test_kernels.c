/* test_kernels.c — rms_norm, swiglu, adamw and grad_norm through the C API:
 * bad arguments return the right status and write nothing; values match
 * float64 formulas written here; thread counts don't change bits. */
#include "ckparity.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 13, D = 517, H = 301 };

static void test_rms_norm(void) {
    float *x = malloc(sizeof(float) * N * D), *y = malloc(sizeof(float) * N * D);
    float *y2 = malloc(sizeof(float) * N * D), w[D];
    float rstd[N];
    for (int k = 0; k < N * D; k++) x[k] = check_uniform(3.0f);
    for (int j = 0; j < D; j++) w[j] = check_uniform(1.0f);
    for (int k = 0; k < N * D; k++) y[k] = 42.0f;

    CHECK(ckp_rms_norm_forward(NULL, w, N, D, 1e-6, y, rstd, 1) == CKP_ERR_NULL_POINTER, "NULL x");
    CHECK(ckp_rms_norm_forward(x, w, 0, D, 1e-6, y, rstd, 1) == CKP_ERR_BAD_SIZE, "N=0");
    CHECK(ckp_rms_norm_forward(x, w, N, D, -1.0, y, rstd, 1) == CKP_ERR_BAD_OPTION, "eps<0");
    CHECK(ckp_rms_norm_forward(x, w, N, D, NAN, y, rstd, 1) == CKP_ERR_BAD_OPTION, "eps NaN");
    CHECK(ckp_rms_norm_forward(x, w, N, D, 1e-6, y, rstd, 0) == CKP_ERR_BAD_OPTION, "torch_threads 0");
    CHECK(y[0] == 42.0f, "y written on error");

    CHECK(ckp_rms_norm_forward(x, w, N, D, 1e-6, y, rstd, 1) == CKP_OK, "forward");
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int j = 0; j < D; j++) ss += (double)x[i * D + j] * x[i * D + j];
        double r = 1.0 / sqrt(ss / D + 1e-6);
        for (int j = 0; j < D; j++) worst = fmax(worst, fabs(y[i * D + j] - x[i * D + j] * r * w[j]));
    }
    CHECK(worst < 1e-5, "rms_norm forward error %g", worst);

    float *dy = malloc(sizeof(float) * N * D), *dx = malloc(sizeof(float) * N * D);
    float *dx2 = malloc(sizeof(float) * N * D), dw[D], dw2[D];
    for (int k = 0; k < N * D; k++) dy[k] = check_uniform(1.0f);
    CHECK(ckp_rms_norm_backward(dy, x, NULL, rstd, N, D, dx, dw, 1) == CKP_ERR_NULL_POINTER, "dweight, no weight");
    CHECK(ckp_rms_norm_backward(dy, x, w, rstd, N, D, x, dw, 1) == CKP_ERR_ALIASING, "dx over x");
    CHECK(ckp_rms_norm_backward(dy, x, w, rstd, N, D, dx, dw, -2) == CKP_ERR_BAD_OPTION, "torch_threads -2");
    for (int threads = 1; threads <= 4; threads++) {
        ckp_set_num_threads(threads);
        CHECK(ckp_rms_norm_forward(x, w, N, D, 1e-6, y2, rstd, 1) == CKP_OK, "forward");
        CHECK(ckp_rms_norm_backward(dy, x, w, rstd, N, D, threads == 1 ? dx : dx2,
                                    threads == 1 ? dw : dw2, 1) == CKP_OK, "backward");
        if (threads > 1)
            CHECK(memcmp(dx, dx2, sizeof(float) * N * D) == 0 && memcmp(dw, dw2, sizeof dw) == 0 &&
                  memcmp(y, y2, sizeof(float) * N * D) == 0, "%d threads change bits", threads);
    }
    /* no dweight asked for: the same dx */
    CHECK(ckp_rms_norm_backward(dy, x, w, rstd, N, D, dx2, NULL, 1) == CKP_OK, "backward without dweight");
    CHECK(memcmp(dx, dx2, sizeof(float) * N * D) == 0, "dx changes without dweight");
    /* the two terms, added as an autograd engine adds them, give dx to the bit */
    float *normalized = malloc(sizeof(float) * N * D), *through_rstd = malloc(sizeof(float) * N * D), dw3[D];
    CHECK(ckp_rms_norm_backward_terms(dy, x, w, rstd, N, D, normalized, NULL, dw3, 1) == CKP_ERR_NULL_POINTER,
          "dx_rstd missing");
    CHECK(ckp_rms_norm_backward_terms(dy, x, w, rstd, N, D, normalized, dy, dw3, 1) == CKP_ERR_ALIASING,
          "dx_rstd over dy");
    CHECK(ckp_rms_norm_backward_terms(dy, x, w, rstd, N, D, normalized, through_rstd, dw3, 1) == CKP_OK, "terms");
    int same = memcmp(dw, dw3, sizeof dw) == 0;
    for (int k = 0; k < N * D; k++) same = same && normalized[k] + through_rstd[k] == dx[k];
    CHECK(same, "dx_normalized + dx_rstd != dx");
    free(x); free(y); free(y2); free(dy); free(dx); free(dx2); free(normalized); free(through_rstd);
}

static void test_swiglu(void) {
    float *x = malloc(sizeof(float) * N * 2 * H), *out = malloc(sizeof(float) * N * H);
    float *dx = malloc(sizeof(float) * N * 2 * H), *dout = malloc(sizeof(float) * N * H);
    for (int k = 0; k < N * 2 * H; k++) x[k] = check_uniform(10.0f);
    x[0] = -1e4f; x[1] = 1e4f; x[2] = -100.0f; x[3] = 88.5f;
    for (int k = 0; k < N * H; k++) dout[k] = check_uniform(1.0f);
    CHECK(ckp_swiglu_forward(x, N, 0, out) == CKP_ERR_BAD_SIZE, "H=0");
    CHECK(ckp_swiglu_forward(x, N, H, NULL) == CKP_ERR_NULL_POINTER, "NULL out");
    CHECK(ckp_swiglu_forward(x, N, H, x + 5) == CKP_ERR_ALIASING, "out inside x");
    CHECK(ckp_swiglu_backward(dout, x, N, H, NULL) == CKP_ERR_NULL_POINTER, "NULL dx");
    CHECK(ckp_swiglu_forward(x, N, H, out) == CKP_OK, "forward");
    CHECK(ckp_swiglu_backward(dout, x, N, H, dx) == CKP_OK, "backward");
    double worst = 0;
    int finite = 1;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < H; j++) {
            double g = x[i * 2 * H + j], u = x[i * 2 * H + H + j];
            worst = fmax(worst, fabs(out[i * H + j] - g / (1 + exp(-g)) * u));
            finite &= isfinite(out[i * H + j]) && isfinite(dx[i * 2 * H + j]) && isfinite(dx[i * 2 * H + H + j]);
        }
    CHECK(worst < 1e-3, "swiglu error %g", worst); /* |out| reaches 1e5 here */
    CHECK(finite, "swiglu produced a non-finite value for finite gates");
    free(x); free(out); free(dx); free(dout);
}

static void test_adamw(void) {
    enum { n = 1001 };
    float p[n], g[n], m[n], v[n], vmax[n];
    for (int k = 0; k < n; k++) { p[k] = check_uniform(1.0f); g[k] = check_uniform(1.0f); m[k] = v[k] = vmax[k] = 0; }
    ckp_adamw_options opt = {1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 0};
    float p0 = p[0];
    CHECK(ckp_adamw_step(p, g, m, v, NULL, n, 1.0, &opt) == CKP_ERR_NULL_POINTER, "amsgrad without max");
    CHECK(ckp_adamw_step(p, g, m, v, vmax, n, 0.0, &opt) == CKP_ERR_BAD_OPTION, "step 0");
    CHECK(ckp_adamw_step(p, g, m, v, vmax, n, 1.5, &opt) == CKP_ERR_BAD_OPTION, "step 1.5");
    CHECK(ckp_adamw_step(p, p, m, v, vmax, n, 1.0, &opt) == CKP_ERR_ALIASING, "grad is param");
    opt.beta1 = 1.0;
    CHECK(ckp_adamw_step(p, g, m, v, vmax, n, 1.0, &opt) == CKP_ERR_BAD_OPTION, "beta1 1");
    opt.beta1 = 0.9;
    CHECK(p[0] == p0 && m[0] == 0.0f, "written on error");
    float p_before[n];
    memcpy(p_before, p, sizeof p);
    CHECK(ckp_adamw_step(p, g, m, v, vmax, n, 1.0, &opt) == CKP_OK, "step");
    /* First step, in float64: m_hat = g, v_hat = g^2, so the update is
     * -lr * g / (|g| + eps) after the decay p * (1 - lr*wd). */
    double worst = 0;
    for (int k = 0; k < n; k++) {
        double expected = p_before[k] * (1 - 1e-3 * 0.01) - 1e-3 * g[k] / (fabs(g[k]) + 1e-8);
        worst = fmax(worst, fabs(p[k] - expected));
    }
    CHECK(worst < 1e-6, "adamw first step error %g", worst);
}

static void test_grad_norm(void) {
    float a[3] = {3, 4, 0}, b[2] = {12, 0};
    const float *tensors[2] = {a, b};
    int64_t sizes[2] = {3, 2};
    double total = -1;
    CHECK(ckp_grad_norm(tensors, sizes, 2, 2.0, &total) == CKP_OK && total == 13.0, "2-norm %g", total);
    CHECK(ckp_grad_norm(tensors, sizes, 2, INFINITY, &total) == CKP_OK && total == 12.0, "inf-norm %g", total);
    CHECK(ckp_grad_norm(tensors, sizes, 2, 1.0, &total) == CKP_OK && total == 19.0, "1-norm %g", total);
    CHECK(ckp_grad_norm(tensors, sizes, 2, 0.0, &total) == CKP_ERR_BAD_OPTION, "p=0");
    a[2] = NAN;
    CHECK(ckp_grad_norm(tensors, sizes, 2, 2.0, &total) == CKP_OK && isnan(total), "NaN 2-norm");
    CHECK(ckp_grad_norm(tensors, sizes, 2, INFINITY, &total) == CKP_OK && isnan(total), "NaN inf-norm");
    a[2] = INFINITY;
    CHECK(ckp_grad_norm(tensors, sizes, 2, 2.0, &total) == CKP_OK && isinf(total), "inf 2-norm");
}

static void test_rope(void) {
    enum { RN = 6, RT = 37, RD = 66 };  /* RD/2 = 33: no vector-friendly width */
    float *x = malloc(sizeof(float) * RN * RT * RD), *out = malloc(sizeof(float) * RN * RT * RD);
    float *out2 = malloc(sizeof(float) * RN * RT * RD), *back = malloc(sizeof(float) * RN * RT * RD);
    float c[RT * RD / 2], s[RT * RD / 2];
    for (int k = 0; k < RN * RT * RD; k++) x[k] = check_uniform(3.0f);
    for (int k = 0; k < RT * RD / 2; k++) {
        c[k] = cosf(0.37f * (float)k);
        s[k] = sinf(0.37f * (float)k);
    }
    CHECK(ckp_rope_forward(x, c, s, RN, RT, 7, CKP_ROPE_HALF, out) == CKP_ERR_BAD_SIZE, "odd head dim");
    CHECK(ckp_rope_forward(x, c, NULL, RN, RT, RD, CKP_ROPE_HALF, out) == CKP_ERR_NULL_POINTER, "NULL sin");
    CHECK(ckp_rope_forward(x, c, s, RN, RT, RD, 2, out) == CKP_ERR_BAD_OPTION, "bad layout");
    CHECK(ckp_rope_forward(x, c, s, RN, RT, RD, CKP_ROPE_HALF, x) == CKP_ERR_ALIASING, "in place");
    for (int layout = 0; layout < 2; layout++) {
        for (int threads = 1; threads <= 4; threads *= 2) {
            ckp_set_num_threads(threads);
            CHECK(ckp_rope_forward(x, c, s, RN, RT, RD, layout, threads == 1 ? out : out2) == CKP_OK, "forward");
        }
        CHECK(memcmp(out, out2, sizeof(float) * RN * RT * RD) == 0, "layout %d: threads change bits", layout);
        /* the backward is the transpose rotation: it takes the output back to x */
        CHECK(ckp_rope_backward(out, c, s, RN, RT, RD, layout, back) == CKP_OK, "backward");
        float worst = 0.0f;
        for (int k = 0; k < RN * RT * RD; k++) worst = fmaxf(worst, fabsf(back[k] - x[k]));
        CHECK(worst < 1e-5f, "layout %d: backward(forward(x)) is %g from x", layout, worst);
    }
    free(x); free(out); free(out2); free(back);
}

int main(void) {
    test_rope();
    test_rms_norm();
    test_swiglu();
    test_adamw();
    test_grad_norm();
    return check_report("test_kernels");
}
