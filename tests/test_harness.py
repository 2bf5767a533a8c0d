"""ckparity train / repro / compare: reports, planted faults, reproducibility,
interruption and usage errors."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ckparity import kernels
from ckparity.cli import main
from ckparity.harness.basics.config import parse_train_args
from ckparity.harness.loop.run import train

SHORT = ["--max-steps", "12", "--grad-accum", "2", "--total-tokens", "4096", "--no-progress"]


def run(tmp_path, *flags, name="r.json"):
    out = tmp_path / name
    return train(parse_train_args(SHORT + list(flags) + ["--json-out", str(out)])), out


def strict_load(path: Path) -> dict:
    def refuse(token):
        raise ValueError(f"bare {token} in report")
    return json.loads(path.read_text(), parse_constant=refuse)


TOP_LEVEL = {
    "schema": str, "status": str, "pass_parity": bool, "config": dict, "env": dict, "steps": int,
    "micro_steps": int, "first_loss_fail_step": (int, type(None)), "first_param_fail_step": (int, type(None)),
    "first_grad_fail_step": (int, type(None)), "first_logit_fail_step": (int, type(None)),
    "first_moment_fail_step": (int, type(None)), "first_nonfinite_step": (int, type(None)),
    "max_loss_abs_diff": float, "max_param_abs_diff": float, "final_ck_loss": float,
    "final_torch_loss": float, "series": dict, "localization": (dict, type(None)), "timing": dict,
}


@pytest.mark.parametrize("model", [["--model", "tiny"], ["--model", "stacked", "--num-layers", "2"]])
def test_short_run_report_schema(tmp_path, model):
    result, path = run(tmp_path, *model)
    data = strict_load(path)
    for key, kind in TOP_LEVEL.items():
        assert isinstance(data[key], kind), f"{key}: {type(data[key]).__name__}"
    assert data["schema"] == "ckparity.drift/1"
    assert data["status"] == "pass" and data["pass_parity"] is True
    assert data["steps"] == 12 and data["micro_steps"] == 24
    assert all(len(v) == 12 for v in data["series"].values())
    for key in ("ckparity", "torch", "numpy", "ckparity_threads", "torch_threads", "cpu", "compiler_flags",
                "library_isa", "output_pool_mb", "huge_pages", "library"):
        assert key in data["env"]
    assert data["final_ck_loss"] == pytest.approx(data["final_torch_loss"], abs=2e-5)
    assert data["series"]["param_tensor"][0] is not None


def _loss_all_tokens(logits, targets):
    # planted fault: divides by every token, ignored ones included
    return F.cross_entropy(logits, targets, reduction="sum") / targets.numel()


def _loss_eps_log(logits, targets):
    # planted fault: -log(p + 1e-10) instead of log-sum-exp
    return F.nll_loss(torch.log(torch.softmax(logits, -1) + 1e-10), targets)


class _AdamWNoBiasCorrection(torch.optim.Optimizer):
    """planted fault: AdamW that skips the bias corrections"""

    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-group["lr"])


kernels.register("cross_entropy", "fault_all_tokens", _loss_all_tokens)
kernels.register("cross_entropy", "fault_eps_log", _loss_eps_log)
kernels.register("adamw", "fault_no_bias_correction", _AdamWNoBiasCorrection)


@pytest.mark.parametrize("model", [["--model", "tiny"], ["--model", "stacked"]])
def test_planted_fault_all_tokens_divisor(tmp_path, model):
    result, _ = run(tmp_path, *model, "--ignore-frac", "0.3", "--ck-loss-backend", "fault_all_tokens")
    assert result["first_loss_fail_step"] == 1
    assert result["status"] == "fail" and not result["pass_parity"]
    assert result["localization"]["first_forward_stage"] == "loss"
    assert result["localization"]["first_backward_stage"] == "dlogits"


def test_planted_fault_eps_log(tmp_path):
    # the clamp only matters once some target probability is tiny: a large lr
    # gets there in a few steps; param/grad tolerances are opened so that the
    # loss is the first failure and localization replays that step.
    result, _ = run(tmp_path, "--lr", "5e-2", "--max-steps", "40", "--param-tol", "1", "--grad-tol", "1",
                    "--ck-loss-backend", "fault_eps_log")
    assert result["first_loss_fail_step"] is not None
    assert result["localization"]["step"] == result["first_loss_fail_step"]
    assert result["localization"]["first_forward_stage"] == "loss"


def test_planted_fault_no_bias_correction(tmp_path):
    result, _ = run(tmp_path, "--ck-optimizer-backend", "fault_no_bias_correction")
    assert result["first_param_fail_step"] == 1
    assert result["first_loss_fail_step"] in (None, 2) or result["first_loss_fail_step"] >= 2
    loc = result["localization"]
    assert loc["first_forward_stage"] is None and loc["first_param_tensor"] == "embedding.weight"


def test_ignore_frac_masks_rows_and_stays_in_parity(tmp_path):
    masked, _ = run(tmp_path, "--ignore-frac", "0.5", name="masked.json")
    plain, _ = run(tmp_path, name="plain.json")
    assert masked["pass_parity"]
    assert masked["series"]["ck_loss"] != plain["series"]["ck_loss"]


@pytest.mark.parametrize("backend", ["c", "c_fused_linear"])
def test_label_smoothing_reaches_both_twins(tmp_path, backend):
    smoothed, _ = run(tmp_path, "--label-smoothing", "0.1", "--ck-loss-backend", backend, name="smoothed.json")
    plain, _ = run(tmp_path, "--ck-loss-backend", backend, name="plain.json")
    assert smoothed["pass_parity"] and smoothed["max_loss_abs_diff"] < 1e-5
    # a smoothed loss is larger than the plain one on the same first batch, on both sides
    for side in ("ck_loss", "torch_loss"):
        assert smoothed["series"][side][0] > plain["series"][side][0] + 1e-3


def _without_timing(report: dict) -> dict:
    report = json.loads(json.dumps(report))
    report.pop("timing")
    for key in ("ck_step_ms", "torch_step_ms"):
        report["series"].pop(key)
    report["config"].pop("json_out")
    return report


def test_identical_runs_identical_reports(tmp_path):
    a, _ = run(tmp_path, "--model", "stacked", name="a.json")
    b, _ = run(tmp_path, "--model", "stacked", name="b.json")
    assert _without_timing(a) == _without_timing(b)


def test_the_twins_take_turns_going_first(tmp_path, monkeypatch):
    """[Note: the twins take turns going first]: whichever twin runs first in a step pays for what
    ran before it, so a fixed order would bias the step times the report compares."""
    from ckparity.harness.twins.stepper import Twin

    calls = []
    for method in ("micro_steps", "update"):
        original = getattr(Twin, method)

        def spy(self, *args, _original=original, _method=method, **kwargs):
            calls.append((_method, self.name))
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(Twin, method, spy)
    result, _ = run(tmp_path, "--max-steps", "4")
    assert result["status"] == "pass"
    for method in ("micro_steps", "update"):
        firsts = [name for m, name in calls if m == method][::2]  # each step's first twin
        assert len(firsts) == 4 and set(firsts) == {"ck", "torch"}, method
        assert firsts[0::2] == [firsts[0]] * 2 and firsts[1::2] == [firsts[1]] * 2, method


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_signal_in_a_step_stops_the_run_after_it(tmp_path, monkeypatch, signum, code):
    """Each signal a run handles, sent to itself during step 3 of 50: the steps
    measured are kept, the status and exit code say which signal. In process,
    so the step is exact and it takes a second; the test below sends one from
    outside."""
    import os

    from ckparity.harness.observers import drift

    real_after_step = drift.DivergenceTracer.after_step

    def after_step_then_signal(self, record):
        real_after_step(self, record)
        if record.step == 3:
            os.kill(os.getpid(), signum)
    monkeypatch.setattr(drift.DivergenceTracer, "after_step", after_step_then_signal)
    # a signal the run does not handle lands here, not in pytest's default action: the assertions fail
    previous = signal.signal(signum, lambda *args: None)
    out = tmp_path / "int.json"
    try:
        assert main(["train", "--max-steps", "50", "--no-progress", "--json-out", str(out)]) == code
    finally:
        signal.signal(signum, previous)
    data = strict_load(out)
    assert data["status"] == "interrupted" and not data["pass_parity"] and data["stopped_by_signal"] == signum
    assert data["steps"] == 3 and data["series"]["step"] == [1, 2, 3]


# from outside, a real process: SIGTERM in CI (what runners and `timeout` send), the others nightly
@pytest.mark.parametrize("signum, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.nightly),
                                          (signal.SIGTERM, 143),
                                          pytest.param(signal.SIGHUP, 129, marks=pytest.mark.nightly)])
def test_signal_writes_interrupted_report(tmp_path, signum, code):
    out = tmp_path / "int.json"
    dump = tmp_path / "dump" / "dump.json"  # written during step 2: the signal lands with a step done
    proc = subprocess.Popen([sys.executable, "-m", "ckparity", "train", "--max-steps", "100000", "--epochs", "50",
                             "--dump-step", "2", "--dump-dir", str(dump.parent), "--json-out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not dump.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signum)
    proc.communicate(timeout=60)
    assert proc.returncode == code
    data = strict_load(out)
    assert data["status"] == "interrupted" and not data["pass_parity"] and data["stopped_by_signal"] == signum
    assert 0 < data["steps"] < 100000 and len(data["series"]["step"]) == data["steps"]


@pytest.mark.parametrize("during_write", [False, True])
def test_signal_after_the_loop_still_interrupts(tmp_path, monkeypatch, during_write):
    """A SIGTERM that arrives once the steps are done -- while the report is
    made, or while it is written -- is not dropped: status interrupted, the
    signal's exit code, and the report on disk says so."""
    import os

    from ckparity.harness.loop import run as run_module

    if during_write:
        real_write = run_module.report.write_json
        sent = []

        def write_then_signal(path, data):
            real_write(path, data)
            if not sent:
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)
        monkeypatch.setattr(run_module.report, "write_json", write_then_signal)
    else:
        real_forecast = run_module.forecast

        def forecast_then_signal(*args):
            os.kill(os.getpid(), signal.SIGTERM)
            return real_forecast(*args)
        monkeypatch.setattr(run_module, "forecast", forecast_then_signal)
    out = tmp_path / "late.json"
    code = main(["train", "--max-steps", "3", "--no-progress", "--json-out", str(out)])
    assert code == 143
    data = strict_load(out)
    assert data["status"] == "interrupted" and data["stopped_by_signal"] == signal.SIGTERM and data["steps"] == 3


@pytest.mark.parametrize("flags, message", [
    (["--seq-len", "0"], "--seq-len must be >= 1"),
    (["--lr", "-1"], "--lr must be"),
    (["--ignore-frac", "1.5"], "--ignore-frac"),
    (["--label-smoothing", "-0.1"], "--label-smoothing must be in [0, 1]"),
    (["--label-smoothing", "0.1", "--tp", "2"], "--label-smoothing is not supported with --tp"),
    (["--ck-loss-backend", "nope"], "--ck-loss-backend: no cross_entropy backend 'nope'; registered: c, c_fused_linear"),
    (["--train-text", "/nonexistent/file.txt"], "cannot read --train-text"),
    (["--total-tokens", "10", "--grad-accum", "8"], "fewer than one step needs"),
])
def test_usage_errors_exit_2_with_one_line(flags, message, capsys):
    assert main(["train"] + flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_bad_flag_type_exits_2(capsys):
    assert main(["train", "--lr", "fast"]) == 2


def test_train_text_and_cli_exit_codes(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 40)
    out = tmp_path / "text.json"
    assert main(["train", *SHORT, "--train-text", str(text), "--json-out", str(out)]) == 0
    assert strict_load(out)["status"] == "pass"
    out2 = tmp_path / "fault.json"
    assert main(["train", *SHORT, "--ck-optimizer-backend", "fault_no_bias_correction",
                 "--json-out", str(out2)]) == 1


def test_compare_table_and_plot(tmp_path, capsys):
    _, a = run(tmp_path, name="a.json")
    _, b = run(tmp_path, "--ck-optimizer-backend", "fault_no_bias_correction", name="b.json")
    png = tmp_path / "drift.png"
    assert main(["compare", str(a), str(b), "--plot", str(png)]) == 0
    table = capsys.readouterr().out
    assert "| first_param_fail_step | - | 1 |" in table
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert main(["compare", str(tmp_path / "missing.json")]) == 2


def test_nonfinite_float_written_as_string(tmp_path):
    from ckparity.harness.basics.report import read_report, write_json

    path = write_json(tmp_path / "x.json", {"schema": "ckparity.drift/1", "a": math.nan, "b": [math.inf, -math.inf]})
    assert strict_load(path) == {"schema": "ckparity.drift/1", "a": "nan", "b": ["inf", "-inf"]}
    assert math.isnan(read_report(path)["a"])


@pytest.mark.parametrize("n", [*range(1, 18), 31, 33, 4095, 4096, 4097, 100003])  # every 8-lane tail
def test_tensor_diff_in_c_matches_the_float64_expression(n):
    """harness/basics/diff.py compares float32 pairs in one C pass (ckp_compare); its figures equal the float64
    torch expression's, NaN and infinities included, for any thread count."""
    from ckparity import get_num_threads, set_num_threads
    from ckparity.harness.basics.diff import tensor_diff
    from ckparity.measure import abs_diff64

    def float64_figures(a, b):
        diff = abs_diff64(a, b)
        if torch.isnan(diff).any():
            return math.inf, math.inf
        abs_diff, scale = float(diff.max()), float(b.double().abs().max())
        return abs_diff, abs_diff / scale if scale > 0 and math.isfinite(scale) else (0.0 if abs_diff == 0 else math.inf)

    g = torch.Generator().manual_seed(n)
    threads = get_num_threads()
    for trial in range(12):
        a = torch.randn(n, generator=g) * 10
        b = a + (torch.rand(n, generator=g) < 0.01) * torch.randn(n, generator=g) * 1e-3
        k = int(torch.randint(0, n, (), generator=g))
        if trial % 4 == 1:
            a[k] = math.nan
        elif trial % 4 == 2:
            a[k] = b[k] = math.nan
        elif trial % 4 == 3:
            a[k], b[k] = (-math.inf, math.inf) if trial % 8 == 3 else (math.inf, math.inf)
        expected = float64_figures(a, b)
        for t in (1, 2):
            set_num_threads(t)
            got = tensor_diff(a, b)
            assert got == expected or all(math.isnan(x) for x in got + expected), (trial, got, expected)
    set_num_threads(threads)


@pytest.mark.parametrize("given, field, expected", [(["--dtype", "bf16"], "dtype", "bfloat16"),
                                                    (["--dtype", "FP32"], "dtype", "float32"),
                                                    (["--amp", "bf16"], "amp", "bfloat16"),
                                                    (["--amp", "bf16-mixed"], "amp", "bfloat16")])
def test_the_dtype_names_people_type(given, field, expected):
    """Accelerate's and Lightning's spellings (bf16, bf16-mixed) are ckparity's bfloat16; others are refused."""
    from ckparity.harness.basics.config import parse_train_args

    assert getattr(parse_train_args(given), field) == expected
    with pytest.raises(SystemExit):
        parse_train_args(["--dtype", "fp16"])
