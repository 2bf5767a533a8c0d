"""The run config: a frozen value, checked when it is made.

``RunConfig()`` is the seed's defaults; presets are values derived from it
(``replace(REPRO_PRESET, max_steps=150)``), and the command line is one way
to fill it: every field is a flag of ``ckparity train`` with the seed's
spelling (``max_steps`` is ``--max-steps``). A bad value raises UsageError
(exit code 2) whichever way the config was made, before any work starts."""

from __future__ import annotations

import argparse
import math
from dataclasses import MISSING, asdict, dataclass, field, fields, replace

from ... import kernels


class UsageError(ValueError):
    """A bad flag, config value or input file (exit code 2)."""


def _flag(default, help: str, **argparse_kwargs):
    return field(default=default, metadata={"help": help, **argparse_kwargs})


@dataclass(frozen=True)
class RunConfig:
    model: str = _flag("tiny", "the twin model (gpt2: llm.c's GPT-2, its MLP 4 x --d-model wide, its lm_head tied)",
                       choices=["tiny", "stacked", "llama", "gpt2"])
    num_layers: int = _flag(2, "blocks of the stacked, llama and gpt2 models")
    heads: int = _flag(4, "llama, gpt2: attention heads (d-model / heads is the head dim, even for llama's rope)")
    kv_heads: int = _flag(0, "llama: key/value heads for grouped-query attention (0: as many as --heads)")
    rope_theta: float = _flag(10000.0, "llama: the rotary embedding's base")
    tie_embeddings: bool = _flag(False, "llama: lm_head shares the embedding matrix")
    gelu: str = _flag("tanh", "gpt2: its MLP's GELU (tanh: GPT-2's and llm.c's; erf: F.gelu's default, as BERT-style "
                              "models use)", choices=["tanh", "erf"])
    batch_size: int = _flag(1, "windows per micro-step (B)")
    epochs: int = _flag(1, "passes over the token stream")
    seq_len: int = _flag(8, "tokens per micro-batch")
    total_tokens: int = _flag(131072, "tokens in the stream (a --train-text is repeated until it has them)")
    vocab: int = _flag(256, "vocabulary size V")
    d_model: int = _flag(64, "model width D")
    hidden: int = _flag(128, "SwiGLU hidden width H")
    eps: float = _flag(1e-5, "RMSNorm eps (LayerNorm's with --model gpt2)")
    dtype: str = _flag("float32", "both twins' params, grads, activations and AdamW state: bfloat16 trains in pure bf16 "
                                  "(as Liger's convergence tests do); the CK twin's kernels run their bf16 forms",
                       choices=["float32", "bfloat16"])
    amp: str = _flag("none", "mixed precision: float32 master weights and AdamW, forward under torch.autocast('cpu', "
                             "bfloat16) on both twins, the loss on float32 logits as autocast gives torch's",
                     choices=["none", "bfloat16"])
    grad_accum: int = _flag(1, "micro-steps per optimizer step (K)")
    optimizer: str = _flag("adamw", "both twins' optimizer (sgd: torch's SGD on both)", choices=["adamw", "sgd"])
    lr: float = _flag(1e-3, "learning rate (the peak, with --lr-schedule or --warmup-steps)")
    lr_schedule: str = _flag("constant", "both twins' lr per step after the warmup, by torch's scheduler classes "
                                         "(harness/longrun/schedule.py)", choices=["constant", "linear", "cosine"])
    warmup_steps: int = _flag(0, "steps of linear warmup from lr/W to lr")
    checkpoint_every: int = _flag(0, "write a checkpoint every N steps, and after the step a SIGTERM/SIGINT/SIGHUP "
                                     "arrives in (0: none; harness/longrun/checkpoint.py)")
    checkpoint_dir: str | None = _flag(None, "where checkpoints go (default reports/checkpoint); a directory that holds "
                                             "anything else, or another run's checkpoints, is refused")
    overwrite_checkpoints: bool = _flag(False, "a fresh run may start over in a --checkpoint-dir that holds another "
                                               "run's checkpoints (only ckparity's own entries are removed)")
    resume: str | None = _flag(None, "go on from the latest checkpoint in this directory, with its config (only "
                                     "--max-steps, --json-out, --no-progress and the checkpoint flags may differ)")
    dump_step: int = _flag(0, "dump both twins' state before this step, its batch, activations and gradients "
                              "(0: none; ckparity replay DIR recomputes it)")
    dump_dir: str | None = _flag(None, "where --dump-step writes (default reports/dump-step-N)")
    init_from: str | None = _flag(None, "start both twins from these weights (safetensors, a torch state_dict or a checkpoint directory; "
                                        "Hugging Face Llama names with --model llama, GPT-2's with --model gpt2); the dims come "
                                        "from them")
    torch_adamw: str = _flag("single_tensor", "the torch twin's AdamW: torch's default CPU path (single_tensor, "
                                              "the one the C AdamW follows) or fused=True (fused: its math in float, "
                                              "the stores rounded)", choices=["single_tensor", "fused"])
    adamw_beta1: float = _flag(0.9, "AdamW beta1")
    adamw_beta2: float = _flag(0.999, "AdamW beta2")
    adamw_eps: float = _flag(1e-8, "AdamW eps")
    adamw_weight_decay: float = _flag(0.01, "AdamW weight decay")
    seed: int = _flag(42, "seed of the weights, the tokens and the ignored targets")
    max_steps: int = _flag(0, "0: all steps of all epochs")
    loss_tol: float = _flag(2e-5, "max |loss difference| per step (the tolerances are float32's: a bf16 run's are "
                                  "these x 2**16, as many ULPs of its dtype at every magnitude)")
    param_tol: float = _flag(3e-5, "max |param difference| per step")
    logit_tol: float = _flag(1e-4, "max |logit difference| per step")
    grad_tol: float = _flag(1e-5, "max |grad difference| per step")
    moment_tol: float = _flag(1e-5, "max |AdamW moment difference| per step")
    train_text: str | None = _flag(None, "train on this file's bytes mod vocab")
    ignore_frac: float = _flag(0.0, "fraction of targets set to ignore_index")
    label_smoothing: float = _flag(0.0, "both twins' cross-entropy label smoothing")
    max_grad_norm: float = _flag(0.0, "clip both twins' gradients (0: off)")
    threads: int = _flag(0, "ckparity's and torch's threads (0: leave as is)")
    torch_threads: int = _flag(0, "torch's threads where they differ from --threads (0: as --threads)")
    localize_step: int = _flag(0, "localize at this step (0: the first failing step)")
    json_out: str | None = _flag(None, "report path (default reports/train_latest.json)")
    no_progress: bool = _flag(False, "no progress bar even on a terminal")
    f64_shadow: bool = _flag(False, "train a third twin in float64 and say which float32 twin is closer to it")
    shadow_every: int = _flag(10, "with --f64-shadow: a one-step local-error probe every N steps")
    envelope: int = _flag(0, "train K noise twins (torch with seeded ULP-level kernel noise) and judge the CK "
                             "twin's drift as a ratio to their envelope (0: off)")
    envelope_ratio: float = _flag(4.0, "with --envelope: the noise ratio above which the drift is beyond noise")
    expect_bitwise: bool = _flag(False, "fail the run when the twins' bits differ at any step (a configuration "
                                        "bit-identical to torch, e.g. c_ptref with torch's AdamW): no tolerance "
                                        "to hide a bug under")
    spike_triage: bool = _flag(False, "when a twin's loss jumps, replay the step in CK, torch and float64 from "
                                      "one state and say whose fault it is (report key spikes)")
    tp: int = _flag(1, "tensor parallel: the CK twin's lm_head and loss split by vocabulary over N ranks")
    dp: int = _flag(1, "data parallel: the CK twin's micro-batches split over N ranks, gradients summed")
    rank_timeout: float = _flag(300.0, "with --tp/--dp: seconds a rank waits for the others before the run ends "
                                       "with an error")
    hang_timeout: float = _flag(600.0, "with a user's backend (a run in a child that keeps its place): seconds "
                                       "the run may stay between two slot calls before it is called hung, killed "
                                       "and reported where it stood; 0: wait forever")
    # The CK twin's kernels, by the seed's flags; kernels.FLAGS maps each
    # flag to its kernel and names the choices.
    ck_rmsnorm_backend: str = _flag("c", "the CK twin's rms_norm")
    ck_swiglu_backend: str = _flag("c", "the CK twin's swiglu")
    ck_loss_backend: str = _flag("c", "the CK twin's cross_entropy (c: default variant, c_ptref: ptref)")
    ck_rope_backend: str = _flag("c", "the CK twin's rope (llama)")
    ck_optimizer_backend: str = _flag("c", "the CK twin's adamw")
    ck_clip_backend: str = _flag("c", "the CK twin's clip_grad_norm (with --max-grad-norm)")
    ck_embedding_backend: str = _flag("torch", "the CK twin's embedding")
    ck_linear_backend: str = _flag("torch", "the CK twin's linear (every projection and the lm_head)")
    ck_attention_backend: str = _flag("torch", "the CK twin's attention (llama)")
    ck_residual_backend: str = _flag("torch", "the CK twin's residual add (stacked, llama)")
    ck_gelu_backend: str = _flag("c", "the CK twin's gelu (gpt2)")
    ck_layer_norm_backend: str = _flag("c", "the CK twin's layer_norm (gpt2)")
    ck_all: str = _flag("", "every slot the CK twin calls that has a backend of this name runs it, but for a slot "
                            "whose flag is given (on the command line: typed, even as its default; in RunConfig: "
                            "set to other than its default); the report's config names each slot's backend, ck_all "
                            "itself is spent on them")

    def __post_init__(self) -> None:
        _apply_ck_all(self)
        _validate(self)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def compute_dtype(self) -> str:
        """The dtype the twins compute in: --dtype, or --amp's under autocast."""
        return self.amp if self.amp != "none" else self.dtype

    def tolerance(self, name: str) -> float:
        """The tolerance field ``name`` (``loss_tol``, ...) in the compute
        dtype's terms: the flags are float32's, and a bfloat16 run's are
        scaled by bf16's ULP over float32's (2**-7 / 2**-23), so that each
        allows as many ULPs of its dtype at every magnitude. Under --amp too:
        the loss, grads and master params there all come from bf16 matmuls."""
        return getattr(self, name) * TOLERANCE_SCALE[self.compute_dtype]


# the tolerance flags' unit per compute dtype: one ULP at 1.0 over float32's
TOLERANCE_SCALE = {"float32": 1.0, "bfloat16": 2.0**16}


def _name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _apply_ck_all(config: RunConfig) -> None:
    """--ck-all NAME: NAME in every slot the CK twin calls that has it, where the slot's flag is at its default
    (a flag given another value keeps it; a slot without NAME keeps its default). Spent on the flags: ck_all is
    "" after, so that a replace() of one flag (attribute's ablations) is not undone by it."""
    if not config.ck_all:
        return
    defaults, used = RunConfig.__dataclass_fields__, kernels_used(config)
    takers = [flag for flag, kernel in kernels.FLAGS.items()
              if kernel in used and config.ck_all in kernels.backends(kernel)]
    if not takers:
        raise UsageError(f"--ck-all {config.ck_all}: no slot this run calls has a backend of that name "
                         f"({', '.join(sorted({b for k in used for b in kernels.backends(k)}))})")
    for flag in takers:
        if getattr(config, flag) == defaults[flag].default:
            object.__setattr__(config, flag, config.ck_all)  # frozen: set while the value is being made
    object.__setattr__(config, "ck_all", "")


def _validate(config: RunConfig) -> None:
    for f in fields(config):
        if f.metadata.get("choices") and getattr(config, f.name) not in f.metadata["choices"]:
            raise UsageError(f"{_name(f.name)} must be one of {f.metadata['choices']}, got {getattr(config, f.name)!r}")
    positive = ["epochs", "seq_len", "total_tokens", "vocab", "d_model", "hidden", "grad_accum", "num_layers",
                "shadow_every", "heads", "batch_size", "tp", "dp"]
    for name in positive:
        if getattr(config, name) < 1:
            raise UsageError(f"{_name(name)} must be >= 1, got {getattr(config, name)}")
    non_negative = ["envelope", "max_steps", "warmup_steps", "checkpoint_every", "dump_step", "threads", "torch_threads", "localize_step", "max_grad_norm", "adamw_weight_decay", "adamw_eps",
                    "loss_tol", "param_tol", "logit_tol", "grad_tol", "moment_tol"]
    for name in non_negative:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise UsageError(f"{_name(name)} must be finite and >= 0, got {value}")
    if not (config.envelope_ratio > 0 and math.isfinite(config.envelope_ratio)):
        raise UsageError(f"--envelope-ratio must be finite and > 0, got {config.envelope_ratio}")
    if not (config.lr > 0 and math.isfinite(config.lr)):
        raise UsageError(f"--lr must be finite and > 0, got {config.lr}")
    if not (config.eps >= 0 and math.isfinite(config.eps)):
        raise UsageError(f"--eps must be finite and >= 0, got {config.eps}")
    for name in ("adamw_beta1", "adamw_beta2"):
        if not 0 <= getattr(config, name) < 1:
            raise UsageError(f"{_name(name)} must be in [0, 1), got {getattr(config, name)}")
    if not 0 <= config.ignore_frac < 1:
        raise UsageError(f"--ignore-frac must be in [0, 1), got {config.ignore_frac}")
    if not 0 <= config.label_smoothing <= 1:
        raise UsageError(f"--label-smoothing must be in [0, 1], got {config.label_smoothing}")

    for name, kernel in kernels.FLAGS.items():
        try:
            kernels.resolve(kernel, getattr(config, name))
        except ValueError as err:
            raise UsageError(f"{_name(name)}: {err}") from None
    if config.kv_heads < 0:
        raise UsageError(f"--kv-heads must be >= 0, got {config.kv_heads}")
    if not (config.rope_theta > 0 and math.isfinite(config.rope_theta)):
        raise UsageError(f"--rope-theta must be finite and > 0, got {config.rope_theta}")
    if config.model == "llama":
        if config.d_model % config.heads or (config.d_model // config.heads) % 2:
            raise UsageError(f"--d-model {config.d_model} must split into --heads {config.heads} heads of an even "
                             f"head dim")
        if config.heads % (config.kv_heads or config.heads):
            raise UsageError(f"--heads {config.heads} must be a multiple of --kv-heads {config.kv_heads}")
    if config.model == "gpt2" and config.d_model % config.heads:
        raise UsageError(f"--d-model {config.d_model} must split into --heads {config.heads} heads")
    # flags that could not take effect: refused, never silently ignored
    defaults = RunConfig.__dataclass_fields__
    unused = []
    if config.model != "llama":  # GPT-2's heads are all query-and-kv heads, no rope, its lm_head always tied
        unused += [n for n in ("heads", "kv_heads", "rope_theta", "tie_embeddings")
                   if getattr(config, n) != defaults[n].default and not (n == "heads" and config.model == "gpt2")]
    if config.model == "gpt2" and config.hidden != defaults["hidden"].default:
        unused.append("hidden")
    if config.model != "gpt2" and config.gelu != defaults["gelu"].default:
        unused.append("gelu")
    used = kernels_used(config)
    unused += [flag for flag, kernel in kernels.FLAGS.items()
               if kernel not in used and getattr(config, flag) != defaults[flag].default]
    if config.model == "tiny" and config.num_layers != defaults["num_layers"].default:
        unused.append("num_layers")
    if not config.f64_shadow and config.shadow_every != defaults["shadow_every"].default:
        unused.append("shadow_every")
    if not config.envelope and config.envelope_ratio != defaults["envelope_ratio"].default:
        unused.append("envelope_ratio")
    if config.overwrite_checkpoints and (not config.checkpoint_every or config.resume):
        unused.append("overwrite_checkpoints")
    if config.optimizer == "sgd" and config.torch_adamw != defaults["torch_adamw"].default:
        unused.append("torch_adamw")
    if unused:
        why = {"hidden": "with --model gpt2 (its MLP is 4 x --d-model wide)", "shadow_every": "without --f64-shadow", "envelope_ratio": "without --envelope", "num_layers": "with --model tiny",
               "ck_clip_backend": "without --max-grad-norm",
               "ck_loss_backend": "with --tp (the CK loss is the vocab-parallel cross-entropy)",
               "ck_optimizer_backend": "with --optimizer sgd (both twins run torch's SGD)",
               "torch_adamw": "with --optimizer sgd (both twins run torch's SGD)",
               "overwrite_checkpoints": "without --checkpoint-every, or with --resume (a resume goes on in its own "
                                        "directory)"}
        name = unused[0]
        raise UsageError(f"{_name(name)} takes no effect {why.get(name, f'with --model {config.model}')}")
    _validate_ranks(config)
    loss = kernels.KERNELS["cross_entropy"].registrations.get(config.ck_loss_backend)
    if config.label_smoothing and loss is not None and "label_smoothing" in loss.unsupported:
        raise UsageError(f"--label-smoothing: the loss backend {config.ck_loss_backend!r} declares it unsupported")
    gelu = kernels.KERNELS["gelu"].registrations.get(config.ck_gelu_backend)
    if config.model == "gpt2" and config.gelu == "erf" and gelu is not None and "erf" in gelu.unsupported:
        raise UsageError(f"--gelu erf: the gelu backend {config.ck_gelu_backend!r} declares it unsupported")
    _validate_precision(config, used)


def _validate_precision(config: RunConfig, used: set[str]) -> None:
    if config.dtype != "float32" and config.amp != "none":
        raise UsageError(f"--amp keeps float32 master weights: it goes with --dtype float32, not --dtype {config.dtype}")
    if config.compute_dtype == "float32":
        return
    mode = f"--dtype {config.dtype}" if config.dtype != "float32" else f"--amp {config.amp}"
    # the fused lm_head + loss takes bf16 hidden and weight; --amp hands it a float32 master weight (with an
    # autocast bf16 hidden), a pair F.linear itself only takes through autocast's casts: no form for that
    refused = {"tp": config.tp > 1 and config.amp != "none", "dp": config.dp > 1 and config.amp != "none",
               "ck_loss_backend": config.ck_loss_backend == "c_fused_linear" and config.amp != "none"}
    why = {"ck_loss_backend": "c_fused_linear (the fused lm_head + loss takes one dtype, not autocast's pair)"}
    for name, bad in refused.items():
        if bad:
            raise UsageError(f"{_name(name)} {why.get(name, '')}{' ' if name in why else ''}is not supported with "
                             f"{mode} yet")
    from ...check.suite import refuses  # the check's own dtype probe: a small case in the dtype

    for flag, kernel in kernels.FLAGS.items():
        if kernel in _kernels_in_bf16(config, used):
            reason = refuses(kernel, getattr(config, flag), config.compute_dtype)
            if reason is not None:
                raise UsageError(f"{_name(flag)} {getattr(config, flag)}: the backend has no {config.compute_dtype} "
                                 f"form ({reason}), and {mode} hands it {config.compute_dtype} tensors")


def _kernels_in_bf16(config: RunConfig, used: set[str]) -> set[str]:
    """The kernels (of ``used``) whose CK backends meet bf16 tensors: all of
    them in pure bf16; under --amp the ones a bf16 linear feeds (swiglu, and
    rope, whose tables the model casts to q's dtype); the residual stream,
    its rms_norm, the float32 logits' loss and the optimizer stay float32."""
    if config.dtype != "float32":
        return set(used)
    return {name for name in used if kernels.KERNELS[name].amp_bf16} if config.amp != "none" else set()


def kernels_used(config: RunConfig) -> set[str]:
    """The kernels the CK twin calls in this configuration: a backend flag of
    any other takes no effect (refused by validate; gate --backend runs
    another configuration that uses it, or says it does not exercise it)."""
    return {name for name, record in kernels.KERNELS.items() if record.used_by is None or record.used_by(config)}


def _validate_ranks(config: RunConfig) -> None:
    if not (config.hang_timeout >= 0 and math.isfinite(config.hang_timeout)):
        raise UsageError(f"--hang-timeout must be finite and >= 0 (0: wait forever), got {config.hang_timeout}")
    if not (config.rank_timeout > 0 and math.isfinite(config.rank_timeout)):
        raise UsageError(f"--rank-timeout must be finite and > 0, got {config.rank_timeout}")
    if config.tp == 1 and config.dp == 1:
        if config.rank_timeout != RunConfig.__dataclass_fields__["rank_timeout"].default:
            raise UsageError("--rank-timeout takes no effect without --tp or --dp")
        return
    if config.tp > 1 and config.dp > 1:
        raise UsageError("--tp and --dp together are not supported: choose one")
    if config.spike_triage:
        raise UsageError("--spike-triage is not supported with --tp or --dp (its replay twins run in one process)")
    if config.dump_step:
        raise UsageError("--dump-step is not supported with --tp or --dp yet (its dump is one process's step)")
    if config.tp > 1:
        if config.tp > config.vocab:
            raise UsageError(f"--tp {config.tp} is more ranks than --vocab {config.vocab} has columns")
        # the loss is the C vocab-parallel cross-entropy; the lm_head is sharded
        refused = {"tie_embeddings": config.tie_embeddings or config.model == "gpt2",
                   "max_grad_norm": config.max_grad_norm > 0, "label_smoothing": config.label_smoothing > 0}
        why = {"tie_embeddings": "(--model gpt2's lm_head is tied) is not supported with --tp (the sharded lm_head "
                                 "cannot share the embedding)",
               "max_grad_norm": "is not supported with --tp (the norm would need the shards' sum)",
               "label_smoothing": "is not supported with --tp (the sharded twin's loss takes none)"}
        for name, bad in refused.items():
            if bad:
                raise UsageError(f"{_name(name)} {why[name]}")
    if config.dp > config.grad_accum:
        raise UsageError(f"--dp {config.dp} needs --grad-accum >= {config.dp}: each rank runs whole micro-batches")


# the names people type for a dtype (Accelerate's and Lightning's --mixed-precision bf16), as ckparity's
DTYPE_SPELLINGS = {"bf16": "bfloat16", "bf16-mixed": "bfloat16", "fp32": "float32", "32": "float32",
                   "no": "none"}


def dtype_name(text: str) -> str:
    """A --dtype or --amp value as ckparity names it (bf16: bfloat16); anything else as given, for the
    choices to judge."""
    return DTYPE_SPELLINGS.get(text.strip().lower(), text)


def add_train_arguments(parser: argparse.ArgumentParser, suppress: bool = False) -> None:
    """Every RunConfig field as a flag; the defaults are RunConfig's (with
    ``suppress``, none: the parsed values are the flags given)."""
    for f in fields(RunConfig):
        help_text = f.metadata["help"]
        if f.name in kernels.FLAGS:
            help_text += f"; one of {kernels.registered(kernels.FLAGS[f.name])}"
        if f.type == "bool":
            parser.add_argument(_name(f.name), action="store_true", help=help_text,
                                **({"default": argparse.SUPPRESS} if suppress else {}))
            continue
        kind = dtype_name if f.name in ("dtype", "amp") else {"int": int, "float": float}.get(f.type, str)
        default = f.default if f.default is not MISSING else None
        parser.add_argument(_name(f.name), type=kind, default=argparse.SUPPRESS if suppress else default,
                            choices=f.metadata.get("choices"), help=f"{help_text} (default {default})")


def given_fields(argv: list[str], extra: dict[str, dict] | None = None) -> frozenset[str]:
    """The RunConfig fields given on the command line ``argv``, whatever their
    values (a flag given with its default value is given: a resume compares it)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_train_arguments(parser, suppress=True)
    for flag, kwargs in (extra or {}).items():
        parser.add_argument(flag, **{k: v for k, v in kwargs.items() if k != "default"}, default=argparse.SUPPRESS)
    given = vars(parser.parse_known_args(argv)[0])
    return frozenset(given) & {f.name for f in fields(RunConfig)}


# every command's --plugin (cli._load_plugins takes it off the command line before a parser sees it;
# the parsers name it for --help)
PLUGIN_HELP = ("load your backends from this module or .py file (repeatable; also CKP_PLUGINS and installed "
               "packages' ckparity.backends entry points); docs/plugins.md")


def add_plugin_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE.py", help=PLUGIN_HELP)


def parse_train_args(argv: list[str], prog: str = "ckparity train",
                     extra: dict[str, dict] | None = None) -> tuple[RunConfig, dict] | RunConfig:
    """The RunConfig the flags give; with ``extra`` ({flag: argparse kwargs}),
    also the values of those flags (a command's own flags next to train's)."""
    parser = argparse.ArgumentParser(prog=prog)
    add_train_arguments(parser)
    add_plugin_argument(parser)
    for flag, kwargs in (extra or {}).items():
        parser.add_argument(flag, **kwargs)
    values = vars(parser.parse_args(argv))
    values.pop("plugin")
    own = {name: values.pop(name) for name in list(values) if name not in {f.name for f in fields(RunConfig)}}
    config = RunConfig(**values)
    # --ck-all takes the slots whose flag is at its default: a backend flag typed on the command line keeps its
    # value even when that value is the default (--ck-all c --ck-attention-backend torch runs torch's attention)
    given = given_fields(argv, extra) if values["ck_all"] else frozenset()
    typed = {flag: values[flag] for flag in kernels.FLAGS if flag in given and getattr(config, flag) != values[flag]}
    if typed:
        config = replace(config, **typed)
    return (config, own) if extra else config
