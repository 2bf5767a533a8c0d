/*
 * ckparity.h — the whole C API of ckparity.
 *
 * ckparity's kernels compute the pieces of an LLM training step that most
 * often make a hand-written trainer drift away from PyTorch, with PyTorch's
 * exact semantics. Every entry point returns a ckp_status (CKP_OK == 0);
 * a bad argument returns an error, writes nothing, and never prints.
 * Buffers are caller-allocated, contiguous, row-major float32; class targets
 * are int64 (torch's dtype, so no copy is needed).
 *
 * Example: mean cross-entropy of logits (N, V) and its gradient.
 *
 *     ckp_cross_entropy_options opt;
 *     ckp_cross_entropy_options_init(&opt);           // torch's defaults
 *     float loss;
 *     ckp_status s = ckp_cross_entropy(logits, targets, NULL, N, V, &opt,
 *                                      &loss, dlogits);
 *     if (s != CKP_OK)
 *         fprintf(stderr, "%s: %s\n", ckp_status_str(s), ckp_last_error());
 *
 * The region between the CDEF markers is read verbatim by the Python loader
 * (cffi's cdef), so it holds plain declarations only: no macros, no #if.
 */
#ifndef CKPARITY_H
#define CKPARITY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CKP_CDEF_BEGIN */

/* Status codes. Values never move once published; new codes go at the end. */
typedef enum {
    CKP_OK = 0,
    CKP_ERR_NULL_POINTER = 1,       /* a required pointer is NULL */
    CKP_ERR_BAD_SIZE = 2,           /* a size is zero, negative or inconsistent */
    CKP_ERR_TARGET_OUT_OF_RANGE = 3,/* a class target outside [0, V) that is not ignore_index */
    CKP_ERR_BAD_OPTION = 4,         /* an option outside its domain (reduction, smoothing, ...) */
    CKP_ERR_ALIASING = 5,           /* an output overlaps an input where that is not allowed */
    CKP_ERR_OUT_OF_MEMORY = 6       /* an entry point could not allocate its working memory (rms_norm) */
} ckp_status;

/* A short fixed name for a status code ("CKP_ERR_BAD_SIZE: ..."). */
const char *ckp_status_str(ckp_status status);

/* Detail of the last failing call made on this thread (which argument, which
 * row, which value). Empty if the last call on this thread succeeded. */
const char *ckp_last_error(void);

/* Library version and the compiler flags the library was built with. */
const char *ckp_version(void);
const char *ckp_build_info(void);

/* Whose code the hot loops run: "x86-64-v4", "x86-64-v3" or "baseline". A
 * default build carries all three and GCC's resolver picks one per CPU at
 * load time; a -Dclones=false build carries one (its -Dmarch's, or the
 * baseline). Every one gives the same bits: only the speed differs. */
const char *ckp_isa(void);

/* Threads. The default comes from CKP_NUM_THREADS, then CK_NUM_THREADS, then
 * the number of cores. Results never depend on the thread count. */
ckp_status ckp_set_num_threads(int num_threads);
int ckp_get_num_threads(void);

/* Which of torch's CPU kernels the bit-identical kernels repeat. ATen builds
 * its CPU kernels once per capability and runs one per process
 * (torch.backends.cpu.get_cpu_capability(), lowered by ATEN_CPU_CAPABILITY):
 * the capability fixes the vector width (8 or 16 floats), where a row's
 * scalar tail starts, which exp it uses (SLEEF's on vectors, libm's expf in
 * the DEFAULT build) and whether its compiler contracted a * b + c into an
 * FMA (AVX2 and AVX-512 builds do; DEFAULT has no FMA). The default is the one
 * torch would pick on this CPU (AVX-512 F/BW/VL/DQ: AVX512; AVX2 and FMA:
 * AVX2; else DEFAULT), lowered by ATEN_CPU_CAPABILITY as torch lowers it; the
 * Python side sets the capability torch reports. Any capability can be set
 * on any CPU: it selects arithmetic, not instructions. */
typedef enum {
    CKP_CAPABILITY_DEFAULT = 0,
    CKP_CAPABILITY_AVX2 = 1,
    CKP_CAPABILITY_AVX512 = 2
} ckp_capability;

ckp_status ckp_set_capability(int capability);
int ckp_get_capability(void);

/* Reductions, numbered as torch's at::Reduction. */
typedef enum {
    CKP_REDUCTION_NONE = 0,
    CKP_REDUCTION_MEAN = 1,
    CKP_REDUCTION_SUM = 2
} ckp_reduction;

/* ------------------------------------------------------------------------
 * cross_entropy (csrc/cross_entropy.c) = F.cross_entropy, forward and
 * backward in one call.
 * ---------------------------------------------------------------------- */
typedef enum {
    CKP_CE_DEFAULT = 0,  /* fused, threaded, log-sum-exp accumulated in double */
    CKP_CE_PTREF = 1     /* ATen's CPU order of operations, single-threaded */
} ckp_cross_entropy_variant;

typedef struct {
    const float *weight;      /* (V) class weights, or NULL for all ones */
    int64_t ignore_index;     /* class-index targets equal to this are skipped (torch: -100) */
    ckp_reduction reduction;  /* torch: CKP_REDUCTION_MEAN */
    double label_smoothing;   /* in [0, 1] */
    double z_loss;            /* >= 0: adds z_loss * logsumexp(row)^2 to each non-ignored row */
    ckp_cross_entropy_variant variant;
    const float *row_grad;    /* the upstream gradient, folded into dlogits where torch's
                                 chain folds it (ptref; default: into its scale): reduction
                                 none (N), one per row; mean and sum (1), the reduced
                                 loss's; NULL for ones */
    int torch_threads;        /* >= 1; ptref only: the threads torch reduces on
                                 (torch.get_num_threads()). A torch.sum over every element
                                 (probability targets' N*V products; label smoothing's N row
                                 terms and, weighted, its kept rows' weights) is split
                                 across torch's threads from 32768 elements on; ptref splits
                                 it the same way (its own work stays on one thread: the same
                                 inputs and torch_threads give the same bits) */
} ckp_cross_entropy_options;

/* Fills *opt with torch's defaults (no weight, ignore_index -100, mean, no
 * smoothing, no z-loss, default variant, torch_threads 1). */
ckp_status ckp_cross_entropy_options_init(ckp_cross_entropy_options *opt);

/* logits is (N, V). Exactly one of target (N, int64 class indices) and
 * target_probs (N, V, class probabilities) is non-NULL.
 * loss is (N) for CKP_REDUCTION_NONE, else (1).
 * dlogits is (N, V) or NULL (forward only): the gradient of the loss with an
 * upstream gradient of 1 (or of opt->row_grad with reduction none). dlogits may
 * be the logits buffer itself (in place); it may not partially overlap it, nor
 * overlap target_probs, opt->weight or opt->row_grad (CKP_ERR_ALIASING).
 * With mean reduction and every target ignored the loss is NaN and dlogits is
 * all zero, as in torch. */
ckp_status ckp_cross_entropy(const float *logits, const int64_t *target,
                             const float *target_probs, int64_t N, int64_t V,
                             const ckp_cross_entropy_options *opt,
                             float *loss, float *dlogits);

/* The ptref variant in bfloat16 (logits, loss and dlogits bf16 as uint16_t), for
 * class targets with class weights and label smoothing (z_loss: CKP_ERR_BAD_OPTION;
 * opt->weight and opt->row_grad, in float, hold bf16 values), bit-identical to
 * torch's F.cross_entropy on bf16 logits: log_softmax's bf16 max and exp-sum
 * temporaries, nll_loss's bf16 cascade and total_weight, label smoothing's bf16
 * tensor ops and sums split on opt->torch_threads as torch's are
 * (csrc/cross_entropy.c). dlogits may be NULL; no output may overlap an input. */
ckp_status ckp_cross_entropy_bf16(const uint16_t *logits, const int64_t *target, int64_t N, int64_t V,
                                  const ckp_cross_entropy_options *opt, uint16_t *loss, uint16_t *dlogits);

/* The default variant on bfloat16 logits (and bf16 target_probs): the float32 kernel's arithmetic
 * on the values widened exactly as they are read, loss in float32, dlogits rounded to bf16 once as
 * it is stored (opt->row_grad folded in before, as in float32) -- the float32 kernel on
 * logits.float(), then dlogits cast to bf16, without the float copies. Options as ckp_cross_entropy's
 * (z_loss, weights, smoothing; opt->variant must be CKP_CE_DEFAULT); dlogits may be NULL or the
 * logits buffer itself (in place), and may not otherwise overlap an input. */
ckp_status ckp_cross_entropy_default_bf16(const uint16_t *logits, const int64_t *target,
                                          const uint16_t *target_probs, int64_t N, int64_t V,
                                          const ckp_cross_entropy_options *opt, float *loss, uint16_t *dlogits);

/* The same with probability targets: target_probs (N, V) bf16, torch's
 * cross_entropy_loss_prob_target on bf16 tensors (its smoothed target, products
 * and torch.sum rounded to bf16 as torch rounds them; opt->ignore_index is not
 * used, as torch allows none with probabilities). dlogits may be NULL; no output
 * may overlap an input. */
ckp_status ckp_cross_entropy_probs_bf16(const uint16_t *logits, const uint16_t *target_probs, int64_t N,
                                        int64_t V, const ckp_cross_entropy_options *opt, uint16_t *loss,
                                        uint16_t *dlogits);

/* bfloat16 logits with float32 probability targets, as torch takes them: the loss float32 (torch
 * promotes it to the targets' dtype). opt->variant CKP_CE_PTREF: torch's bits -- log_softmax in bf16
 * (its bf16 temporaries), the products and torch.sum in float32 over the bf16 logp, the gradient
 * reaching logp rounded to bf16 once (autograd casts it to logp's dtype), then log_softmax's bf16
 * backward; no z_loss; dlogits may be NULL and may not overlap an input. CKP_CE_DEFAULT: the default
 * variant's arithmetic on the widened values, dlogits rounded once (NULL, or the logits buffer
 * itself: in place). opt->weight holds the class weights as floats (bf16 or float32 values). */
ckp_status ckp_cross_entropy_probs_bf16_f32p(const uint16_t *logits, const float *target_probs, int64_t N,
                                             int64_t V, const ckp_cross_entropy_options *opt, float *loss,
                                             uint16_t *dlogits);

/* ------------------------------------------------------------------------
 * rms_norm (csrc/rms_norm.c) = F.rms_norm(x, (D,), weight, eps).
 * ---------------------------------------------------------------------- */

/* x is (N, D), weight is (D) or NULL, y is (N, D), rstd is (N):
 * rstd_i = 1 / sqrt(mean_j x_ij^2 + eps),  y_ij = (x_ij * rstd_i) * weight_j,
 * in torch's float operations and summation order.
 * eps >= 0 (torch's eps=None is FLT_EPSILON, 1.1920929e-07).
 * torch_threads >= 1: the threads torch reduces on (torch.get_num_threads());
 * a sum torch reduces to one value -- the row of a one-row input (N = 1),
 * dweight's column at D = 1 -- is split across them from 32768 elements on,
 * and is split here the same way (the work itself stays on this library's
 * threads: the same inputs and torch_threads give the same bits). 1: no split. */
ckp_status ckp_rms_norm_forward(const float *x, const float *weight, int64_t N, int64_t D,
                                double eps, float *y, float *rstd, int torch_threads);

/* dy, x, dx are (N, D); rstd is (N) from the forward; dweight is (D), or NULL:
 * not computed (as torch skips a weight's gradient it does not need; must be
 * NULL when weight is). dx may be dy (in place). torch_threads as above. With
 * a weight of D >= 8 the call allocates dweight's cascade state (16 KB per
 * group of up to 1024 columns; CKP_ERR_OUT_OF_MEMORY, nothing written, when
 * that fails): it walks the rows in blocks, carrying the cascades between them. */
ckp_status ckp_rms_norm_backward(const float *dy, const float *x, const float *weight,
                                 const float *rstd, int64_t N, int64_t D,
                                 float *dx, float *dweight, int torch_threads);

/* The same backward with dx as the two terms torch's autograd adds
 * separately: dx_normalized = (dy * weight) * rstd, the gradient through the
 * product x * rstd, and dx_rstd = (g_mean / D) * (2 * x), the gradient through
 * rstd (dx = dx_normalized + dx_rstd). When x has other uses (a residual
 * stream), torch's engine adds the gradients of all of x's uses one by one,
 * these two among them; a caller whose autograd engine adds the two terms in
 * their place gets the same association of the sum, where one pre-added dx
 * would not (ckparity.rms_norm does this). dx_normalized may be dy (in
 * place); dx_rstd may overlap nothing. */
ckp_status ckp_rms_norm_backward_terms(const float *dy, const float *x, const float *weight,
                                       const float *rstd, int64_t N, int64_t D,
                                       float *dx_normalized, float *dx_rstd, float *dweight,
                                       int torch_threads);

/* The same in bfloat16 (uint16_t: a float's high 16 bits, as torch stores
 * bf16) with rstd in float: torch computes rms_norm on bf16 tensors in float
 * and rounds each result once -- y, dx (its two terms added in float) and
 * dweight are the float32 results of the same values, rounded to bf16
 * (csrc/rms_norm.c). These run the float32 kernel's arithmetic on the rows
 * in place, widening as they load and rounding as they store (the weight and
 * dweight's sums as floats are allocated per call: CKP_ERR_OUT_OF_MEMORY,
 * before anything is written, when that fails). */
ckp_status ckp_rms_norm_forward_bf16(const uint16_t *x, const uint16_t *weight, int64_t N, int64_t D,
                                     double eps, uint16_t *y, float *rstd, int torch_threads);
ckp_status ckp_rms_norm_backward_bf16(const uint16_t *dy, const uint16_t *x, const uint16_t *weight,
                                      const float *rstd, int64_t N, int64_t D,
                                      uint16_t *dx, uint16_t *dweight, int torch_threads);

/* bf16 x with a float32 weight, as torch allows it (F.rms_norm computes the
 * same float composite): y and dx bf16, dweight float32 and not rounded. */
ckp_status ckp_rms_norm_forward_bf16_f32w(const uint16_t *x, const float *weight, int64_t N, int64_t D,
                                          double eps, uint16_t *y, float *rstd, int torch_threads);
ckp_status ckp_rms_norm_backward_bf16_f32w(const uint16_t *dy, const uint16_t *x, const float *weight,
                                           const float *rstd, int64_t N, int64_t D,
                                           uint16_t *dx, float *dweight, int torch_threads);

/* The same four in float16 (uint16_t: IEEE binary16 bits), torch's Half composite rounded once as
 * its bf16 one is: a float16 weight, or a float32 one with dweight float32. */
ckp_status ckp_rms_norm_forward_f16(const uint16_t *x, const uint16_t *weight, int64_t N, int64_t D,
                                    double eps, uint16_t *y, float *rstd, int torch_threads);
ckp_status ckp_rms_norm_backward_f16(const uint16_t *dy, const uint16_t *x, const uint16_t *weight,
                                     const float *rstd, int64_t N, int64_t D,
                                     uint16_t *dx, uint16_t *dweight, int torch_threads);
ckp_status ckp_rms_norm_forward_f16_f32w(const uint16_t *x, const float *weight, int64_t N, int64_t D,
                                         double eps, uint16_t *y, float *rstd, int torch_threads);
ckp_status ckp_rms_norm_backward_f16_f32w(const uint16_t *dy, const uint16_t *x, const float *weight,
                                          const float *rstd, int64_t N, int64_t D,
                                          uint16_t *dx, float *dweight, int torch_threads);

/* ------------------------------------------------------------------------
 * swiglu (csrc/swiglu.c): x is (N, 2H), gate = x[:, :H], up = x[:, H:],
 * out = F.silu(gate) * up is (N, H).
 * ---------------------------------------------------------------------- */
ckp_status ckp_swiglu_forward(const float *x, int64_t N, int64_t H, float *out);

/* dout is (N, H), x and dx are (N, 2H). */
ckp_status ckp_swiglu_backward(const float *dout, const float *x, int64_t N, int64_t H,
                               float *dx);

/* The same in bfloat16 (uint16_t: a float's high 16 bits, as torch stores
 * bf16), bit-identical to torch's bf16 ops: out = bf16(bf16(silu(gate)) * up),
 * each op computing in float and rounding once (csrc/swiglu.c). */
ckp_status ckp_swiglu_forward_bf16(const uint16_t *x, int64_t N, int64_t H, uint16_t *out);
ckp_status ckp_swiglu_backward_bf16(const uint16_t *dout, const uint16_t *x, int64_t N, int64_t H,
                                    uint16_t *dx);

/* The same in float16 (uint16_t: IEEE binary16 bits, as torch stores Half), bit-identical to torch's
 * float16 ops, which round as its bf16 ones do: out = f16(f16(silu(gate)) * up). */
ckp_status ckp_swiglu_forward_f16(const uint16_t *x, int64_t N, int64_t H, uint16_t *out);
ckp_status ckp_swiglu_backward_f16(const uint16_t *dout, const uint16_t *x, int64_t N, int64_t H,
                                   uint16_t *dx);

/* ------------------------------------------------------------------------
 * gelu (csrc/gelu.c): y = F.gelu(x, approximate="tanh") over n contiguous
 * floats, and its backward dx = dy * gelu'(x). torch_threads >= 1: the
 * threads torch runs the op on (torch.get_num_threads()); its loop splits a
 * tensor into that many pieces past a grain and computes each piece's last
 * elements apart, so the bits follow it (the work stays on this library's
 * threads). No output may overlap an input.
 * ---------------------------------------------------------------------- */
ckp_status ckp_gelu_forward(const float *x, int64_t n, int torch_threads, float *y);
ckp_status ckp_gelu_backward(const float *dy, const float *x, int64_t n, int torch_threads, float *dx);
/* The same in bfloat16 (uint16_t: a float's high 16 bits), bit-identical to torch's bf16 GELU: the float
 * formula on the widened values, rounded to bf16 once. */
ckp_status ckp_gelu_forward_bf16(const uint16_t *x, int64_t n, int torch_threads, uint16_t *y);
ckp_status ckp_gelu_backward_bf16(const uint16_t *dy, const uint16_t *x, int64_t n, int torch_threads,
                                  uint16_t *dx);

/* ------------------------------------------------------------------------
 * gelu_erf (csrc/gelu_erf.c): y = F.gelu(x) in its erf form (approximate="none") over n contiguous values,
 * and its backward dx = dy * gelu'(x), in the form torch runs ([Note: torch's erf GELU is oneDNN's]):
 * oneDNN's eltwise gelu_erf at an avx512 ISA (MINIMAX) or below it (ABRAMOWITZ_STEGUN; the backward is
 * the same at both) -- every element its own, so any thread count gives the same bits --, or ATen's own
 * code (ATEN: one element, oneDNN disabled, bf16 below avx512_core: its vectorized erf at the capability
 * torch runs, split into torch's pieces at torch_threads >= 1, as gelu's tanh form is; the oneDNN forms
 * ignore torch_threads). No output may overlap an input (CKP_ERR_ALIASING); another form is
 * CKP_ERR_BAD_OPTION.
 * ---------------------------------------------------------------------- */
enum { CKP_GELU_ERF_MINIMAX = 0, CKP_GELU_ERF_ABRAMOWITZ_STEGUN = 1, CKP_GELU_ERF_ATEN = 2 };
/* OR'ed into a bf16 entry's form: a result that is a float denormal is stored as a signed zero, as oneDNN's
 * vcvtneps2bf16 stores it (oneDNN at avx512_core_bf16 and above; below, its emulated rounding keeps them). */
enum { CKP_GELU_ERF_BF16_FLUSH = 8 };
ckp_status ckp_gelu_erf_forward(const float *x, int64_t n, int form, int torch_threads, float *y);
ckp_status ckp_gelu_erf_backward(const float *dy, const float *x, int64_t n, int form, int torch_threads, float *dx);
/* The same in bfloat16: the float formula on the widened values, rounded to bf16 once. */
ckp_status ckp_gelu_erf_forward_bf16(const uint16_t *x, int64_t n, int form, int torch_threads, uint16_t *y);
ckp_status ckp_gelu_erf_backward_bf16(const uint16_t *dy, const uint16_t *x, int64_t n, int form, int torch_threads,
                                      uint16_t *dx);

/* ------------------------------------------------------------------------
 * layer_norm (csrc/layer_norm.c): F.layer_norm over the last N elements of
 * each of M rows of x (M x N, float32), weight and bias (N) or NULL, as ATen
 * computes it (its row moments, its reductions, torch's FMAs):
 * y = (x - mean) * rstd * weight + bias; mean and rstd (M) as torch's
 * native_layer_norm returns them. eps is any value torch takes (a negative
 * one too), converted to float as torch does.
 * ---------------------------------------------------------------------- */
ckp_status ckp_layer_norm_forward(const float *x, const float *weight, const float *bias, int64_t M, int64_t N,
                                  double eps, float *y, float *mean, float *rstd);

/* dy, x, dx (M x N); mean, rstd (M) from the forward; weight (N) or NULL.
 * dx, dweight, dbias may each be NULL (not computed). torch_threads >= 1:
 * the threads torch runs the backward on (torch.get_num_threads()): its
 * dweight and dbias are one partial sum per thread, added in thread order,
 * and follow it; the work stays on this library's threads. With dweight
 * or dbias the call allocates 2 x torch_threads x N floats
 * (CKP_ERR_OUT_OF_MEMORY, nothing written, when that fails). */
ckp_status ckp_layer_norm_backward(const float *dy, const float *x, const float *mean, const float *rstd,
                                   const float *weight, int64_t M, int64_t N, int torch_threads, float *dx,
                                   float *dweight, float *dbias);

/* The same in bfloat16 (x, weight, bias, y, mean, rstd, dy, dx, dweight, dbias all bf16, as torch's
 * LayerNorm keeps them when its params are bf16): float arithmetic inside, rounded where torch rounds. */
ckp_status ckp_layer_norm_forward_bf16(const uint16_t *x, const uint16_t *weight, const uint16_t *bias, int64_t M,
                                       int64_t N, double eps, uint16_t *y, uint16_t *mean, uint16_t *rstd);
ckp_status ckp_layer_norm_backward_bf16(const uint16_t *dy, const uint16_t *x, const uint16_t *mean,
                                        const uint16_t *rstd, const uint16_t *weight, int64_t M, int64_t N,
                                        int torch_threads, uint16_t *dx, uint16_t *dweight, uint16_t *dbias);
/* Mixed types (torch's layer_norm_kernel_mixed_type<BFloat16, float>): a bf16 x, dy, y and dx with float32
 * weight and bias; mean and rstd float32 (not rounded), dweight and dbias float32 -- the float sums of the
 * per-thread bf16 buffers. */
ckp_status ckp_layer_norm_forward_bf16_mixed(const uint16_t *x, const float *weight, const float *bias, int64_t M,
                                             int64_t N, double eps, uint16_t *y, float *mean, float *rstd);
ckp_status ckp_layer_norm_backward_bf16_mixed(const uint16_t *dy, const uint16_t *x, const float *mean,
                                              const float *rstd, const float *weight, int64_t M, int64_t N,
                                              int torch_threads, uint16_t *dx, float *dweight, float *dbias);

/* ------------------------------------------------------------------------
 * linear (csrc/linear.c): C (M x N, row-major) = A (M x K) . B (K x N) + bias
 * (N, or NULL), float32, in the order of MKL's one-thread sgemm (K in blocks
 * of 384, the last two sharing the rest below 192 columns; an FMA chain per block; the blocks
 * added left to right; a bias is C's start, or with bias_after added to the
 * product). A[m,k] is a[m*a_rs + k*a_cs] and
 * B[k,n] is b[k*b_rs + n*b_cs]: transposed operands by their strides. c may
 * overlap nothing. The same bits at any thread count. On MKL's AVX2 branch
 * (ckp_get_gemm_order: CKP_GEMM_ORDER_AVX2) a product of under 4 rows or 12
 * columns follows MKL's small paths (one row or one column: its gemv), whose
 * bits depend on where A's, B's or C's rows start relative to 16 bytes, as
 * MKL's do: give the operands the alignment torch's tensors have to get
 * torch's bits (csrc/linear.c's Notes).
 * torch_threads >= 1: the threads torch runs MKL on (torch.get_num_threads()).
 * On the AVX2 branch at 2, MKL shares a product of 5..11 rows between its
 * threads by rows, each share on its own path; the order follows that. The
 * work stays on this library's threads: the same bits at any count of them.
 * ---------------------------------------------------------------------- */
ckp_status ckp_gemm(const float *a, int64_t a_rs, int64_t a_cs, const float *b, int64_t b_rs, int64_t b_cs,
                    int64_t M, int64_t K, int64_t N, const float *bias, int bias_after, float *c, int torch_threads);
/* C (M x N, bf16, row-major) = A (M x K) . B (K x N), bf16 operands by their strides, in the order oneDNN's
 * AMX brgemm matmul sums it (csrc/linear_bf16.c): K in chunks starting at chunk_starts[0..chunks) (rising,
 * within (0, K)), each summed from 0 and added in order; a chunk in tiles of `width` terms (even), a tile's
 * even- and odd-placed terms two float32 chains from 0 whose sum joins the chunk's; denormals flushed;
 * rounded to bf16 once. Width 0 is oneDNN's AVX-512 bf16 form (no AMX): a chunk one float32 chain over K's
 * pairs, each pair's odd-placed term first (VDPBF16PS; an odd K padded with a zero). The chunks and the width
 * are oneDNN's choice for the shape: ckparity measures them (ckparity/ops/_onednn.py). A bias (bf16 (N), or
 * NULL) is added to the float32 sum before the rounding (measured for width 0). The same bits at any thread
 * count. Width 0 runs VDPBF16PS itself where the CPU has it (avx512_bf16: every CPU whose oneDNN takes that form),
 * its float32 emulation (an FMA under DAZ and FTZ per term) elsewhere, or where the environment sets
 * CKP_BF16_EMULATE when the library first runs it (tests/test_linear.py compares the two). */
ckp_status ckp_gemm_bf16_tiles(const uint16_t *a, int64_t a_rs, int64_t a_cs, const uint16_t *b, int64_t b_rs,
                               int64_t b_cs, int64_t M, int64_t K, int64_t N, int64_t width,
                               const int64_t *chunk_starts, int64_t chunks, const uint16_t *bias, uint16_t *c);
/* C (M x N, bf16, row-major) = A (M x K) . B (K x N) (+ bias, bf16 (N), or NULL), bf16 operands by their
 * strides, in the order ATen's own bf16 GEMM sums it where torch runs no oneDNN (csrc/linear_bf16_aten.c):
 * CKP_ATEN_BF16_DOT (its fp32-arith dot: 8 registers of 8 or 16 lanes by the capability set, then tails; bias
 * added after), _PAIRS (four chains by k mod 4; bias added after) or _CHAIN (one chain from the bias). Which
 * form a torch.mm takes is set by its operands' layouts (ckparity/ops/_aten_bf16.py). Rounded to bf16 once.
 * With bias_after, the product is rounded and the bias added to it and rounded again (matmul, then add_).
 * The same bits at any thread count. */
typedef enum { CKP_ATEN_BF16_DOT = 0, CKP_ATEN_BF16_PAIRS = 1, CKP_ATEN_BF16_CHAIN = 2 } ckp_aten_bf16_form;
ckp_status ckp_gemm_bf16_aten(const uint16_t *a, int64_t a_rs, int64_t a_cs, const uint16_t *b, int64_t b_rs,
                              int64_t b_cs, int64_t M, int64_t K, int64_t N, const uint16_t *bias, int bias_after,
                              int form, uint16_t *c);
/* The order the GEMMs follow (linear's and attention's): MKL's own (CKP_GEMM_ORDER_MKL: the order above, with
 * its skinny paths, on one thread) or MKL's strict Conditional Numerical Reproducibility order
 * (CKP_GEMM_ORDER_STRICT, what MKL_CBWR=...,STRICT makes MKL run at any thread count: K in blocks of 384, two
 * sharing K <= 768, else the remainder last; no skinny paths), or its AVX2 branch's strict order
 * (CKP_GEMM_ORDER_STRICT_AVX2: MKL_CBWR=AVX2,STRICT; blocks of 192), or its AVX2 branch's own order on one
 * thread (CKP_GEMM_ORDER_AVX2: on a CPU without AVX-512, or an AMD one with it but Zen 4; K in blocks of 192; 2-3 rows: the 16-lane dot products). Read from MKL_CBWR
 * and the CPU once, as MKL reads them; ckp_set_gemm_order overrides it. */
enum {
    CKP_GEMM_ORDER_MKL = 0,
    CKP_GEMM_ORDER_STRICT = 1,
    CKP_GEMM_ORDER_STRICT_AVX2 = 2,
    CKP_GEMM_ORDER_AVX2 = 3
};
ckp_status ckp_set_gemm_order(int order);
int ckp_get_gemm_order(void);
/* 1 where MKL's AUTO branch runs its AVX2 code on this CPU: AVX2 and FMA without AVX-512, or an AMD CPU with
 * AVX-512 other than Zen 4 (family 19h; measured on a Zen 5, family 1Ah, MKL 2024.2); else 0. The one place the
 * rule is written (ckparity.cpu reads it). */
int ckp_mkl_auto_runs_avx2(void);
/* dbias (N) = dy (M x N, contiguous) summed over its rows in torch.sum's order (autograd's bias
 * gradient of F.linear), on torch_threads as torch splits a one-column sum. */
ckp_status ckp_linear_dbias(const float *dy, int64_t M, int64_t N, float *dbias, int torch_threads);
/* The same of a bf16 dy into a bf16 dbias: the float32 sums in torch.sum's order for a bf16 tensor (its
 * vectors of 16 bf16 values where float32's are of 8 floats), each rounded once. */
ckp_status ckp_linear_dbias_bf16(const uint16_t *dy, int64_t M, int64_t N, uint16_t *dbias, int torch_threads);

/* ------------------------------------------------------------------------
 * attention (csrc/attention.c): F.scaled_dot_product_attention without mask or
 * dropout, float32, as ATen's CPU flash kernel computes it (its blocks, its
 * exps, its online softmax; its GEMMs in MKL's one-thread order). q (B, Hq,
 * Tq, d), k and v (B, Hkv, Tk, d), each by its batch, head and position
 * strides (3 each; the head dim contiguous); Hq a multiple of Hkv (query head
 * h reads kv head h / (Hq / Hkv)). scale: the softmax scale (torch's default
 * is 1 / sqrt(d)), converted to float. out (B, Hq, Tq, d) and lse (B, Hq, Tq)
 * contiguous. The backward takes dout by its strides as q (ATen's flash
 * backward reads grad_out.transpose(1, 2) made contiguous: MKL's small sgemm on
 * its AVX2 branch reads where its rows start), out contiguous as out, the
 * forward's lse, and writes dq (B, Hq, Tq, d), dk and dv (B, Hkv, Tk, d) by
 * their strides (each row its own; ATen's backward writes them as (B, T, H, d)
 * buffers, and MKL's small paths on its AVX2 branch sum a row of C from its
 * 16-byte boundary: where the rows start moves bits).
 * torch_threads >= 1: torch.get_num_threads(). ATen runs a pass whose
 * parallel loop has one item (the forward's B x Hq x q blocks, the backward's
 * B x Hkv) on the calling thread, where MKL has torch's threads: its GEMMs
 * then follow MKL at that count (ckp_gemm's). The same bits at any count of
 * this library's threads.
 * ---------------------------------------------------------------------- */
ckp_status ckp_attention_forward(const float *q, const int64_t *q_strides, const float *k, const int64_t *k_strides,
                                 const float *v, const int64_t *v_strides, int64_t B, int64_t Hq, int64_t Hkv,
                                 int64_t Tq, int64_t Tk, int64_t d, double scale, int is_causal, float *out,
                                 float *lse, int torch_threads);
ckp_status ckp_attention_backward(const float *dout, const int64_t *dout_strides, const float *q,
                                  const int64_t *q_strides, const float *k,
                                  const int64_t *k_strides, const float *v, const int64_t *v_strides,
                                  const float *out, const float *lse, int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq,
                                  int64_t Tk, int64_t d, double scale, int is_causal, float *dq,
                                  const int64_t *dq_strides, float *dk, const int64_t *dk_strides, float *dv,
                                  const int64_t *dv_strides, int torch_threads);
/* The same in bfloat16 (q, k, v, dout, out, dq, dk, dv bf16; lse float32), as torch's bf16 flash kernel computes it
 * where its GEMMs are MKL's (its AVX2 code) and ATen's own or oneDNN's AVX-512 bf16 ones (no AMX: csrc/attention.c's
 * [Note: ATen's bf16 flash attention]): P and dS rounded to bf16 for the GEMMs that read them, dQ, dK and dV
 * accumulated in bf16 by the GEMM bf16_gemm names. */
ckp_status ckp_attention_forward_bf16(const uint16_t *q, const int64_t *q_strides, const uint16_t *k,
                                      const int64_t *k_strides, const uint16_t *v, const int64_t *v_strides, int64_t B,
                                      int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t d, double scale,
                                      int is_causal, uint16_t *out, float *lse, int torch_threads);
/* Which GEMM torch's bf16 flash backward adds its dQ, dK and dV blocks through: ATen's own bf16 loops (where
 * torch's bf16 matmul runs no oneDNN) or oneDNN's AVX-512 bf16 brgemm (no AMX: [Note: oneDNN's AVX-512 bf16
 * order]), which ATen takes for a block's GEMM of more than 16^3 multiply-adds (smaller ones: its own loops). */
typedef enum { CKP_BF16_GEMM_ATEN = 0, CKP_BF16_GEMM_ONEDNN = 1 } ckp_bf16_gemm;
ckp_status ckp_attention_backward_bf16(const uint16_t *dout, const int64_t *dout_strides, const uint16_t *q,
                                       const int64_t *q_strides, const uint16_t *k, const int64_t *k_strides,
                                       const uint16_t *v, const int64_t *v_strides, const uint16_t *out,
                                       const float *lse, int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk,
                                       int64_t d, double scale, int is_causal, uint16_t *dq, const int64_t *dq_strides,
                                       uint16_t *dk, const int64_t *dk_strides, uint16_t *dv,
                                       const int64_t *dv_strides, int bf16_gemm, int torch_threads);

/* ------------------------------------------------------------------------
 * embedding (csrc/embedding.c): F.embedding over n indices (int64, each in
 * [0, V)) into a (V, D) weight: out (n, D) = weight[idx]; its backward
 * dweight (V, D) = the rows of dout added per index in index order from
 * zeros, none for padding_idx (-1: none). float32, and bfloat16 with each
 * add rounded as torch's bf16 add_ rounds it. Outputs may overlap nothing.
 * ---------------------------------------------------------------------- */
ckp_status ckp_embedding_forward(const int64_t *idx, int64_t n, const float *weight, int64_t V, int64_t D,
                                 float *out);
ckp_status ckp_embedding_forward_bf16(const int64_t *idx, int64_t n, const uint16_t *weight, int64_t V, int64_t D,
                                      uint16_t *out);
ckp_status ckp_embedding_backward(const float *dout, const int64_t *idx, int64_t n, int64_t V, int64_t D,
                                  int64_t padding_idx, float *dweight);
ckp_status ckp_embedding_backward_bf16(const uint16_t *dout, const int64_t *idx, int64_t n, int64_t V, int64_t D,
                                       int64_t padding_idx, uint16_t *dweight);

/* ------------------------------------------------------------------------
 * residual (csrc/residual.c): out = x + y over n elements, as torch.add:
 * float32, and bfloat16 computed in float and rounded once. out may be x or
 * y exactly (in place); any other overlap is refused.
 * ---------------------------------------------------------------------- */
ckp_status ckp_residual_add(const float *x, const float *y, int64_t n, float *out);
ckp_status ckp_residual_add_bf16(const uint16_t *x, const uint16_t *y, int64_t n, uint16_t *out);

/* ------------------------------------------------------------------------
 * adamw (csrc/adamw.c) = one step of torch.optim.AdamW's single-tensor path
 * on one parameter tensor, updating param and the moments in place.
 * ---------------------------------------------------------------------- */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    int amsgrad;   /* keep max_exp_avg_sq and normalize by it */
    int maximize;  /* ascend: use -grad */
    int fused;     /* torch.optim.AdamW(fused=True)'s kernel instead of the single-tensor path:
                      the math in float from the unrounded moments, only the stores rounded */
} ckp_adamw_options;

/* param, grad, exp_avg, exp_avg_sq are (n); max_exp_avg_sq is (n) with
 * amsgrad, else may be NULL. step is the step count after this step's
 * increment (1 on the first step), as torch's state["step"] holds it. */
ckp_status ckp_adamw_step(float *param, const float *grad, float *exp_avg, float *exp_avg_sq,
                          float *max_exp_avg_sq, int64_t n, double step,
                          const ckp_adamw_options *opt);

/* The same step on a bfloat16 parameter (uint16_t), its bf16 gradient and bf16
 * moments, as torch.optim.AdamW's default (single-tensor) path steps one: every
 * op computing in float and rounding its result to bf16 (csrc/adamw.c). */
ckp_status ckp_adamw_step_bf16(uint16_t *param, const uint16_t *grad, uint16_t *exp_avg, uint16_t *exp_avg_sq,
                               uint16_t *max_exp_avg_sq, int64_t n, double step, const ckp_adamw_options *opt);

/* ------------------------------------------------------------------------
 * grad_norm (csrc/clip_grad_norm.c): the total norm used by
 * torch.nn.utils.clip_grad_norm_: the norm_type-norm of the per-tensor norms
 * of count tensors (tensors[k] has sizes[k] floats). norm_type is > 0 or
 * INFINITY. A NaN anywhere gives NaN, an inf gives inf: never a finite norm.
 * ---------------------------------------------------------------------- */
ckp_status ckp_grad_norm(const float *const *tensors, const int64_t *sizes, int64_t count,
                         double norm_type, double *total_norm);

/* ------------------------------------------------------------------------
 * rope (csrc/rope.c): rotary position embedding of x (N, T, d), N = batch x
 * heads, d even, with cos and sin (T, d/2): one angle per position and
 * frequency. Layouts: rotate-half (Llama) and interleaved pairs. out and dx
 * may not overlap any input.
 * ---------------------------------------------------------------------- */
typedef enum {
    CKP_ROPE_HALF = 0,        /* (x[i], x[i + d/2]) rotate together */
    CKP_ROPE_INTERLEAVED = 1  /* (x[2i], x[2i + 1]) rotate together */
} ckp_rope_layout;

ckp_status ckp_rope_forward(const float *x, const float *cos, const float *sin, int64_t N, int64_t T, int64_t d,
                            int layout, float *out);

/* dout and dx are (N, T, d): the gradient of x (the transpose rotation). */
ckp_status ckp_rope_backward(const float *dout, const float *cos, const float *sin, int64_t N, int64_t T,
                             int64_t d, int layout, float *dx);

/* The same in bfloat16 (x, cos, sin, out all bf16 as uint16_t), bit-identical to
 * torch's bf16 ops: each product rounded to bf16, then the sum (csrc/rope.c). */
ckp_status ckp_rope_forward_bf16(const uint16_t *x, const uint16_t *cos, const uint16_t *sin, int64_t N, int64_t T,
                                 int64_t d, int layout, uint16_t *out);
ckp_status ckp_rope_backward_bf16(const uint16_t *dout, const uint16_t *cos, const uint16_t *sin, int64_t N,
                                  int64_t T, int64_t d, int layout, uint16_t *dx);

/* The same in float16 (uint16_t: IEEE binary16 bits), each op rounding to float16 as torch's Half
 * ops do. */
ckp_status ckp_rope_forward_f16(const uint16_t *x, const uint16_t *cos, const uint16_t *sin, int64_t N, int64_t T,
                                int64_t d, int layout, uint16_t *out);
ckp_status ckp_rope_backward_f16(const uint16_t *dout, const uint16_t *cos, const uint16_t *sin, int64_t N,
                                 int64_t T, int64_t d, int layout, uint16_t *dx);

/* ------------------------------------------------------------------------
 * vocab-parallel cross_entropy (csrc/vocab_parallel_cross_entropy.c): class
 * targets, logits split by vocabulary; this rank holds columns
 * [vocab_start, vocab_start + V_local) of V. The caller all-reduces between
 * the passes: MAX over row_max, SUM over sums (N, 3 doubles). See the file.
 * ---------------------------------------------------------------------- */
ckp_status ckp_vocab_parallel_ce_max(const float *logits, int64_t N, int64_t V_local, float *row_max);
ckp_status ckp_vocab_parallel_ce_sums(const float *logits, const int64_t *target, int64_t N, int64_t V_local,
                                      int64_t vocab_start, int64_t V, int64_t ignore_index,
                                      const float *global_max, double *sums);
ckp_status ckp_vocab_parallel_ce_loss(const int64_t *target, int64_t N, int64_t V, int64_t ignore_index,
                                      double label_smoothing, double z_loss, const float *global_max,
                                      const double *global_sums, float *loss_rows);
/* row_grad (N) is each row's upstream gradient (the reduction's 1/count
 * folded in); dlogits (N, V_local) may be logits (in place). */
ckp_status ckp_vocab_parallel_ce_backward(const float *logits, const int64_t *target, int64_t N, int64_t V_local,
                                          int64_t vocab_start, int64_t V, int64_t ignore_index,
                                          double label_smoothing, double z_loss, const float *global_max,
                                          const double *global_sums, const float *row_grad, float *dlogits);

/* ------------------------------------------------------------------------
 * compare (csrc/compare.c): the harness's comparison of two float32 tensors
 * of n elements in one pass: max |a - b| in double over the elements that
 * differ (NaN in both counts as equal; NaN in one only gives NaN), max |b|
 * (NaN if b has a NaN), and the number of elements that differ.
 * ---------------------------------------------------------------------- */
ckp_status ckp_compare(const float *a, const float *b, int64_t n, double *max_abs_diff, double *max_abs_b,
                       int64_t *differing);

/* CKP_CDEF_END */

#ifdef __cplusplus
}
#endif

#endif /* CKPARITY_H */
