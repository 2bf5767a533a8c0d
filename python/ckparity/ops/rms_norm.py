"""ckparity.rms_norm: F.rms_norm on the C kernel (csrc/rms_norm.c)."""

from __future__ import annotations

import math

import torch

from .. import _bindings
from .._tensors import require_float32
from ..errors import InvalidArgument
from ._function import first_order_only

# torch's eps=None: the float32 machine epsilon (ATen: numeric_limits<float>::epsilon()).
DEFAULT_EPS = torch.finfo(torch.float32).eps


class _RMSNormFunction(torch.autograd.Function):
    """First-order only: see ops/_function.py."""

    @staticmethod
    def forward(x, weight, eps):
        y = torch.empty_like(x)
        rstd = torch.empty(x.shape[0], dtype=torch.float32)
        _bindings.rms_norm_forward(x, weight, eps, y, rstd)
        return y, rstd

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, _ = inputs
        _, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(x, weight, rstd)

    @staticmethod
    @first_order_only
    def backward(ctx, dy, _drstd):
        x, weight, rstd = ctx.saved_tensors
        dx = torch.empty_like(x)
        dweight = torch.empty_like(weight) if weight is not None else None
        _bindings.rms_norm_backward(dy.contiguous(), x, weight, rstd, dx, dweight)
        return dx, dweight, None


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """F.rms_norm: normalizes over the trailing ``normalized_shape`` dimensions
    by 1/sqrt(mean(x^2) + eps), then scales by ``weight``. eps=None is float32's
    machine epsilon, as in torch. Non-contiguous inputs are copied."""
    require_float32(input, "input")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) == 0 or input.dim() < len(shape) or tuple(input.shape[-len(shape):]) != shape:
        raise InvalidArgument(f"normalized_shape {shape} must match the trailing dimensions of input "
                              f"{tuple(input.shape)}")
    if weight is not None:
        require_float32(weight, "weight")
        if tuple(weight.shape) != shape:
            raise InvalidArgument(f"weight must have shape {shape}, got {tuple(weight.shape)}")
        weight = weight.contiguous()
    eps = DEFAULT_EPS if eps is None else float(eps)
    if not (eps >= 0 and math.isfinite(eps)):
        raise InvalidArgument(f"eps must be finite and >= 0, got {eps}")
    if input.numel() == 0:  # no rows, or rows of width 0: torch returns the empty shape, graph kept
        return input * (weight if weight is not None else 1.0)
    x = input.reshape(-1, math.prod(shape)).contiguous()
    y, _ = _RMSNormFunction.apply(x, weight, eps)
    return y.reshape(input.shape)
