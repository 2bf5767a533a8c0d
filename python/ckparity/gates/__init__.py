"""ckparity gate: the CI parity gates, one module and one ``Gate`` record each (record.py).

Each gate is a function of its settings (its record's, overridden per tier and
dtype and by --config gates.toml) that returns a result: passed, a one-line
summary and the details. `run_gates` writes reports/gates/<gate>_latest.json
for each and a Markdown summary. Tests plant faults through the settings (a
backend name) or by swapping an entry of a kernel record's gate_cases /
optimizer_parity.OPTIMIZERS, and check that the gate fails and says why.

Adding a gate: its module here with its ``GATE`` record, and its line in GATE_RECORDS."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Callable

import torch

import ckparity

from .. import kernels
from .._tensors import DTYPES
from ..harness.basics import progress
from ..harness.basics.config import RunConfig
from ..harness.basics.interrupts import Interrupted, stop_on_signals
from ..harness.basics.junit import TestCase
from ..harness.basics.report import write_json, write_text
from . import (accuracy_parity, common, depth_sweep, distributed_parity, drift_smoke, fd_gradients, kernel_parity,
               long_horizon, noise_envelope, optimizer_parity, replay_determinism)
from .common import gate_runs
from .record import Gate

HANG_TIMEOUT = RunConfig.hang_timeout  # train's --hang-timeout default, for gate's

# the gates in the order the suite runs them
GATE_RECORDS: list[Gate] = [m.GATE for m in (kernel_parity, optimizer_parity, fd_gradients, replay_determinism,
                                             drift_smoke, long_horizon, depth_sweep, accuracy_parity, noise_envelope,
                                             distributed_parity)]
GATE_NAMES = [g.name for g in GATE_RECORDS]
RECORDS: dict[str, Gate] = {g.name: g for g in GATE_RECORDS}
GATES: dict[str, Callable] = {g.name: g.run for g in GATE_RECORDS}
# Settings per gate; the "full" tier overrides some of them (TIERS).
DEFAULTS: dict[str, dict] = {g.name: g.settings for g in GATE_RECORDS}
TIERS = {"quick": {}, "full": {g.name: g.full for g in GATE_RECORDS if g.full}}
# the gates that run in another dtype (gate --dtype), and what that dtype changes in their settings:
# bf16 holds the kernels with bf16 claims to torch's bf16 bits, ckparity's bf16 AdamW to torch's params
# bit for bit (its claim: no MKL sqrt in bf16's path), and the 850-step preset's ptref twin to every bit
DTYPE_GATES = [name for name, values in DEFAULTS.items() if "dtype" in values]
DTYPE_SETTINGS = {"bfloat16": {g.name: g.dtypes["bfloat16"] for g in GATE_RECORDS if "bfloat16" in g.dtypes}}

__all__ = ["DEFAULTS", "DTYPE_GATES", "DTYPE_SETTINGS", "GATES", "GATE_NAMES", "GATE_RECORDS", "TIERS", "Gate",
           "gate_runs", "markdown_summary", "run_gates", "run_one", "settings_for", "settings_with_backends", "table"]


def settings_for(tier: str, config_path: str | None = None, dtype: str = "float32") -> dict[str, dict]:
    """DEFAULTS, then the tier's overrides, then the dtype's (DTYPE_GATES
    run in it), then the config file's."""
    settings = copy.deepcopy(DEFAULTS)
    for gate, values in TIERS[tier].items():
        settings[gate].update(values)
    if dtype != "float32":
        for gate in DTYPE_GATES:
            settings[gate].update(dtype=dtype, **DTYPE_SETTINGS[dtype].get(gate, {}))
    if config_path:
        try:
            overrides = tomllib.loads(Path(config_path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"cannot read --config {config_path}: {err}") from None
        for gate, values in overrides.items():
            if gate not in settings or not isinstance(values, dict):
                raise ValueError(f"--config {config_path}: unknown gate [{gate}] (gates: {', '.join(GATE_NAMES)})")
            unknown = set(values) - set(settings[gate])
            if unknown:
                raise ValueError(f"--config {config_path}: [{gate}] has unknown keys {sorted(unknown)} "
                                 f"(known: {sorted(settings[gate])})")
            for key, value in values.items():  # a value of the setting's own kind (an int where a float is, too)
                default = settings[gate][key]
                kinds = (int, float) if isinstance(default, float) else (type(default),)
                if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, kinds):
                    raise ValueError(f"--config {config_path}: [{gate}] {key} = {value!r} is a "
                                     f"{type(value).__name__}, the setting takes a {type(default).__name__} "
                                     f"(default {default!r})")
            settings[gate].update(values)
    for gate in DTYPE_GATES:
        if settings[gate]["dtype"] not in DTYPES:
            raise ValueError(f"[{gate}] dtype must be \"float32\" or \"bfloat16\", got {settings[gate]['dtype']!r}")
    return settings


def settings_with_backends(settings: dict, ck_backends: dict[str, str]) -> dict:
    """A gate's settings with gate --backend's backends in them, as they run:
    ``ck_backends``, each backend flag the settings name set to the chosen
    one, and ``loss_backends`` the chosen loss alone (the gate's runs of
    ckparity's own loss variants would all be the user's loss: one run, not
    three copies)."""
    settings = dict(settings, ck_backends=dict(ck_backends))
    flags = {kernel: flag for flag, kernel in kernels.FLAGS.items()}
    for kernel, name in ck_backends.items():
        if flags[kernel] in settings:
            settings[flags[kernel]] = name
        if kernel == "cross_entropy" and "loss_backends" in settings:
            settings["loss_backends"] = [name]
    return settings


def run_gates(names: list[str], settings: dict[str, dict], out_dir: Path, tier: str,
              echo: Callable[[str], None] = print, ck_backends: dict[str, str] | None = None,
              fail_fast: bool = False, hang_timeout: float = HANG_TIMEOUT) -> list[dict]:
    """Runs the gates ``names`` in that order; ``ck_backends`` (slot -> backend
    name, from ``gate --backend``) puts a registered backend in every gate's
    CK side, a process running them killed as hung when it calls no slot for
    ``hang_timeout`` seconds (0: waits); ``fail_fast`` stops after the first
    gate that fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        if ck_backends:
            settings[name] = dict(settings_with_backends(settings[name], ck_backends), hang_timeout=hang_timeout)
    results = []
    with stop_on_signals() as stop:
        _run_each(names, settings, out_dir, tier, echo, results, fail_fast)
        stop.hold()
        summary = markdown_summary(results, tier)
        write_text(out_dir / "summary.md", summary)
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a") as f:
            f.write(summary)
    return results


def run_one(name: str, settings: dict, out_dir: Path) -> dict:
    """One gate's result; a gate that raises fails and says why (a signal passes through)."""
    try:
        return GATES[name](settings, out_dir)
    except Exception as err:
        return common.result(False, f"error: {type(err).__name__}: {err}")


def _run_isolated(name: str, settings: dict, out_dir: Path, carry: dict) -> dict:
    """run_one in a process of its own (``python -m ckparity.gates``) that loads ``carry``: a user's
    backend that segfaults or aborts -- in a gate's own twins (fd_gradients, depth_sweep) or in a check --
    fails this gate, not the gates after it. A signal here is passed on to the child and waited for."""
    from ..harness.loop.child import ending, killed_if_hung, place

    with tempfile.TemporaryDirectory(prefix="ckparity-gate-") as scratch:
        answer, where_file = Path(scratch) / "result.json", str(Path(scratch) / "where")
        # the gate's own twins keep their place there (a run it trains in a child keeps its own)
        env = dict(kernels.child_env(carry), **{progress.ENV: where_file})
        proc = subprocess.Popen([sys.executable, "-m", "ckparity.gates", name, json.dumps(settings), str(out_dir),
                                 str(answer), json.dumps(carry)], env=env)
        timeout = settings.get("hang_timeout", HANG_TIMEOUT)
        try:
            hung = killed_if_hung(proc, where_file, timeout)
        except BaseException:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            raise
        if answer.exists() and not hung:
            return json.loads(answer.read_text())
        where = progress.read(where_file) or {}
    how = f"hung (no slot called for {timeout:g} s) and killed" if hung else ending(proc.returncode)
    backends = ", ".join(f"{kernel}={backend}" for kernel, backend in settings["ck_backends"].items())
    return common.result(False, f"crashed: the gate's process was {how} in {place(where)} (with {backends})",
                         crash={"ending": how, "stage": where.get("stage"), "kernel": where.get("kernel"),
                                "backends": settings["ck_backends"]})


def _run_each(names, settings, out_dir, tier, echo, results, fail_fast) -> None:
    for name in names:
        start = time.perf_counter()
        chosen = settings[name].get("ck_backends", {})
        # a gate whose own twins call a user's backends runs in a fresh process that can load them (a crash
        # ends that gate only); the others' kernels run in training children or check's child already
        carry = kernels.carried_together(chosen.items()) if chosen and RECORDS[name].kernels_here else None
        try:
            result = (_run_isolated(name, settings[name], out_dir, carry) if carry is not None
                      else run_one(name, settings[name], out_dir))
        except KeyboardInterrupt as err:  # Ctrl-C or a signal: this gate proves nothing, and no other gate runs
            signum = err.signum if isinstance(err, Interrupted) else 2
            result = common.result(False, "interrupted", interrupted=signum)
        if chosen and "exercised" in result["details"]:  # said plainly: a backend this gate did not call
            missed = [f"{k}={n}" for k, n in chosen.items() if k not in result["details"]["exercised"]]
            result["details"]["not_exercised"] = missed
            if missed:
                result["summary"] += f"; does not exercise {', '.join(missed)}"
        result.update(gate=name, tier=tier, settings=settings[name], seconds=time.perf_counter() - start,
                      schema="ckparity.gate/1", torch=torch.__version__, ckparity=ckparity.__version__)
        write_json(out_dir / f"{name}_latest.json", result)
        results.append(result)
        echo(f"{'PASS' if result['passed'] else 'FAIL'} {name:20s} {result['seconds']:6.1f}s  {result['summary']}")
        if result["details"].get("interrupted") or (fail_fast and not result["passed"]):
            break


def junit_cases(results: list[dict]) -> list[TestCase]:
    """A JUnit test case per gate run: failing with its summary where the gate failed."""
    return [TestCase(f"ckparity.gate.{r['tier']}", r["gate"], r["seconds"],
                     failure=None if r["passed"] else r["summary"], output=r["summary"]) for r in results]


def markdown_summary(results: list[dict], tier: str) -> str:
    passed = sum(r["passed"] for r in results)
    lines = [f"## ckparity gates ({tier} tier): {passed}/{len(results)} passed", "",
             "| gate | result | time | summary |", "|---|---|---|---|"]
    for r in results:
        text = r["summary"].replace("|", "\\|")
        lines.append(f"| {r['gate']} | {'pass' if r['passed'] else '**FAIL**'} | {r['seconds']:.1f}s | {text} |")
    return "\n".join(lines) + "\n"


def table() -> str:
    """The gates as a Markdown table (docs/harness.md): what each runs, and when it passes."""
    rows = ["| gate | what it checks | passes when |", "|---|---|---|"]
    rows += [f"| `{g.name}` | {g.checks} | {g.passes} |" for g in GATE_RECORDS]
    return "\n".join(rows)
