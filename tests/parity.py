"""The tests' side of ckparity.measure: every figure a test measures is kept
and written to reports/parity_latest.json at the end of the session (conftest.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ckparity.measure import max_ulp, parity

__all__ = ["MEASUREMENTS", "check_parity", "max_ulp", "write_measurements"]

MEASUREMENTS: list[dict] = []


def check_parity(name: str, ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor,
                 factor: float = 2.0, floor_ulps: float = 0.5) -> dict:
    """Asserts ckparity.measure.parity's rule and records the figures."""
    figures = parity(name, ours, theirs, reference, factor, floor_ulps)
    MEASUREMENTS.append(figures)
    assert figures["ok"], f"{name}: {figures['reason']}"
    return figures


def write_measurements(path: Path) -> None:
    if not MEASUREMENTS:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"torch": torch.__version__, "measurements": MEASUREMENTS}, indent=1))
    os.replace(tmp, path)
