/*
 * mutants.h — the numerics mutants of `ckparity mutate` (python/ckparity/mutate.py).
 *
 * A mutant is a realistic numerics bug planted at one place in a kernel, to
 * prove that the parity gates can fail: `ckparity mutate` builds the library
 * with -DCKP_MUTANT_ID=CKP_MUT_<NAME> in a scratch build directory, loads it
 * through CKP_LIB and runs the gates against it. Every real build has
 * CKP_MUTANT_ID 0, so each CKP_MUTANT(x) below is the constant 0 and the
 * compiler drops the mutant's code; it is still parsed and type-checked in
 * every build, so the catalogue cannot rot. The names here and in mutate.py's
 * catalogue are the same (tests/test_mutate.py checks).
 */
#ifndef CKP_MUTANTS_H
#define CKP_MUTANTS_H

enum {
    CKP_MUT_NONE = 0,
    CKP_MUT_CE_FLOAT_ACCUMULATOR,      /* sum of exps in one float instead of 8 double lanes */
    CKP_MUT_CE_CHEAP_EXP,              /* exp by a degree-3 polynomial instead of degree 6 */
    CKP_MUT_CE_MEAN_COUNTS_IGNORED,    /* the mean's denominator counts ignored rows */
    CKP_MUT_CE_IGNORED_GRAD_NOT_ZEROED,/* ignored rows' dlogits left as they were */
    CKP_MUT_CE_SMOOTHING_WRONG_V,      /* label smoothing divided by V - 1 */
    CKP_MUT_CE_PROB_CLAMP,             /* nll as -log(p_t + 1e-10) */
    CKP_MUT_CE_BLOCKS_REVERSED,        /* the row blocks' losses combined last to first */
    CKP_MUT_RMS_EPS_OUTSIDE_SQRT,      /* 1 / (sqrt(mean) + eps) */
    CKP_MUT_RMS_SUM_REVERSED,          /* the sum of squares right to left */
    CKP_MUT_SWIGLU_SWAP_BACKWARD,      /* gate and up halves swapped in backward only */
    CKP_MUT_SWIGLU_LIBM_EXP,           /* the C library's expf on every element */
    CKP_MUT_ADAMW_BIAS_CORRECTION_FLOAT, /* 1 - beta^step in float */
    CKP_MUT_ADAMW_NO_BIAS_CORRECTION,  /* bias corrections left out */
    CKP_MUT_ADAMW_COUPLED_DECAY,       /* weight decay added to the gradient (Adam's L2, not AdamW) */
    CKP_MUT_ADAMW_EPS_INSIDE_SQRT,     /* denom = sqrt(v / bc2 + eps) */
    CKP_MUT_ADAMW_LERP_UNFUSED,        /* the moment's lerp rounded twice where torch's build fuses it */
    CKP_MUT_RMS_DWEIGHT_ASSOCIATION,   /* dweight's term (dy * x) * rstd instead of dy * (x * rstd) */
    CKP_MUT_RMS_BACKWARD_NO_RSTD_TERM, /* dx without the gradient through rstd */
    CKP_MUT_RMS_BACKWARD_MEAN_OFF_BY_ONE, /* the backward's mean divided by D - 1 */
    CKP_MUT_SWIGLU_UNFUSED_SLOPE,      /* g * (1 - s) + 1 rounded twice where torch's build fuses it */
    CKP_MUT_ROPE_BACKWARD_NOT_TRANSPOSED, /* the backward rotates by +angle, as the forward */
    CKP_MUT_ROPE_LAST_PAIR_SKIPPED,    /* the row's last rotated pair copied, not rotated (an off-by-one tail) */
    CKP_MUT_PTREF_LIBM_LOG,            /* ptref's log(sum) by libm's logf instead of torch's SLEEF log */
    CKP_MUT_PTREF_UNFUSED_BACKWARD,    /* ptref's g - exp(logp) * sum rounded twice where torch fuses it */
    CKP_MUT_PTREF_SMOOTHING_CASCADE_DENOMINATOR, /* smoothing's weighted mean over nll_loss's cascade total */
    CKP_MUT_CE_ZLOSS_NO_GRAD,          /* the z-loss term left out of dlogits */
    CKP_MUT_VP_CE_FLOAT_SUMS,          /* the vocab-parallel sums of exps in float */
    CKP_MUT_VP_CE_SHARD_START_TARGET,  /* a target in the shard's first column not counted as owned */
    CKP_MUT_GRAD_NORM_FLOAT_ACCUMULATOR, /* the squares summed in float */
    CKP_MUT_COMPARE_TAIL_SKIPPED,      /* the harness's comparison ignores each block's last n % 8 elements */
    CKP_MUT_COMPARE_NAN_EQUAL,         /* a NaN on one side only compared as equal */
    CKP_MUT_PTREF_FULL_SUM_UNSPLIT,    /* probability targets' sum over every element in one piece, where torch splits it across its threads */
    CKP_MUT_ADAMW_FUSED_BC2_UNDER_SQRT, /* fused=True: sqrt(v / bc2) where torch's fused kernel divides sqrt(v) by sqrt(bc2) */
    CKP_MUT_ADAMW_FUSED_TAIL_AS_VECTOR, /* fused=True: the scalar tail contracts exp_avg_sq's update as the vector loop does */
};

#ifndef CKP_MUTANT_ID
#define CKP_MUTANT_ID CKP_MUT_NONE
#endif
#define CKP_MUTANT(name) (CKP_MUTANT_ID == CKP_MUT_##name)

#endif /* CKP_MUTANTS_H */
