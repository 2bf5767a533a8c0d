"""The twins' precision: float32, pure bfloat16 (--dtype) or mixed
precision (--amp), applied to both twins by the same code, so that the CK
twin meets exactly the casts the torch twin does.

- pure bf16: the model is built in float32 (the seed's init, as every run)
  and cast to bf16 before the twins copy it; params, grads, activations and
  AdamW's moments are bf16, and every CK kernel runs its bf16 form;
- --amp bfloat16: float32 master weights and optimizer; each micro-step's
  forward and loss run under ``torch.autocast("cpu", torch.bfloat16)``, so
  the linears (and attention) run in bf16 on both twins and the C kernels
  receive whatever dtype autocast hands them (swiglu gets bf16, the
  residual stream and its rms_norm stay float32). Autocast upcasts
  ``F.cross_entropy``'s logits to float32; a C loss is no ATen op, so the
  loss of both twins is called on ``logits.float()`` -- the very cast
  autocast makes -- and returns float32 as torch's does."""

from __future__ import annotations

import contextlib
from functools import wraps

import torch

from ..._tensors import DTYPES


def cast_model(model: torch.nn.Module, config) -> torch.nn.Module:
    """The model in --dtype (its buffers too: llama's rope tables are then the
    float32 tables rounded once, as Hugging Face's Llama casts them)."""
    return model.to(DTYPES[config.dtype])


def autocast(config):
    """The context each micro-step's forward and loss run in."""
    if config.amp == "none":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=DTYPES[config.amp])


def float_loss(loss):
    """``loss`` on float32 logits: autocast's cast of F.cross_entropy's
    input, made explicitly so that a C loss gets it too."""
    @wraps(loss)
    def on_float(logits, targets, **kwargs):
        return loss(logits.float(), targets, **kwargs)
    return on_float
