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
};

#ifndef CKP_MUTANT_ID
#define CKP_MUTANT_ID CKP_MUT_NONE
#endif
#define CKP_MUTANT(name) (CKP_MUTANT_ID == CKP_MUT_##name)

#endif /* CKP_MUTANTS_H */
