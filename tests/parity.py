"""Measures used by every parity test: ULP distance to torch, error against a
float64 evaluation of the same formula, and the rule that ties them together."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

# Every measurement a test makes, written to reports/parity_latest.json at the
# end of the session (see conftest.py) so figures can be quoted with their source.
MEASUREMENTS: list[dict] = []


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 whose order matches the floats' order (adjacent floats differ by 1)."""
    bits = x.detach().contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def max_ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest ULP distance between float32 tensors, over the elements of b at
    least 1e-3 of b's largest magnitude (near zero, ULPs measure nothing);
    NaN in both counts 0, NaN in one only counts 2**31."""
    a, b = a.detach().float().flatten(), b.detach().float().flatten()
    finite = b[torch.isfinite(b)]
    if finite.numel():
        significant = ~(b.abs() < 1e-3 * finite.abs().max())
        a, b = a[significant], b[significant]
    both_nan = torch.isnan(a) & torch.isnan(b)
    if (torch.isnan(a) != torch.isnan(b)).any():
        return 2**31
    distance = (ordered_bits(a) - ordered_bits(b)).abs()
    distance = torch.where(both_nan, torch.zeros_like(distance), distance)
    return int(distance.max()) if distance.numel() else 0


def error64(x: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest |x - reference| with the reference in float64; matching non-finite values count 0."""
    x64, ref = x.detach().double(), reference.detach().double()
    same = (x64 == ref) | (torch.isnan(x64) & torch.isnan(ref))
    diff = torch.where(same, torch.zeros_like(ref), (x64 - ref).abs())
    return float(diff.max()) if diff.numel() else 0.0


def check_parity(name: str, ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor,
                 factor: float = 2.0, floor_ulps: float = 0.5,
                 rtol: float | None = None, atol: float | None = None) -> dict:
    """Asserts ckparity's ``ours`` against torch's ``theirs`` and a float64 ``reference``:
    within torch.testing.assert_close's float32 tolerances (or tighter ones given),
    widened to twice torch's own float64 error where torch is less accurate than that,
    and with a float64 error no worse than ``factor`` times torch's, give or take
    ``floor_ulps`` float32 ULPs of the largest reference value. Returns the figures."""
    ours_error, torch_error = error64(ours, reference), error64(theirs, reference)
    if rtol is None:
        rtol, atol = 1.3e-6, 1e-5  # assert_close's float32 defaults
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=max(atol, 2 * torch_error), equal_nan=True,
                               msg=lambda m: f"{name}: {m}")
    # The floor: when torch is exact to the last bit, rounding the exact
    # float64 answer once (half an ULP) is still allowed.
    finite = reference[torch.isfinite(reference)].double()
    floor = float(finite.abs().max()) * 2.0**-23 * floor_ulps if finite.numel() else 0.0
    figures = {"name": name, "max_ulp": max_ulp(ours, theirs), "ckparity_error64": ours_error,
               "torch_error64": torch_error}
    MEASUREMENTS.append(figures)
    assert ours_error <= factor * torch_error + floor, (
        f"{name}: float64 error {ours_error:.3g} is worse than {factor}x torch's {torch_error:.3g}")
    return figures


def write_measurements(path: Path) -> None:
    if not MEASUREMENTS:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"torch": torch.__version__, "measurements": MEASUREMENTS}, indent=1))
    os.replace(tmp, path)
