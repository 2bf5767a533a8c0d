"""ckparity mutate: the catalogue matches the C sources, and one mutant runs
end to end (built, loaded through CKP_LIB, killed by a gate)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckparity.mutate import CONTROL, build, catalogue, equivalence_probe

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    """One scratch build directory for the module: the control build is made once."""
    return tmp_path_factory.mktemp("mutant_builds")


def test_every_mutant_is_planted_somewhere():
    """A catalogue entry no kernel tests for would be a mutant that cannot be killed (nor run)."""
    sources = "".join(p.read_text() for p in (ROOT / "csrc").glob("*.c"))
    planted = set(re.findall(r"CKP_MUTANT\((\w+)\)", sources))
    named = {m.name.upper() for m in catalogue(ROOT) if m.meson_args[0].startswith("-Dc_args")}
    assert named == planted
    assert len(catalogue(ROOT)) >= 12


def _mutate(tmp_path, build_dir, *args):
    return subprocess.run([sys.executable, "-m", "ckparity", "mutate", "--source", str(ROOT),
                           "--build-dir", str(build_dir), "--out-dir", str(tmp_path / "gates"),
                           "--json-out", str(tmp_path / "mutate.json"), *args],
                          capture_output=True, text=True, timeout=900)


@pytest.mark.nightly  # CI builds and runs mutants in the tests below (equivalence, SIGTERM, a failed build)
def test_one_mutant_end_to_end(tmp_path, build_dir):
    """Two gates, of which kernel_parity kills ce_cheap_exp: without --matrix they
    run in the order of the control's times (kernel_parity first, unless the
    machine is busy) and stop at the kill; with --matrix both run."""
    done = _mutate(tmp_path, build_dir, "--mutants", "ce_cheap_exp", "--gates", "fd_gradients", "kernel_parity")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "mutate.json").read_text())
    assert report["control"]["gates"] == {"fd_gradients": "passed", "kernel_parity": "passed"}
    seconds = report["control"]["gate_seconds"]
    first, second = sorted(seconds, key=seconds.get)
    (row,) = report["mutants"]
    assert row["mutant"] == "ce_cheap_exp" and row["killed_by"] == ["kernel_parity"]
    assert list(row["gates"]) == [first, second]
    assert row["gates"][second] == ("not_run" if first == "kernel_parity" else "failed")
    assert row["cheapest_killer"] == "kernel_parity" and report["score"] == 1.0
    assert row["equivalent_on_probe"] is False and row["probe"]["outputs_differing"]
    done = _mutate(tmp_path, build_dir, "--mutants", "ce_cheap_exp", "--gates", "fd_gradients", "kernel_parity",
                   "--matrix")
    (row,) = json.loads((tmp_path / "mutate.json").read_text())["mutants"]
    assert row["gates"] == {"fd_gradients": "passed", "kernel_parity": "failed"}
    # the gate ran against the mutant's build, not the installed library
    gate = json.loads((tmp_path / "gates" / "ce_cheap_exp" / "kernel_parity_latest.json").read_text())
    assert not gate["passed"] and "cross_entropy.default" in gate["summary"]


def test_a_mutant_equivalent_on_the_probe_skips_the_gates_without_matrix(tmp_path, build_dir):
    """ce_blocks_reversed reorders a double sum: no float32 output changes on
    the probe, so the quick run does not spend every gate on it; it is out of
    the score's denominator, not a kill."""
    done = _mutate(tmp_path, build_dir, "--mutants", "ce_blocks_reversed", "--gates", "kernel_parity")
    assert done.returncode == 1, done.stdout + done.stderr  # no score to meet --min-score with
    report = json.loads((tmp_path / "mutate.json").read_text())
    (row,) = report["mutants"]
    assert row["gates"] == {"kernel_parity": "skipped"} and row["equivalent_on_probe"] and not row["killed"]
    assert not (tmp_path / "gates" / "ce_blocks_reversed").exists()
    assert report["equivalent"] == 1 and report["score"] is None and report["score_raw"] == 0.0
    assert "equivalent on the probe" in done.stdout


def test_unknown_mutant_is_refused_before_any_build(tmp_path):
    done = _mutate(tmp_path, tmp_path / "build", "--mutants", "no_such_mutant", "--gates", "kernel_parity")
    assert done.returncode == 2 and "no_such_mutant" in done.stderr
    assert not (tmp_path / "build").exists()


def test_equivalence_probe_tells_a_reordered_double_sum_from_a_reordered_float_one(build_dir):
    """Reversing the order in which cross-entropy's double block sums are added
    changes no float32 output on the probe; reversing rms_norm's float sum of
    squares changes many."""
    mutants = {m.name: m for m in catalogue(ROOT)}
    control = build(CONTROL, ROOT, build_dir)
    same = equivalence_probe(control, build(mutants["ce_blocks_reversed"], ROOT, build_dir))
    assert same["outputs_compared"] > 50 and same["outputs_differing"] == []
    reordered = equivalence_probe(control, build(mutants["rms_sum_reversed"], ROOT, build_dir))
    assert {row["case"].split()[0] for row in reordered["outputs_differing"]} == {"rms_norm"}


def test_the_probe_sees_a_target_at_a_shard_start_and_a_nan_on_one_side(build_dir):
    """Two mutants a gate kills that the probe once could not tell from the
    control (so the quick tier skipped their gates and took them out of the
    score): a target in a vocab shard's first column not counted as owned, a
    NaN on one side only compared equal."""
    mutants = {m.name: m for m in catalogue(ROOT)}
    control = build(CONTROL, ROOT, build_dir)
    for name, family in (("vp_ce_shard_start_target", "vocab_parallel_ce"), ("compare_nan_equal", "compare")):
        seen = equivalence_probe(control, build(mutants[name], ROOT, build_dir))
        assert {row["case"].split()[0] for row in seen["outputs_differing"]} == {family}, name


# Reverses the order in which double block sums are added, whose float32
# rounding the probe never sees change; every gate passed it in the quick run
# that still ran the gates on it (README "Do the gates fail?").
EQUIVALENT = {"ce_blocks_reversed"}


@pytest.mark.nightly
def test_the_probe_tells_every_mutant_but_the_equivalent_one_from_the_control(build_dir):
    """Without --matrix a mutant the probe cannot tell from the control skips
    the gates and leaves the score: each blind spot of the probe would make
    the score look better than it is. Builds the whole catalogue (minutes)."""
    control = build(CONTROL, ROOT, build_dir)
    blind = {m.name for m in catalogue(ROOT)
             if not equivalence_probe(control, build(m, ROOT, build_dir))["outputs_differing"]}
    assert blind == EQUIVALENT


def test_a_gate_kill_of_a_probe_equivalent_mutant_is_reported_as_a_blind_spot(tmp_path, monkeypatch):
    """With --matrix the gates run on a mutant the probe calls equivalent; a
    kill there is a case the probe lacks, and the report names it."""
    import ckparity.mutate as mutate

    monkeypatch.setattr(mutate, "build", lambda mutant, source, root: tmp_path / mutant.name)
    monkeypatch.setattr(mutate, "equivalence_probe", lambda a, b: {"outputs_compared": 1, "outputs_differing": []})
    outcome = lambda library: "failed" if library.name == "ce_cheap_exp" else "passed"  # noqa: E731
    monkeypatch.setattr(mutate, "run_gates", lambda library, gates, *a, **k: {
        "gates": {g: outcome(library) for g in gates}, "gate_seconds": {g: 1.0 for g in gates}, "seconds": 1.0,
        "reason": None})
    report = mutate.mutate(ROOT, tmp_path, tmp_path, "quick", ["kernel_parity"], ["ce_cheap_exp", "ce_blocks_reversed"],
                           60, echo=lambda *a: None, matrix=True)
    assert report["probe_blind_spots"] == ["ce_cheap_exp"]
    assert report["killed"] == 1 and report["equivalent"] == 1
    assert "probe blind spot: ce_cheap_exp" in mutate.table(report)


def test_a_failed_build_leaves_a_report_that_says_so(tmp_path):
    broken = tmp_path / "checkout"
    (broken / "csrc").mkdir(parents=True)
    (broken / "csrc" / "mutants.h").write_text((ROOT / "csrc" / "mutants.h").read_text())
    (broken / "meson_options.txt").write_text((ROOT / "meson_options.txt").read_text())  # -Dclones, -Dmarch
    (broken / "meson.build").write_text("project('broken', 'c')\nerror('this checkout does not build')\n")
    done = subprocess.run([sys.executable, "-m", "ckparity", "mutate", "--source", str(broken),
                           "--build-dir", str(tmp_path / "build"), "--out-dir", str(tmp_path / "gates"),
                           "--json-out", str(tmp_path / "mutate.json"), "--gates", "kernel_parity"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    report = json.loads((tmp_path / "mutate.json").read_text())
    assert "building control failed" in report["error"] and "does not build" in report["error"]
    assert report["mutants"] == [] and len(report["not_measured"]) == len(catalogue(ROOT))


def test_only_a_failed_gate_kills_a_crash_measures_nothing():
    from ckparity.mutate import Mutant, kill_row

    control = {"gate_seconds": {"a": 1.0, "b": 5.0, "c": 2.0}}
    mutant = Mutant("m", "a planted bug", ())
    failed = kill_row(control, mutant, {"gates": {"a": "passed", "b": "failed", "c": "failed"}, "seconds": 3.0,
                                        "reason": None})
    assert failed["killed"] and failed["killed_by"] == ["b", "c"] and failed["cheapest_killer"] == "c"
    assert failed["unmeasured_gates"] == []
    crashed = kill_row(control, mutant, {"gates": {"a": "passed", "b": "crashed", "c": "not_run"}, "seconds": 3.0,
                                         "reason": "exit 2: usage"})
    assert not crashed["killed"] and crashed["unmeasured_gates"] == ["b", "c"]
    assert crashed["unmeasured_reason"] == "exit 2: usage"


def test_sigterm_leaves_the_report_of_what_was_measured(tmp_path):
    import signal
    import time

    out = tmp_path / "mutate.json"
    proc = subprocess.Popen([sys.executable, "-m", "ckparity", "mutate", "--source", str(ROOT), "--build-dir",
                             str(tmp_path / "build"), "--out-dir", str(tmp_path / "gates"), "--json-out", str(out),
                             "--gates", "kernel_parity", "--mutants", "ce_cheap_exp"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)  # inside the control build or its gate run
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    report = json.loads(out.read_text())
    assert report["interrupted"] is True and "ce_cheap_exp" in report["not_measured"]
