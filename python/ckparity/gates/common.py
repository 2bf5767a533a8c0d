"""What the gates share: a gate's result, the short run the harness gates start from, and running
the harness for a gate -- with gate --backend's backends, in a process of its own where they can be
carried there, and a signal stopping the gates too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .. import kernels
from ..harness.basics.config import RunConfig, UsageError, kernels_used
from ..harness.basics.interrupts import Interrupted
from ..harness.loop.run import train


def result(passed: bool, summary: str, **details) -> dict:
    return {"passed": passed, "summary": summary, "details": details}


# the gates' short runs
SHORT_RUN = RunConfig(no_progress=True, total_tokens=4096, grad_accum=2)


def series_without_timing(report: dict) -> dict:
    return {k: v for k, v in report["series"].items() if not k.endswith("_ms")}


def with_backends(config: RunConfig, settings: dict) -> RunConfig:
    """config with those of ``gate --backend SLOT=NAME``'s backends
    (settings["ck_backends"]) that its CK twin calls (kernels_used): a
    backend of a kernel the run does not call is not forced on it; and
    gate --hang-timeout's seconds (settings["hang_timeout"]) for its child."""
    flags = {kernel: flag for flag, kernel in kernels.FLAGS.items()}
    used = kernels_used(config)
    return replace(config, hang_timeout=settings.get("hang_timeout", config.hang_timeout),
                   **{flags[kernel]: name for kernel, name in settings.get("ck_backends", {}).items()
                      if kernel in used})



def brought(chosen, models: list[str], base: RunConfig) -> dict[str, dict]:
    """For the gates that sweep models (fd_gradients, depth_sweep): each chosen kernel no run of ``models`` (from
    ``base``) calls brings the run of its record's ``exercise`` that does -- model -> that run's change (rope's
    and attention's llama; GPT-2's kernels gpt2, every other slot bitwise)."""
    out: dict[str, dict] = {}
    for kernel in chosen:
        change = (kernels.KERNELS[kernel].exercise or ("", {}))[1]
        called = any(kernel in kernels_used(replace(base, model=model)) for model in [*models, *out])
        if not called and change.get("model"):
            out[change["model"]] = change
    return out


def gate_runs(runs: dict[str, RunConfig], settings: dict) -> dict[str, RunConfig]:
    """A harness gate's runs with gate --backend's backends: each run with the
    ones it calls, labelled with them (``tiny+swiglu=mine``; a run that
    would repeat another is run once), and for a chosen kernel no run calls,
    the first run changed to call it (its record's ``exercise``: ``+llama`` for
    rope, one rank for the loss under --tp) -- or, where that is not a valid run,
    nothing: the gate's ``exercised`` then lacks it and its summary says so."""
    chosen = settings.get("ck_backends", {})
    if not chosen:
        return runs
    out: dict[str, RunConfig] = {}
    for label, config in runs.items():
        config = with_backends(config, settings)
        applied = [f"{k}={n}" for k, n in chosen.items() if k in kernels_used(config) and n != label]
        out["+".join([label, *applied])] = config
    first_label, first = next(iter(runs.items()))
    for kernel in chosen:
        if any(kernel in kernels_used(c) for c in out.values()):
            continue
        if kernels.KERNELS[kernel].exercise is None:
            continue
        name, change = kernels.KERNELS[kernel].exercise
        try:
            config = with_backends(replace(first, **change), settings)
        except UsageError:  # not a valid run of this gate: reported as not exercised
            continue
        applied = [f"{k}={n}" for k, n in chosen.items() if k in kernels_used(config)]
        out["+".join([first_label, name, *applied])] = config
    return out


def train_in_gate(config: RunConfig, settings: dict) -> dict:
    """train() (or, for --tp/--dp, the launcher) with the gate's backends, and
    a signal that stopped it stopping the gates too. A run with a user's
    backend (gate --backend) trains in a process of its own that keeps its
    place, where the backend can be carried there (kernels.carried): a crash
    or a hang in its C is that run's error, naming the kernel, the stage and
    the step, not the end of the gates."""
    from ..harness.loop.child import carry_for, train_isolated
    from ..harness.ranks.launch import launch

    config = with_backends(config, settings)
    carry = carry_for(config) if settings.get("ck_backends") else None
    if config.tp * config.dp > 1:
        report = launch(config)
    else:
        report = train_isolated(config, carry) if carry is not None else train(config)
    if report["status"] == "interrupted":
        raise Interrupted(report["stopped_by_signal"])
    return report


def harness_gate(runs: dict[str, RunConfig], out_dir: Path, gate: str, settings: dict,
                  bitwise: set[str] = frozenset()) -> dict:
    """The runs, each to pass parity; the runs labelled in ``bitwise`` to stay
    bit-identical to the torch twin too (their first divergence, if any, fails)."""
    rows, failures = [], []
    runs = gate_runs(runs, settings)
    for label, config in runs.items():
        path = out_dir / f"{gate}_{label}.json"
        report = train_in_gate(replace(config, no_progress=True, json_out=str(path)), settings)
        row = {key: report[key] for key in ("status", "steps", "first_loss_fail_step", "first_param_fail_step",
                                            "max_loss_abs_diff", "max_param_abs_diff")}
        row["run"], row["report"] = label, str(path)
        rows.append(row)
        ranks = report.get("ranks") or {}
        if report.get("error"):
            failures.append(f"{label}: {report['status']}: {report['error']}")
        elif ranks.get("replicated_params_identical") is False:
            failures.append(f"{label}: replicated params differ between ranks from step "
                            f"{ranks['first_rank_mismatch_step']}")
        elif not report["pass_parity"]:
            loc = report["localization"] or {}
            where = loc.get("first_forward_stage") or loc.get("first_backward_stage") or loc.get("first_param_tensor")
            failures.append(f"{label}: {report['status']} (loss fails at {report['first_loss_fail_step']}, "
                            f"params at {report['first_param_fail_step']}; localized to {where})")
        elif label in bitwise and report["divergence"]["first_step"] is not None:
            d = report["divergence"]
            failures.append(f"{label}: not bit-identical to the torch twin from step {d['first_step']} (first "
                            f"differing: {d['stage']}, {d['tensor']}; max ULP diff {report['max_ulp_diff']})")
        row["bitwise"] = report["divergence"]["first_step"] is None if report.get("divergence") else None
    # a failed run may have no figures (None): its summary is the failure
    summary = failures[0] if failures else "; ".join(
        f"{r['run']}: {r['status']}, max |loss diff| {r['max_loss_abs_diff']:.2g}, "
        f"max |param diff| {r['max_param_abs_diff']:.2g}" for r in rows)
    return result(not failures, summary, runs=rows, failures=failures, exercised=exercised(runs, settings))


def exercised(runs: dict[str, RunConfig], settings: dict) -> list[str]:
    """The chosen kernels (gate --backend) that a run of the gate called."""
    used = set().union(*(kernels_used(c) for c in runs.values()))
    return sorted(used & set(settings.get("ck_backends", {})))
