"""accuracy_parity: who is closer to float64, step by step."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..measure import nan_max
from .common import exercised, gate_runs, result, train_in_gate
from .record import Gate



def run(settings: dict, out_dir: Path | None = None) -> dict:
    """Who is closer to exact arithmetic, step by step: the stress profile with
    the float64 shadow; at every probe (one step from the torch twin's state)
    the CK twin's gradient and parameter errors against float64 must be at
    most ``factor`` times the torch twin's plus a floor. A kernel more accurate
    than torch's passes; one that is merely different from torch does too,
    as long as it is not less accurate."""
    from ..harness.studies.repro import STRESS

    failures, rows = [], []
    runs = gate_runs({b: replace(STRESS, max_steps=settings["steps"], f64_shadow=True,
                                 shadow_every=settings["shadow_every"], ck_loss_backend=b,
                                 ck_optimizer_backend=settings["ck_optimizer_backend"], no_progress=True)
                      for b in settings["loss_backends"]}, settings)
    for backend, config in runs.items():
        config = replace(config, json_out=str(out_dir / f"accuracy_parity_{backend}.json"))
        report = train_in_gate(config, settings)
        if report["status"] == "error" or not report.get("shadow"):
            failures.append(f"loss {backend}: the run {report['status']}: {report.get('error')}")
            continue
        probes = report["shadow"]["probes"]
        if not probes["step"]:
            failures.append(f"loss {backend}: no probe was measured (the run stopped at step {report['steps']})")
            continue
        for kind in ("grad", "param"):
            ck, ref = probes[f"ck_local_{kind}_error"], probes[f"torch_local_{kind}_error"]
            rows.append({"loss_backend": backend, "quantity": kind, "probes": len(ck),
                         "max_ck_error": nan_max(ck), "max_torch_error": nan_max(ref)})
            for step, c, t in zip(probes["step"], ck, ref):
                # written so that NaN fails: NaN <= anything is False
                if not c <= settings["factor"] * t + settings[f"{kind}_floor"]:
                    failures.append(f"loss {backend}, step {step}: CK {kind} error {c:.3g} > "
                                    f"{settings['factor']}x torch's {t:.3g}")
                    break
    summary = failures[0] if failures else "; ".join(
        f"{r['loss_backend']} {r['quantity']}: CK {r['max_ck_error']:.2g} vs torch {r['max_torch_error']:.2g}"
        for r in rows)
    return result(not failures, summary, rows=rows, failures=failures, exercised=exercised(runs, settings))


GATE = Gate(
    name="accuracy_parity", run=run,
    settings={"steps": 30, "shadow_every": 5, "factor": 2.0, "grad_floor": 1e-9, "param_floor": 1e-9,
              "loss_backends": ["c", "c_ptref"], "ck_optimizer_backend": "c"},
    full={"steps": 300, "shadow_every": 10},
    checks="the stress profile with the float64 shadow, loss backends `c` and `c_ptref`, 30 steps with a probe every "
           "5 (full: 300 and 10): at each probe, one step from the torch twin's state by both float32 twins and the "
           "float64 shadow",
    passes="the CK twin's gradient and param errors against float64 ≤ `factor` (2) × the torch twin's + a floor "
           "(1e-9): a kernel more accurate than torch's passes, a less accurate one fails")
