"""The harness's flags (the seed's, with the seed's defaults) and their checks."""

from __future__ import annotations

import argparse
import math

from . import backends


class UsageError(ValueError):
    """A bad flag value (exit code 2)."""


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--model", choices=["tiny", "stacked"], default="tiny")
    a("--num-layers", type=int, default=2, help="blocks of the stacked model")
    a("--epochs", type=int, default=1)
    a("--seq-len", type=int, default=8)
    a("--total-tokens", type=int, default=131072)
    a("--vocab", type=int, default=256)
    a("--d-model", type=int, default=64)
    a("--hidden", type=int, default=128)
    a("--eps", type=float, default=1e-5, help="RMSNorm eps")
    a("--grad-accum", type=int, default=1, help="micro-steps per optimizer step (K)")
    a("--optimizer", choices=["adamw", "sgd"], default="adamw")
    a("--lr", type=float, default=1e-3)
    a("--adamw-beta1", type=float, default=0.9)
    a("--adamw-beta2", type=float, default=0.999)
    a("--adamw-eps", type=float, default=1e-8)
    a("--adamw-weight-decay", type=float, default=0.01)
    a("--seed", type=int, default=42)
    a("--max-steps", type=int, default=0, help="0: all steps of all epochs")
    a("--loss-tol", type=float, default=2e-5, help="max |loss difference| per step")
    a("--param-tol", type=float, default=3e-5, help="max |param difference| per step")
    a("--logit-tol", type=float, default=1e-4, help="max |logit difference| per step")
    a("--grad-tol", type=float, default=1e-5, help="max |grad difference| per step")
    a("--moment-tol", type=float, default=1e-5, help="max |AdamW moment difference| per step")
    a("--train-text", default=None, help="train on this file's bytes mod vocab")
    a("--ignore-frac", type=float, default=0.0, help="fraction of targets set to ignore_index")
    a("--max-grad-norm", type=float, default=0.0, help="clip both twins' gradients (0: off)")
    a("--threads", type=int, default=0, help="ckparity's and torch's threads (0: leave as is)")
    a("--localize-step", type=int, default=0, help="localize at this step (0: the first failing step)")
    a("--json-out", default=None, help="report path (default reports/train_latest.json)")
    a("--no-progress", action="store_true", help="no progress bar even on a terminal")
    for kind, default in (("rmsnorm", "c"), ("swiglu", "c"), ("loss", "c"), ("optimizer", "c")):
        a(f"--ck-{kind}-backend", default=default,
          help=f"one of {sorted(backends.TABLES[kind])} (default {default})")


def validate(config: argparse.Namespace) -> None:
    positive = ["epochs", "seq_len", "total_tokens", "vocab", "d_model", "hidden", "grad_accum", "num_layers"]
    for name in positive:
        if getattr(config, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")
    non_negative = ["max_steps", "threads", "localize_step", "max_grad_norm", "adamw_weight_decay", "adamw_eps",
                    "loss_tol", "param_tol", "logit_tol", "grad_tol", "moment_tol"]
    for name in non_negative:
        value = getattr(config, name)
        if not (value >= 0 and math.isfinite(value)):
            raise UsageError(f"--{name.replace('_', '-')} must be finite and >= 0, got {value}")
    if not (config.lr > 0 and math.isfinite(config.lr)):
        raise UsageError(f"--lr must be finite and > 0, got {config.lr}")
    if not (config.eps >= 0 and math.isfinite(config.eps)):
        raise UsageError(f"--eps must be finite and >= 0, got {config.eps}")
    for name in ("adamw_beta1", "adamw_beta2"):
        if not 0 <= getattr(config, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(config, name)}")
    if not 0 <= config.ignore_frac < 1:
        raise UsageError(f"--ignore-frac must be in [0, 1), got {config.ignore_frac}")
    for kind in backends.TABLES:
        value = getattr(config, f"ck_{kind}_backend")
        if value not in backends.TABLES[kind]:
            raise UsageError(f"--ck-{kind}-backend must be one of {sorted(backends.TABLES[kind])}, got {value!r}")


def parse_train_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ckparity train")
    add_train_arguments(parser)
    config = parser.parse_args(argv)
    validate(config)
    return config
