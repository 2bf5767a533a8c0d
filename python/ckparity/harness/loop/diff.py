"""How two twins' tensors are compared: max-abs difference, and the
normwise relative difference max|a - b| / max|b|, per named tensor."""

from __future__ import annotations

import math

import torch

from ... import _bindings
from ...measure import abs_diff64


def _figures(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a-b| with NaN where one side only is NaN, max |b|): one pass in C
    for float32 pairs (the harness's own hot loop), torch in float64 otherwise."""
    if a.dtype == b.dtype == torch.float32 and a.shape == b.shape:
        abs_diff, scale, _ = _bindings.compare(a.detach().contiguous(), b.detach().contiguous())
        return abs_diff, scale
    diff = abs_diff64(a, b)
    return float(diff.max()), float(b.detach().double().abs().max())


def tensor_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a-b|, max |a-b| / max |b|) in float64; inf if either side is
    non-finite where the other is not."""
    if a.numel() == 0:
        return 0.0, 0.0
    abs_diff, scale = _figures(a, b)
    if math.isnan(abs_diff):
        return math.inf, math.inf
    rel = abs_diff / scale if scale > 0 and math.isfinite(scale) else (0.0 if abs_diff == 0 else math.inf)
    return abs_diff, rel


def worst_diff(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """The named pair with the largest max-abs difference, its figures, and
    whether every pair is identical (a max-abs difference of 0 is bit
    equality up to the sign of zero, which torch.equal ignores too)."""
    best = {"abs": 0.0, "rel": 0.0, "tensor": None, "identical": True}
    for name, (a, b) in pairs.items():
        abs_diff, rel = tensor_diff(a, b)
        identical = best["identical"] and abs_diff == 0.0
        if best["tensor"] is None or abs_diff > best["abs"]:  # tensor_diff never returns NaN
            best = {"abs": abs_diff, "rel": rel, "tensor": name}
        best["identical"] = identical
    return best
