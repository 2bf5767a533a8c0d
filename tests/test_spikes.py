"""--spike-triage: the spike rule, the classes, and planted spikes -- a
kernel fault that bites only at large logits in the CK twin (kernel), in the
torch twin (torch_only), in both float32 twins but not in float64
(float32_numerics), and an lr spike in both twins (dynamics) -- classified
as what they are."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import reference
from ckparity import kernels
from ckparity.harness.basics.config import UsageError
from ckparity.harness.studies.repro import STRESS
from ckparity.harness.loop.run import train
from ckparity.harness.observers.spikes import classify, is_spike


def test_spike_rule():
    flat = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]
    assert is_spike(1.6, flat) == (True, 1.0)
    assert not is_spike(1.4, flat)[0]
    assert not is_spike(1.6, flat[:4])[0]  # too little history
    assert not is_spike(0.03, [0.01] * 10)[0]  # 3x, but 0.02 nats: noise near zero loss
    assert is_spike(float("nan"), flat)[0]


def test_classes():
    assert classify(ck=True, ref=False, f64=False) == "kernel"
    assert classify(ck=True, ref=True, f64=False) == "float32_numerics"
    assert classify(ck=True, ref=True, f64=True) == "dynamics_or_data"
    assert classify(ck=False, ref=True, f64=False) == "torch_only"
    assert classify(ck=False, ref=False, f64=False) == "not_reproduced"


def _overflow_guard(loss):
    def guarded(logits, targets, **kw):
        # a misplaced overflow guard: a float32 batch whose largest logit exceeds 12 is halved
        if logits.dtype == torch.float32 and float(logits.detach().max()) > 12.0:
            logits = logits * 0.5
        return loss(logits, targets, **kw)
    return guarded


def _first_triage(tmp_path, monkeypatch, planted: dict[str, object]) -> dict:
    for name, loss in planted.items():
        monkeypatch.setitem(kernels.backends("cross_entropy"), name, _overflow_guard(loss))
    report = train(replace(STRESS, max_steps=60, spike_triage=True, no_progress=True,
                           json_out=str(tmp_path / "r.json")))
    first = report["spikes"]["triages"][0]
    # the torch side is the torch twin's own step; its forward from the restored state repeats it
    assert first["torch_forward_identical"] is True
    return first


def test_kernel_fault_at_large_logits_is_a_kernel_spike(tmp_path, monkeypatch):
    first = _first_triage(tmp_path, monkeypatch, {"c": ckparity.cross_entropy})
    assert first["spiked"] == {"ck": True, "torch": False}
    assert first["replay_spiked"] == {"ck": True, "f64": False}
    assert first["class"] == "kernel" and first["worst_stage"]["ck"]["stage"] == "loss"
    assert first["worst_stage"]["torch"]["rel_diff"] < 1e-5


def test_fault_in_the_torch_twin_is_torch_only(tmp_path, monkeypatch):
    first = _first_triage(tmp_path, monkeypatch, {"torch": F.cross_entropy})
    assert first["spiked"] == {"ck": False, "torch": True}
    assert first["class"] == "torch_only" and first["worst_stage"]["torch"]["stage"] == "loss"


def test_fault_in_both_float32_twins_is_float32_numerics(tmp_path, monkeypatch):
    first = _first_triage(tmp_path, monkeypatch, {"c": ckparity.cross_entropy, "torch": F.cross_entropy})
    assert first["spiked"] == {"ck": True, "torch": True}
    assert first["replay_spiked"] == {"ck": True, "f64": False}  # float64 runs torch's loss unguarded
    assert first["class"] == "float32_numerics"


def test_lr_spike_is_dynamics(tmp_path, monkeypatch):
    def spiky(make, at=30, factor=1000.0):
        def build(params, **kw):
            optimizer, steps = make(params, **kw), [0]
            plain = optimizer.step

            def step():
                steps[0] += 1
                scale = factor if steps[0] == at else 1.0
                for group in optimizer.param_groups:
                    group["lr"] *= scale
                plain()
                for group in optimizer.param_groups:
                    group["lr"] /= scale
            optimizer.step = step
            return optimizer
        return build

    monkeypatch.setitem(kernels.backends("adamw"), "c", spiky(ckparity.optim.AdamW))
    monkeypatch.setitem(kernels.backends("adamw"), "torch", spiky(reference.adamw))
    report = train(replace(STRESS, max_steps=40, spike_triage=True, no_progress=True,
                           json_out=str(tmp_path / "r.json")))
    spikes = report["spikes"]
    assert spikes["spike_steps"][0] == 31  # the loss after the update with lr x 1000
    assert spikes["triages"][0]["class"] == "dynamics_or_data"
    assert spikes["triages"][0]["spiked"] == {"ck": True, "torch": True}
    assert spikes["triages"][0]["replay_spiked"] == {"ck": True, "f64": True}


def test_refused_with_ranks():
    with pytest.raises(UsageError, match="spike-triage"):
        replace(STRESS, spike_triage=True, dp=2, grad_accum=2)
