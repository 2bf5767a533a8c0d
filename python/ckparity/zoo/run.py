"""ckparity zoo: run each scenario the way a user would find the bug, and the
peers' criteria on the same runs.

Per scenario, ckparity's tools as a user runs them on a suspect kernel:
- its registration: the slot's contract check (a bug it refuses is caught
  before any step);
- ``ckparity train`` with ``--envelope 2`` (the planted backend on its slot,
  ckparity's kernels elsewhere: c_ptref for the loss, bit-identical to
  torch, so the drift is the bug's): failing is detection, its step the
  first step a tolerance or the envelope fails at;
- ``ckparity check`` of the planted backend (the run's dtype);
- ``ckparity attribute`` of the same run without the envelope (its variants
  are full runs; the envelope would triple them): the kinds it names
  responsible, or its suspect when no variant crosses a tolerance. A resume
  scenario cannot be ablated (its config is the checkpoint's): the stage
  where the twins first differ is what it blames.
The peers' criteria (harness/observers/peers.py) are computed on the same
train run. The control is the base run without a bug, over several seeds:
no criterion may fire (the false-alarm row)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path

from .. import check as checking, kernels
from ..harness.basics.config import RunConfig
from ..harness.basics.report import write_json
from ..harness.loop.run import train as train_run
from ..harness.basics.interrupts import Interrupted, stop_on_signals
from ..harness.observers.peers import CRITERIA
from ..harness.studies.attribute import attribute
from . import bugs
from .scenarios import SCENARIOS, Scenario

SCHEMA = "ckparity.zoo/1"
PLUGIN = "ckparity.zoo.bugs"  # the planted bugs, loaded through the plugin door
STEPS = 300
ENVELOPE = 2
# ckparity's kernels on every slot but the planted one; the loss the ptref variant (bit-identical to torch)
BASE = RunConfig(ck_loss_backend="c_ptref", envelope=ENVELOPE, no_progress=True)


def train(config: RunConfig) -> dict:
    """A train run; one a signal stopped stops the zoo (train writes its report and returns)."""
    report = train_run(config)
    if report["status"] == "interrupted":
        raise Interrupted(report["stopped_by_signal"] or 2)
    return report


def config_of(scenario: Scenario | None, steps: int, seed: int, out: Path) -> RunConfig:
    name = scenario.name if scenario else f"control_seed{seed}"
    planted = {scenario.flag: scenario.backend, **scenario.flags} if scenario else {}
    return replace(BASE, **planted, seed=seed, max_steps=steps, json_out=str(out / f"{name}.json"))


def _train(scenario: Scenario, config: RunConfig, out: Path) -> dict:
    if not scenario.resume_at:
        return train(config)
    ckpt = out / f"{scenario.name}_checkpoint"
    train(replace(config, max_steps=scenario.resume_at, checkpoint_every=scenario.resume_at,
                  checkpoint_dir=str(ckpt), overwrite_checkpoints=True,
                  json_out=str(out / f"{scenario.name}_before_resume.json")))
    return train(replace(config, resume=str(ckpt), checkpoint_every=scenario.resume_at, checkpoint_dir=str(ckpt)))


def check_findings(checked: dict | None) -> dict:
    """property -> verdict, of the properties whose verdict a parity gate fails
    (check/rule.py), bad_input left out: the zoo's bugs are written in torch
    ops and take any shape (a real kernel refuses them); that is not the bug."""
    if checked is None:
        return {}
    return {r["property"]: r["verdict"] for r in checked["properties"]
            if r["property"] != "bad_input" and not checking.gate_passes(r["verdict"])}


def first_fail_step(report: dict) -> int | None:
    """The first step the run fails at: a tolerance, the envelope by size, or
    with --expect-bitwise the first differing bits (a direction has no step:
    the run's last)."""
    envelope = report.get("envelope") or {}
    bitwise = (report.get("divergence") or {}).get("first_step") if report.get("failed_by_bitwise") else None
    steps = [report["first_loss_fail_step"], report["first_param_fail_step"], envelope.get("first_beyond_step"),
             bitwise]
    steps = [s for s in steps if s is not None]
    if steps:
        return min(steps)
    return report["steps"] if report["status"] == "fail" else None


def peer_steps(report: dict) -> dict:
    """criterion -> the step it fails the run at, or None."""
    return {name: (r["step"] if r["detected"] else None) for name, r in (report.get("peers") or {}).items()}


def _blame(scenario: Scenario, config: RunConfig, report: dict, out: Path, jobs: int) -> tuple[list[str], str]:
    if scenario.resume_at:
        divergence = report.get("divergence") or {}
        stage, kernel = divergence.get("stage"), divergence.get("kernel")
        return ([kernel] if kernel else []), f"the twins first differ at stage {stage!r} ({kernel or 'no kernel'})"
    # no more threads than cores: oversubscribed OpenMP threads spin (a 2-thread run's ablation took 6 min at 2 jobs)
    jobs = max(1, min(jobs, (os.cpu_count() or 1) // max(1, config.threads)))
    result = attribute(replace(config, envelope=0), str(out / f"{scenario.name}_attribute.json"), jobs)
    if result["status"] == "interrupted":  # attribute writes its report and returns: the zoo stops too
        raise Interrupted(result["stopped_by_signal"])
    verdict = result["verdict"]
    blamed = verdict["responsible"] or ([verdict["suspect"]] if verdict.get("suspect") else [])
    return blamed, verdict["summary"]


def run_scenario(scenario: Scenario, steps: int, out: Path, jobs: int) -> dict:
    start = time.perf_counter()
    config = config_of(scenario, steps, BASE.seed, out)
    report = _train(scenario, config, out)
    # check has no suite for every slot (clip_grad_norm): None there
    checked = (checking.check(scenario.slot, scenario.backend, dtype=config.dtype)
               if scenario.slot in checking.covered() else None)
    contract = bugs.REFUSED.get(scenario.backend)
    caught = [name for name, hit in (("contract", contract is not None), ("train", report["status"] == "fail"),
                                     ("check", bool(check_findings(checked)))) if hit]
    blamed, attribution = _blame(scenario, config, report, out, jobs)
    envelope = report.get("envelope") or {}
    return {"name": scenario.name, "source": scenario.source, "what": scenario.what, "kind": scenario.kind,
            "backend": scenario.backend, "flags": scenario.flags, "resume_at": scenario.resume_at or None,
            "detected": bool(caught), "caught_by": caught, "first_fail_step": first_fail_step(report),
            "contract": contract,
            "train": {"status": report["status"], "first_loss_fail_step": report["first_loss_fail_step"],
                      "first_param_fail_step": report["first_param_fail_step"],
                      "first_beyond_step": envelope.get("first_beyond_step"), "directed": envelope.get("directed"),
                      "forecast_param_fail_step": report.get("forecast_param_fail_step"),
                      "error": report["error"], "report": config.json_out},
            "check": checked and {"verdict": checked["verdict"], "passed": checked["passed"],
                                  "findings": check_findings(checked)},
            "blamed": blamed, "blamed_right": scenario.kind in blamed, "attribution": attribution,
            "peers": peer_steps(report), "seconds": round(time.perf_counter() - start, 1)}


def run_control(steps: int, seeds: int, out: Path) -> dict:
    rows = []
    for seed in range(BASE.seed, BASE.seed + seeds):
        report = train(config_of(None, steps, seed, out))
        fired = [name for name, step in peer_steps(report).items() if step is not None]
        rows.append({"seed": seed, "status": report["status"], "noise_verdict": report["noise_verdict"],
                     "peers_fired": fired})
    return {"passed": all(r["status"] == "pass" and not r["peers_fired"] for r in rows), "seeds": rows}


def zoo(names: list[str], steps: int, seeds: int, out_dir: Path, json_out: str, jobs: int,
        progress=lambda line: None) -> dict:
    """The zoo's report (schema ckparity.zoo/1), written after every scenario (a
    stopped zoo leaves what it measured)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels.use_plugins([PLUGIN])  # as --plugin loads it: here, and in every process a tool starts
    chosen = [s for s in SCENARIOS if s.name in names] if names else SCENARIOS
    result = {"schema": SCHEMA, "status": "running", "steps": steps, "envelope": ENVELOPE,
              "base": {"loss": BASE.ck_loss_backend, "model": BASE.model},
              "criteria": {name: repr(c) for name, c in CRITERIA.items()}, "scenarios": [], "control": None}
    try:
        with stop_on_signals():  # SIGTERM/SIGHUP as Ctrl-C: the report says interrupted
            for scenario in chosen:
                result["scenarios"].append(run_scenario(scenario, steps, out_dir, jobs))
                progress(row_line(result["scenarios"][-1]))
                write_json(json_out, result)
            if seeds:
                result["control"] = run_control(steps, seeds, out_dir)
        result["status"] = "complete"
    except KeyboardInterrupt as err:  # a signal here, or in a run (its report is written; see train above)
        result.update(status="interrupted", stopped_by_signal=getattr(err, "signum", signal.SIGINT))
        raise
    finally:
        write_json(json_out, result)
    return result


def passed(result: dict) -> bool:
    """Every scenario detected and the control silent."""
    return all(s["detected"] for s in result["scenarios"]) and (result["control"] or {"passed": True})["passed"]


def _step(step) -> str:
    return "-" if step is None else str(step)


def row_line(s: dict) -> str:
    return (f"| {s['name']} | {_step(s['first_fail_step']) if s['detected'] else 'missed'} | "
            f"{', '.join(s['caught_by']) or '-'} | {', '.join(s['blamed']) or '-'}{'' if s['blamed_right'] else ' (x)'} | "
            + " | ".join(_step(s["peers"].get(name)) for name in CRITERIA) + f" | {s['seconds']:.0f} |")


def table(result: dict) -> str:
    lines = ["| scenario | ckparity: first fail step | caught by | blamed | "
             + " | ".join(CRITERIA) + " | seconds |", "|---" * (5 + len(CRITERIA)) + "|"]
    lines += [row_line(s) for s in result["scenarios"]]
    detected = sum(s["detected"] for s in result["scenarios"])
    right = sum(s["blamed_right"] for s in result["scenarios"])
    peers = {name: sum(s["peers"].get(name) is not None for s in result["scenarios"]) for name in CRITERIA}
    lines.append(f"\nckparity detected {detected}/{len(result['scenarios'])}, blamed the right kind in {right}; "
                 + ", ".join(f"{name} {n}" for name, n in peers.items()))
    control = result["control"]
    if control:
        lines.append(f"control (no bug), {len(control['seeds'])} seeds: "
                     + ("every criterion silent" if control["passed"] else
                        "FALSE ALARM: " + "; ".join(f"seed {r['seed']}: {r['status']}, peers {r['peers_fired']}"
                                                    for r in control["seeds"]
                                                    if r["status"] != "pass" or r["peers_fired"])))
    return "\n".join(lines)
