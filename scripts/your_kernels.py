"""Every command's verdict on a user's kernels: the stand-ins of
scripts/standin_kernels.py (exact, 1e-3 off, crashing, without label
smoothing; each slot) through ``ckparity check``, ``ckparity gate`` (the
gate that judges the slot, and a short drift_smoke) and a short ``ckparity
train``, as a user would run them (--plugin, the command line only), with
what each said: exit code, verdict, and whether that is honest.

    python scripts/your_kernels.py --json-out reports/your_kernels/after.json

Run it with another installation's Python (PYTHONPATH naming an older
ckparity) for the "before" column. ``--loss-gate-time`` also times the gates
that train under ``gate --backend loss=exact`` (long_horizon,
accuracy_parity, noise_envelope at the quick tier), and counts their runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def plugin(cwd: Path, kernel: str, name: str) -> str:
    """A plugin file registering the one stand-in ``name`` of ``kernel``."""
    path = cwd / f"standin_{kernel}_{name}.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport standin_kernels\n"
                    f"standin_kernels.register({kernel!r}, {name!r})\n")
    return str(path)
SLOTS = {"cross_entropy": ["exact", "off", "crashes", "no_smoothing"], "rms_norm": ["exact", "off", "crashes"],
         "swiglu": ["exact", "off", "crashes"], "rope": ["exact", "off", "crashes"],
         "adamw": ["exact", "off", "crashes"]}
FLAGS = {"cross_entropy": "--ck-loss-backend", "rms_norm": "--ck-rmsnorm-backend", "swiglu": "--ck-swiglu-backend",
         "rope": "--ck-rope-backend", "adamw": "--ck-optimizer-backend"}
# what an honest verdict is: check's, and whether a gate or a train run should pass
HONEST_CHECK = {"exact": {"bitwise"}, "off": {"wrong"}, "crashes": {"crashes"},
                "no_smoothing": {"not supported"}}
SHORT = """[drift_smoke]
steps = 20
models = ["tiny"]
[optimizer_parity]
steps = 20
[long_horizon]
steps = 30
[accuracy_parity]
steps = 20
[noise_envelope]
steps = 30
"""


def ckparity(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "ckparity", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=3600, env={**os.environ, "CKP_PLUGINS": ""})
    return done, round(time.perf_counter() - start, 1)


def _last_line(done: subprocess.CompletedProcess) -> str:
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return lines[-1][:300] if lines else ""


def check_row(cwd: Path, kernel: str, name: str) -> dict:
    out = cwd / f"check_{kernel}_{name}.json"
    done, seconds = ckparity(cwd, "check", kernel, "--plugin", plugin(cwd, kernel, name), "--backend", name, "--json-out", str(out))
    report = json.loads(out.read_text()) if out.is_file() else {}
    verdict = report.get("verdict")
    return {"command": "check", "kernel": kernel, "backend": name, "exit": done.returncode, "verdict": verdict,
            "seconds": seconds, "said": _last_line(done) if not report else None}


def gate_row(cwd: Path, kernel: str, name: str) -> dict:
    gates = ["optimizer_parity" if kernel == "adamw" else "kernel_parity", "drift_smoke"]
    out = cwd / f"gates_{kernel}_{name}"
    done, seconds = ckparity(cwd, "gate", "--plugin", plugin(cwd, kernel, name), "--backend", f"{kernel}={name}", "--only", *gates,
                             "--config", str(cwd / "short.toml"), "--out-dir", str(out))
    results = {g: json.loads((out / f"{g}_latest.json").read_text()) for g in gates
               if (out / f"{g}_latest.json").is_file()}
    user = (results.get("kernel_parity", {}).get("details", {}).get("user_backends") or [{}])[0]
    return {"command": "gate", "kernel": kernel, "backend": name, "exit": done.returncode,
            "passed": {g: r["passed"] for g, r in results.items()}, "entry_passed": user.get("passed"),
            "summaries": {g: r["summary"][:300] for g, r in results.items()},
            "seconds": seconds, "said": _last_line(done) if not results else None}


def train_row(cwd: Path, kernel: str, name: str) -> dict:
    out = cwd / f"train_{kernel}_{name}.json"
    model = ["--model", "llama"] if kernel == "rope" else []
    done, seconds = ckparity(cwd, "train", "--plugin", plugin(cwd, kernel, name), FLAGS[kernel], name, *model, "--max-steps", "20",
                             "--no-progress", "--json-out", str(out))
    report = json.loads(out.read_text()) if out.is_file() else {}
    return {"command": "train", "kernel": kernel, "backend": name, "exit": done.returncode,
            "status": report.get("status"), "seconds": seconds, "said": _last_line(done) if not report else None}


def honest(row: dict) -> bool:
    """Whether what the command said of the stand-in is true."""
    name = row["backend"]
    refused = row["exit"] == 2 and "breaks its contract" in (row["said"] or "")  # before any run, with the reason
    if row["command"] == "check":
        return (row["verdict"] in HONEST_CHECK[name] and row["exit"] == (0 if name in ("exact", "no_smoothing")
                                                                           else 1)) or (name == "off" and refused)
    if row["command"] == "gate":  # the judging gate passes exactly the kernels that should, its entry agreeing
        judged = row["passed"].get("optimizer_parity" if row["kernel"] == "adamw" else "kernel_parity")
        should = name in ("exact", "no_smoothing")
        return (judged == should and row.get("entry_passed") in (None, judged)
                and row["exit"] == (0 if should else 1)) or (name == "off" and refused)
    # train: exact and no_smoothing pass; off fails parity, or its contract refuses it (exit 2, no report);
    # crashes either never reaches a crashing width (passes) or stops with no parity verdict on the kernel
    if name in ("exact", "no_smoothing"):
        return row["status"] == "pass" and row["exit"] == 0
    if name == "off":
        return (row["status"], row["exit"]) == ("fail", 1) or refused
    return (row["status"], row["exit"]) == ("pass", 0) or (row["status"] in (None, "error") and row["exit"] != 0)


def loss_gate_time(cwd: Path) -> dict:
    gates = ["long_horizon", "accuracy_parity", "noise_envelope"]
    out = cwd / "loss_gates"
    done, seconds = ckparity(cwd, "gate", "--plugin", plugin(cwd, "cross_entropy", "exact"), "--backend", "loss=exact",
                             "--only", *gates, "--out-dir", str(out))  # the quick tier's settings
    runs = {}
    for g in gates:
        path = out / f"{g}_latest.json"
        if path.is_file():  # long_horizon lists its runs; accuracy_parity and noise_envelope rows per loss backend
            details = json.loads(path.read_text())["details"]
            runs[g] = len(details["runs"]) if "runs" in details else len({r["loss_backend"] for r in details["rows"]})
    return {"exit": done.returncode, "seconds": seconds, "runs": runs, "said": _last_line(done)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out", required=True)
    parser.add_argument("--loss-gate-time", action="store_true")
    parser.add_argument("--only", nargs="+", choices=["check", "gate", "train"], default=["check", "gate", "train"])
    parser.add_argument("--rescore", default=None, help="score the rows of this earlier result again (and with "
                        "--loss-gate-time, time the loss gates again) instead of running them")
    args = parser.parse_args()
    rows = json.loads(Path(args.rescore).read_text())["rows"] if args.rescore else []
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        (cwd / "short.toml").write_text(SHORT)
        commands = {"check": check_row, "gate": gate_row, "train": train_row}
        for kernel, names in SLOTS.items() if not args.rescore else ():
            for name in names:
                for command in args.only:
                    row = commands[command](cwd, kernel, name)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        earlier = json.loads(Path(args.rescore).read_text())["loss_gate_time"] if args.rescore else None
        timing = loss_gate_time(cwd) if args.loss_gate_time else earlier
    for row in rows:
        row["honest"] = honest(row)
    honest_rows = sum(r["honest"] for r in rows)
    result = {"rows": rows, "honest": honest_rows, "of": len(rows), "loss_gate_time": timing}
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{honest_rows} of {len(rows)} honest; loss gates: {timing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
