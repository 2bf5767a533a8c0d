"""long_horizon: the 850-step preset under each loss backend."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .. import cpu
from ..harness.studies.repro import PRESET
from .common import harness_gate
from .record import Gate



def run(settings: dict, out_dir: Path | None = None) -> dict:
    """The 850-step preset (its first ``steps``) in the gate's dtype under
    each loss backend: every run passes parity, and the runs of
    ``bitwise_loss_backends`` (bf16: ptref, whose twin is bit for bit
    torch's) stay bit-identical where the claims hold at this capability."""
    runs = {b: replace(PRESET, ck_loss_backend=b, max_steps=settings["steps"], dtype=settings["dtype"],
                       ck_optimizer_backend=settings["ck_optimizer_backend"])
            for b in settings["loss_backends"]}
    bitwise = set(settings["bitwise_loss_backends"]) if cpu.matched() and not settings.get("ck_backends") else set()
    return harness_gate(runs, out_dir, "long_horizon", settings, bitwise)


GATE = Gate(
    name="long_horizon", run=run,
    settings={"dtype": "float32", "steps": 150, "loss_backends": ["c", "c_ptref"], "ck_optimizer_backend": "c",
              # loss backends whose runs must stay bit-identical to the torch twin (where the claims hold)
              "bitwise_loss_backends": []},
    full={"steps": 850},
    dtypes={"bfloat16": {"bitwise_loss_backends": ["c_ptref"]}},
    checks="the repro preset with loss backends `c` and `c_ptref`, `steps` 150 (full: 850)",
    passes="`pass_parity`")
