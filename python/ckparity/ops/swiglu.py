"""ckparity.swiglu: F.silu(gate) * up on the C kernel (csrc/swiglu.c)."""

from __future__ import annotations

import torch

from .._native import check, lib
from .._tensors import pointer, require_float32


class _SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        N, H2 = x.shape
        out = torch.empty(N, H2 // 2, dtype=torch.float32)
        check(lib.ckp_swiglu_forward(pointer(x), N, H2 // 2, pointer(out)), "swiglu")
        ctx.save_for_backward(x)
        return out

    @staticmethod
    def backward(ctx, dout):
        (x,) = ctx.saved_tensors
        N, H2 = x.shape
        dout = dout.contiguous()
        dx = torch.empty_like(x)
        check(lib.ckp_swiglu_backward(pointer(dout), pointer(x), N, H2 // 2, pointer(dx)), "swiglu backward")
        return dx


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """[..., 2H] -> [..., H]: F.silu(x[..., :H]) * x[..., H:]."""
    require_float32(x, "x")
    if x.dim() == 0 or x.shape[-1] % 2 != 0 or x.shape[-1] == 0:
        raise ValueError(f"swiglu needs a last dimension of even size 2H > 0, got shape {tuple(x.shape)}")
    H2 = x.shape[-1]
    flat = x.reshape(-1, H2).contiguous()
    out_shape = x.shape[:-1] + (H2 // 2,)
    if flat.shape[0] == 0:
        return x[..., : H2 // 2] * 0.0
    return _SwiGLUFunction.apply(flat).reshape(out_shape)
