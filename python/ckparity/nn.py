"""Drop-in torch.nn modules backed by ckparity's kernels."""

from __future__ import annotations

import torch

from .ops.cross_entropy import cross_entropy


class CrossEntropyLoss(torch.nn.Module):
    """torch.nn.CrossEntropyLoss on the C kernel, plus ``z_loss`` and ``variant``."""

    def __init__(
        self,
        weight: torch.Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        *,
        z_loss: float = 0.0,
        variant: str = "default",
    ) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.variant = variant

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
        )
