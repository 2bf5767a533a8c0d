"""Checks and pointer casts shared by every op: one place decides what a
tensor handed to the C library must be."""

from __future__ import annotations

import torch

from ._native import ffi

_C_TYPES = {torch.float32: "float *", torch.int64: "int64_t *", torch.float64: "double *"}


def require_cpu(tensor: torch.Tensor, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise TypeError(
            f"{name} is on device {tensor.device}; ckparity's kernels run on the CPU only "
            f"(move it with .cpu())"
        )


def require_float32(tensor: torch.Tensor, name: str) -> None:
    require_cpu(tensor, name)
    if tensor.dtype != torch.float32:
        raise TypeError(
            f"{name} must be float32, got {tensor.dtype}; ckparity's kernels are float32 "
            f"(convert with .float() if that is what you mean)"
        )


def pointer(tensor: torch.Tensor | None):
    """A cffi pointer to a contiguous CPU tensor's data (NULL for None)."""
    if tensor is None:
        return ffi.NULL
    assert tensor.is_contiguous(), "internal: pointer() needs a contiguous tensor"
    return ffi.cast(_C_TYPES[tensor.dtype], tensor.data_ptr())
