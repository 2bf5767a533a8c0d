"""examples/ckparity-example-kernels, end to end: an out-of-tree C kernel
package with its own meson build and a ckparity.backends entry point is
built and installed into a scratch directory, found by a fresh ckparity
process through the entry point alone (no --plugin), checked, trained with
and gated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ckparity-example-kernels"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("example_site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--target", str(target), str(EXAMPLE)],
                   check=True, capture_output=True, text=True, timeout=300)
    return target


def _ckparity(site: Path, cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckparity", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(site)})


@pytest.mark.parametrize("kernel", ["swiglu", "rms_norm"])
def test_the_installed_package_is_checked(site, tmp_path, kernel):
    done = _ckparity(site, tmp_path, "check", kernel, "--backend", "example", "--json-out", "-")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    # libm's expf and double row sums: not torch's bits, as accurate
    assert report["schema"] == "ckparity.check/1" and report["verdict"] == "as accurate as torch", report


def test_the_installed_package_trains_and_gates(site, tmp_path):
    out = tmp_path / "r.json"
    done = _ckparity(site, tmp_path, "train", "--ck-swiglu-backend", "example", "--ck-rmsnorm-backend", "example",
                     "--ck-optimizer-backend", "example", "--max-steps", "10", "--json-out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["status"] == "pass" and report["steps"] == 10
    assert report["max_moment_abs_diff"] > 0  # its moments were compared under torch's names, not as 0
    gate = _ckparity(site, tmp_path, "gate", "--backend", "swiglu=example", "--backend", "optimizer=example",
                     "--only", "kernel_parity", "optimizer_parity", "--out-dir", str(tmp_path / "gates"))
    kernel = json.loads((tmp_path / "gates" / "kernel_parity_latest.json").read_text())
    assert kernel["passed"] and kernel["details"]["user_backends"][0]["verdict"] == "as accurate as torch"
    # its AdamW writes torch's formulas as plain C multiply-adds; where torch's vectorized lerp fuses
    # one (AVX2, AVX-512) the moments are not torch's bits: held to check's bar, not to ckparity's
    # own kernel's bitwise moments, it is as accurate as torch on any CPU
    optimizer = json.loads((tmp_path / "gates" / "optimizer_parity_latest.json").read_text())
    sizes = optimizer["details"]["sizes"]
    assert sizes["verdict"] in ("bitwise", "as accurate as torch") and sizes["cases"] == 4
    assert optimizer["passed"] and gate.returncode == 0, gate.stdout


def test_a_faulty_kernel_of_the_package_is_judged_by_every_command(site, tmp_path):
    """The package's two deliberately faulty swiglus: the exp2f one is not as accurate as torch
    (check exits 0 on less accurate, 1 on wrong; the gate fails it either way); the one that aborts
    past 1024 columns crashes in check's child (SIGABRT, its property and case named) and fails the
    gate with a report, while a training run at narrow widths, which never reaches the abort, passes."""
    fast = _ckparity(site, tmp_path, "check", "swiglu", "--backend", "example_fast", "--json-out", "fast.json")
    report = json.loads((tmp_path / "fast.json").read_text())
    assert report["verdict"] in ("less accurate", "wrong") and not report["passes_gates"], report["verdict"]
    assert fast.returncode == (0 if report["verdict"] == "less accurate" else 1)
    widths = next(r for r in report["properties"] if r["property"] == "widths")
    assert widths["failing"] > 0 and widths["worst"][0]["ckparity_error64"] > widths["worst"][0]["torch_error64"]
    small = _ckparity(site, tmp_path, "check", "swiglu", "--backend", "example_small", "--json-out", "small.json")
    crashed = json.loads((tmp_path / "small.json").read_text())
    assert small.returncode == 1 and crashed["verdict"] == "crashes"
    assert crashed["crash"]["ending"] == "killed by SIGABRT" and crashed["crash"]["property"] == "widths"
    assert crashed["crash"]["case"].startswith("width=1376")
    gate = _ckparity(site, tmp_path, "gate", "--backend", "swiglu=example_fast", "--only", "kernel_parity",
                     "--out-dir", str(tmp_path / "fast_gates"))
    assert gate.returncode == 1
    entry = json.loads((tmp_path / "fast_gates" / "kernel_parity_latest.json").read_text())["details"]["user_backends"]
    assert entry[0]["passed"] is False and entry[0]["verdict"] == report["verdict"]
    gate = _ckparity(site, tmp_path, "gate", "--backend", "swiglu=example_small", "--only", "kernel_parity",
                     "--out-dir", str(tmp_path / "small_gates"))
    entry = json.loads((tmp_path / "small_gates" / "kernel_parity_latest.json").read_text())["details"]["user_backends"]
    assert gate.returncode == 1 and entry[0]["verdict"] == "crashes"  # a report, not a gate killed by SIGABRT
    train = _ckparity(site, tmp_path, "train", "--ck-swiglu-backend", "example_small", "--max-steps", "3",
                      "--json-out", "t.json")
    assert train.returncode == 0 and json.loads((tmp_path / "t.json").read_text())["status"] == "pass"
