"""--dump-step N / ckparity replay / load_dump: a step taken out of
a run holds both twins' state before it, its batch, activations and
gradients; recomputed from the dump it repeats the run's bits, and a planted
fault shows in the CK-against-float64 rows, not in torch's."""

from __future__ import annotations

import json

import pytest
import torch

from ckparity import kernels
from ckparity.cli import main
from ckparity.harness.basics.config import RunConfig, UsageError
from ckparity.harness.longrun.dump import load_dump, replay
from ckparity.harness.loop.run import train


def test_a_dumped_step_loads_and_replays_to_the_runs_bits(tmp_path):
    report = train(RunConfig(model="stacked", grad_accum=2, max_steps=4, dump_step=3, dump_dir=str(tmp_path / "d"),
                             no_progress=True, json_out=str(tmp_path / "r.json")))
    assert report["dump"] == str(tmp_path / "d")
    dump = load_dump(str(tmp_path / "d"))
    assert dump["step"] == 3 and dump["config"].model == "stacked" and len(dump["batch"]) == 2
    tokens, targets = dump["batch"][0]
    assert tokens.dtype == torch.int64 and tokens.shape == targets.shape
    assert set(dump["before"]["ck"]["model"]) == set(dump["before"]["torch"]["model"])
    assert "loss" in dump["ck"]["acts"][0] and "logits" in dump["ck"]["act_grads"][0]
    assert set(dump["ck"]["grads"]) == set(dump["before"]["ck"]["model"])
    # the step's own loss, as the run recorded it
    run_losses = json.loads((tmp_path / "r.json").read_text())["series"]["ck_loss"]
    dumped = sum(float(a["loss"]) for a in dump["ck"]["acts"]) / 2
    assert dumped == pytest.approx(run_losses[2], rel=1e-6)
    result = replay(str(tmp_path / "d"))
    assert result["faithful"] is True
    assert [r["stage"] for r in result["ck_vs_torch"]["forward"]][-2:] == ["logits", "loss"]
    assert main(["replay", str(tmp_path / "d"), "--json-out", str(tmp_path / "rows.json")]) == 0
    assert json.loads((tmp_path / "rows.json").read_text())["step"] == 3


def test_a_planted_loss_fault_shows_against_float64_in_the_ck_rows(tmp_path, monkeypatch):
    monkeypatch.setitem(kernels.backends("cross_entropy"), "off_1e-3",
                        lambda x, t, **kw: kernels.backends("cross_entropy")["torch"](x, t, **kw) * (1 + 1e-3))
    train(RunConfig(max_steps=2, dump_step=2, dump_dir=str(tmp_path / "d"), ck_loss_backend="off_1e-3",
                    no_progress=True, json_out=str(tmp_path / "r.json")))
    result = replay(str(tmp_path / "d"))
    loss = {k: next(r for r in result[k]["forward"] if r["stage"] == "loss") for k in
            ("ck_vs_float64", "torch_vs_float64")}
    assert loss["ck_vs_float64"]["abs_diff"] > 1000 * loss["torch_vs_float64"]["abs_diff"]


def test_bad_dump_requests_are_refused(tmp_path):
    with pytest.raises(UsageError, match="--dump-step 9 is beyond the run's 4 steps"):
        train(RunConfig(max_steps=4, dump_step=9, no_progress=True, json_out=str(tmp_path / "r.json")))
    assert not (tmp_path / "r.json").exists()
    with pytest.raises(UsageError, match="no step dump there"):
        load_dump(str(tmp_path))
