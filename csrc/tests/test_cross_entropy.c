/* test_cross_entropy.c — the C API of cross_entropy called directly:
 * bad arguments return errors and write nothing; results match a float64
 * reference written here; in place equals out of place; threads don't change bits. */
#include "ckparity.h"
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { N = 37, V = 301 };

/* float64 reference of mean CE with class weights; ignored rows skipped. */
static double reference_mean_loss(const float *x, const int64_t *t, const float *w, int64_t ignore) {
    double total = 0, weight_sum = 0;
    for (int i = 0; i < N; i++) {
        if (t[i] == ignore) continue;
        double m = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) m = fmax(m, x[i * V + j]);
        for (int j = 0; j < V; j++) s += exp(x[i * V + j] - m);
        double wt = w ? w[t[i]] : 1.0;
        total += wt * (m + log(s) - x[i * V + t[i]]);
        weight_sum += wt;
    }
    return total / weight_sum;
}

static void test_bad_arguments(const float *x, const int64_t *t) {
    ckp_cross_entropy_options opt;
    ckp_cross_entropy_options_init(&opt);
    float loss = 12345.0f;
    float *dx = malloc(sizeof(float) * N * V);
    for (int k = 0; k < N * V; k++) dx[k] = 7.0f;

    CHECK(ckp_cross_entropy(NULL, t, NULL, N, V, &opt, &loss, dx) == CKP_ERR_NULL_POINTER, "NULL logits");
    CHECK(ckp_cross_entropy(x, NULL, NULL, N, V, &opt, &loss, dx) == CKP_ERR_NULL_POINTER, "no target");
    CHECK(ckp_cross_entropy(x, t, x, N, V, &opt, &loss, dx) == CKP_ERR_NULL_POINTER, "two targets");
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, NULL, &loss, dx) == CKP_ERR_NULL_POINTER, "NULL options");
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &opt, NULL, dx) == CKP_ERR_NULL_POINTER, "NULL loss");
    CHECK(ckp_cross_entropy(x, t, NULL, 0, V, &opt, &loss, dx) == CKP_ERR_BAD_SIZE, "N=0");
    CHECK(ckp_cross_entropy(x, t, NULL, N, -1, &opt, &loss, dx) == CKP_ERR_BAD_SIZE, "V<0");
    CHECK(ckp_cross_entropy(x, t, NULL, INT64_MAX / 2, 3, &opt, &loss, dx) == CKP_ERR_BAD_SIZE, "overflow");

    ckp_cross_entropy_options bad = opt;
    bad.reduction = (ckp_reduction)7;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION, "reduction 7");
    bad = opt;
    bad.variant = (ckp_cross_entropy_variant)9;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION, "variant 9");
    bad = opt;
    bad.label_smoothing = 1.5;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION, "smoothing 1.5");
    bad.label_smoothing = NAN;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION, "smoothing NaN");
    bad = opt;
    bad.z_loss = -1;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION, "z_loss -1");
    bad = opt;
    bad.torch_threads = 0;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION, "torch_threads 0");
    CHECK(opt.torch_threads == 1, "options_init sets torch_threads 1");
    CHECK(ckp_cross_entropy(x, NULL, x, N, V, &opt, &loss, dx) == CKP_OK, "probability targets ok");
    bad = opt;
    bad.ignore_index = 3;
    CHECK(ckp_cross_entropy(x, NULL, x, N, V, &bad, &loss, dx) == CKP_ERR_BAD_OPTION,
          "ignore_index >= 0 with probabilities");

    /* partial overlap of dlogits and logits */
    float *buf = malloc(sizeof(float) * (N * V + 1));
    memcpy(buf, x, sizeof(float) * N * V);
    CHECK(ckp_cross_entropy(buf, t, NULL, N, V, &opt, &loss, buf + 1) == CKP_ERR_ALIASING, "partial overlap");
    CHECK(ckp_cross_entropy(buf, t, NULL, N, V, &opt, buf + 5, NULL) == CKP_ERR_ALIASING, "loss inside logits");
    /* inputs read after dlogits is first written must not live inside it */
    CHECK(ckp_cross_entropy(x, NULL, buf, N, V, &opt, &loss, buf) == CKP_ERR_ALIASING, "dlogits is target_probs");
    bad = opt;
    bad.weight = buf + 3;
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, &loss, buf) == CKP_ERR_ALIASING, "weight inside dlogits");
    bad = opt;
    bad.reduction = CKP_REDUCTION_NONE;
    bad.row_grad = buf + 7;
    float *row_loss = malloc(sizeof(float) * N);
    CHECK(ckp_cross_entropy(x, t, NULL, N, V, &bad, row_loss, buf) == CKP_ERR_ALIASING, "row_grad inside dlogits");
    free(row_loss);
    free(buf);

    /* out-of-range target: error names row and value, nothing written */
    int64_t *bad_t = malloc(sizeof(int64_t) * N);
    memcpy(bad_t, t, sizeof(int64_t) * N);
    bad_t[21] = V + 4;
    for (int k = 0; k < N * V; k++) dx[k] = 7.0f;
    loss = 12345.0f;
    for (int variant = 0; variant < 2; variant++) {
        opt.variant = (ckp_cross_entropy_variant)variant;
        ckp_status s = ckp_cross_entropy(x, bad_t, NULL, N, V, &opt, &loss, dx);
        CHECK(s == CKP_ERR_TARGET_OUT_OF_RANGE, "status %d", (int)s);
        CHECK(strstr(ckp_last_error(), "row 21") != NULL && strstr(ckp_last_error(), "305") != NULL,
              "detail '%s'", ckp_last_error());
        CHECK(loss == 12345.0f, "loss written on error");
        int untouched = 1;
        for (int k = 0; k < N * V; k++) untouched &= dx[k] == 7.0f;
        CHECK(untouched, "dlogits written on error");
    }
    bad_t[21] = -1; /* negative but not ignore_index */
    CHECK(ckp_cross_entropy(x, bad_t, NULL, N, V, &opt, &loss, dx) == CKP_ERR_TARGET_OUT_OF_RANGE, "-1");
    CHECK(strcmp(ckp_status_str(CKP_ERR_TARGET_OUT_OF_RANGE), "CKP_ERR_TARGET_OUT_OF_RANGE") == 0, "name");
    CHECK(ckp_set_num_threads(0) == CKP_ERR_BAD_OPTION, "0 threads");
    free(bad_t);
    free(dx);
}

static void test_values_inplace_threads(const float *x, const int64_t *t, const float *w) {
    float *dx = malloc(sizeof(float) * N * V), *dx2 = malloc(sizeof(float) * N * V);
    float *inplace = malloc(sizeof(float) * N * V);
    for (int variant = 0; variant < 2; variant++) {
        ckp_cross_entropy_options opt;
        ckp_cross_entropy_options_init(&opt);
        opt.variant = (ckp_cross_entropy_variant)variant;
        opt.weight = w;
        opt.ignore_index = 5;
        float loss = 0, loss2 = 0;
        CHECK(ckp_cross_entropy(x, t, NULL, N, V, &opt, &loss, dx) == CKP_OK, "run");
        double ref = reference_mean_loss(x, t, w, 5);
        CHECK(fabs(loss - ref) <= 1e-5 * fabs(ref), "variant %d loss %.9g ref %.9g", variant, loss, ref);

        /* gradient rows sum to zero (softmax minus a distribution) */
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double s = 0;
            for (int j = 0; j < V; j++) s += dx[i * V + j];
            worst = fmax(worst, fabs(s));
        }
        CHECK(worst < 1e-6, "variant %d gradient row sum %g", variant, worst);

        memcpy(inplace, x, sizeof(float) * N * V);
        CHECK(ckp_cross_entropy(inplace, t, NULL, N, V, &opt, &loss2, inplace) == CKP_OK, "in place");
        CHECK(memcmp(inplace, dx, sizeof(float) * N * V) == 0 && loss2 == loss,
              "variant %d in-place bits differ", variant);

        for (int threads = 1; threads <= 4; threads++) {
            ckp_set_num_threads(threads);
            CHECK(ckp_cross_entropy(x, t, NULL, N, V, &opt, &loss2, dx2) == CKP_OK, "threads");
            CHECK(loss2 == loss && memcmp(dx, dx2, sizeof(float) * N * V) == 0,
                  "variant %d: %d threads change bits", variant, threads);
        }
    }
    free(dx);
    free(dx2);
    free(inplace);
}

int main(void) {
    float *x = malloc(sizeof(float) * N * V);
    float w[V];
    int64_t t[N];
    for (int k = 0; k < N * V; k++) x[k] = check_uniform(8.0f);
    for (int j = 0; j < V; j++) w[j] = 0.5f + 0.5f * (check_uniform(1.0f) + 1.0f);
    for (int i = 0; i < N; i++) t[i] = (i * 7919) % V;
    t[3] = 5; /* ignore_index 5 in the value test */
    t[4] = 5;
    test_bad_arguments(x, t);
    test_values_inplace_threads(x, t, w);
    test_values_inplace_threads(x, t, NULL);
    free(x);
    return check_report("test_cross_entropy");
}
