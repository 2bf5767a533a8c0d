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
