"""The zoo's scenarios: each a class of bug people ship, with where it was
reported, planted through a public door -- a backend of zoo/bugs.py on one
slot, and the flags of the run it shows in. docs/zoo.md says how to add one."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import kernels


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str           # the kernel record the bug is planted in (attribute's kind): the right answer to "blamed"
    bug: str            # its backend in zoo/bugs.py (registered as zoo_<bug>)
    what: str           # the bug, in a line
    source: str         # where people reported it
    flags: dict = field(default_factory=dict)  # the run it shows in (RunConfig fields)
    resume_at: int = 0  # > 0: the run stops here with a checkpoint and is resumed (the bug is in the resume)

    @property
    def slot(self) -> str:
        return self.kind

    @property
    def flag(self) -> str:
        return kernels.KERNELS[self.kind].flag

    @property
    def backend(self) -> str:
        return f"zoo_{self.bug}"


# a GPT-2 scenario's run: every other slot bitwise (kernels.record.GPT2_RUN says why: GPT-2's key bias's
# gradient is rounding noise, which the C AdamW's last bits would turn into a parameter failure of their own)
GPT2 = {"model": "gpt2", "ck_optimizer_backend": "torch"}

SCENARIOS = [
    Scenario("grad_accum_ragged_ignore", "cross_entropy", "ce_grad_counts_ignored_rows",
             "under gradient accumulation with ragged ignore_index, the gradient is divided by every row of the "
             "micro-batch, ignored ones included (the loss itself is right)",
             "https://github.com/linkedin/Liger-Kernel/issues/802", {"grad_accum": 4, "ignore_frac": 0.3}),
    Scenario("ignored_rows_in_the_mean", "cross_entropy", "ce_mean_counts_ignored_rows",
             "the mean loss divides by all rows, ignore_index rows counted",
             "https://github.com/linkedin/Liger-Kernel/issues/1082", {"ignore_frac": 0.3}),
    Scenario("label_smoothing_over_v_minus_1", "cross_entropy", "ce_smoothing_over_v_minus_1",
             "label smoothing spreads eps over the V-1 wrong classes where torch spreads eps/V over all V",
             "https://github.com/k2-fsa/icefall/issues/107", {"label_smoothing": 0.1}),
    Scenario("loss_backward_ignores_upstream_grad", "cross_entropy", "ce_backward_ignores_upstream",
             "the loss's backward returns the gradient it made in forward, ignoring the upstream gradient: "
             "the 1/K of gradient accumulation is lost (gradients K times too large)",
             "https://github.com/huggingface/trl/issues/5890", {"grad_accum": 4}),
    Scenario("vocab_shard_offset_off_by_one", "cross_entropy", "ce_vocab_shard_off_by_one",
             "a vocabulary shard finds its targets at t - offset + 1",
             "https://github.com/apple/ml-cross-entropy/pull/59"),
    Scenario("adamw_eps_inside_sqrt", "adamw", "adamw_eps_inside_sqrt",
             "AdamW's eps inside the square root: sqrt(v_hat + eps)",
             "https://github.com/keras-team/keras/issues/17391"),
    Scenario("adamw_bias_correction_off_by_one", "adamw", "adamw_bias_correction_ahead",
             "the bias corrections use step + 1",
             "https://github.com/Oneflow-Inc/oneflow/pull/5960"),
    Scenario("adamw_l2_not_decoupled", "adamw", "adamw_decay_in_gradient",
             "weight decay added to the gradient (Adam + L2) instead of decoupled",
             "https://github.com/pytorch/pytorch/pull/41679", {"adamw_weight_decay": 0.1}),
    Scenario("adamw_other_default_eps", "adamw", "adamw_other_default_eps",
             "another framework's default eps (1e-7) where torch's 1e-8 is configured: a slow drift",
             "https://github.com/keras-team/tf-keras/issues/315"),
    Scenario("rmsnorm_eps_outside_sqrt", "rms_norm", "rms_eps_outside_sqrt",
             "RMSNorm's eps added to the root, x / (sqrt(mean(x^2)) + eps)",
             "https://github.com/allenai/OLMo/issues/281"),
    Scenario("gemma_one_plus_w", "rms_norm", "rms_gemma_one_plus_w",
             "Gemma's (1 + w) weight where the model means w",
             "https://github.com/linkedin/Liger-Kernel/issues/74"),
    Scenario("rmsnorm_backward_forgets_weight", "rms_norm", "rms_backward_forgets_weight",
             "RMSNorm's dx computed without the weight: invisible while the weight is still 1",
             "https://github.com/karpathy/llm.c/pull/763"),
    Scenario("rmsnorm_leans_below_ulp", "rms_norm", "rms_leans_below_ulp",
             "a moved rounding point: every fourth output one ULP away from 0, below an ULP on average, "
             "always the same way",
             "https://github.com/vllm-project/vllm/issues/42325"),
    Scenario("rope_interleaved_for_rotate_half", "rope", "rope_interleaved",
             "RoPE pairs (2i, 2i+1) where the model's layout pairs (i, i + d/2)",
             "https://github.com/ohdearquant/lattice/issues/392", {"model": "llama"}),
    Scenario("linear_k_tail_dropped", "linear", "linear_k_tail_dropped",
             "a GEMM that steps K 16 at a time with no remainder loop: a width of 100 loses its last 4 columns",
             "https://github.com/CNugteren/myGEMM/issues/1", {"d_model": 100}),
    Scenario("linear_accumulates_in_bf16", "linear", "linear_accumulates_in_bf16",
             "a GEMM whose accumulator is the output's bf16: every 16-deep block's sum rounded to 8 bits",
             "https://github.com/pytorch/pytorch/pull/188998"),
    Scenario("linear_transposed_wrong_stride", "linear", "linear_transposed_wrong_stride",
             "the transposed weight read with the leading dimension of the other layout (right for no shape "
             "but hidden by square tests)",
             "https://github.com/mikkyang/rust-blas/issues/6"),
    Scenario("linear_bias_twice", "linear", "linear_bias_twice",
             "the bias added in the GEMM's epilogue and again by the layer around it",
             # GPT-2's projections are the twins' biased linears
             "https://github.com/casper-hansen/AutoAWQ/issues/369", GPT2),
    Scenario("attention_without_causal_mask", "attention", "attention_no_causal_mask",
             "the causal mask never applied: each position sees the tokens it is trained to predict",
             "https://github.com/facebookresearch/xformers/issues/103", {"model": "llama"}),
    Scenario("softmax_without_max_subtraction", "attention", "attention_softmax_unshifted",
             "attention's softmax as exp(s) / sum(exp(s)): a score past 88.7 overflows and the row is NaN",
             "https://github.com/pytorch/executorch/pull/18407", {"model": "llama"}),
    Scenario("gqa_kv_heads_tiled", "attention", "attention_gqa_heads_tiled",
             "GQA's kv heads tiled (query head h reads kv head h % kv_heads) where torch groups them (h // group)",
             # two kv heads for four query heads: with as many kv heads as heads (llama's default) no head is shared
             "https://github.com/onnx/onnx/pull/7274", {"model": "llama", "kv_heads": 2}),
    Scenario("attention_backward_without_lse", "attention", "attention_backward_without_lse",
             "a flash backward that recomputes the probabilities as exp(s - max) without the saved logsumexp: "
             "never normalized",
             "https://github.com/Dao-AILab/flash-attention/issues/1012", {"model": "llama"}),
    Scenario("embedding_backward_drops_repeats", "embedding", "embedding_backward_drops_repeats",
             "the embedding's gradient scattered, not added: a repeated token keeps its last use's gradient",
             "https://github.com/tenstorrent/tt-metal/issues/6232"),
    Scenario("layer_norm_unbiased_variance", "layer_norm", "layer_norm_unbiased_variance",
             "LayerNorm divided by the unbiased variance (D - 1) where torch's is the biased one (D)",
             "https://github.com/LBANN/lbann/pull/2024", GPT2),
    Scenario("layer_norm_dbeta_wrong_axis", "layer_norm", "layer_norm_dbeta_wrong_axis",
             "LayerNorm's dbeta summed along the wrong axis of the (N, D) gradient (read as (D, N))",
             "https://github.com/flagos-ai/FlagGems/issues/5392", GPT2),
    Scenario("gelu_erf_where_tanh_asked", "gelu", "gelu_erf_where_tanh_asked",
             "GELU's erf form where GPT-2's tanh form is asked (the form argument ignored)",
             "https://github.com/kyutai-labs/pocket-tts/pull/278", GPT2),
    Scenario("gelu_tanh_where_erf_asked", "gelu", "gelu_tanh_where_erf_asked",
             "GELU's tanh approximation where F.gelu's default erf form is asked (an engine with only the tanh form)",
             "https://github.com/huggingface/candle/pull/900", dict(GPT2, gelu="erf")),
    Scenario("position_embedding_grad_never_written", "embedding", "embedding_position_grad_dropped",
             "the learned position table's gradient never written: the positions never train",
             "https://github.com/jadore801120/attention-is-all-you-need-pytorch/issues/33", GPT2),
    Scenario("clip_norm_of_one_shard", "clip_grad_norm", "clip_norm_of_one_shard",
             "clip_grad_norm over one rank's shard of the params, the norm never all-reduced",
             "https://github.com/pytorch/torchtitan/issues/596", {"max_grad_norm": 0.05}),
    Scenario("resume_loses_optimizer_step", "adamw", "adamw_step_not_saved",
             "the optimizer's step count is not in its state_dict: after a resume the bias corrections start over",
             "https://github.com/NVIDIA-NeMo/Automodel/issues/763", resume_at=100),
    Scenario("thread_count_dependent_sum", "rms_norm", "rms_thread_split_sum",
             "the sum of squares split into one block per thread: the bits depend on the thread count",
             "https://github.com/hypre-space/hypre/issues/467", {"threads": 2}),
    Scenario("bf16_sum_accumulated_in_bf16", "rms_norm", "rms_sum_in_input_dtype",
             "a bf16 run's sum of squares kept in bf16 across blocks where float was meant (d_model 256: 4 blocks)",
             "https://github.com/pytorch/pytorch/issues/92164",
             # the bug-free bf16 run (c_ptref, the C AdamW) is bit-identical to torch's: a user expects bits
             {"dtype": "bfloat16", "d_model": 256, "expect_bitwise": True}),
]

BY_NAME = {s.name: s for s in SCENARIOS}
