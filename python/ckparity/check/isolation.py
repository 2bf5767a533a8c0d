"""ckparity check in a child process: a crash in a backend's C -- a
segfault, an abort -- or a hang ends the child, not the command, and is the
verdict ``crashes`` naming the property and case it was in.

The child registers the backend as this process did: it loads the same
plugins (CKP_PLUGINS, entry points) and whatever registered the backend
here (kernels.carried: its Registration.origin, a plugin, the module whose
import registered it, or a module attribute holding it), with the parent's
sys.path. It runs
the contract check as the suite's first property. A child that cannot set
up (a plugin that fails to load, no such backend) is CheckSetupError -- an
error of the check, never a verdict on the kernel. A backend only this
process can reach (a callable made in a function, or in __main__) is
checked here by ``run``, and its report says so (``isolated: false``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import cpu, kernels
from .._tensors import DTYPES
from .suite import SCHEMA, check, record_of

DEFAULT_TIMEOUT = 1800.0  # seconds: ckparity's own kernels take seconds; a hang is a verdict, not a wait
EXIT_SETUP = 3  # the child's exit code when it could not set up the check


class CheckSetupError(ValueError):
    """The check could not start (in its child): a plugin failed to load, or no such backend."""


def run(kernel: str, backend: str, seed: int = 0, timeout: float = DEFAULT_TIMEOUT, adamw: dict | None = None,
        dtype: str = "float32", speed: bool = False) -> dict:
    """The check of ``backend``: in a child process when one can register it
    (isolated_check), else in this one (the report's ``isolated`` is False,
    ``in_process_because`` says why). ``speed``: as isolated_check's."""
    carry = kernels.carried(record_of(kernel).name, backend)
    if carry is None:
        report = check(kernel, backend, seed, adamw, dtype)
        report.update(isolated=False, in_process_because=_NOT_CARRIED.format(kernel=record_of(kernel).name,
                                                                              backend=backend))
        if speed:
            report["speed"] = _speed(report, dtype)
        return report
    return isolated_check(kernel, backend, seed, timeout, carry, adamw, dtype, speed)


_NOT_CARRIED = ("the {kernel} backend {backend!r} is a callable only this process can reach (made in a function or "
                "in __main__); register it when a module is imported, or bind it to a module's name, for a child "
                "process to check it")


def isolated_check(kernel: str, backend: str, seed: int = 0, timeout: float = DEFAULT_TIMEOUT,
                   carry: dict | None = None, adamw: dict | None = None, dtype: str = "float32",
                   speed: bool = False) -> dict:
    """check() in a child process (see the module's docstring). The report
    comes back through a file, not the child's stdout (which a backend may
    print to). A bad kernel name raises ValueError here, before the child
    starts; a child that cannot set up raises CheckSetupError; a signal to
    this process kills the child. ``speed``: the report's ``speed`` is the
    backend timed against torch eager (check/speed.py), where its verdict is
    one check passes (the timeout covers it too)."""
    kernel = record_of(kernel).name
    if carry is None:
        carry = kernels.carried(kernel, backend)
        if carry is None:
            raise CheckSetupError(_NOT_CARRIED.format(kernel=kernel, backend=backend))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "report.json"
        request = json.dumps({"kernel": kernel, "backend": backend, "seed": seed, "adamw": adamw, "dtype": dtype,
                              "speed": speed, "out": str(out), **carry})
        proc = subprocess.Popen([sys.executable, "-m", "ckparity.check.child", request], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=kernels.child_env(carry))
        timed_out = False
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
            timed_out = True
        except BaseException as stopped:  # a signal to check (Interrupted) ends its child too
            proc.kill()
            _, stderr = proc.communicate()
            if hasattr(stopped, "signum"):  # the report of what ran, for the command to write
                stopped.report = _ended_report(kernel, backend, dtype, stderr, start, "interrupted",
                                               f"stopped by {signal.Signals(stopped.signum).name} (killed)")
            raise
        if proc.returncode == EXIT_SETUP and out.is_file():
            raise CheckSetupError(f"the check of the {kernel} backend {backend!r} could not start: "
                                  f"{json.loads(out.read_text())['setup_error']}")
        if proc.returncode == 0 and out.is_file():
            return {**json.loads(out.read_text()), "isolated": True}
    ending = (f"still running after the --timeout of {timeout:g} s (killed)" if timed_out
              else f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
              else f"exit {proc.returncode}")
    return _ended_report(kernel, backend, dtype, stderr, start, "crashes", ending)


def _ended_report(kernel: str, backend: str, dtype: str, stderr: str, start: float, verdict: str,
                  ending: str) -> dict:
    """The report of a child that did not finish: the properties it finished
    (its TRACE rows), the one it was in with ``verdict``, and how it ended."""
    rows, cases, other = [], [], []
    for line in stderr.splitlines():
        traced = json.loads(line) if line.startswith(('{"property"', '{"row"')) else None
        if traced is None:
            other.append(line)
        elif "row" in traced:
            rows.append(traced["row"])  # a property that finished before the crash
        else:
            cases.append(traced)
    last = cases[-1] if cases else {"property": None, "case": None}
    if last["property"] is not None and last["property"] not in {r["property"] for r in rows}:
        why = f"{last['case']}: the check's process was {ending}"
        rows.append({"property": last["property"], "cases": sum(c["property"] == last["property"] for c in cases),
                     "bit_identical": None, "failing": 1, "max_ulp": None, "verdict": verdict, "groups": {},
                     "worst": [{"case": last["case"], "verdict": verdict, "why": why}], "failures": [why]})
    return {"schema": SCHEMA, "kernel": kernel, "backend": backend, "dtype": dtype, "capability": cpu.capability(),
            "properties": rows, "not_run": {}, "verdict": verdict, "passed": False, "passes_gates": False,
            "isolated": True,
            "crash": {"ending": ending, "property": last["property"], "case": last["case"],
                      "stderr": " ".join(other[-3:])[-500:]},
            "seconds": round(time.perf_counter() - start, 1)}


def child(request: dict) -> int:
    """The child's side: set up (plugins, the carried registration; contracts
    deferred to the suite), run the suite, write the report to the file the
    parent named. Exit EXIT_SETUP with {"setup_error": why} when set-up fails."""
    from . import properties

    out = Path(request["out"])
    properties.TRACE = lambda line: print(line, file=sys.stderr, flush=True)
    kernels.deferred_contracts()
    try:
        kernels.load_configured()
        kernels.load_carried(request)
        kernels.resolve(request["kernel"], request["backend"])
    except (ValueError, TypeError) as err:
        out.write_text(json.dumps({"setup_error": str(err)}))
        return EXIT_SETUP
    report = check(request["kernel"], request["backend"], request["seed"], request["adamw"], request["dtype"])
    if request.get("speed"):
        report["speed"] = _speed(report, request["dtype"])
    out.write_text(json.dumps(report))
    return 0


def _speed(report: dict, dtype: str) -> dict:
    """The backend against torch eager, or why it is not timed."""
    from . import speed

    record = record_of(report["kernel"])
    if record.optimizer:
        return {"not_timed": "an optimizer: bench times it (ckparity bench)"}
    if not report["passed"] or report["verdict"] == "not supported":
        return {"not_timed": f"its verdict is {report['verdict']}"}
    return speed.speedup(record.conformance, record.backends[report["backend"]], record.backends["torch"],
                         DTYPES[dtype])

