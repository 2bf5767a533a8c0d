"""--envelope: the null model's ULP moves, and the verdict on a bit-identical and a faulty CK twin."""

from __future__ import annotations

from dataclasses import replace

import torch

from ckparity.harness import backends
from ckparity.harness.config import RunConfig
from ckparity.harness.envelope import move_ulps
from ckparity.harness.run import train


def test_move_ulps_steps_the_bits_and_leaves_zero_inf_nan():
    t = torch.tensor([1.0, -2.5, 0.0, float("inf"), float("nan"), 1e-30] * 100)
    moved = move_ulps(t, -2, 2, torch.Generator().manual_seed(0))
    steps = moved.view(torch.int32).long() - t.view(torch.int32).long()
    finite = torch.isfinite(t) & (t != 0)
    assert steps[finite].abs().max() == 2 and (steps[finite] != 0).any()
    assert torch.equal(moved[~finite & ~t.isnan()], t[~finite & ~t.isnan()]) and moved[t.isnan()].isnan().all()


def test_verdicts(tmp_path):
    base = RunConfig(max_steps=30, grad_accum=2, envelope=2, no_progress=True)
    same = train(replace(base, ck_loss_backend="torch", ck_optimizer_backend="torch", json_out=str(tmp_path / "a.json")))
    assert same["noise_verdict"] == "within_noise" and same["envelope"]["max_noise_ratio"]["param"] == 0.0
    backends.register("cross_entropy", "off_1e-4", lambda x, t: backends.CROSS_ENTROPY["torch"](x, t) * (1 + 1e-4))
    off = train(replace(base, ck_loss_backend="off_1e-4", json_out=str(tmp_path / "b.json")))
    assert off["noise_verdict"] == "beyond_noise" and off["envelope"]["first_beyond_step"] == 1
