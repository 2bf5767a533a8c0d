"""What each backend flag selects: the one table from the seed's flag
spellings (``--ck-loss-backend c_ptref``) to ckparity's kernel names
(``cross_entropy``, variant ``ptref``). The CK twin takes its ops from here;
the torch twin always uses the "torch" entries.

Tests (and the gates) plant faults by registering extra entries with
``register``; the command line offers every registered name."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

import ckparity
from ckparity import reference

# loss functions take (logits (N, V), targets (N)) and return the mean loss; with --label-smoothing
# they are called with label_smoothing= too.
RMS_NORM: dict[str, Callable] = {"c": ckparity.rms_norm, "torch": F.rms_norm}
SWIGLU: dict[str, Callable] = {"c": ckparity.swiglu, "torch": reference.swiglu}
CROSS_ENTROPY: dict[str, Callable] = {
    "c": lambda logits, targets, **kw: ckparity.cross_entropy(logits, targets, variant="default", **kw),
    "c_ptref": lambda logits, targets, **kw: ckparity.cross_entropy(logits, targets, variant="ptref", **kw),
    "torch": F.cross_entropy,
}
# lm_head + loss fused, (hidden (N, D), weight (V, D), targets (N)) -> mean loss: chosen by
# --ck-loss-backend like the losses above, but it replaces the lm_head's graph too (models.Ops.head_loss)
HEAD_LOSS: dict[str, Callable] = {
    "c_fused_linear": lambda hidden, weight, targets, **kw: ckparity.fused_linear_cross_entropy(hidden, weight, targets,
                                                                                                **kw)}
# listed with the losses so that --ck-loss-backend offers it; on logits alone it is the default
# kernel, which the fused op runs on each chunk
CROSS_ENTROPY["c_fused_linear"] = CROSS_ENTROPY["c"]
# rope takes (q or k (B, heads, T, d), cos, sin (T, d/2)), rotate-half layout.
ROPE: dict[str, Callable] = {"c": lambda x, cos, sin: ckparity.rope(x, cos, sin, layout="half"),
                             "torch": lambda x, cos, sin: reference.rope(x, cos, sin, "half")}
# optimizers take (params, lr, betas, eps, weight_decay) like torch.optim.AdamW.
ADAMW: dict[str, Callable] = {"c": ckparity.optim.AdamW, "torch": reference.adamw}
CLIP_GRAD_NORM: dict[str, Callable] = {"c": ckparity.clip_grad_norm_, "torch": torch.nn.utils.clip_grad_norm_}

BACKENDS: dict[str, dict[str, Callable]] = {
    "rms_norm": RMS_NORM, "swiglu": SWIGLU, "cross_entropy": CROSS_ENTROPY, "rope": ROPE, "adamw": ADAMW,
    "clip_grad_norm": CLIP_GRAD_NORM}

# the backends ckparity itself offers (register() adds others, e.g. planted faults)
BUILTIN: dict[str, tuple[str, ...]] = {kernel: tuple(table) for kernel, table in BACKENDS.items()}

# RunConfig field (the seed's flag, --ck-loss-backend) -> kernel name
FLAGS = {"ck_rmsnorm_backend": "rms_norm", "ck_swiglu_backend": "swiglu", "ck_loss_backend": "cross_entropy",
         "ck_rope_backend": "rope", "ck_optimizer_backend": "adamw", "ck_clip_backend": "clip_grad_norm"}


def register(kernel: str, name: str, fn: Callable) -> None:
    """Adds a backend of ``kernel`` (e.g. a planted fault in a test), chosen by
    its flag (``register("cross_entropy", "fault", f)``: ``--ck-loss-backend fault``)."""
    BACKENDS[kernel][name] = fn
