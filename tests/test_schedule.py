"""--lr-schedule / --warmup-steps: torch's scheduler classes give ckparity's
AdamW and torch's the same lr at every step, bit for bit; the lr follows the
closed form of each schedule; the twins stay bit-identical under a schedule
where their kernels are; bad values are refused before the run."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import ckparity
from ckparity import reference
from ckparity.harness.longrun import schedule
from ckparity.harness.basics.config import RunConfig, UsageError
from ckparity.harness.loop.run import train
from ckparity.harness.twins.stepper import Twin


def _lrs(make, config: RunConfig, steps: int) -> list[float]:
    p = torch.nn.Parameter(torch.randn(5))
    twin = Twin("t", torch.nn.Linear(1, 1), make([p], lr=config.lr), None)
    schedule.attach(twin, config, steps)
    lrs = []
    for _ in range(steps):
        lrs.append(twin.optimizer.param_groups[0]["lr"])
        p.grad = torch.ones(5)
        twin.update(0.0)
    return lrs


@pytest.mark.parametrize("kind", schedule.SCHEDULES)
@pytest.mark.parametrize("warmup", [0, 4])
def test_both_optimizers_get_the_same_lr_and_it_follows_the_schedule(kind, warmup):
    config = RunConfig(lr=3e-3, lr_schedule=kind, warmup_steps=warmup, no_progress=True)
    steps = 20
    ours, torchs = _lrs(ckparity.optim.AdamW, config, steps), _lrs(reference.adamw, config, steps)
    assert ours == torchs  # the same Python floats: bit for bit
    rest = steps - warmup
    for k, lr in enumerate(ours):
        if k < warmup:
            expected = 3e-3 * (1 / warmup + (1 - 1 / warmup) * k / warmup)
        else:
            t = k - warmup
            expected = 3e-3 * {"constant": 1.0, "linear": 1 - t / rest,
                               "cosine": 0.5 * (1 + math.cos(math.pi * t / rest))}[kind]
        assert lr == pytest.approx(expected, rel=1e-9, abs=1e-15), (k, lr, expected)


def test_a_bitwise_twin_stays_bitwise_under_a_schedule_and_the_schedule_changes_the_run(tmp_path):
    base = RunConfig(model="stacked", num_layers=2, max_steps=12, ck_loss_backend="c_ptref",
                     ck_optimizer_backend="torch", no_progress=True)
    cosine = train(replace(base, lr_schedule="cosine", warmup_steps=3, json_out=str(tmp_path / "a.json")))
    flat = train(replace(base, json_out=str(tmp_path / "b.json")))
    assert cosine["status"] == "pass" and cosine["max_param_abs_diff"] == 0.0
    assert cosine["series"]["torch_loss"][-1] != flat["series"]["torch_loss"][-1]  # the lr did change
    assert cosine["config"]["lr_schedule"] == "cosine" and cosine["config"]["warmup_steps"] == 3


def test_the_float64_shadow_and_envelope_members_follow_the_schedule(tmp_path):
    """A member or a shadow without the schedule would drift from the twins from the first step."""
    report = train(RunConfig(max_steps=8, lr_schedule="linear", warmup_steps=2, envelope=1, f64_shadow=True,
                             ck_loss_backend="c_ptref", ck_optimizer_backend="torch", no_progress=True,
                             json_out=str(tmp_path / "r.json")))
    assert report["status"] == "pass"
    assert max(report["shadow"]["series"]["torch_param_diff"]) < 1e-5  # unscheduled: ~5e-3
    assert max(report["envelope"]["series"]["param_max"]) < 1e-5  # a member at the unscheduled lr: ~5e-3


def test_bad_schedules_are_refused_before_the_run(tmp_path):
    with pytest.raises(UsageError, match="lr-schedule"):
        RunConfig(lr_schedule="step")
    with pytest.raises(UsageError, match="warmup-steps"):
        RunConfig(warmup_steps=-1)
    with pytest.raises(UsageError, match="leaves none of the run's 5 steps"):  # 47 tokens: 5 windows of 8
        train(RunConfig(total_tokens=48, warmup_steps=5, no_progress=True, json_out=str(tmp_path / "r.json")))
    assert not (tmp_path / "r.json").exists()
