"""depth_sweep: residual twins of growing depth, the bitwise variant bit-identical at every depth."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .. import kernels
from ..harness.basics.config import kernels_used
from ..harness.basics.interrupts import Interrupted
from .common import brought, result, with_backends
from .record import Gate



def _in_c(config, models: list[str]) -> set[str]:
    """The claim keys of the kernels ``config``'s CK twin runs on ckparity's C, over ``models``."""
    runs = [replace(config, model=model) for model in models]
    return {kernels.claim_key(k, getattr(run, kernels.KERNELS[k].flag)) for run in runs for k in kernels_used(run)
            if getattr(run, kernels.KERNELS[k].flag) != "torch"}


def run(settings: dict, out_dir: Path | None = None) -> dict:
    """Residual twins of growing depth: the "bitwise" variant (every kernel
    bit-identical) must stay bit-identical at every depth, and every variant
    must pass parity. Under ``gate --backend``, one variant instead: the CK
    twin with those backends (ckparity's own elsewhere), held to parity at
    every depth -- a user's kernels are not claimed bit-identical."""
    from ..harness.studies.repro import DEPTH, DEPTH_VARIANTS
    from ..harness.studies.repro import depth_sweep as sweep

    variants = {name: DEPTH_VARIANTS[name] for name in settings["variants"]}
    preset = replace(DEPTH, max_steps=settings["steps"], no_progress=True, dtype=settings["dtype"])
    rows, exercised = [], set()
    # a chosen kernel no gate model calls brings the run that does
    runs = {model: preset for model in settings["models"]}
    runs.update({model: replace(preset, **change)
                 for model, change in brought(settings.get("ck_backends", {}), settings["models"], preset).items()})
    for model, base in runs.items():
        if settings.get("ck_backends"):  # the backends each model calls (rope: llama's only)
            chosen = with_backends(replace(base, model=model), settings)
            exercised |= kernels_used(chosen)
            variants = {"backends": {flag: getattr(chosen, flag) for flag in kernels.FLAGS
                                     if getattr(chosen, flag) != getattr(preset, flag)}}
        rows += sweep(str(out_dir), preset, settings["depths"], variants, [model])[0]
    if any(r["status"] == "interrupted" for r in rows):
        raise Interrupted(2)
    # the bitwise variant is held to bits where the kernels it runs in C are bit-identical at this capability
    held = _in_c(replace(preset, **DEPTH_VARIANTS["bitwise"]), settings["models"]) <= set(
        kernels.bit_identical(settings["dtype"]))
    failures = [f"L={r['layers']} {r['variant']}: not bit-identical (first divergence at {r['first_divergence_stage']})"
                for r in rows if held and r["variant"] == "bitwise" and not r["bitwise"]]
    failures += [f"L={r['layers']} {r['variant']}: {r['status']} (params fail at {r['first_param_fail_step']})"
                 for r in rows if r["status"] != "pass"]
    if failures:
        summary = failures[0]
    elif any(r["variant"] == "bitwise" for r in rows):
        summary = (f"{len(rows)} runs at L={settings['depths']}: all pass, bitwise variant "
                   + ("bit-identical at every depth" if held else "not held to bits (the library and torch run at "
                      "other CPU capabilities)"))
    else:  # gate --backend: the user's kernels are held to parity, not claimed bit-identical
        summary = (f"{len(rows)} runs at L={settings['depths']} with "
                   f"{', '.join(f'{k}={n}' for k, n in settings['ck_backends'].items())}: all pass parity "
                   "(not held to bits)")
    return result(not failures, summary, rows=rows, failures=failures,
                   exercised=sorted(exercised & set(settings.get("ck_backends", {}))))


GATE = Gate(
    name="depth_sweep", run=run,
    settings={"dtype": "float32", "depths": [1, 4], "steps": 10, "variants": ["bitwise", "c"],
              "models": ["stacked", "llama"]},
    full={"depths": [1, 2, 6, 12, 24], "steps": 100, "variants": ["bitwise", "c", "c_ptref", "torch"]},
    checks="`stacked` and `llama` twins at L ∈ {1, 4} for 10 steps, variants `bitwise` and `c` (full: L ∈ "
           "{1, 2, 6, 12, 24}, 100 steps, every variant)",
    passes="the `bitwise` variant bit-identical at every depth; every run `pass_parity`",
    kernels_here=True)  # repro's depth sweep trains in the gate's process
