"""ckparity.swiglu: F.silu(gate) * up on the C kernel (csrc/swiglu.c)."""

from __future__ import annotations

import torch

from .. import _bindings
from .._tensors import WITH_FLOAT16, empty, empty_like, plain, require_floating
from ..errors import InvalidArgument
from ._function import CFunction, first_order_only


class _SwiGLUFunction(CFunction):
    """x (..., 2H), contiguous -> (..., H): the leading dims taken as they are (a reshape around the Function
    would be two more autograd nodes per call). First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x):
        out = empty((*x.shape[:-1], x.shape[-1] // 2), x.dtype)
        _bindings.swiglu_forward(x, out)
        return out

    @staticmethod
    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    @first_order_only
    def backward(ctx, dout):
        (x,) = ctx.saved_tensors
        dx = empty_like(x)  # x is contiguous (the op made it so)
        _bindings.swiglu_backward(dout.contiguous().to(x.dtype), x, dx)
        return dx


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """[..., 2H] -> [..., H]: F.silu(x[..., :H]) * x[..., H:], in x's dtype
    (float32, or bfloat16 or float16 with torch's rounding in that dtype: out = bf16(bf16(silu) * up))."""
    if isinstance(x, torch.Tensor) and plain(x, x.dim(), WITH_FLOAT16) and x.dim() and x.shape[-1] % 2 == 0 \
            and x.numel():
        return _SwiGLUFunction.apply(x)  # the common case, without the checks' errors to build
    require_floating(x, "x", dtypes=WITH_FLOAT16)
    if x.dim() == 0 or x.shape[-1] % 2 != 0:
        raise InvalidArgument(f"swiglu needs a last dimension of even size 2H, got shape {tuple(x.shape)}")
    if x.numel() == 0:  # no rows, or H = 0: torch's empty output, and empty gradients
        return x[..., : x.shape[-1] // 2] * 0.0
    return _SwiGLUFunction.apply(x.contiguous())
