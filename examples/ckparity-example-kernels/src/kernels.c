/* kernels.c -- a user's C kernels, written the way a small C training engine
 * writes them, with no ckparity code in them: RMSNorm (double row sums),
 * SwiGLU (libm expf) and an AdamW step. ckparity checks them from the
 * outside (ckparity_example/__init__.py registers them). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void ex_rms_norm_forward(const float *x, const float *w, float *y, int64_t rows, int64_t D, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D;
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) ss += (double)xr[i] * xr[i];
        float rstd = (float)(1.0 / sqrt(ss / (double)D + eps));
        for (int64_t i = 0; i < D; i++) y[r * D + i] = xr[i] * rstd * w[i];
    }
}

/* dx = rstd * (w*dy - x * rstd^2 * mean(w*dy*x)); dw = sum over rows of dy * x * rstd, in double
 * (a float sum over the rows was less accurate than torch's: `ckparity check rms_norm` said so) */
int ex_rms_norm_backward(const float *dy, const float *x, const float *w, float *dx, float *dw, int64_t rows,
                         int64_t D, float eps) {
    double *acc = calloc((size_t)D, sizeof *acc);
    if (acc == NULL) return 1;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * D, *dyr = dy + r * D;
        double ss = 0.0, dot = 0.0;
        for (int64_t i = 0; i < D; i++) {
            ss += (double)xr[i] * xr[i];
            dot += (double)dyr[i] * w[i] * xr[i];
        }
        double rstd = 1.0 / sqrt(ss / (double)D + eps);
        double k = rstd * rstd * rstd * dot / (double)D;
        for (int64_t i = 0; i < D; i++) {
            dx[r * D + i] = (float)(rstd * dyr[i] * w[i] - k * xr[i]);
            acc[i] += (double)dyr[i] * xr[i] * rstd;
        }
    }
    for (int64_t i = 0; i < D; i++) dw[i] = (float)acc[i];
    free(acc);
    return 0;
}

/* out = silu(gate) * up, gate the first H columns of each row of x (rows, 2H) */
void ex_swiglu_forward(const float *x, float *out, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < H; i++) {
            float g = x[r * 2 * H + i], u = x[r * 2 * H + H + i];
            out[r * H + i] = g / (1.0f + expf(-g)) * u;
        }
}

void ex_swiglu_backward(const float *dout, const float *x, float *dx, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < H; i++) {
            float g = x[r * 2 * H + i], u = x[r * 2 * H + H + i], d = dout[r * H + i];
            float s = 1.0f / (1.0f + expf(-g));
            dx[r * 2 * H + i] = d * u * s * (1.0f + g * (1.0f - s));
            dx[r * 2 * H + H + i] = d * g * s;
        }
}

/* Two deliberately faulty variants, for seeing what ckparity says of a kernel
   that is not right (tests/test_example_package.py):
   - fast: e^-g as exp2f(-g * log2(e)): the product rounds before the exp, an
     error that grows with |g| (a common "fast exp");
   - small: a scratch size assumed, and abort() past it (a C assertion that
     fires in production at a width the author never tried). */
void ex_swiglu_forward_fast(const float *x, float *out, int64_t rows, int64_t H) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < H; i++) {
            float g = x[r * 2 * H + i], u = x[r * 2 * H + H + i];
            out[r * H + i] = g / (1.0f + exp2f(-g * 1.44269504f)) * u;
        }
}

void ex_swiglu_forward_small(const float *x, float *out, int64_t rows, int64_t H) {
    if (H > 1024)
        abort();
    ex_swiglu_forward(x, out, rows, H);
}

/* torch.optim.AdamW's single-tensor step, in float, its order of operations */
void ex_adamw_step(float *p, const float *g, float *m, float *v, int64_t n, int64_t step, double lr, double beta1,
                   double beta2, double eps, double wd) {
    float decay = (float)(1.0 - lr * wd), a = (float)(1.0 - beta1), b2 = (float)beta2, c = (float)(1.0 - beta2);
    double bc1 = 1.0 - pow(beta1, (double)step), bc2_sqrt = sqrt(1.0 - pow(beta2, (double)step));
    float step_size = (float)(lr / bc1), bc2s = (float)bc2_sqrt, e = (float)eps;
    for (int64_t i = 0; i < n; i++) {
        p[i] *= decay;
        m[i] += a * (g[i] - m[i]);
        v[i] = v[i] * b2 + c * g[i] * g[i];
        p[i] += -step_size * (m[i] / (sqrtf(v[i]) / bc2s + e));
    }
}
