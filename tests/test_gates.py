"""ckparity gate: every gate fails, and says why, when a fault is planted."""

from __future__ import annotations

import json
from dataclasses import replace

import torch
import torch.nn.functional as F

import ckparity
from ckparity import gates, kernels, reference
from ckparity.cli import main


def small(gate: str, **overrides) -> dict:
    settings = gates.settings_for("quick")[gate]
    settings.update(overrides)
    return settings


def test_kernel_parity_catches_a_broken_kernel(monkeypatch):
    check = gates.kernel_parity.gate_cases()["swiglu"]
    monkeypatch.setitem(kernels.KERNELS["swiglu"].gate_cases, "swiglu",
                        replace(check, ours=lambda x: check.ours(x) * (1 + 1e-4)))  # 1e-4 off
    result = gates.kernel_parity.run(small("kernel_parity"))
    assert not result["passed"]
    assert "swiglu" in result["summary"] and "failed" in result["summary"]


def test_kernel_parity_holds_bitwise_kernels_to_torchs_bits(monkeypatch):
    """One ULP on a few outputs passes the accuracy rule, not the bitwise one."""
    def one_ulp_off(x, *args, **kwargs):
        y = gates.kernel_parity.gate_cases()["rms_norm"].theirs(x, *args, **kwargs)
        every_97th = torch.arange(y.numel()).reshape(y.shape) % 97 == 0
        return y + torch.where(every_97th, torch.nextafter(y, y + 1) - y, 0.0).detach()

    monkeypatch.setitem(kernels.KERNELS["rms_norm"].gate_cases, "rms_norm",
                        replace(gates.kernel_parity.gate_cases()["rms_norm"], ours=one_ulp_off))
    result = gates.kernel_parity.run(small("kernel_parity"))
    assert not result["passed"] and "bits" in result["summary"] and "rms_norm" in result["summary"]
    relaxed = gates.kernel_parity.run(small("kernel_parity", bitwise_kernels=["swiglu"]))
    assert relaxed["passed"], relaxed["summary"]
    # at a capability the library cannot follow, nothing is held to torch's bits, only to accuracy
    monkeypatch.setattr(gates.kernel_parity.cpu, "matched", lambda: False)
    unmatched = gates.kernel_parity.run(small("kernel_parity"))
    assert unmatched["passed"] and unmatched["details"]["held_bitwise"] == [], unmatched["summary"]


def test_kernel_parity_holds_rope_to_torchs_bits(monkeypatch):
    """A rope rounded once (in float64, as a contracted multiply-add would
    nearly do) is more accurate than torch, not torch's bits: it fails."""
    def rounded_once(x, cos, sin, layout="half"):
        return _Float64Once.apply(x, cos, sin, layout)

    monkeypatch.setitem(kernels.KERNELS["rope"].gate_cases, "rope", replace(gates.kernel_parity.gate_cases()["rope"], ours=rounded_once))
    result = gates.kernel_parity.run(small("kernel_parity"))
    assert not result["passed"] and "rope" in result["summary"] and "bits" in result["summary"], result["summary"]


class _Float64Once(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, layout):
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout
        return reference.rope(x.double(), cos.double(), sin.double(), layout).float()

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        with torch.enable_grad():
            x = torch.zeros(grad.shape, dtype=torch.float64, requires_grad=True)
            (dx,) = torch.autograd.grad(reference.rope(x, cos.double(), sin.double(), ctx.layout), x, grad.double())
        return dx.float(), None, None, None


def test_kernel_parity_passes_as_built():
    assert gates.kernel_parity.run(small("kernel_parity"))["passed"]


class _PerturbedAdamW(ckparity.optim.AdamW):
    """planted fault: the second moment is nudged after each step"""

    def step(self, closure=None):
        super().step(closure)
        for state in self.state.values():
            state["exp_avg_sq"].mul_(1 + 2**-20)


def test_optimizer_parity_catches_perturbed_moments(monkeypatch):
    monkeypatch.setitem(gates.optimizer_parity.OPTIMIZERS, "ckparity", _PerturbedAdamW)
    result = gates.optimizer_parity.run(small("optimizer_parity", steps=5, sizes=[17]))
    assert not result["passed"] and "moments not bit-identical" in result["summary"]


class _Float64AdamW(torch.optim.Optimizer):
    """A user's AdamW that steps float64 copies and rounds them to the float32 params and
    moments: not torch's bits, and closer to exact arithmetic -- or, with ``slip``, every
    param moved by 1e-3 of itself after the step: wrong."""

    def __init__(self, params, slip=0.0, **kw):
        super().__init__(params, {})
        self.params = self.param_groups[0]["params"]
        self.copies = [p.detach().double().requires_grad_() for p in self.params]
        self.inner, self.slip = torch.optim.AdamW(self.copies, **kw), slip

    @torch.no_grad()
    def step(self, closure=None):
        for p, c in zip(self.params, self.copies):
            c.grad = p.grad.double()
        self.inner.step()
        for p, c in zip(self.params, self.copies):
            p.copy_(c * (1 + self.slip))
            self.state[p] = {k: v.float() for k, v in self.inner.state[c].items() if k != "step"}


def test_optimizer_parity_holds_a_users_adamw_to_checks_bar(monkeypatch):
    """--backend adamw=NAME: an AdamW more exact than torch's passes (ckparity's own
    bitwise claim is not a user's contract); a wrong step fails, with check's reason."""
    monkeypatch.setitem(kernels.backends("adamw"), "f64", lambda params, **kw: _Float64AdamW(params, **kw))
    monkeypatch.setitem(kernels.backends("adamw"), "slipped", lambda params, **kw: _Float64AdamW(params, slip=1e-3, **kw))
    settings = small("optimizer_parity", steps=5, sizes=[1, 17, 301])
    ok = gates.optimizer_parity.run({**settings, "ck_backends": {"adamw": "f64"}})
    assert ok["passed"] and ok["details"]["sizes"]["verdict"] == "as accurate as torch", ok["summary"]
    assert ok["details"]["sizes"]["bit_identical"] == 0  # not torch's bits, and passes
    bad = gates.optimizer_parity.run({**settings, "ck_backends": {"adamw": "slipped"}})
    assert not bad["passed"] and bad["details"]["sizes"]["verdict"] == "wrong" and "not close" in bad["summary"]


def _swiglu_wrong_backward(x):
    # planted fault: forward is right, the gradient of the up half is halved
    H = x.shape[-1] // 2
    up = x[..., H:]
    up = up * 0.5 + (up * 0.5).detach()
    return F.silu(x[..., :H]) * up


kernels.register("swiglu", "fault_wrong_backward", _swiglu_wrong_backward)


def test_fd_gradients_catches_a_wrong_gradient():
    result = gates.fd_gradients.run(small("fd_gradients", ck_swiglu_backend="fault_wrong_backward",
                                      models=["tiny"], coordinates=8))
    assert not result["passed"]
    assert "grad" in result["summary"] and "vs finite difference" in result["summary"]


def test_fd_gradients_passes_as_built():
    assert gates.fd_gradients.run(small("fd_gradients", coordinates=8))["passed"]


def _loss_random_order(logits, targets):
    # planted fault: a reduction whose order changes from run to run
    order = torch.randperm(targets.numel(), generator=torch.Generator().manual_seed(torch.seed()))
    rows = F.cross_entropy(logits[order] * 1.0001, targets[order], reduction="none")
    return rows.sum() / rows.numel()


kernels.register("cross_entropy", "fault_nondeterministic", _loss_random_order)


def test_replay_determinism_catches_a_nondeterministic_reduction(tmp_path):
    result = gates.replay_determinism.run(small("replay_determinism", ck_loss_backend="fault_nondeterministic",
                                            steps=4), tmp_path)
    assert not result["passed"] and "differs in" in result["summary"]


def test_drift_smoke_catches_a_broken_optimizer(tmp_path):
    from test_harness import _AdamWNoBiasCorrection  # noqa: F401  (registers the planted fault)

    result = gates.drift_smoke.run(small("drift_smoke", steps=5, models=["tiny"],
                                     ck_optimizer_backend="fault_no_bias_correction"), tmp_path)
    assert not result["passed"]
    assert "params at 1" in result["summary"] and "embedding.weight" in result["summary"]


def test_long_horizon_catches_a_broken_loss(tmp_path):
    from test_harness import _loss_eps_log  # noqa: F401  (registers the planted faults)

    result = gates.long_horizon.run(small("long_horizon", steps=5, loss_backends=["fault_all_tokens"]), tmp_path)
    assert result["passed"] is True  # no ignored targets in the preset: dividing by all tokens is right
    kernels.register("cross_entropy", "fault_scaled", lambda logits, t: F.cross_entropy(logits, t) * 1.001)
    result = gates.long_horizon.run(small("long_horizon", steps=5, loss_backends=["fault_scaled"]), tmp_path)
    assert not result["passed"] and "loss fails at 1" in result["summary"] and "loss" in result["summary"]


def test_cli_writes_reports_summary_and_exit_code(tmp_path, capsys):
    config = tmp_path / "gates.toml"
    config.write_text("[optimizer_parity]\nsteps = 3\nsizes = [7]\n")
    out = tmp_path / "g"
    assert main(["gate", "--only", "optimizer_parity", "--config", str(config), "--out-dir", str(out)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("PASS optimizer_parity")
    report = json.loads((out / "optimizer_parity_latest.json").read_text())
    assert report["passed"] and report["settings"]["steps"] == 3 and report["settings"]["sizes"] == [7]
    assert "| optimizer_parity | pass |" in (out / "summary.md").read_text()


def test_cli_bad_config_exits_2(tmp_path, capsys):
    config = tmp_path / "gates.toml"
    config.write_text("[optimizer_parity]\nstepz = 3\n")
    assert main(["gate", "--config", str(config), "--out-dir", str(tmp_path)]) == 2
    assert "unknown keys ['stepz']" in capsys.readouterr().err
    config.write_text("[nope]\nx = 1\n")
    assert main(["gate", "--config", str(config), "--out-dir", str(tmp_path)]) == 2
    config.write_text('[long_horizon]\ndtype = "float16"\n')
    assert main(["gate", "--config", str(config), "--out-dir", str(tmp_path)]) == 2
    assert 'dtype must be "float32" or "bfloat16"' in capsys.readouterr().err


def test_failing_gate_exits_1(tmp_path, monkeypatch):
    monkeypatch.setitem(gates.optimizer_parity.OPTIMIZERS, "ckparity", _PerturbedAdamW)
    config = tmp_path / "gates.toml"
    config.write_text("[optimizer_parity]\nsteps = 3\nsizes = [7]\n")
    assert main(["gate", "--only", "optimizer_parity", "--config", str(config), "--out-dir", str(tmp_path)]) == 1


def test_depth_sweep_passes_as_built(tmp_path):
    result = gates.depth_sweep.run(small("depth_sweep", steps=3), tmp_path)
    assert result["passed"], result["summary"]
    assert all(r["bitwise"] for r in result["details"]["rows"] if r["variant"] == "bitwise")


def test_depth_sweep_catches_a_broken_composition(tmp_path, monkeypatch):
    from test_composition import _pre_added_rms_norm

    monkeypatch.setitem(kernels.backends("rms_norm"), "c", _pre_added_rms_norm)  # the pre-added dx, planted as "c"
    result = gates.depth_sweep.run(small("depth_sweep", steps=3, variants=["bitwise"]), tmp_path)
    assert not result["passed"] and "not bit-identical" in result["summary"]


def test_depth_sweep_runs_the_gates_backends(tmp_path, monkeypatch):
    """gate --backend: one variant, the CK twin with the user's kernels, held to parity
    (not to bits); a user's swiglu 1e-3 off fails it."""
    monkeypatch.setitem(kernels.backends("swiglu"), "off", lambda x: kernels.backends("swiglu")["torch"](x) * (1 + 1e-3))
    result = gates.depth_sweep.run({**small("depth_sweep", steps=3), "ck_backends": {"swiglu": "off"}}, tmp_path)
    assert {r["variant"] for r in result["details"]["rows"]} == {"backends"} and not result["passed"]
    report = json.loads(next(tmp_path.glob("depth_*_backends.json")).read_text())
    assert report["config"]["ck_swiglu_backend"] == "off" and report["config"]["ck_loss_backend"] == "c"
    monkeypatch.setitem(kernels.backends("swiglu"), "same", kernels.backends("swiglu")["torch"])
    assert gates.depth_sweep.run({**small("depth_sweep", steps=3), "ck_backends": {"swiglu": "same"}}, tmp_path)["passed"]


def test_accuracy_parity_passes_as_built(tmp_path):
    result = gates.accuracy_parity.run(small("accuracy_parity", steps=10, shadow_every=5), tmp_path)
    assert result["passed"], result["summary"]


def test_accuracy_parity_catches_a_less_accurate_update(tmp_path):
    from test_attribution import _BiasedAdamW  # noqa: F401  (registers "fault_biased")

    result = gates.accuracy_parity.run(small("accuracy_parity", steps=10, shadow_every=5, loss_backends=["c"],
                                         ck_optimizer_backend="fault_biased"), tmp_path)
    assert not result["passed"] and "CK param error" in result["summary"]


def _loss_raises(logits, targets):
    raise RuntimeError("planted: the CK loss raises")


def _loss_nan(logits, targets):
    return F.cross_entropy(logits, targets) * float("nan")


def _loss_by_thread_count(logits, targets):
    # planted fault: a sum whose blocking follows the thread count, as a
    # reduction split by "whatever threads there are" would
    rows = F.cross_entropy(logits, targets, reduction="none")
    blocks = rows.chunk(ckparity.get_num_threads() * 3)
    return sum(block.sum() for block in blocks) / rows.numel()


kernels.register("cross_entropy", "fault_raises", _loss_raises)
kernels.register("cross_entropy", "fault_nan", _loss_nan)
kernels.register("cross_entropy", "fault_thread_count", _loss_by_thread_count)


def test_accuracy_parity_fails_on_a_run_that_errors(tmp_path):
    result = gates.accuracy_parity.run(small("accuracy_parity", steps=10, shadow_every=5, loss_backends=["fault_raises"]),
                                   tmp_path)
    assert not result["passed"] and "the run error" in result["summary"], result["summary"]


def test_accuracy_parity_fails_on_nan(tmp_path):
    result = gates.accuracy_parity.run(small("accuracy_parity", steps=10, shadow_every=5, loss_backends=["fault_nan"]),
                                   tmp_path)
    assert not result["passed"], result["summary"]


def test_nan_max_keeps_a_nan_wherever_it_is():
    from ckparity.measure import nan_max

    assert nan_max([1.0, float("nan"), 2.0]) != nan_max([1.0, float("nan"), 2.0])
    assert nan_max([1.0, 3.0, 2.0]) == 3.0 and nan_max([]) == 0.0


def test_the_parity_rule_asks_who_is_nearer_where_torchs_nans_are_the_references():
    """Where torch has a NaN the float64 evaluation has not (attention's row of -inf scores), a kernel with
    torch's NaNs is judged on the other elements -- a NaN error once failed it for being torch; one nearer or
    farther there is still told apart, and a NaN torch lacks is still not close."""
    from ckparity.measure import parity

    reference = torch.tensor([float("-inf"), 1.0, 2.0, 3.0], dtype=torch.float64)
    theirs = torch.tensor([float("nan"), 1.0, 2.0, 3.0 + 2 ** -21])
    assert parity("out", theirs.clone(), theirs, reference)["ok"]
    near = torch.tensor([float("nan"), 1.0, 2.0, 3.0])
    assert parity("out", near, theirs, reference)["ok"]
    far = torch.tensor([float("nan"), 1.0, 2.0 + 2 ** -18, 3.0 + 2 ** -21])
    assert not parity("out", far, theirs, reference, rtol=1e-3, atol=1e-3)["ok"]  # close, but 8x torch's error
    lone = torch.tensor([float("nan"), float("nan"), 2.0, 3.0 + 2 ** -21])
    assert "not close" in parity("out", lone, theirs, reference)["reason"]


def test_replay_determinism_fails_on_a_run_that_errors(tmp_path):
    result = gates.replay_determinism.run(small("replay_determinism", ck_loss_backend="fault_raises", steps=2), tmp_path)
    assert not result["passed"] and "error" in result["summary"], result["summary"]


def test_replay_determinism_really_threads_and_catches_a_thread_count_dependence(tmp_path):
    result = gates.replay_determinism.run(small("replay_determinism", ck_loss_backend="fault_thread_count", steps=2),
                                      tmp_path)
    assert not result["passed"] and "threads=2 differs" in result["summary"], result["summary"]
    assert result["details"]["threads_used"] == {"first": 1, "again": 1, "threads=2": 2}
    # the run is wide enough that every C kernel of the step crosses its OpenMP threshold
    run = gates.replay_determinism.REPLAY_RUN
    tokens = run.batch_size * run.seq_len
    assert tokens * run.vocab >= 16384 and tokens * run.d_model >= 32768 and tokens * run.hidden >= 32768
    assert run.vocab * run.d_model > 65536


def test_noise_envelope_catches_a_biased_loss(tmp_path):
    from test_attribution import _loss_scaled  # noqa: F401  (registers "fault_scaled_loss": 0.1% off)

    result = gates.noise_envelope.run(small("noise_envelope", steps=10, members=1, loss_backends=["fault_scaled_loss"]),
                                  tmp_path)
    assert not result["passed"] and "beyond" in result["summary"], result["summary"]


def test_noise_envelope_catches_a_one_ulp_bias_by_its_direction(tmp_path, monkeypatch):
    """One ULP outward on every dlogit: a drift the size of the null's (fixed
    random signs make the same size), but an error with a direction."""
    from test_envelope import _GradOneUlpUp  # its backward: each gradient element one ULP further from 0

    monkeypatch.setitem(kernels.backends("cross_entropy"), "fault_dlogits_outward",
                        lambda x, t, **kw: F.cross_entropy(_GradOneUlpUp.apply(x), t, **kw))
    result = gates.noise_envelope.run(small("noise_envelope", steps=10, members=1,
                                        loss_backends=["fault_dlogits_outward"]), tmp_path)
    assert not result["passed"] and "loss.grad0 leans one way" in result["summary"], result["summary"]


def test_noise_envelope_passes_as_built(tmp_path):
    result = gates.noise_envelope.run(small("noise_envelope", steps=10, members=1, loss_backends=["c"]), tmp_path)
    assert result["passed"], result["summary"]


def test_optimizer_parity_holds_the_fused_adamw_to_torchs_fused_bits(monkeypatch):
    """The single-tensor step where fused=True's should be: within 8 ULPs of torch's fused params, but not
    its bits -- the fused reference's bar."""
    assert gates.optimizer_parity.run(small("optimizer_parity", steps=5, sizes=[17, 1000]))["passed"]
    monkeypatch.setitem(gates.optimizer_parity.OPTIMIZERS, "ckparity_fused", gates.optimizer_parity.OPTIMIZERS["ckparity"])
    result = gates.optimizer_parity.run(small("optimizer_parity", steps=5, sizes=[17, 1000]))
    assert not result["passed"] and "fused=True" in result["summary"], result["summary"]
