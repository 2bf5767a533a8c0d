"""ckparity mutate: do the gates fail when the kernels are wrong?

A gate that cannot fail proves nothing. This builds the C library once per
mutant -- a realistic numerics bug planted at one place in a kernel
(csrc/mutants.h: a float accumulator, a cheaper exp, the mean counting
ignored rows, AdamW's bias correction in float, ...) or one build flag
(-ffp-contract=fast) -- in scratch build directories, runs the gates against
each build (CKP_LIB, one `ckparity gate` process per mutant, so a crash in C
takes down one mutant's run only) and writes a kill matrix: mutant x gate,
the mutation score, and for each mutant the cheapest gate that kills it.

A control build (no mutant, built the same way) runs first: a gate that
fails on it kills everything and proves nothing, so the run stops there.

A mutant no gate kills is either a gap in the gates or an equivalent mutant
(one whose change never reaches a float32 output). Each mutant's library
and the control's run every case of ckparity.builds (every kernel, odd
widths, several reduction blocks: seconds) as soon as it is built; a
survivor with no output differing there is reported ``equivalent_on_probe``
and left out of the score's denominator (``score``; ``score_raw`` counts
it). The probe can show a difference, not prove there is none: an
equivalent verdict covers exactly those cases. Without ``--matrix`` a mutant
equivalent on the probe does not run the gates (its gates are "skipped":
running every gate on one took 726 of a quick run's 1311 s); with it, it
runs them, and a gate that kills it shows a case the probe lacks: the report
lists it in ``probe_blind_spots`` (the quick tier would have taken it out of
the score). Two such were found that way -- a target at a vocab shard's first
column, a NaN on one side of the comparison -- and are probe cases now;
tests/test_mutate.py's nightly case holds the probe to every mutant of the
catalogue.

The catalogue is read from csrc/mutants.h (each CKP_MUT_<NAME> with its
comment), so it needs a source checkout: `--source`, by default the
directory above the current one that holds csrc/mutants.h.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = "ckparity.mutate/1"
MUTANTS_HEADER = Path("csrc") / "mutants.h"


@dataclass(frozen=True)
class Mutant:
    name: str                     # lower case, as on the command line and in the report
    what: str                     # the planted bug, in words
    meson_args: tuple[str, ...]   # how its build differs from a real one


CONTROL = Mutant("control", "no mutant: the library as released, built the same way", ())
FLAG_MUTANTS = (Mutant("fp_contract_fast", "-ffp-contract=fast: the compiler fuses a*b+c into FMAs wherever it likes",
                       ("-Dfp_contract=fast",)),)


def catalogue(source: Path) -> list[Mutant]:
    """The flag mutants, then each CKP_MUT_<NAME> of csrc/mutants.h with its comment."""
    text = (source / MUTANTS_HEADER).read_text()
    entries = re.findall(r"CKP_MUT_([A-Z0-9_]+),\s*/\*\s*(.*?)\s*\*/", text)
    return list(FLAG_MUTANTS) + [Mutant(name.lower(), what, (f"-Dc_args=-DCKP_MUTANT_ID=CKP_MUT_{name}",))
                                 for name, what in entries if name != "NONE"]


def find_source(start: Path, search_up: bool = True) -> Path:
    for directory in (start, *start.parents) if search_up else (start,):
        if (directory / MUTANTS_HEADER).is_file() and (directory / "meson.build").is_file():
            return directory
    raise FileNotFoundError(f"no ckparity checkout (with {MUTANTS_HEADER} and meson.build) "
                            f"{'at or above' if search_up else 'at'} {start}: ckparity mutate builds the library "
                            "from source" + ("; pass --source" if search_up else ""))


class BuildFailed(RuntimeError):
    pass


def check_tools() -> None:
    """meson and ninja on PATH, before any build starts."""
    missing = [tool for tool in ("meson", "ninja") if shutil.which(tool) is None]
    if missing:
        raise FileNotFoundError(f"ckparity mutate builds the C library and needs {' and '.join(missing)} on PATH "
                                "(./scripts/setup.sh installs them into .venv)")


def isa_args() -> list[str]:
    """Every build of a run (the control's, each mutant's) carries only the code
    that this CPU's clones would run (``-Dclones=false -Dmarch=``): the bits are
    the default build's (tests/test_clones.py), the gates run as fast, and a
    build compiles one ISA's hot loops instead of three (about half the time)."""
    from ._native import isa

    level = isa()
    return ["-Dclones=false"] + ([] if level == "baseline" else [f"-Dmarch={level}"])


def build(mutant: Mutant, source: Path, build_root: Path) -> Path:
    """Builds the library for one mutant (incrementally if its directory
    exists, with the options it was set up with); returns the .so."""
    directory = build_root / mutant.name
    commands = [["ninja", "-C", str(directory), "libckparity.so"]]
    if not (directory / "build.ninja").is_file():
        commands.insert(0, ["meson", "setup", str(directory), str(source), "--buildtype=release", *isa_args(),
                            *mutant.meson_args])
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise BuildFailed(f"building {mutant.name} failed ({' '.join(command[:2])}):\n{tail}")
    return directory / "libckparity.so"


def run_gates(library: Path, gates: list[str], tier: str, out_dir: Path, timeout: float,
              fail_fast: bool = False) -> dict:
    """One `ckparity gate` process against ``library``, the gates in the
    given order; per gate "passed", "failed", or, when the process ended with
    anything but 0 or 1 (a usage error, an unwritten report, a signal, a
    hang), "crashed"/"timeout" for the gate that was running and "not_run" for
    those after it (with ``fail_fast``, those after the first failure are
    "not_run" too). Only "failed" kills: the others measured nothing
    (``reason`` says why)."""
    env = dict(os.environ, CKP_LIB=str(library))
    command = [sys.executable, "-m", "ckparity", "gate", "--tier", tier, "--out-dir", str(out_dir), "--only", *gates,
               *(["--fail-fast"] if fail_fast else [])]
    for stale in out_dir.glob("*_latest.json"):
        stale.unlink()
    start = time.perf_counter()
    ending, reason = None, None
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode not in (0, 1):
            ending = "crashed"
            reason = (f"killed by signal {-done.returncode}" if done.returncode < 0 else
                      f"exit {done.returncode}") + ": " + " ".join(done.stderr.strip().splitlines()[-2:])[-300:]
    except subprocess.TimeoutExpired:
        ending, reason = "timeout", f"no result within {timeout:.0f}s"
    outcomes, seconds = {}, {}
    for gate in gates:
        path = out_dir / f"{gate}_latest.json"
        if path.is_file():
            result = json.loads(path.read_text())
            outcomes[gate] = "passed" if result["passed"] else "failed"
            seconds[gate] = result["seconds"]
        elif ending is not None:
            outcomes[gate], ending = ending, "not_run"  # the first missing gate is the one that died
        else:
            outcomes[gate] = "not_run"
    return {"gates": outcomes, "gate_seconds": seconds, "seconds": time.perf_counter() - start, "reason": reason}


def kill_row(control: dict, mutant: Mutant, run: dict) -> dict:
    """One mutant's row of the kill matrix: which gates kill it (report
    failed on it), the cheapest of them by the control run's time, and the
    gates that measured nothing (their process crashed, hung or exited with
    neither 0 nor 1). A mutant no gate killed whose every gate was measured
    survived; with an unmeasured gate it is not measured."""
    killers = [g for g, outcome in run["gates"].items() if outcome == "failed"]
    unmeasured = [g for g, outcome in run["gates"].items() if outcome in ("crashed", "timeout", "not_run")]
    cheapest = min(killers, key=lambda g: control["gate_seconds"].get(g, float("inf"))) if killers else None
    return {"mutant": mutant.name, "what": mutant.what, "build": list(mutant.meson_args), "gates": run["gates"],
            "killed": bool(killers), "killed_by": killers, "cheapest_killer": cheapest,
            "unmeasured_gates": unmeasured, "unmeasured_reason": run["reason"] if unmeasured else None,
            "seconds": run["seconds"]}


def mutate(source: Path, build_root: Path, out_dir: Path, tier: str, gates: list[str], names: list[str] | None,
           timeout: float, echo=print, matrix: bool = True) -> dict:
    """The whole run; the report says how far it got: a failed build, or
    Ctrl-C, ends it with what was measured until then (``error`` /
    ``interrupted``), never with nothing. Without ``matrix`` each mutant's
    gates run cheapest first (by the control's times) and stop at its first
    kill -- that kill is its cheapest killer, and the score is the same; the
    gates after it are "not_run" in its row."""
    start = time.perf_counter()
    known = catalogue(source)
    mutants = known if not names else [m for m in known if m.name in names]
    missing = set(names or ()) - {m.name for m in known}
    if missing:
        raise ValueError(f"unknown mutants {sorted(missing)} (known: {', '.join(m.name for m in known)})")
    report = {"schema": SCHEMA, "tier": tier, "gates": gates, "matrix": matrix, "build": isa_args(), "mutants": [],
              "score": None, "error": None, "interrupted": False}
    rows = []
    try:
        control_library = build(CONTROL, source, build_root)
        report["control"] = control = run_gates(control_library, gates, tier, out_dir / CONTROL.name, timeout)
        echo(f"control: {control['seconds']:.0f}s, " + ", ".join(f"{g} {o}" for g, o in control["gates"].items()))
        broken = [g for g, outcome in control["gates"].items() if outcome != "passed"]
        if broken:
            report["error"] = f"the gates {broken} do not pass on the control build: their kills would prove nothing"
        order = gates if matrix else sorted(gates, key=lambda g: control["gate_seconds"][g])
        for mutant in mutants if not broken else ():
            library = build(mutant, source, build_root)
            probe = equivalence_probe(control_library, library)
            if matrix or probe["outputs_differing"]:
                run = run_gates(library, order, tier, out_dir / mutant.name, timeout, fail_fast=not matrix)
            else:
                run = {"gates": {g: "skipped" for g in order}, "gate_seconds": {}, "seconds": 0.0, "reason": None}
            row = kill_row(control, mutant, run)
            row["probe"], row["equivalent_on_probe"] = probe, not probe["outputs_differing"]
            rows.append(row)
            echo(f"{mutant.name:32s} {'KILLED by ' + ', '.join(row['killed_by']) if row['killed'] else 'SURVIVED'}"
                 f"{' (equivalent on the probe)' if row['equivalent_on_probe'] else ''}  ({row['seconds']:.0f}s)")
    except BuildFailed as err:
        report["error"] = str(err)
    except KeyboardInterrupt:
        report["interrupted"] = True
    report["mutants"] = rows
    measured = [row for row in rows if row["killed"] or not row["unmeasured_gates"]]
    killed = sum(row["killed"] for row in measured)
    equivalent = sum(row["equivalent_on_probe"] and not row["killed"] for row in measured)
    report["score_raw"] = killed / len(measured) if measured else None
    report["score"] = killed / (len(measured) - equivalent) if len(measured) > equivalent else None
    report["killed"], report["equivalent"] = killed, equivalent
    report["probe_blind_spots"] = [row["mutant"] for row in rows if row["equivalent_on_probe"] and row["killed"]]
    report["survived"] = [row["mutant"] for row in measured if not row["killed"]]
    report["not_measured"] = ([row["mutant"] for row in rows if row not in measured]
                              + [m.name for m in mutants[len(rows):]])
    report["wall_s"] = time.perf_counter() - start
    return report


def equivalence_probe(control: Path, mutant: Path) -> dict:
    """ckparity.builds' cases through both libraries (loaded side by side)."""
    from ._native import ffi
    from .builds import differences

    return differences(ffi.dlopen(str(control)), ffi.dlopen(str(mutant)))


def table(report: dict) -> str:
    gates = report["gates"]
    short = {"passed": ".", "failed": "K", "crashed": "C", "timeout": "T", "not_run": "-", "skipped": "s"}
    lines = ["| mutant | " + " | ".join(gates) + " | cheapest killer |", "|---" * (len(gates) + 2) + "|"]
    for row in report["mutants"]:
        verdict = row["cheapest_killer"] or ("not measured" if row["unmeasured_gates"] else
                                             "survived: equivalent on the probe" if row.get("equivalent_on_probe")
                                             else "**survived**")
        lines.append(f"| {row['mutant']} | " + " | ".join(short[row["gates"][g]] for g in gates) + f" | {verdict} |")
    lines.append("")
    for row in report["mutants"]:
        if row["unmeasured_gates"] and not row["killed"]:
            lines.append(f"not measured: {row['mutant']} ({', '.join(row['unmeasured_gates'])}: "
                         f"{row['unmeasured_reason']})")
    for name in report.get("probe_blind_spots", ()):
        lines.append(f"probe blind spot: {name} is killed by a gate, but the probe (ckparity.builds) cannot tell it "
                     "from the control -- without --matrix it would be called equivalent: add a case that shows it")
    if report["error"] or report["interrupted"]:
        lines.append(f"{'error: ' + report['error'] if report['error'] else 'interrupted'}; not measured: "
                     f"{', '.join(report['not_measured']) or 'none'}")
    if report["score"] is not None:
        lines.append(f"score {report['killed']}/{len(report['mutants']) - report['equivalent']} = "
                     f"{report['score']:.0%} of the non-equivalent mutants killed ({report['equivalent']} equivalent "
                     f"on the probe; raw {report['score_raw']:.0%}), {report['tier']} tier, {report['wall_s']:.0f}s; "
                     "K failed (a kill), C crashed and T timed out (not measured), . passed, "
                     "s skipped (equivalent on the probe)")
    return "\n".join(lines)
