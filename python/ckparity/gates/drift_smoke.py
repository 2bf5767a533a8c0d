"""drift_smoke: short runs of the tiny and stacked twins pass parity."""

from __future__ import annotations

from pathlib import Path

from ..harness.basics.config import RunConfig
from .common import harness_gate
from .record import Gate



def run(settings: dict, out_dir: Path | None = None) -> dict:
    runs = {model: RunConfig(model=model, num_layers=2, max_steps=settings["steps"], grad_accum=settings["grad_accum"],
                             ck_loss_backend=settings["ck_loss_backend"],
                             ck_optimizer_backend=settings["ck_optimizer_backend"])
            for model in settings["models"]}
    return harness_gate(runs, out_dir, "drift_smoke", settings)


GATE = Gate(
    name="drift_smoke", run=run,
    settings={"steps": 100, "grad_accum": 2, "models": ["tiny", "stacked"], "ck_loss_backend": "c",
              "ck_optimizer_backend": "c"},
    full={"steps": 300},
    checks="`steps` (100; full 300) of the tiny and the 2-layer stacked twin, K=2",
    passes="`pass_parity`")
