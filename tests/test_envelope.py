"""--envelope: the null model's moves (ULPs of the weights, the CK kernels'
measured differences with a random sign), and the verdict on a bit-identical
and a faulty CK twin."""

from __future__ import annotations

import json
import math

from dataclasses import replace

import torch
import torch.nn.functional as F

import ckparity
from ckparity import kernels
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.observers.envelope import LEAN_MARGIN, Measured, Signs, mirror, move_ulps, null_ops, window_ratio
from ckparity.harness.loop.run import train


def test_move_ulps_steps_the_bits_and_leaves_zero_inf_nan():
    t = torch.tensor([1.0, -2.5, 0.0, float("inf"), float("nan"), 1e-30] * 100)
    moved = move_ulps(t, -2, 2, torch.Generator().manual_seed(0))
    steps = moved.view(torch.int32).long() - t.view(torch.int32).long()
    finite = torch.isfinite(t) & (t != 0)
    assert steps[finite].abs().max() == 2 and (steps[finite] != 0).any()
    assert torch.equal(moved[~finite & ~t.isnan()], t[~finite & ~t.isnan()]) and moved[t.isnan()].isnan().all()


def test_mirror_moves_by_cks_difference_cut_to_the_reach_with_the_members_signs():
    ref = torch.randn(4096)
    ck = torch.nextafter(ref, ref * 2)  # 1 ULP outward
    ck[:100] = ref[:100] * (1 + 1e-3)   # far beyond a 3-ULP reach
    ck[100:103] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    signs = Signs(12345)("slot", ref.shape)
    out = mirror(ref, ck, torch.full(ref.shape, 3.0, dtype=torch.float64), signs)
    steps = _magnitude_steps(out, ref)
    assert torch.equal(steps[103:].double(), signs[103:])  # outward where the sign is +, inward where -
    assert set(steps[103:].unique().tolist()) == {-1, 1}  # CK's 1 ULP, either way
    assert 0.45 < float((steps[103:] == 1).float().mean()) < 0.55  # each sign about half the time
    assert set(steps[:100].unique().tolist()) == {-3, 3}  # cut to the reach
    assert torch.equal(out[100:103], ref[100:103])  # not finite: torch's


def test_a_members_signs_are_fixed_for_the_run_and_its_own():
    """The same sign at an element on every call (a deterministic kernel's
    difference keeps its sign), drawn from the seed alone (a checkpoint holds
    the seed), independent between keys, shapes and members; half each way."""
    a, b = Signs(7), Signs(8)
    first = a("loss.grad0", (64, 256))
    assert torch.equal(first, a("loss.grad0", (64, 256))) and torch.equal(first, Signs(7)("loss.grad0", (64, 256)))
    assert set(first.unique().tolist()) == {-1.0, 1.0} and abs(float(first.mean())) < 0.02
    for other in (b("loss.grad0", (64, 256)), a("swiglu", (64, 256)), a("loss.grad0", (256, 64)).reshape(64, 256)):
        assert 0.4 < float((other == first).double().mean()) < 0.6


def test_the_ratio_is_taken_over_a_window_of_steps():
    """A sporadic 3-ULP loss difference on a step where no member's differs is
    met by the members' differences of the steps around it; a difference that
    grows past the members' is beyond, and so is a NaN."""
    ulp, floor = 2.0**-24, 2.0**-25
    members = [ulp if step % 3 == 0 else 0.0 for step in range(100)]
    ck = [0.0] * 100
    ck[70] = 3 * ulp  # members[70] is 0: the step alone would say 6x the floor
    assert ck[70] / max(members[70], floor) == 6.0
    assert window_ratio(ck[:71], members[:71], floor) == 3.0
    grown = [step * ulp for step in range(100)]
    assert window_ratio(grown, members, floor) == 99.0
    assert math.isnan(window_ratio(ck[:70] + [float("nan")], members[:71], floor))
    assert window_ratio([ulp], [0.0], 0.0) == float("inf") and window_ratio([0.0], [0.0], 0.0) == 0.0


def _one_ulp_up(x):
    return torch.nextafter(x, x * 2)


class _GradOneUlpUp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _one_ulp_up(grad)


def _magnitude_steps(x, exact):
    """x's distance from exact in ULPs, + away from 0 (a float's bits, read as
    an int32, grow with its magnitude for either sign)."""
    return x.detach().view(torch.int32).long() - exact.detach().view(torch.int32).long()


def test_null_members_carry_the_ck_kernels_measured_difference(monkeypatch):
    """A CK swiglu whose output is 1 ULP up and whose input gradient is 1 ULP
    up: a null member's swiglu is torch's +-1 ULP in both, both signs, and
    the measured figures say +1 on average; a slot whose CK backend is torch's
    own (or bit-identical to it) adds nothing."""
    monkeypatch.setitem(kernels.backends("swiglu"), "up", lambda x: _one_ulp_up(kernels.backends("swiglu")["torch"](_GradOneUlpUp.apply(x))))
    measured = Measured()
    ops = null_ops(RunConfig(ck_swiglu_backend="up", ck_rmsnorm_backend="torch", no_progress=True),
                   Signs(12345), measured)
    x = torch.randn(64, 2 * 96, requires_grad=True)
    out = ops.swiglu(x)
    exact = kernels.backends("swiglu")["torch"](x)
    steps = _magnitude_steps(out, exact)
    assert set(steps.unique().tolist()) == {-1, 1}
    up = torch.randn_like(out)
    (dx,) = torch.autograd.grad(out, x, up)
    (dx_exact,) = torch.autograd.grad(exact, x, up)
    steps = _magnitude_steps(dx, dx_exact)
    assert set(steps.unique().tolist()) == {-1, 1} and 0.4 < float((steps == 1).float().mean()) < 0.6
    figures = measured.report()
    assert figures["swiglu"]["differing"] == out.numel() and figures["swiglu"]["max_abs_ulps"] == 1.0
    assert figures["swiglu"]["beyond_reach"] == 0  # 1 ULP is within any reach (>= 2)
    assert figures["swiglu.grad0"]["max_abs_ulps"] == 1.0
    # a bias is what these show: 1 ULP outward, none in value (swiglu's outputs have both signs)
    assert figures["swiglu"]["mean_outward_ulps"] == 1.0 and abs(figures["swiglu"]["mean_signed_ulps"]) < 0.2
    assert figures["swiglu"]["outward_share"] == 1.0 and 0.3 < figures["swiglu"]["up_share"] < 0.7
    y = torch.randn(8, 32)
    assert torch.equal(ops.rms_norm(y, (32,), None, 1e-5), F.rms_norm(y, (32,), None, 1e-5))


def _lean(ref, ck, exact):
    measured = Measured()
    measured.add("slot", ref, ck, torch.full(ref.shape, 2.0, dtype=torch.float64), exact)
    return measured.report()["slot"]["lean"]


def test_the_lean_tells_a_bias_from_a_rounding_and_from_removing_torchs_own():
    """exact: float64 values; torch's: rounded to nearest. A CK one ULP outward
    of torch's leans outward (directed); a CK at the other float neighbour of
    exact (a rounding otherwise than torch's) does not; nor does a CK that is
    unbiased where torch's is always low; and a lean over too few elements
    is not evidence."""
    exact = torch.randn(20000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref = exact.float()
    outward = torch.nextafter(ref, ref * 2)
    biased = _lean(ref, outward, exact)
    assert biased["directed"] and biased["ck_out"] > 0.9 and abs(biased["torch_out"]) < 0.05
    other = torch.where(ref.double() > exact, torch.nextafter(ref, ref - 1), torch.nextafter(ref, ref + 1))
    rounding = _lean(ref, other, exact)
    assert not rounding["directed"] and rounding["n"] == exact.numel() and abs(rounding["ck_up"]) < 0.05
    low = torch.where(ref.double() > exact, torch.nextafter(ref, ref - 1), ref)  # torch's always below
    removed = _lean(low, ref, exact)  # CK rounds to nearest where torch's was low
    assert removed["torch_up"] == -1.0 and not removed["directed"]
    assert biased["excess_ulps"] > 0.9 and abs(rounding["excess_ulps"]) < 0.05 and removed["excess_ulps"] < 0
    few = _lean(ref[:400], outward[:400], exact[:400])  # lean 1 - 0 over 400: 10 standard errors of 2/sqrt(n)
    assert few["directed"]
    assert not _lean(ref[:20], outward[:20], exact[:20])["directed"]  # 2.2 and ~3.4 standard errors


def test_the_lean_in_ulps_sees_a_one_ulp_bias_where_torchs_errors_are_several_ulps():
    """torch's error uniform in -15..15 ULPs (the dlogits' reach the float64
    value by several): one ULP outward moves few elements across the float64
    value, so the sign's lean barely moves; the mean error in ULPs moves by one."""
    gen = torch.Generator().manual_seed(5)
    exact = torch.randn(20000, dtype=torch.float64, generator=gen)
    near = exact.float()
    ref = (near.view(torch.int32) + torch.randint(-15, 16, near.shape, generator=gen, dtype=torch.int32)).view(torch.float32)
    ck = torch.nextafter(ref, ref * 2)
    measured = Measured()
    measured.add("slot", ref, ck, torch.full(ref.shape, 32.0, dtype=torch.float64), exact)
    lean = measured.report()["slot"]["lean"]
    assert lean["excess"] < LEAN_MARGIN  # the sign alone would call it undirected
    assert 0.6 < lean["excess_ulps"] < 1.1 and lean["directed"]  # |1 + t| - |t| for torch's lean t, about 0 and measured.directed() == ["slot"]


def test_verdicts(tmp_path):
    base = RunConfig(max_steps=30, grad_accum=2, envelope=2, no_progress=True)
    same = train(replace(base, ck_loss_backend="torch", ck_optimizer_backend="torch", json_out=str(tmp_path / "a.json")))
    assert same["noise_verdict"] == "within_noise" and same["envelope"]["max_noise_ratio"]["param"] == 0.0
    kernels.register("cross_entropy", "off_1e-4", lambda x, t: kernels.backends("cross_entropy")["torch"](x, t) * (1 + 1e-4))
    off = train(replace(base, ck_loss_backend="off_1e-4", json_out=str(tmp_path / "b.json")))
    assert off["noise_verdict"] == "beyond_noise" and off["envelope"]["first_beyond_step"] == 1
    assert same["envelope"]["directed"] == [] and same["envelope"]["null_model"]["measured"]["loss"]["lean"]["n"] == 0


class _OutwardAdamW(ckparity.optim.AdamW):
    """A planted bias: ckparity's AdamW, then every param one ULP further from 0."""

    @torch.no_grad()
    def step(self, closure=None):
        super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.copy_(torch.nextafter(p, p * 2))


def test_the_ck_optimizers_difference_is_measured_and_carried(tmp_path, monkeypatch):
    """Each member's update carries the CK optimizer's step's difference from
    torch's: a planted outward ULP is measured on every param with its
    direction (outward_share 1); C AdamW's differences (where torch's sqrt
    rounds otherwise; how many depends on the CPU) stay within the reach; with
    torch's AdamW there is no optimizer noise at all."""
    monkeypatch.setitem(kernels.backends("adamw"), "outward", _OutwardAdamW)
    base = RunConfig(max_steps=10, envelope=1, ck_loss_backend="c_ptref", no_progress=True)
    planted = train(replace(base, ck_optimizer_backend="outward", json_out=str(tmp_path / "p.json")))
    figures = planted["envelope"]["null_model"]["measured"]["adamw.param"]
    assert figures["differing"] > 0.9 * figures["elements"] and figures["outward_share"] > 0.99
    # against torch's step in float64: an error that leans outward, which torch's does not
    assert planted["envelope"]["directed"] == ["adamw.param"] and planted["noise_verdict"] == "beyond_noise"
    assert figures["lean"]["ck_out"] > 0.5 > abs(figures["lean"]["torch_out"])
    assert planted["envelope"]["null_model"]["adamw"].startswith("measured")
    c = train(replace(base, json_out=str(tmp_path / "c.json")))["envelope"]["null_model"]["measured"]
    assert c["adamw.param"]["beyond_reach"] == 0 and not c["adamw.param"]["lean"]["directed"]
    same = train(replace(base, ck_optimizer_backend="torch", json_out=str(tmp_path / "t.json")))
    assert "adamw.param" not in same["envelope"]["null_model"]["measured"]
    # bit-identical kernels and optimizer: the CK twin does not move from the torch twin at all
    assert same["envelope"]["max_noise_ratio"]["param"] == 0.0


def test_train_prints_the_noise_verdict_and_why(tmp_path, capsys, monkeypatch):
    from ckparity.cli import main

    monkeypatch.setitem(kernels.backends("cross_entropy"), "outward",
                        lambda x, t, **kw: F.cross_entropy(_GradOneUlpUp.apply(x), t, **kw))
    code = main(["train", "--max-steps", "6", "--envelope", "1", "--ck-loss-backend", "outward",
                 "--ck-optimizer-backend", "torch", "--no-progress", "--json-out", str(tmp_path / "r.json")])
    assert "ckparity train: beyond_noise (directed: loss.grad0)" in capsys.readouterr().out
    # one ULP outward on every dlogit crosses no tolerance; the direction alone fails the run
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 1 and report["status"] == "fail" and report["failed_by_envelope"]
    assert report["first_loss_fail_step"] is None and report["first_param_fail_step"] is None
    code = main(["train", "--max-steps", "3", "--envelope", "1", "--no-progress", "--json-out", str(tmp_path / "s.json")])
    assert "ckparity train: within_noise\n" in capsys.readouterr().out
    assert code == 0 and not json.loads((tmp_path / "s.json").read_text())["failed_by_envelope"]


def test_the_lean_leaves_out_values_below_the_normal_range():
    """Subnormal float64 values: CK two ULPs toward 0 on every one is no lean
    (their ULP is 2^-149 absolute, not a relative precision); the same on
    normal values is."""
    exact = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(9)) * 1e-39
    ref = exact.float()
    inward = torch.nextafter(torch.nextafter(ref, torch.zeros(())), torch.zeros(()))
    assert _lean(ref, inward, exact)["n"] == 0
    normal = exact * 1e30
    assert _lean(normal.float(), torch.nextafter(normal.float(), torch.zeros(())), normal)["directed"]


def test_expect_bitwise_fails_a_run_on_any_differing_bit(tmp_path, capsys, monkeypatch):
    """--expect-bitwise: a configuration bit-identical to torch (c_ptref with torch's AdamW) passes; the same
    with one dlogit one ULP off at one step -- inside every tolerance, too small and too rare for the
    envelope to weigh -- fails at that step, where without the flag the run passes."""
    from ckparity.cli import main

    calls = {"n": 0}

    def one_ulp_once(x, t, **kw):
        calls["n"] += 1
        return F.cross_entropy(_GradOneUlpUp.apply(x) if calls["n"] == 3 else x, t, **kw)

    common = ["train", "--max-steps", "6", "--ck-optimizer-backend", "torch", "--no-progress"]
    code = main(common + ["--ck-loss-backend", "c_ptref", "--expect-bitwise", "--json-out", str(tmp_path / "a.json")])
    report = json.loads((tmp_path / "a.json").read_text())
    assert code == 0 and not report["failed_by_bitwise"] and report["divergence"]["first_step"] is None
    monkeypatch.setitem(kernels.backends("cross_entropy"), "one_ulp_once", one_ulp_once)
    code = main(common + ["--ck-loss-backend", "one_ulp_once", "--json-out", str(tmp_path / "b.json")])
    assert code == 0 and json.loads((tmp_path / "b.json").read_text())["divergence"]["first_step"] is not None
    calls["n"] = 0
    code = main(common + ["--ck-loss-backend", "one_ulp_once", "--expect-bitwise", "--json-out", str(tmp_path / "c.json")])
    report = json.loads((tmp_path / "c.json").read_text())
    assert code == 1 and report["status"] == "fail" and report["failed_by_bitwise"]
    assert report["first_loss_fail_step"] is None and report["first_param_fail_step"] is None
    assert f"first differing bits at step {report['divergence']['first_step']}" in capsys.readouterr().out
