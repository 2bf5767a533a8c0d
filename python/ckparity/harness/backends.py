"""What each backend flag selects. The CK twin takes its ops from here; the
torch twin always uses the "torch" entries.

Tests (and the gates) plant faults by registering extra entries with
``register``; the command line offers every registered name."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

import ckparity


def _torch_swiglu(x: torch.Tensor) -> torch.Tensor:
    H = x.shape[-1] // 2
    return F.silu(x[..., :H]) * x[..., H:]


def _torch_adamw(params, **kw):
    return torch.optim.AdamW(params, foreach=False, fused=False, **kw)


# loss functions take (logits (N, V), targets (N)) and return the mean loss.
RMSNORM: dict[str, Callable] = {"c": ckparity.rms_norm, "torch": F.rms_norm}
SWIGLU: dict[str, Callable] = {"c": ckparity.swiglu, "torch": _torch_swiglu}
LOSS: dict[str, Callable] = {
    "c": lambda logits, targets: ckparity.cross_entropy(logits, targets, variant="default"),
    "c_ptref": lambda logits, targets: ckparity.cross_entropy(logits, targets, variant="ptref"),
    "torch": F.cross_entropy,
}
# optimizers take (params, lr, betas, eps, weight_decay) like torch.optim.AdamW.
OPTIMIZER: dict[str, Callable] = {"c": ckparity.optim.AdamW, "torch": _torch_adamw}
CLIP: dict[str, Callable] = {"c": ckparity.clip_grad_norm_, "torch": torch.nn.utils.clip_grad_norm_}

TABLES = {"rmsnorm": RMSNORM, "swiglu": SWIGLU, "loss": LOSS, "optimizer": OPTIMIZER}


def register(kind: str, name: str, fn: Callable) -> None:
    """Adds a backend (e.g. a planted fault in a test) under ``--ck-<kind>-backend name``."""
    TABLES[kind][name] = fn
