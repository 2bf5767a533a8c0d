"""ckparity.rms_norm: F.rms_norm on the C kernel (csrc/rms_norm.c)."""

from __future__ import annotations

import math

import torch

from .._native import check, lib
from .._tensors import pointer, require_float32

# torch's eps=None: the float32 machine epsilon (ATen: numeric_limits<float>::epsilon()).
DEFAULT_EPS = torch.finfo(torch.float32).eps


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        N, D = x.shape
        y = torch.empty_like(x)
        rstd = torch.empty(N, dtype=torch.float32)
        check(lib.ckp_rms_norm_forward(pointer(x), pointer(weight), N, D, eps, pointer(y), pointer(rstd)),
              "rms_norm")
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        N, D = x.shape
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        dweight = torch.empty_like(weight) if weight is not None else None
        check(lib.ckp_rms_norm_backward(pointer(dy), pointer(x), pointer(weight), pointer(rstd), N, D,
                                        pointer(dx), pointer(dweight)), "rms_norm backward")
        return dx, dweight, None


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """F.rms_norm: normalizes over the trailing ``normalized_shape`` dimensions
    by 1/sqrt(mean(x^2) + eps), then scales by ``weight``. eps=None is float32's
    machine epsilon, as in torch. Non-contiguous inputs are copied."""
    require_float32(input, "input")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) == 0 or input.dim() < len(shape) or tuple(input.shape[-len(shape):]) != shape:
        raise ValueError(f"normalized_shape {shape} must match the trailing dimensions of input "
                         f"{tuple(input.shape)}")
    if weight is not None:
        require_float32(weight, "weight")
        if tuple(weight.shape) != shape:
            raise ValueError(f"weight must have shape {shape}, got {tuple(weight.shape)}")
        weight = weight.contiguous()
    eps = DEFAULT_EPS if eps is None else float(eps)
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    D = math.prod(shape)
    x = input.reshape(-1, D).contiguous()
    if x.numel() == 0:
        return input * (weight if weight is not None else 1.0)
    return _RMSNormFunction.apply(x, weight, eps).reshape(input.shape)
