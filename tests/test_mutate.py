"""ckparity mutate: the catalogue matches the C sources, and one mutant runs
end to end (built, loaded through CKP_LIB, killed by a gate)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from ckparity.mutate import catalogue

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_is_planted_somewhere():
    """A catalogue entry no kernel tests for would be a mutant that cannot be killed (nor run)."""
    sources = "".join(p.read_text() for p in (ROOT / "csrc").glob("*.c"))
    planted = set(re.findall(r"CKP_MUTANT\((\w+)\)", sources))
    named = {m.name.upper() for m in catalogue(ROOT) if m.meson_args[0].startswith("-Dc_args")}
    assert named == planted
    assert len(catalogue(ROOT)) >= 12


def _mutate(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "ckparity", "mutate", "--source", str(ROOT),
                           "--build-dir", str(tmp_path / "build"), "--out-dir", str(tmp_path / "gates"),
                           "--json-out", str(tmp_path / "mutate.json"), *args],
                          capture_output=True, text=True, timeout=900)


def test_one_mutant_end_to_end(tmp_path):
    done = _mutate(tmp_path, "--mutants", "ce_cheap_exp", "--gates", "kernel_parity")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "mutate.json").read_text())
    assert report["control"]["gates"] == {"kernel_parity": "passed"}
    (row,) = report["mutants"]
    assert row["mutant"] == "ce_cheap_exp" and row["killed_by"] == ["kernel_parity"]
    assert report["score"] == 1.0
    # the gate ran against the mutant's build, not the installed library
    gate = json.loads((tmp_path / "gates" / "ce_cheap_exp" / "kernel_parity_latest.json").read_text())
    assert not gate["passed"] and "cross_entropy.default" in gate["summary"]


def test_unknown_mutant_is_refused_before_any_build(tmp_path):
    done = _mutate(tmp_path, "--mutants", "no_such_mutant", "--gates", "kernel_parity")
    assert done.returncode == 2 and "no_such_mutant" in done.stderr
    assert not (tmp_path / "build").exists()
