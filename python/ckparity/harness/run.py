"""ckparity train: the training loop of both twins, read as what it is —
build twins, feed the same batches, step, compare, record — and the report."""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time

import torch

import ckparity

from . import report
from .data import Batches, load_tokens
from .diff import all_finite, tensor_diff, worst_diff
from .localize import localize
from .twins import build_twins

# (series key, report key, tolerance flag): the quantities with a first-fail step.
CHECKS = [
    ("loss_abs_diff", "first_loss_fail_step", "loss_tol"),
    ("param_abs_diff", "first_param_fail_step", "param_tol"),
    ("grad_abs_diff", "first_grad_fail_step", "grad_tol"),
    ("logit_abs_diff", "first_logit_fail_step", "logit_tol"),
    ("moment_abs_diff", "first_moment_fail_step", "moment_tol"),
]


def environment() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import numpy

    return {
        "ckparity": ckparity.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
        "python": platform.python_version(), "ckparity_threads": ckparity.get_num_threads(),
        "torch_threads": torch.get_num_threads(), "cpu": cpu, "cores": os.cpu_count(),
        "compiler_flags": ckparity.build_info(), "library": str(ckparity._native.LIBRARY_PATH),
    }


def _progress(total: int, enabled: bool):
    if not enabled or not sys.stderr.isatty() or os.environ.get("CI"):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="step", leave=False)


def train(config) -> dict:
    """Runs both twins; returns the report (also written to config.json_out)."""
    if config.threads:
        ckparity.set_num_threads(config.threads)
        torch.set_num_threads(config.threads)
    batches = Batches(load_tokens(config), config)
    ck, ref = build_twins(config)
    series: dict[str, list] = {key: [] for key in (
        "step", "ck_loss", "torch_loss", "loss_abs_diff", "logit_abs_diff", "logit_rel_diff",
        "grad_abs_diff", "grad_rel_diff", "grad_tensor", "param_abs_diff", "param_rel_diff", "param_tensor",
        "moment_abs_diff", "moment_rel_diff", "moment_tensor", "ck_grad_norm", "torch_grad_norm",
        "ck_step_ms", "torch_step_ms")}
    first_fail = {report_key: None for _, report_key, _ in CHECKS}
    first_nonfinite_step, one_sided_nonfinite = None, False
    localize_at = config.localize_step or None
    snapshot, localization, status, error = None, None, "pass", None
    started = time.perf_counter()
    bar = _progress(batches.num_steps, not config.no_progress)
    try:
        for s in range(batches.num_steps):
            step = s + 1
            windows = batches.step(s)
            if localization is None and (localize_at is None or localize_at == step):
                snapshot = ck.snapshot()
            times = {}
            for twin in (ck, ref):
                twin.optimizer.zero_grad(set_to_none=True)
                times[twin.name] = twin.seconds
            losses = {"ck": [], "torch": []}
            loss_diff = logit_diff = logit_rel = 0.0
            scale = 1.0 / len(windows)
            for tokens, targets in windows:
                outputs = {twin.name: twin.micro_step(tokens, targets, scale) for twin in (ck, ref)}
                for name, (loss, _) in outputs.items():
                    losses[name].append(float(loss))
                d = abs(losses["ck"][-1] - losses["torch"][-1])
                loss_diff = max(loss_diff, d if math.isfinite(d) else math.inf)
                a, r = tensor_diff(outputs["ck"][1]["logits"], outputs["torch"][1]["logits"])
                logit_diff, logit_rel = max(logit_diff, a), max(logit_rel, r)
            ref_grads = ref.grads()
            grads = worst_diff({n: (g, ref_grads[n]) for n, g in ck.grads().items()})
            grad_norms = {t.name: float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g.double()) for g in t.grads().values()]))) for t in (ck, ref)}
            for twin in (ck, ref):
                twin.update(config.max_grad_norm)
            ref_params = ref.params()
            params = worst_diff({n: (p, ref_params[n]) for n, p in ck.params().items()})
            ref_moments = ref.moments()
            moments = worst_diff({n: (m, ref_moments[n]) for n, m in ck.moments().items() if n in ref_moments})

            record = {
                "step": step, "ck_loss": statistics.fmean(losses["ck"]), "torch_loss": statistics.fmean(losses["torch"]),
                "loss_abs_diff": loss_diff, "logit_abs_diff": logit_diff, "logit_rel_diff": logit_rel,
                "grad_abs_diff": grads["abs"], "grad_rel_diff": grads["rel"], "grad_tensor": grads["tensor"],
                "param_abs_diff": params["abs"], "param_rel_diff": params["rel"], "param_tensor": params["tensor"],
                "moment_abs_diff": moments["abs"], "moment_rel_diff": moments["rel"],
                "moment_tensor": moments["tensor"], "ck_grad_norm": grad_norms["ck"],
                "torch_grad_norm": grad_norms["torch"],
                "ck_step_ms": 1e3 * (ck.seconds - times["ck"]), "torch_step_ms": 1e3 * (ref.seconds - times["torch"]),
            }
            for key, value in record.items():
                series[key].append(value)

            failed_now = False
            for series_key, report_key, tol_key in CHECKS:
                if first_fail[report_key] is None and not record[series_key] <= getattr(config, tol_key):
                    first_fail[report_key] = step
                    failed_now = failed_now or report_key in ("first_loss_fail_step", "first_param_fail_step")
            finite = {t.name: all_finite([torch.tensor(losses[t.name])] + list(t.grads().values())
                                         + list(t.params().values())) for t in (ck, ref)}
            if first_nonfinite_step is None and not all(finite.values()):
                first_nonfinite_step = step
            one_sided_nonfinite = one_sided_nonfinite or finite["ck"] != finite["torch"]
            if localization is None and (localize_at == step or (localize_at is None and failed_now)):
                localization = localize(config, step, snapshot, windows)
            if bar is not None:
                bar.update(1)
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception as err:  # the report still says what was measured before it
        status, error = "error", f"{type(err).__name__}: {err}"
    finally:
        if bar is not None:
            bar.close()

    # an interrupted or broken run proves nothing about the steps it did not reach
    pass_parity = (status == "pass" and first_fail["first_loss_fail_step"] is None
                   and first_fail["first_param_fail_step"] is None and not one_sided_nonfinite
                   and len(series["step"]) == batches.num_steps)
    if status == "pass" and not pass_parity:
        status = "fail"
    wall = time.perf_counter() - started

    def finite_max(key):
        values = series[key]
        return max(values) if values else None

    result = {
        "schema": report.SCHEMA,
        "status": status,
        "pass_parity": pass_parity,
        "error": error,
        "config": vars(config),
        "env": environment(),
        "steps": len(series["step"]),
        "planned_steps": batches.num_steps,
        "micro_steps": sum(len(batches.step(s)) for s in range(len(series["step"]))),
        **first_fail,
        "first_nonfinite_step": first_nonfinite_step,
        "one_sided_nonfinite": one_sided_nonfinite,
        "max_loss_abs_diff": finite_max("loss_abs_diff"),
        "max_param_abs_diff": finite_max("param_abs_diff"),
        "max_grad_abs_diff": finite_max("grad_abs_diff"),
        "max_logit_abs_diff": finite_max("logit_abs_diff"),
        "max_moment_abs_diff": finite_max("moment_abs_diff"),
        "final_ck_loss": series["ck_loss"][-1] if series["ck_loss"] else None,
        "final_torch_loss": series["torch_loss"][-1] if series["torch_loss"] else None,
        "series": series,
        "localization": localization,
        "timing": {
            "wall_s": wall,
            "ck_total_s": ck.seconds, "torch_total_s": ref.seconds,
            "ck_step_ms_median": statistics.median(series["ck_step_ms"]) if series["step"] else None,
            "torch_step_ms_median": statistics.median(series["torch_step_ms"]) if series["step"] else None,
        },
    }
    report.write_json(config.json_out or "reports/train_latest.json", result)
    return result
