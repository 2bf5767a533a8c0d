"""The parity measures shared by the tests and `ckparity gate`: ULP distance
to torch, error against a float64 evaluation of the same formula, and the
rule that ties them together."""

from __future__ import annotations

import torch

# assert_close's float32 defaults
RTOL, ATOL = 1.3e-6, 1e-5
# per dtype: assert_close's (rtol, atol) and one ULP at 1.0 (the parity rule's floor unit)
TOLERANCES = {torch.float32: (RTOL, ATOL, 2.0**-23), torch.bfloat16: (1.6e-2, 1e-5, 2.0**-7)}

# (factor, floor_ulps) of the parity rule per kernel kind. A kernel may have a
# float64 error up to 2x torch's. ptref, which repeats torch's own float
# operations, may be no worse than torch, give or take 4 ULPs of the largest
# value: its log is glibc's logf where torch's is SLEEF's logf_u10 (1 ULP apart
# at most), and log_softmax's backward multiplies exp(logp) by the row's
# gradient sum, which turns that ULP into several ULPs of the result; torch's
# own full-tensor sums also move by 1-2 ULPs with its thread count, which
# ptref cannot follow.
RULES = {"default": (2.0, 0.5), "ptref": (1.0, 4.0)}


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 whose order matches the floats' order (adjacent floats differ by 1)."""
    bits = x.detach().contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)


def max_ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest ULP distance between float32 (or bfloat16: in bf16 ULPs)
    tensors, over the elements of b at least 1e-3 of b's largest magnitude
    (near zero, ULPs measure nothing); NaN in both counts 0, NaN in one only
    counts 2**31."""
    unit = 2**16 if a.dtype == b.dtype == torch.bfloat16 else 1  # a bf16 value is a float32 with 16 zero bits
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
    return int(distance.max()) // unit if distance.numel() else 0


def differing_elements(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements of two same-shaped tensors differ (NaN equals NaN; -0 equals 0)."""
    return int((~((a == b) | (a.isnan() & b.isnan()))).sum())


def abs_diff64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| elementwise in float64, with equal values (infinities of one
    sign, NaN against NaN) counting 0; NaN where only one side is NaN."""
    a, b = a.detach().double(), b.detach().double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return torch.where(same, torch.zeros_like(b), (a - b).abs())


def error64(x: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest |x - reference| with the reference in float64; matching non-finite values count 0."""
    diff = abs_diff64(x, reference)
    return float(diff.max()) if diff.numel() else 0.0


def parity(name: str, ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor,
           factor: float = 2.0, floor_ulps: float = 0.5, rtol: float | None = None, atol: float | None = None) -> dict:
    """The parity rule: ``ours`` within rtol/atol of torch's ``theirs`` (atol widened to
    twice torch's own float64 error where torch is less accurate than that), and a
    float64 error no worse than ``factor`` times torch's, give or take ``floor_ulps``
    float32 ULPs of the largest reference value (when torch is exact to the last
    bit, rounding the exact answer once is still allowed). Returns the figures with
    ``ok`` and, when not ok, ``reason``."""
    default_rtol, default_atol, ulp = TOLERANCES.get(theirs.dtype, TOLERANCES[torch.float32])
    rtol, atol = default_rtol if rtol is None else rtol, default_atol if atol is None else atol
    ours_error, torch_error = error64(ours, reference), error64(theirs, reference)
    figures = {"name": name, "max_ulp": max_ulp(ours, theirs), "max_abs": error64(ours, theirs),
               "ckparity_error64": ours_error, "torch_error64": torch_error, "ok": True, "reason": None}
    allowed = max(atol, 2 * torch_error)
    try:
        torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=rtol, atol=allowed, equal_nan=True)
    except AssertionError as err:
        # assert_close's first line is "Tensor-likes are not close!": the figures say how far, and who is nearer
        beyond = next((line.strip() for line in str(err).splitlines() if line.strip().startswith("Mismatched")),
                      str(err).splitlines()[0])
        figures.update(ok=False, reason=f"not close to torch: {beyond}; max |diff| {figures['max_abs']:.3g} "
                                        f"(rtol {rtol:g}, atol {allowed:.3g}); float64 error {ours_error:.3g}, "
                                        f"torch's {torch_error:.3g}")
        return figures
    finite = reference[torch.isfinite(reference)].double()
    floor = float(finite.abs().max()) * ulp * floor_ulps if finite.numel() else 0.0
    if torch_error != torch_error:
        # torch's NaNs are not the float64 evaluation's (a row of -inf scores: 0/0 in one, -inf in the other);
        # ours are torch's (assert_close above holds NaN to NaN), so who is nearer is asked where torch's NaNs
        # are the reference's -- elsewhere a NaN error would fail a kernel for being torch
        where = torch.isnan(theirs.detach()) == torch.isnan(reference)
        ours_error, torch_error = error64(ours[where], reference[where]), error64(theirs[where], reference[where])
        figures.update(ckparity_error64=ours_error, torch_error64=torch_error)
    if not ours_error <= factor * torch_error + floor:
        figures.update(ok=False, reason=f"float64 error {ours_error:.3g} is worse than {factor}x torch's "
                                        f"{torch_error:.3g}")
    return figures


def nan_max(values) -> float:
    """max() that any NaN makes NaN: the builtin max keeps a NaN only if it
    comes first, and a measure that loses a NaN passes what it should fail."""
    values = [float(v) for v in values]
    return float("nan") if any(v != v for v in values) else max(values, default=0.0)
