"""ckparity.clip_grad_norm_: torch.nn.utils.clip_grad_norm_ with the norm
reduced in C (csrc/clip_grad_norm.c)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from .._native import check, ffi, lib
from .._tensors import pointer, require_float32


def grad_norm(tensors: list[torch.Tensor], norm_type: float = 2.0) -> float:
    """The norm_type-norm of all the tensors together, in double; NaN/inf propagate."""
    for k, t in enumerate(tensors):
        require_float32(t, f"gradient {k}")
    contiguous = [t.contiguous() for t in tensors]
    pointers = ffi.new("float *[]", [pointer(t) for t in contiguous])
    sizes = ffi.new("int64_t[]", [t.numel() for t in contiguous])
    total = ffi.new("double *")
    check(lib.ckp_grad_norm(pointers, sizes, len(contiguous), float(norm_type), total), "grad_norm")
    return total[0]


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
    """Scales the gradients in place so that their total norm is at most
    max_norm, as torch.nn.utils.clip_grad_norm_ does (coefficient
    max_norm / (total_norm + 1e-6), clamped at 1). Returns the total norm as a
    float32 tensor. A NaN or inf gradient gives a NaN or inf norm (and a
    RuntimeError with error_if_nonfinite=True), never a finite one."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if not (norm_type > 0):
        raise ValueError(f"norm_type must be > 0 or inf, got {norm_type}")
    if not grads:
        return torch.tensor(0.0)
    total_norm = torch.tensor(grad_norm(grads, norm_type), dtype=torch.float32)
    if error_if_nonfinite and not math.isfinite(float(total_norm)):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
            "anyway, set `error_if_nonfinite=False`")
    # torch's float32 arithmetic for the coefficient, so the scaling matches it.
    clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(clip_coef)
    return total_norm
