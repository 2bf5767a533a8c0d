"""noise_envelope: float noise or a bug -- the drift against null twins' envelope."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..harness.studies.repro import PRESET
from .common import exercised, gate_runs, result, train_in_gate
from .record import Gate



def run(settings: dict, out_dir: Path | None = None) -> dict:
    """Float noise or a bug: the 850-step repro with --envelope (harness/observers/envelope.py);
    each loss backend's drift must stay within ``ratio`` times the envelope of
    null twins that carry the CK kernels' own differences with random,
    fixed signs, and no kernel's error may lean one way more than torch's
    (harness/observers/envelope.py; README "Noise or bug" for what it detects and what
    it does not)."""
    rows, failures = [], []
    runs = gate_runs({b: replace(PRESET, ck_loss_backend=b, max_steps=settings["steps"], envelope=settings["members"],
                                 dtype=settings["dtype"],
                                 envelope_ratio=settings["ratio"], ck_optimizer_backend=settings["ck_optimizer_backend"],
                                 no_progress=True) for b in settings["loss_backends"]}, settings)
    for backend, config in runs.items():
        config = replace(config, json_out=str(out_dir / f"noise_envelope_{backend}.json"))
        report = train_in_gate(config, settings)
        if report.get("error"):
            failures.append(f"{backend}: {report['status']}: {report['error']}")
            continue
        if report["first_nonfinite_step"] is not None:
            failures.append(f"{backend}: non-finite from step {report['first_nonfinite_step']}")
            continue
        envelope = report["envelope"]
        rows.append({"loss_backend": backend, "verdict": envelope["verdict"],
                     "first_beyond_step": envelope["first_beyond_step"], "directed": envelope["directed"],
                     "max_noise_ratio": envelope["max_noise_ratio"]})
        if envelope["first_beyond_step"] is not None:
            failures.append(f"{backend}: drift beyond {settings['ratio']}x the noise envelope from step "
                            f"{envelope['first_beyond_step']} (max ratio {envelope['max_noise_ratio']})")
        if envelope["directed"]:
            failures.append(f"{backend}: the error of {', '.join(envelope['directed'])} leans one way more than "
                            f"torch's (null_model.measured.*.lean)")
    summary = failures[0] if failures else "; ".join(
        f"{r['loss_backend']}: within noise (max ratio loss {r['max_noise_ratio']['loss']:.2f}, "
        f"param {r['max_noise_ratio']['param']:.2f})" for r in rows)
    return result(not failures, summary, rows=rows, failures=failures, exercised=exercised(runs, settings))


GATE = Gate(
    name="noise_envelope", run=run,
    settings={"dtype": "float32", "steps": 100, "members": 2, "ratio": 4.0,
              # c_ptref is torch's bits (its drift is 0: long_horizon holds that); the full tier runs it too
              "loss_backends": ["c", "c_fused_linear"], "ck_optimizer_backend": "c"},
    full={"steps": 850, "members": 4, "loss_backends": ["c", "c_ptref", "c_fused_linear"]},
    checks="the repro preset with `--envelope members` (2; full 4), loss backends `c`, `c_fused_linear` (full: "
           "`c_ptref` too), `steps` 100 (full: 850)",
    passes="every backend's `noise_verdict` is `within_noise` at `ratio` (4): no drift beyond the envelope, no "
           "directed slot")
