"""ckparity.rope: rotary position embedding on the C kernel (csrc/rope.c),
bit-identical to the torch formulation in ckparity.reference.rope."""

from __future__ import annotations

import torch

from .. import _bindings
from .._tensors import WITH_FLOAT16, empty_like, require_floating
from ..errors import InvalidArgument
from ._function import CFunction, first_order_only


class _RoPEFunction(CFunction):
    """First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, cos, sin, layout):
        x = x.contiguous()  # here, not before the Function: a copy there is an autograd node or two more
        out = empty_like(x)
        _bindings.rope_forward(x, cos, sin, layout, out)
        return out

    @staticmethod
    def save(ctx, inputs, output):
        _, cos, sin, layout = inputs
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout

    @staticmethod
    @first_order_only
    def backward(ctx, dout):
        cos, sin = ctx.saved_tensors
        dout = dout.contiguous().to(cos.dtype)
        dx = empty_like(dout)
        _bindings.rope_backward(dout, cos, sin, ctx.layout, dx)
        return dx, None, None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, layout: str = "half") -> torch.Tensor:
    """Rotates x (..., T, d) — queries or keys, d the head dim (even) — by the
    angles whose cosines and sines are cos, sin (T, d/2). layout "half"
    rotates (x[i], x[i + d/2]) as Llama does, "interleaved" (x[2i], x[2i+1]).
    Gradients flow to x; cos and sin are tables (a gradient of them raises).
    float32, or bfloat16 or float16 (x, cos and sin alike) with torch's rounding in
    that dtype: each product, then the sum."""
    require_floating(x, "x", dtypes=WITH_FLOAT16)
    require_floating(cos, "cos", like=x, dtypes=WITH_FLOAT16)
    require_floating(sin, "sin", like=x, dtypes=WITH_FLOAT16)
    if layout not in _bindings.ROPE_LAYOUTS:
        raise InvalidArgument(f"layout must be one of {sorted(_bindings.ROPE_LAYOUTS)}, got {layout!r}")
    if x.dim() < 2 or x.shape[-1] % 2 != 0 or x.shape[-1] == 0:
        raise InvalidArgument(f"rope needs x of shape (..., T, d) with an even head dim d > 0, got {tuple(x.shape)}")
    T, d = x.shape[-2], x.shape[-1]
    if cos.shape != (T, d // 2) or sin.shape != (T, d // 2):
        raise InvalidArgument(f"cos and sin must have shape (T, d/2) = {(T, d // 2)}, got {tuple(cos.shape)} "
                              f"and {tuple(sin.shape)}")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise NotImplementedError("ckparity.rope differentiates with respect to x, not cos or sin")
    if x.numel() == 0:
        return x * 1.0
    return _RoPEFunction.apply(x, cos.contiguous(), sin.contiguous(), layout)
