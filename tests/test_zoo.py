"""ckparity zoo and the peers' criteria: each criterion fires on what its
source checks and not on a twin without a bug; the zoo detects planted
bugs, blames their slot, and fails when a scenario is missed or the control
raises an alarm."""

from __future__ import annotations

import json
from dataclasses import replace

import torch.nn.functional as F

from ckparity import kernels
from ckparity.cli import main
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.loop.run import train
from ckparity.harness.observers.peers import allclose
from ckparity.zoo.run import passed, table
from ckparity.zoo.scenarios import SCENARIOS

import torch

BASE = RunConfig(max_steps=33, ck_loss_backend="c_ptref", no_progress=True)


def _scaled(factor):
    return lambda logits, t, **kw: F.cross_entropy(logits, t, **kw) * factor


kernels.register("cross_entropy", "zoo_test_1e-3", _scaled(1 + 1e-3))
kernels.register("cross_entropy", "zoo_test_1e-6", _scaled(1 + 1e-6))


def test_liger_fires_on_a_loss_llm_c_misses_and_neither_on_torch(tmp_path):
    """A loss 0.1% off: |diff| ~5e-3 is under llm.c's 1e-2, over Liger fp32's
    rtol 2e-5 (known at step 32, when its test compares); 1e-6 off is under
    both; the torch backends trip nothing."""
    off = train(replace(BASE, ck_loss_backend="zoo_test_1e-3", json_out=str(tmp_path / "a.json")))["peers"]
    assert off["liger_fp32"] == {"detected": True, "step": 32, "failed": ["loss"], "reached": True}
    assert not off["llm_c"]["detected"] and off["llm_c"]["reached"]
    assert not off["liger_bf16"]["detected"]  # rtol 1e-2
    small = train(replace(BASE, ck_loss_backend="zoo_test_1e-6", json_out=str(tmp_path / "b.json")))["peers"]
    assert not any(r["detected"] for r in small.values())
    same = train(replace(BASE, ck_optimizer_backend="torch", ck_loss_backend="torch", json_out=str(tmp_path / "c.json")))
    assert not any(r["detected"] for r in same["peers"].values()) and same["divergence"]["first_step"] is None


def test_llm_c_checks_the_first_steps_logits_and_grads(tmp_path):
    """A loss 2x off is caught by llm.c at step 1 (loss and gradients); a run
    shorter than Liger's 32 steps never reaches its comparison."""
    kernels.register("cross_entropy", "zoo_test_x2", _scaled(2.0))
    peers = train(replace(BASE, max_steps=5, ck_loss_backend="zoo_test_x2", json_out=str(tmp_path / "r.json")))["peers"]
    assert peers["llm_c"]["step"] == 1 and {"grads", "loss"} <= set(peers["llm_c"]["failed"])
    assert peers["liger_fp32"] == {"detected": False, "step": None, "failed": [], "reached": False}


def test_allclose_is_ligers_rule():
    expected, actual = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 2.1e-5])
    assert not allclose(expected, actual, 0.0, 1e-5) and allclose(expected, actual, 0.0, 2e-5)
    assert not allclose(torch.tensor([float("nan")]), torch.tensor([1.0]), 1.0, 1.0)
    assert allclose(torch.tensor([float("inf")]), torch.tensor([float("inf")]), 0.0, 0.0)


def test_every_scenario_names_a_source_and_a_slot():
    names = [s.name for s in SCENARIOS]
    assert len(names) >= 16 and len(set(names)) == len(names)
    for s in SCENARIOS:
        assert s.source.startswith("https://github.com/") and s.kind in kernels.KERNELS
        RunConfig(**s.flags)  # the flags are the run's: a typo would fail here


def test_the_zoo_detects_blames_and_writes_its_report(tmp_path, capsys):
    """One scenario end to end, shortened (CI time: a bug caught at step 1 is the other tests' case): the
    rms_norm whose error is one ULP outward on a fourth of its outputs crosses no tolerance and no peer's
    criterion, and fails the run by the envelope's direction; attribute blames rmsnorm, and check calls it
    less accurate. The control stays silent."""
    out = tmp_path / "zoo.json"
    code = main(["zoo", "--only", "rmsnorm_leans_below_ulp", "--steps", "40", "--seeds", "1",
                 "--jobs", "1", "--out-dir", str(tmp_path / "runs"), "--json-out", str(out),
                 "--html", str(tmp_path / "zoo.html")])
    report = json.loads(out.read_text())
    assert code == 0 and report["schema"] == "ckparity.zoo/1" and report["status"] == "complete"
    (lean,) = report["scenarios"]
    assert lean["name"] == "rmsnorm_leans_below_ulp"
    assert lean["detected"] and lean["caught_by"] == ["train", "check"] and lean["train"]["directed"]
    assert lean["first_fail_step"] == 40  # a direction has no step: the run's last
    # check sees the lean as less accurate than torch (a gate fails it; check itself exits 0)
    assert lean["check"]["passed"] and "bad_input" not in lean["check"]["findings"]
    assert lean["check"]["findings"]["widths"] == "less accurate"
    assert lean["train"]["first_loss_fail_step"] is None and lean["train"]["first_param_fail_step"] is None
    assert lean["peers"] == {"liger_fp32": None, "liger_bf16": None, "llm_c": None}
    assert lean["blamed"] == ["rms_norm"]
    assert report["control"]["passed"] and report["control"]["seeds"][0]["peers_fired"] == []
    assert "| rmsnorm_leans_below_ulp | 40 | train, check | rms_norm |" in capsys.readouterr().out
    page = (tmp_path / "zoo.html").read_text()  # the page: the verdict line and the same row as a table row
    assert '<p class="pass">1 of 1 planted bugs detected</p>' in page
    assert "<td>rmsnorm_leans_below_ulp</td><td>40</td><td>train, check</td><td>rms_norm</td>" in page


def test_a_missed_scenario_or_a_false_alarm_fails_the_zoo():
    row = {"name": "x", "detected": False, "first_fail_step": None, "caught_by": [], "blamed": [],
           "blamed_right": False, "peers": {"liger_fp32": None, "liger_bf16": None, "llm_c": None}, "seconds": 1.0}
    missed = {"scenarios": [row], "control": {"passed": True, "seeds": []}}
    assert not passed(missed) and "| x | missed |" in table(missed)
    alarm = {"scenarios": [{**row, "detected": True}],
             "control": {"passed": False, "seeds": [{"seed": 42, "status": "fail", "peers_fired": []}]}}
    assert not passed(alarm) and "FALSE ALARM" in table(alarm)


def test_an_unknown_scenario_is_refused_before_any_run(tmp_path, capsys):
    assert main(["zoo", "--only", "no_such", "--json-out", str(tmp_path / "z.json")]) == 2
    assert "no scenario 'no_such'" in capsys.readouterr().err and not (tmp_path / "z.json").exists()


def test_a_signal_stops_the_zoo_and_leaves_its_report(tmp_path, monkeypatch):
    """A run a signal stopped writes its report and returns: the zoo stops
    there too (it does not go on to the next scenario), status interrupted."""
    import pytest

    from ckparity.harness.basics.interrupts import Interrupted
    from ckparity.zoo import run

    monkeypatch.setattr(run, "train_run", lambda config: {"status": "interrupted", "stopped_by_signal": 15})
    out = tmp_path / "zoo.json"
    with pytest.raises(Interrupted):
        run.zoo(["gemma_one_plus_w"], 5, 0, tmp_path / "runs", str(out), 1)
    report = json.loads(out.read_text())
    assert report["status"] == "interrupted" and report["stopped_by_signal"] == 15 and report["scenarios"] == []
