"""``ckparity check --plugin engine.py`` with no kernel named: every backend
the plugins register (or, with ``--all``, every backend but torch's of every
slot check covers), each checked in its own child as ``ckparity check`` checks
one, and timed against torch eager at the slot's realistic shape
(check/speed.py). One table -- slot, backend, verdict, bit-identical
fraction, max ULP, speed -- and one line a person can quote: how many slots
are correct (a verdict a parity gate passes: bitwise or as accurate as torch)
and how many are correct and faster than torch (KernelBench's fast_p at
p = 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from .. import cpu, kernels
from .isolation import DEFAULT_TIMEOUT, CheckSetupError, run
from .rule import check_passes, gate_passes, worst
from .suite import covered

SCHEMA = "ckparity.check-engine/1"


def backends_to_check(every: bool = False) -> list[tuple[str, str]]:
    """(kernel, backend) of each backend the configured plugins register (every=True: every backend of every
    covered slot but torch's), found in a child process: a plugin that crashes as it loads kills that child,
    not this command (CheckSetupError says why)."""
    code = ("import json, sys; from ckparity import kernels; from ckparity.check import engine; "
            "kernels.deferred_contracts(); kernels.load_configured(); "
            f"print(json.dumps(engine.registered_here({every!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CheckSetupError(f"the plugins could not be loaded (exit {proc.returncode}): "
                              f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return [tuple(pair) for pair in json.loads(proc.stdout.strip().splitlines()[-1])]


def registered_here(every: bool) -> list[list[str]]:
    """In the listing child: the pairs, in the slots' order."""
    pairs = []
    for name in covered():
        record = kernels.KERNELS[name]
        names = [b for b in record.backends if b != "torch"] if every else list(record.registrations)
        pairs += [[name, b] for b in names]
    return pairs


def _row(report: dict) -> dict:
    measured = [r for r in report["properties"] if isinstance(r.get("bit_identical"), int) and r["cases"]]
    cases = sum(r["cases"] for r in measured)
    speed = report.get("speed") or {}
    return {"kernel": report["kernel"], "backend": report["backend"], "verdict": report["verdict"],
            "correct": gate_passes(report["verdict"]),
            "bit_identical": round(sum(r["bit_identical"] for r in measured) / cases, 4) if cases else None,
            "max_ulp": max((r["max_ulp"] for r in measured if r.get("max_ulp") is not None), default=None),
            "speedup": speed.get("speedup"), "speed_shape": speed.get("shape"),
            "speed_note": speed.get("error") or speed.get("not_timed")}


def check_engine(pairs: list[tuple[str, str]], dtype: str = "float32", timeout: float = DEFAULT_TIMEOUT,
                 progress=lambda line: None) -> dict:
    """Each pair checked (and timed) in its own child (in this process where no child can reach it: check.run);
    the report keeps every check's own report too."""
    if not pairs:
        raise CheckSetupError("no backend to check: the plugins register none (--all checks ckparity's own)")
    start, reports = time.perf_counter(), []
    try:
        for kernel, backend in pairs:
            progress(f"ckparity check: {kernel} --backend {backend} ...")
            reports.append(run(kernel, backend, timeout=timeout, dtype=dtype, speed=True))
    except BaseException as stopped:  # a signal (Interrupted): the report of the slots checked so far
        if hasattr(stopped, "signum"):
            stopped.report = _engine_report(reports + ([stopped.report] if hasattr(stopped, "report") else []),
                                            dtype, start, interrupted=True)
        raise
    return _engine_report(reports, dtype, start)


def _engine_report(reports: list[dict], dtype: str, start: float, interrupted: bool = False) -> dict:
    rows = [_row(r) for r in reports]
    correct = sum(r["correct"] for r in rows)
    faster = sum(r["correct"] and (r["speedup"] or 0) > 1 for r in rows)
    verdict = worst(r["verdict"] for r in rows)
    return {"schema": SCHEMA, "dtype": dtype, "capability": cpu.capability(), "rows": rows, "slots": len(rows),
            "correct": correct, "correct_and_faster": faster, "fast_1": round(faster / len(rows), 4) if rows else None,
            "line": quotable(len(rows), correct, faster) + ("; interrupted" if interrupted else ""),
            "verdict": verdict, "passed": check_passes(verdict) and not interrupted, "interrupted": interrupted,
            "checks": reports, "seconds": round(time.perf_counter() - start, 1)}


def quotable(slots: int, correct: int, faster: int) -> str:
    fast = f"{faster / slots:.2f}" if slots else "-"
    return (f"{correct} of {slots} slots correct (bitwise or as accurate as torch); {faster} of {slots} correct "
            f"and faster than torch eager (fast_1 = {fast})")


def table(report: dict) -> str:
    lines = [f"ckparity check (engine, {report['dtype']}): {report['line']} ({report['seconds']} s)",
             "| slot | backend | verdict | bit-identical | max ULP | speed vs torch eager | timed at |",
             "|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        bits = "-" if r["bit_identical"] is None else f"{100 * r['bit_identical']:.1f}%"
        speed = f"{r['speedup']:.2f}x" if r["speedup"] is not None else (r["speed_note"] or "-")
        lines.append(f"| {r['kernel']} | {r['backend']} | {r['verdict']} | {bits} | "
                     f"{'-' if r['max_ulp'] is None else r['max_ulp']} | {speed} | {r['speed_shape'] or '-'} |")
    return "\n".join(lines)
