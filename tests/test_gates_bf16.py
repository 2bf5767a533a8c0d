"""gate --dtype bfloat16: each bf16 gate passes on ckparity's kernels and
fails on the bf16 fault it exists for -- a SwiGLU rounded once where torch
rounds silu first, AdamW by torch's other reference (fused=True), a loss
summed in float where torch keeps bf16 partial sums, a SwiGLU that leans away
from 0 by less than an ULP on average -- and says why. (A run
that errors, NaN and inf: tests/test_gate_faults.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ckparity import cpu, gates, kernels

SMALL = {"optimizer_parity": {"steps": 5, "sizes": [17, 1000]}, "long_horizon": {"steps": 20},
         "noise_envelope": {"steps": 60, "loss_backends": ["c_ptref"]},
         "depth_sweep": {"depths": [2], "steps": 5, "models": ["stacked"]}}

pytestmark = pytest.mark.skipif(not cpu.matched(), reason="the bf16 gates hold bits where the library follows "
                                                          "torch's capability")


def _run(gate, tmp_path, **changes):
    settings = gates.settings_for("quick", dtype="bfloat16")
    settings[gate].update(SMALL.get(gate, {}), **changes)
    (result,) = gates.run_gates([gate], settings, tmp_path, "quick, bfloat16", echo=lambda line: None)
    return result


def _swiglu_rounded_once(x):
    a, b = x.float().chunk(2, dim=-1)
    return (F.silu(a) * b).to(x.dtype)


@pytest.mark.parametrize("gate", gates.DTYPE_GATES)
def test_each_bf16_gate_passes_on_ckparitys_kernels(gate, tmp_path):
    result = _run(gate, tmp_path)
    assert result["passed"], result["summary"]
    assert result["settings"]["dtype"] == "bfloat16"


def test_kernel_parity_in_bf16_fails_on_a_single_rounded_swiglu(monkeypatch, tmp_path):
    record = kernels.KERNELS["swiglu"]
    monkeypatch.setitem(record.gate_cases, "swiglu", replace(record.gate_cases["swiglu"], ours=_swiglu_rounded_once))
    result = _run("kernel_parity", tmp_path)
    assert not result["passed"] and "swiglu" in result["summary"] and "torch's bits" in result["summary"]


def test_optimizer_parity_in_bf16_fails_on_torchs_other_adamw(monkeypatch, tmp_path):
    """fused=True does its math in float from unrounded moments: after a few steps its bf16 params are not
    the single-tensor path's."""
    monkeypatch.setitem(gates.optimizer_parity.OPTIMIZERS, "ckparity", lambda params, **kw: torch.optim.AdamW(params, fused=True, **kw))
    result = _run("optimizer_parity", tmp_path)
    assert not result["passed"] and "bit-identical" in result["summary"] + str(result["details"]["failures"])


def test_long_horizon_in_bf16_fails_on_a_loss_summed_in_float(monkeypatch, tmp_path):
    def summed_in_float(logits, targets):  # torch's bf16 nll keeps bf16 partial sums and a bf16 total weight
        rows = F.cross_entropy(logits, targets, reduction="none")
        return (rows.float().sum() / (targets != -100).sum()).to(logits.dtype)

    monkeypatch.setitem(kernels.backends("cross_entropy"), "c_ptref", summed_in_float)
    result = _run("long_horizon", tmp_path, loss_backends=["c_ptref"])
    assert not result["passed"] and "not bit-identical" in result["summary"], result["summary"]


def test_depth_sweep_in_bf16_fails_on_a_single_rounded_swiglu(monkeypatch, tmp_path):
    monkeypatch.setitem(kernels.backends("swiglu"), "c", _swiglu_rounded_once)
    result = _run("depth_sweep", tmp_path)
    assert not result["passed"] and "bitwise: not bit-identical" in result["summary"], result["summary"]


def test_noise_envelope_in_bf16_fails_on_a_swiglu_that_leans_one_way(monkeypatch, tmp_path):
    """Rounded away from 0 wherever torch's round-to-nearest went toward it: within the tolerances and
    never more than one ULP, but always outward -- the envelope's direction verdict sees it."""
    import ckparity

    def leaning(x):
        y = ckparity.swiglu(x)
        a, b = x.float().chunk(2, dim=-1)
        return torch.where(y.float().abs() < (F.silu(a) * b).abs(), torch.nextafter(y, y * 2), y)

    monkeypatch.setitem(kernels.backends("swiglu"), "c", leaning)
    result = _run("noise_envelope", tmp_path)
    assert not result["passed"] and "leans one way" in result["summary"] and "swiglu" in result["summary"], \
        result["summary"]


def test_gate_refuses_a_float32_only_gate_in_bf16(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ckparity", "gate", "--dtype", "bfloat16", "--only", "fd_gradients",
                          "--out-dir", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 2 and "fd_gradients run in float32 only" in out.stderr
