"""ckparity attribute: which of the CK twin's kernels makes a run fail?

An ablation over the backend flags. From the configured run it makes:
- "as configured";
- "without <kind>": that kind's backend swapped to torch, the others as configured;
- "only <kind>": that kind as configured, every other kind on torch;
- "alternative <kind>=<backend>": another C backend of that kind (c_ptref
  for c), the others as configured;
- "all torch": the control, every kind on torch.
Each variant is a full `ckparity train` run (in parallel processes, --jobs),
and the verdict reads them:
- the control fails: no ckparity kernel is the cause (a tolerance too tight
  for the config, or torch disagreeing with itself);
- the configured run passes: the kinds ranked by effect (by_effect): how
  much closer to torch swapping each out brings the param drift, in ULPs;
  "nothing is responsible" only when the run is bit-identical or no
  ablation changes its drift;
- some kinds fail alone ("only <kind>" fails) and pass when swapped out:
  those kinds are responsible;
- no kind fails alone but the configured run fails: the combination is
  responsible, narrowed to the kinds whose removal makes it pass."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from ... import kernels
from ..loop import child
from ..basics import progress
from ..basics.config import RunConfig, UsageError, kernels_used
from ..basics.interrupts import Interrupted, stop_on_signals
from ..basics.report import check_writable, check_writable_dir, read_report, write_json
from ..observers.forecast import forecast_text

SCHEMA = "ckparity.attribution/1"
# a kind is a kernel record's name (--ck-loss-backend: "cross_entropy"): one vocabulary with check, the zoo and
# the divergence's stage
KINDS = kernels.FLAGS


def variants(config: RunConfig) -> dict[str, dict[str, str]]:
    """name -> the backend of every kind the model uses (flag -> backend)."""
    used = kernels_used(config)  # the slots this configuration's CK twin calls: one rule, config's
    configured = {flag: getattr(config, flag) for flag, kernel in kernels.FLAGS.items() if kernel in used}
    in_c = [flag for flag, backend in configured.items() if backend != "torch"]
    out = {"as configured": configured}
    for flag in in_c:
        out[f"without {KINDS[flag]}"] = {**configured, flag: "torch"}
        out[f"only {KINDS[flag]}"] = {f: (b if f == flag else "torch") for f, b in configured.items()}
        for backend in kernels.KERNELS[kernels.FLAGS[flag]].builtin:
            if backend not in ("torch", configured[flag]) and _valid(config, {**configured, flag: backend}):
                out[f"alternative {KINDS[flag]}={backend}"] = {**configured, flag: backend}
    out["all torch"] = {flag: "torch" for flag in configured}
    return out


def _valid(config: RunConfig, backends: dict[str, str]) -> bool:
    """Whether the configuration takes these backends: an alternative it
    refuses (c_fused_linear under --amp) is no variant of it."""
    try:
        replace(config, **backends)
    except UsageError:
        return False
    return True


_ROW_KEYS = ("status", "steps", "first_loss_fail_step", "first_param_fail_step", "max_param_abs_diff", "max_loss_abs_diff",
             "divergence", "forecast_param_fail_step", "error", "crash")


def _row(report: dict) -> dict:
    row = {key: report.get(key) for key in _ROW_KEYS}
    # the drift in ULPs of the run's dtype: what the ranking by effect compares
    row["max_param_ulp_diff"] = (report.get("max_ulp_diff") or {}).get("param")
    return row


def _finished(config: RunConfig, returncode: int, where_file: Path) -> dict:
    """A child's row: its report, or an error row when it died without one, saying where it was (the
    kernel, the stage and the step its progress record last held)."""
    if Path(config.json_out).exists():
        return _row(read_report(config.json_out))
    where = progress.read(str(where_file)) or {}
    error = f"the run's process was {child.ending(returncode)} and wrote no report, in {child.place(where)}"
    return {"status": "error", "first_loss_fail_step": None, "first_param_fail_step": None,
            "max_param_abs_diff": None, "max_loss_abs_diff": None, "forecast_param_fail_step": None,
            "max_param_ulp_diff": None, "divergence": None, "error": error,
            "crash": {"ending": child.ending(returncode), **where}}


def _in_process(configs: dict[str, RunConfig]) -> dict[str, dict]:
    """One variant after another from this process (planted backends of tests stay visible): a variant with a
    user's backend that a fresh process can load runs in a child (loop/child.train_isolated), so a segfault
    in it is that variant's error row, named, not the end of the ablation."""
    from ..loop.run import train

    rows = {}
    for name, config in configs.items():
        carry = child.carry_for(config) if child.users_backends(config) else None
        report = child.train_isolated(config, carry) if carry is not None else train(config)
        rows[name] = _row(report)
        if report["status"] == "interrupted":
            raise Interrupted(report["stopped_by_signal"])
    return rows


def _in_processes(configs: dict[str, RunConfig], jobs: int) -> dict[str, dict]:
    """Each variant a `python -m ckparity.harness.loop.child CONFIG_JSON` process, at most ``jobs`` at once.
    A signal that stops this process is passed on to the running children, whose reports then say
    "interrupted"; they are waited for, so none is left behind."""
    waiting, running, rows = list(configs.items()), {}, {}
    scratch = tempfile.TemporaryDirectory(prefix="ckparity-progress-")
    where = {name: Path(scratch.name) / f"{k}.where" for k, name in enumerate(configs)}  # each child's place
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                name, config = waiting.pop(0)
                running[name] = subprocess.Popen(child.command(config), stdout=subprocess.DEVNULL,
                                                 env={**os.environ, progress.ENV: str(where[name])})
            for name, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[name]
                    rows[name] = _finished(configs[name], proc.returncode, where[name])
            time.sleep(0.05)
    except KeyboardInterrupt:
        for proc in running.values():
            proc.send_signal(signal.SIGTERM)
        for proc in running.values():
            proc.wait()
        raise
    finally:
        scratch.cleanup()
    return rows


def verdict(rows: dict[str, dict]) -> dict:
    # a variant that errored, crashed or was cut short measured nothing: it
    # is not a parity failure and blames no kernel; the verdict waits for it
    unmeasured = {name: row["status"] for name, row in rows.items() if row["status"] not in ("pass", "fail")}
    if unmeasured:
        listed = ", ".join(f"{name} ({status})" for name, status in unmeasured.items())
        return {"responsible": [], "unmeasured": sorted(unmeasured),
                "summary": f"no verdict: {len(unmeasured)} variant{'s' if len(unmeasured) > 1 else ''} did not run "
                           f"to the end: {listed}; see their reports"}
    failed = {name: row["status"] == "fail" for name, row in rows.items()}
    kinds = [name.removeprefix("only ") for name in rows if name.startswith("only ")]
    alternatives = [name.removeprefix("alternative ") for name in rows
                    if name.startswith("alternative ") and not failed[name]]
    if failed["all torch"]:
        return {"responsible": [], "summary": "the all-torch control fails too: no ckparity kernel is the cause "
                                              "(a tolerance too tight for this config, or torch disagreeing with itself)"}
    if not failed["as configured"]:
        return by_effect(rows, kinds)
    alone = [k for k in kinds if failed[f"only {k}"]]
    needed = [k for k in kinds if not failed[f"without {k}"]]
    passing = f"; passes with {', '.join(alternatives)}" if alternatives else ""
    if alone:
        responsible = [k for k in alone if k in needed] or alone
        many = len(responsible) > 1
        swapped = ([f"the run passes with {'them' if many else 'it'} on torch"] if set(responsible) <= set(needed)
                   else ["swapping one of them to torch does not make the run pass" if many
                         else "swapping it to torch alone does not make the run pass"])
        return {"responsible": responsible,
                "summary": f"the {', '.join(responsible)} backend{'s' if many else ''} "
                           f"{'fail' if many else 'fails'} on {'their' if many else 'its'} own "
                           f"({swapped[0]}){passing}"}
    responsible = needed or kinds
    return {"responsible": responsible,
            "summary": f"no backend fails on its own: only the combination of {', '.join(kinds)} fails"
                       + (f", and swapping {' or '.join(needed)} to torch makes it pass" if needed else "")
                       + passing}


def _drift(row: dict) -> float:
    """A variant's drift from torch: its largest param difference in ULPs (0 when bit-identical)."""
    if row["divergence"] and row["divergence"].get("first_step") is None:
        return 0.0
    return row["max_param_ulp_diff"] or 0.0


def by_effect(rows: dict[str, dict], kinds: list[str]) -> dict:
    """The verdict of a configured run that crosses no tolerance in its steps:
    a bug that drifts slowly (an optimizer's, crossing at step 146 of a
    100-step window) is not "nothing". Each kind's effect is how much closer
    to torch swapping it out brings the run (the param drift, in ULPs of the
    dtype), and how far it drifts alone; the kinds are ranked by it, and the
    top one that drifts alone is the suspect. Nothing is responsible only
    when no ablation changes the drift."""
    configured = _drift(rows["as configured"])
    ranked = sorted(({"kind": k, "effect_ulps": configured - _drift(rows[f"without {k}"]),
                      "alone_ulps": _drift(rows[f"only {k}"])} for k in kinds),
                    key=lambda r: (-r["effect_ulps"], -r["alone_ulps"]))
    forecast = forecast_text(rows["as configured"])
    if configured == 0.0 or not any(r["effect_ulps"] > 0 or r["alone_ulps"] > 0 for r in ranked):
        why = "bit-identical to torch" if configured == 0.0 else "no ablation changes its drift"
        return {"responsible": [], "ranked": ranked, "suspect": None,
                "summary": f"the configured run passes and is {why}: nothing is responsible"}
    suspect = next((r["kind"] for r in ranked if r["alone_ulps"] > 0), ranked[0]["kind"])
    effects = ", ".join(f"{r['kind']} {r['effect_ulps']:.3g} ULPs (alone {r['alone_ulps']:.3g})" for r in ranked)
    when = f"; its params' forecast crossing of the tolerance: step {forecast}" if forecast else ""
    return {"responsible": [], "ranked": ranked, "suspect": suspect,
            "summary": f"no variant crosses a tolerance in the run's steps, but the twins drift "
                       f"{configured:.3g} ULPs apart; ranked by effect (how much closer to torch swapping each to "
                       f"torch brings the params): {effects}; suspect: {suspect}{when}"}


def attribute(config: RunConfig, json_out: str, jobs: int) -> dict:
    check_writable(json_out, "--json-out")
    runs_dir = Path(json_out).with_suffix("") if json_out != "-" else Path("reports/attribute")
    runs_dir = runs_dir.parent / f"{runs_dir.name}_runs"
    check_writable_dir(runs_dir, "the variants' reports")
    plan = variants(config)
    threads = config.threads or max(1, (os.cpu_count() or 1) // jobs)
    configs = {name: replace(config, **backends, threads=threads, no_progress=True,
                             json_out=str(runs_dir / f"{name.replace(' ', '_').replace('=', '-')}.json"))
               for name, backends in plan.items()}
    for c in configs.values():  # a report left by an earlier ablation must not pass for this one's
        Path(c.json_out).unlink(missing_ok=True)
    start = time.perf_counter()
    status, stopped_by, rows = "complete", None, {}
    with stop_on_signals() as stop:
        try:
            rows = _in_process(configs) if jobs == 1 else _in_processes(configs, jobs)
        except KeyboardInterrupt as err:
            status, stopped_by = "interrupted", err.signum if isinstance(err, Interrupted) else signal.SIGINT
            rows = {name: _row(read_report(c.json_out)) for name, c in configs.items() if Path(c.json_out).exists()}
        stop.hold()
        result = {
            "schema": SCHEMA, "status": status, "stopped_by_signal": stopped_by, "config": config.to_dict(),
            "jobs": jobs, "wall_s": time.perf_counter() - start,
            "variants": [{"name": name, "backends": {KINDS[f]: b for f, b in plan[name].items()}, **rows[name],
                          "report": configs[name].json_out} for name in plan if name in rows],
            "verdict": verdict(rows) if status == "complete" else
            {"responsible": [], "summary": "interrupted: no verdict from an incomplete ablation"},
        }
        write_json(json_out, result)
    return result


def table(result: dict) -> str:
    """The variants as a Markdown table, and the verdict."""
    lines = ["| variant | backends | status | first loss fail | first param fail | max param diff | first divergence |",
             "|---|---|---|---|---|---|---|"]
    for v in result["variants"]:
        backends = " ".join(f"{k}={b}" for k, b in v["backends"].items())
        diff = "-" if v["max_param_abs_diff"] is None else f"{v['max_param_abs_diff']:.3g}"
        parted = (v["divergence"] or {}).get("first_step") or (v.get("error") if v["status"] == "error" else None)
        lines.append(f"| {v['name']} | {backends} | {v['status']} | {v['first_loss_fail_step'] or '-'} | "
                     f"{v['first_param_fail_step'] or '-'} | {diff} | {parted or '-'} |")
    return "\n".join(lines) + f"\n\nverdict: {result['verdict']['summary']}"
