"""The torch formulations ckparity is measured against, written once: the
harness's torch twin, the gates, the bench and the tests all use these."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """[..., 2H] -> [..., H]: silu of the first half times the second half."""
    H = x.shape[-1] // 2
    return F.silu(x[..., :H]) * x[..., H:]


def adamw(params, **kwargs) -> torch.optim.AdamW:
    """torch.optim.AdamW on its single-tensor path (foreach and fused off): the
    path ckparity's AdamW repeats operation by operation."""
    return torch.optim.AdamW(params, foreach=False, fused=False, **kwargs)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "half") -> torch.Tensor:
    """Rotary position embedding of x (..., T, d) with cos, sin (T, d/2).
    half: Llama's x * cos + rotate_half(x) * sin with the (T, d/2) tables
    repeated to (T, d); interleaved: the pairs (x[2i], x[2i+1]) rotated."""
    if layout == "half":
        h = x.shape[-1] // 2
        rotated = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
        return x * torch.cat((cos, cos), dim=-1) + rotated * torch.cat((sin, sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
