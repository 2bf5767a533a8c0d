"""Drift attribution: the cyclic text, the first bitwise divergence, the
ablation verdict (ckparity attribute), the float64 shadow and the forecast,
each shown to name the planted cause."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import kernels
from ckparity.cli import main
from ckparity.harness.studies.attribute import attribute, verdict
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.basics.data import load_tokens
from ckparity.harness.observers.forecast import forecast
from ckparity.harness.studies.repro import HELLO_TEXT
from ckparity.harness.loop.run import train

SHORT = RunConfig(max_steps=6, grad_accum=2, total_tokens=4096, no_progress=True)
ALL_TORCH = dict(ck_rmsnorm_backend="torch", ck_swiglu_backend="torch", ck_loss_backend="torch",
                 ck_optimizer_backend="torch")


def run(tmp_path, config: RunConfig, name: str = "r.json") -> dict:
    return train(replace(config, json_out=str(tmp_path / name)))


def test_cyclic_text_is_the_bytes_repeated():
    tokens = load_tokens(replace(SHORT, train_text=HELLO_TEXT, total_tokens=20))
    assert tokens.tolist() == (list(b"Hello!") * 4)[:20]


class _SwiGLUOneUlpBackward(torch.autograd.Function):
    """planted fault: swiglu's gradient one ULP up, its forward exact"""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        H = x.shape[-1] // 2
        return F.silu(x[..., :H]) * x[..., H:]

    @staticmethod
    def backward(ctx, dout):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xx = x.detach().requires_grad_(True)
            H = xx.shape[-1] // 2
            (dx,) = torch.autograd.grad(F.silu(xx[..., :H]) * xx[..., H:], xx, dout)
        return torch.nextafter(dx, torch.full_like(dx, math.inf))


kernels.register("swiglu", "fault_one_ulp_backward", _SwiGLUOneUlpBackward.apply)


def test_divergence_names_the_planted_stage(tmp_path):
    result = run(tmp_path, replace(SHORT, **{**ALL_TORCH, "ck_swiglu_backend": "fault_one_ulp_backward"}))
    divergence = result["divergence"]
    assert divergence["first_step"] == 1
    assert divergence["stage"] == "dfc1"  # the gradient swiglu returns, for its input fc1
    assert divergence["kernel"] == "swiglu"  # the record whose backward computed it: the planted one
    assert divergence["tensor"] == "fc1.weight.grad"
    assert divergence["per_quantity"]["grads"] == 1 and divergence["per_quantity"]["logits"] in (None, 2)
    assert result["pass_parity"]  # a one-ULP difference is within tolerance: the tracer sees below it


@pytest.mark.parametrize("overrides", [{}, {"ck_loss_backend": "c_ptref"}, {"ck_loss_backend": "torch"},
                                       {**ALL_TORCH, "ck_swiglu_backend": "fault_one_ulp_backward"},
                                       {"model": "stacked", "num_layers": 2, "max_grad_norm": 0.5}])
def test_live_first_difference_equals_the_replayed_one(tmp_path, overrides):
    """The run reads the first divergence off its own step; a replay of that
    step from the initial state (the old way) names the same stage and tensor."""
    from ckparity.harness.basics.data import Batches
    from ckparity.harness.observers.localize import first_difference
    from ckparity.harness.twins.factory import build_twins

    config = replace(SHORT, **overrides)
    divergence = run(tmp_path, config)["divergence"]
    assert divergence["first_step"] == 1
    ck, _ = build_twins(config)
    windows = Batches(load_tokens(config), config).step(0)
    replayed = first_difference(config, ck.snapshot(), windows)
    assert (divergence["stage"], divergence["tensor"]) == (replayed["stage"], replayed["tensor"])


def test_identical_twins_have_no_divergence(tmp_path):
    divergence = run(tmp_path, replace(SHORT, **ALL_TORCH))["divergence"]
    assert divergence["first_step"] is None and divergence["stage"] is None
    assert set(divergence["per_quantity"].values()) == {None}


def test_a_failure_one_step_shows_is_localized_as_single_step(tmp_path):
    # param-tol below one step's difference: the replayed step itself is over it
    result = run(tmp_path, replace(SHORT, param_tol=1e-12, ck_loss_backend="c"))
    assert result["first_param_fail_step"] == 1
    assert result["localization"]["kind"] == "single_step"
    assert result["localization"]["first_param_tensor"] == "embedding.weight"  # the first tensor over 1e-12


def test_accumulated_drift_is_localized_as_such(tmp_path):
    """An update 1e-5 too large every step (the planted fault_biased AdamW)
    and param-tol 3.5e-5: no single step from a shared state is over it, the
    drift of three is."""
    result = run(tmp_path, replace(SHORT, **{**ALL_TORCH, "ck_optimizer_backend": "fault_biased"}, param_tol=3.5e-5,
                                   max_steps=8))
    assert result["first_param_fail_step"] == 3
    assert result["localization"]["kind"] == "accumulated"
    assert result["localization"]["first_param_tensor"] is None
    assert result["localization"]["first_divergence_step"] == 1  # the twins differed from the first update on


def _loss_scaled(logits, targets):
    return F.cross_entropy(logits, targets) * 1.001  # planted fault: 0.1% off


kernels.register("cross_entropy", "fault_scaled_loss", _loss_scaled)


def test_attribute_names_the_planted_backend_only(tmp_path):
    config = replace(SHORT, ck_loss_backend="fault_scaled_loss")
    result = attribute(config, str(tmp_path / "attr.json"), jobs=1)
    # the kinds are the kernel records' names (--ck-loss-backend: cross_entropy), as check and the zoo say them
    assert result["verdict"]["responsible"] == ["cross_entropy"], result["verdict"]
    assert "cross_entropy" in result["verdict"]["summary"]
    names = {v["name"]: v for v in result["variants"]}
    assert names["all torch"]["status"] == "pass" and names["only cross_entropy"]["status"] == "fail"
    assert (tmp_path / "attr_runs" / "only_cross_entropy.json").exists()


def test_attribute_without_a_fault_blames_nothing(tmp_path):
    """A bit-identical configuration (c_ptref and the C norm and SwiGLU; the C AdamW differs by
    an ULP or two where torch's sqrt rounds otherwise, on some CPUs): no ablation changes a drift of 0."""
    config = replace(SHORT, ck_loss_backend="c_ptref", ck_optimizer_backend="torch")
    result = attribute(config, str(tmp_path / "attr.json"), jobs=1)
    assert result["verdict"]["responsible"] == [] and result["verdict"]["suspect"] is None
    assert "bit-identical to torch: nothing is responsible" in result["verdict"]["summary"]


def _biased_adamw(bias: float) -> type:
    """planted fault: torch's AdamW, every update ``bias`` too large"""

    class BiasedAdamW(torch.optim.AdamW):
        def __init__(self, params, **kw):
            super().__init__(params, foreach=False, **kw)

        @torch.no_grad()
        def step(self, closure=None):
            super().step(closure)
            for group in self.param_groups:
                for p in group["params"]:
                    p.add_(bias)

    return BiasedAdamW


# below every tolerance in the window
kernels.register("adamw", "fault_slow", _biased_adamw(1e-9))


def test_a_drift_inside_every_tolerance_is_ranked_by_effect(tmp_path):
    """No variant crosses a tolerance in 6 steps; the planted optimizer is
    ranked first (swapping it out brings the run closest to torch) and is the
    suspect, not "nothing is responsible"."""
    config = replace(SHORT, ck_loss_backend="c_ptref", ck_optimizer_backend="fault_slow")
    result = attribute(config, str(tmp_path / "attr.json"), jobs=1)
    v = result["verdict"]
    assert all(row["status"] == "pass" for row in result["variants"])
    assert v["responsible"] == [] and v["suspect"] == "adamw"
    assert v["ranked"][0]["kind"] == "adamw" and v["ranked"][0]["effect_ulps"] > 0
    assert all(r["effect_ulps"] == 0 and r["alone_ulps"] == 0 for r in v["ranked"][1:])
    assert "nothing is responsible" not in v["summary"] and "suspect: adamw" in v["summary"]


def test_a_forecast_far_past_the_run_is_said_to_be_one():
    """The suspect's summary gives the forecast as an extrapolation, never as a bare step (the 850-step
    repro's forecast was 26361249495)."""
    from ckparity.harness.studies.attribute import by_effect

    row = {"max_param_ulp_diff": 4.0, "steps": 300, "forecast_param_fail_step": 26361249495, "divergence": None}
    rows = {"as configured": row, "without adamw": dict(row, max_param_ulp_diff=0.0),
            "only adamw": dict(row, max_param_ulp_diff=4.0)}
    summary = by_effect(rows, ["adamw"])["summary"]
    assert summary.endswith("suspect: adamw; its params' forecast crossing of the tolerance: "
                            "step ~2.6e+10: a forecast 8.8e+07x past this run's 300 steps, not a measurement")


def test_attribute_when_torch_disagrees_with_itself(tmp_path, monkeypatch):
    # torch's own loss, made nondeterministic: both twins use it, so even the control fails
    noisy = lambda logits, t: F.cross_entropy(logits, t) * (1 + 1e-3 * torch.rand(()))  # noqa: E731
    monkeypatch.setitem(kernels.backends("cross_entropy"), "torch", noisy)
    result = attribute(SHORT, str(tmp_path / "attr.json"), jobs=1)
    assert result["verdict"]["responsible"] == []
    assert "control fails too" in result["verdict"]["summary"]


def _row(failed: bool) -> dict:
    return {"status": "fail" if failed else "pass"}


def test_verdict_for_a_combination():
    rows = {"as configured": _row(True), "all torch": _row(False),
            "without loss": _row(False), "only loss": _row(False),
            "without optimizer": _row(False), "only optimizer": _row(False),
            "without rmsnorm": _row(True), "only rmsnorm": _row(False)}
    v = verdict(rows)
    assert v["responsible"] == ["loss", "optimizer"]
    assert "only the combination" in v["summary"] and "loss or optimizer" in v["summary"]


def test_a_variant_that_errors_blames_no_kernel():
    """A crashed or usage-error variant measured nothing: no verdict, no blame."""
    rows = {"as configured": _row(True), "all torch": _row(False), "without loss": _row(False),
            "only loss": {"status": "error"}, "without optimizer": _row(True), "only optimizer": _row(False)}
    v = verdict(rows)
    assert v["responsible"] == [] and v["unmeasured"] == ["only loss"]
    assert "no verdict" in v["summary"] and "only loss (error)" in v["summary"]


def test_verdict_does_not_claim_a_swap_that_did_not_pass():
    # loss fails alone, but swapping it out alone still fails (optimizer fails alone too, and is needed)
    rows = {"as configured": _row(True), "all torch": _row(False), "without loss": _row(True),
            "only loss": _row(True), "without optimizer": _row(True), "only optimizer": _row(True)}
    v = verdict(rows)
    assert v["responsible"] == ["loss", "optimizer"]
    assert "does not make the run pass" in v["summary"] and "passes with" not in v["summary"]


_BiasedAdamW = _biased_adamw(1e-5)
kernels.register("adamw", "fault_biased", _BiasedAdamW)


def test_shadow_says_the_biased_twin_is_further_from_float64(tmp_path, monkeypatch):
    config = replace(SHORT, **ALL_TORCH, f64_shadow=True, shadow_every=2)
    ck_biased = run(tmp_path, replace(config, ck_optimizer_backend="fault_biased"), "ck.json")["shadow"]["summary"]
    assert ck_biased["closer_to_f64"] == "torch" and ck_biased["closer_to_f64_locally"] == "torch"
    monkeypatch.setitem(kernels.backends("adamw"), "torch", _BiasedAdamW)  # the torch twin perturbed instead
    torch_biased = run(tmp_path, replace(config, ck_optimizer_backend="c"), "torch.json")["shadow"]["summary"]
    assert torch_biased["closer_to_f64"] == "ck" and torch_biased["closer_to_f64_locally"] == "ck"


def test_shadow_ties_bit_identical_twins(tmp_path):
    summary = run(tmp_path, replace(SHORT, **ALL_TORCH, f64_shadow=True, shadow_every=3))["shadow"]["summary"]
    assert summary["closer_to_f64"] == "tie" and summary["probe_wins"] == {"ck": 0, "torch": 0, "tie": 2}


def test_forecast_of_exponential_growth():
    steps = list(range(1, 101))
    diffs = [1e-8 * math.exp(0.05 * s) for s in steps]  # crosses 3e-5 at step 160.1
    f = forecast(steps, diffs, 3e-5, 400, first_divergence=1)
    assert f["model"] == "exponential" and f["param_fail_step"] == 161 and f["fit_steps"] == [1, 100]


def test_forecast_says_why_it_has_no_step():
    assert "never differed" in forecast([1, 2], [0.0, 0.0], 3e-5, 10, None)["reason"]
    assert "crossed within" in forecast(list(range(1, 11)), [1.0] * 10, 3e-5, 30, 1)["reason"]
    flat = forecast(list(range(1, 31)), [1e-6] * 30, 3e-5, 100, 1)
    assert flat["param_fail_step"] is None and "does not grow" in flat["reason"]


@pytest.mark.parametrize("args, message", [
    (["train", "--f64-shadow", "--shadow-every", "0"], "--shadow-every must be >= 1"),
    (["attribute", "--jobs", "0"], "--jobs must be >= 1"),
    (["attribute", "--ck-loss-backend", "nope"], "--ck-loss-backend: no cross_entropy backend 'nope'"),
])
def test_new_flags_refuse_bad_values(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_repro_rejects_an_unknown_preset(capsys):
    assert main(["repro", "--preset", "nope"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_hello_text_ships_with_the_package():
    assert open(HELLO_TEXT, "rb").read() == b"Hello!"
    assert ckparity.__file__  # the text is found next to the installed package


def _import_cpu_seconds() -> float:
    """The CPU a child spends importing ckparity and torch before it trains (4.1 s on an AVX2 AMD EPYC, where a
    fixed 4 s signalled the children before they could write a report)."""
    import resource
    import subprocess
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import ckparity.harness.loop.child"], check=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_attribute_in_processes_and_sigterm(tmp_path):
    """--jobs 2 runs each variant in its own process; SIGTERM reaches the running ones, their reports say
    "interrupted", and the ablation's report is written and says so."""
    import json
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "attr.json"
    from test_ranks import _wait_for_cpu_seconds

    proc = subprocess.Popen([sys.executable, "-m", "ckparity", "attribute", "--max-steps", "100000", "--epochs", "50",
                             "--jobs", "2", "--json-out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    jobs, deadline = [], time.monotonic() + 120
    while len(jobs) < 2 and time.monotonic() < deadline:  # the two variants' processes
        jobs = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        time.sleep(0.05)
    _wait_for_cpu_seconds(jobs, _import_cpu_seconds() + 2.0)  # torch imported, both variants training
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    result = json.loads(out.read_text())
    assert result["status"] == "interrupted" and result["stopped_by_signal"] == signal.SIGTERM
    assert [v["status"] for v in result["variants"]] == ["interrupted", "interrupted"]
