"""How fast a backend of a slot is against torch eager: forward and backward
at the slot's realistic shape (the record's ``Conformance.speed``, or its
``make`` at a width of 4096 and 256 rows), the two sides timed in turn
(bench.interleaved_median_ms: a shared machine's drift falls on both), the
figure a ratio of the two in the same run -- never a time to compare across
runs. ``ckparity check`` with no kernel named reports it per slot."""

from __future__ import annotations

import torch

from .. import bench
from .properties import floating

SPEED_WIDTH, SPEED_ROWS = 4096, 256
REPEATS = 7


def _case_tensors(kernel_slot, g: torch.Generator) -> dict:
    """The tensors the slot is timed on."""
    if kernel_slot.speed is not None:
        return kernel_slot.speed(g)
    return kernel_slot.make(SPEED_WIDTH, SPEED_ROWS, g)


def _fwd_bwd(kernel_slot, fn, tensors: dict, dtype: torch.dtype):
    """One forward and backward of fn on fresh leaves of ``tensors`` (the copies cost both sides alike)."""
    def run():
        leaves = {k: v.detach().clone().requires_grad_(k in kernel_slot.differentiated)
                  for k, v in floating(tensors, dtype).items()}
        out = kernel_slot.call(fn, leaves)
        out.backward(torch.ones_like(out))
    return run


def speedup(kernel_slot, fn, torch_fn, dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """{"shape", "ours_ms", "torch_ms", "speedup"}: torch's median time over the backend's (above 1: faster),
    or {"error"} where a side raises at this shape (its verdict is the check's)."""
    tensors = _case_tensors(kernel_slot, torch.Generator().manual_seed(seed))
    shape = ", ".join(f"{k} {tuple(v.shape)}" for k, v in tensors.items() if isinstance(v, torch.Tensor))
    try:
        ours, theirs = bench.interleaved_median_ms([_fwd_bwd(kernel_slot, fn, tensors, dtype),
                                                    _fwd_bwd(kernel_slot, torch_fn, tensors, dtype)], REPEATS)
    except Exception as err:  # noqa: BLE001 -- a backend's failure here is a figure missing, not a dead check
        return {"shape": shape, "error": f"{type(err).__name__}: {err}"}
    return {"shape": shape, "ours_ms": round(ours, 4), "torch_ms": round(theirs, 4),
            "speedup": round(theirs / ours, 3) if ours > 0 else None}
