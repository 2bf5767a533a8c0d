"""Drop-in torch.nn modules backed by ckparity's kernels."""

from __future__ import annotations

import torch

from .ops.cross_entropy import cross_entropy
from .ops.rms_norm import rms_norm
from .ops.swiglu import swiglu


class CrossEntropyLoss(torch.nn.Module):
    """torch.nn.CrossEntropyLoss on the C kernel, plus ``z_loss``, ``variant`` and ``inplace_backward``."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        *,
        z_loss: float = 0.0,
        variant: str = "default",
        inplace_backward: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.variant = variant
        self.inplace_backward = inplace_backward

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(
            input,
            target,
            self.weight,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            z_loss=self.z_loss,
            variant=self.variant,
            inplace_backward=self.inplace_backward,
        )


class RMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm on the C kernel (same arguments and state_dict)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape = shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class SwiGLU(torch.nn.Module):
    """[..., 2H] -> [..., H]: silu(first half) * second half."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x)
