"""How two twins' tensors are compared: max-abs difference, the normwise
relative difference max|a - b| / max|b|, and the same difference in ULPs of
the tensor's dtype at its largest value, max|a - b| / ulp(max|b|) -- the
one measure that reads alike in float32 and bfloat16 (a bf16 loss near 10
moves in steps of 2**-4), per named tensor."""

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


# the spacing of a dtype's values in [1, 2)
EPSILON = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7, torch.float64: 2.0**-52}


def ulp_at(value: float, dtype: torch.dtype) -> float:
    """One ULP of ``dtype`` at |value| (at the smallest normal below it)."""
    exponent = math.frexp(max(abs(value), torch.finfo(dtype).tiny))[1] - 1
    return math.ldexp(EPSILON[dtype], exponent)


def tensor_figures(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(max |a-b|, max |a-b| / max |b|, max |a-b| in ULPs of b's dtype at
    max |b|) in float64; inf if either side is non-finite where the other is not."""
    if a.numel() == 0:
        return 0.0, 0.0, 0.0
    abs_diff, scale = _figures(a, b)
    if math.isnan(abs_diff):
        return math.inf, math.inf, math.inf
    if abs_diff == 0:
        return 0.0, 0.0, 0.0
    if not (scale > 0 and math.isfinite(scale)):
        return abs_diff, math.inf, math.inf
    return abs_diff, abs_diff / scale, abs_diff / ulp_at(scale, b.dtype)


def tensor_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a-b|, max |a-b| / max |b|): tensor_figures without the ULPs."""
    return tensor_figures(a, b)[:2]


def worst_diff(pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """The named pair with the largest max-abs difference, its figures, the
    largest ULP difference of any pair (``ulp``), and whether every pair is
    identical (a max-abs difference of 0 is bit equality up to the sign of
    zero, which torch.equal ignores too)."""
    best = {"abs": 0.0, "rel": 0.0, "tensor": None, "identical": True, "ulp": 0.0}
    for name, (a, b) in pairs.items():
        abs_diff, rel, ulps = tensor_figures(a, b)
        identical, most_ulps = best["identical"] and abs_diff == 0.0, max(best["ulp"], ulps)
        if best["tensor"] is None or abs_diff > best["abs"]:  # tensor_figures never returns NaN
            best = {"abs": abs_diff, "rel": rel, "tensor": name}
        best["identical"], best["ulp"] = identical, most_ulps
    return best
