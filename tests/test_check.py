"""ckparity check: the verdicts on ckparity's own kernels and on planted
faults, one per verdict, and the command line's exit codes and report."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ckparity import check as conformance
from ckparity import kernels, reference
from ckparity.cli import main


@pytest.fixture
def few_widths(monkeypatch):
    """Planted faults show at any width: a short sweep keeps these tests fast."""
    for name, record in kernels.KERNELS.items():
        if record.conformance is not None and not record.optimizer:
            widths = [2, 8, 34, 300] if name == "rope" else [1, 7, 64, 301]
            monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=widths))


@pytest.fixture
def planted(monkeypatch):
    def plant(kernel, name, fn):
        monkeypatch.setitem(kernels.backends(kernel), name, fn)
        # the planted faults wrap torch's own op: the cheats property would name that first (test_cheats.py)
        monkeypatch.setattr(kernels.KERNELS[kernels.slot(kernel)], "torch_ops", ())
        return name
    return plant


def _verdicts(report):
    return {r["property"]: r["verdict"] for r in report["properties"]}


def test_own_swiglu_full_sweep_is_bitwise_where_the_library_follows_torch():
    report = conformance.check("swiglu", "c")
    widths = next(r for r in report["properties"] if r["property"] == "widths")
    assert widths["cases"] == 2 * (300 + 6)  # 1..300 and six large widths, at 1 and 3 rows
    expected = "bitwise" if "swiglu" in kernels.bit_identical() else "as accurate as torch"
    assert report["verdict"] == expected and report["passed"] and report["schema"] == "ckparity.check/1"


def test_own_default_cross_entropy_is_as_accurate_not_bitwise(few_widths):
    report = conformance.check("loss", "c")  # the flag's spelling of the slot
    assert report["kernel"] == "cross_entropy" and _verdicts(report)["widths"] == "as accurate as torch"
    assert report["passed"]


def test_a_fast_exp_swiglu_is_less_accurate_or_wrong(few_widths, planted):
    def fast_exp_swiglu(x):
        g, u = x.chunk(2, -1)
        e = torch.exp(-g).to(torch.bfloat16).float()  # an 8-bit-mantissa exp
        return g / (1 + e) * u
    report = conformance.check("swiglu", planted("swiglu", "fast_exp", fast_exp_swiglu))
    assert _verdicts(report)["widths"] in ("less accurate", "wrong") and report["verdict"] == "wrong"
    assert not report["passed"] and report["properties"][0]["failures"]


def test_a_mean_over_ignored_rows_is_wrong(few_widths, planted):
    def counts_ignored(logits, targets, **kw):
        return F.cross_entropy(logits, targets, reduction="sum", **kw) / len(targets)
    report = conformance.check("cross_entropy", planted("cross_entropy", "counts_ignored", counts_ignored))
    assert _verdicts(report)["widths"] == "wrong" and not report["passed"]


def test_a_backend_raising_on_valid_input_crashes(few_widths, planted):
    def no_ignore_index(logits, targets, **kw):
        if (targets < 0).any():
            raise IndexError("target -100 out of bounds")
        return F.cross_entropy(logits, targets, **kw)
    report = conformance.check("cross_entropy", planted("cross_entropy", "no_ignore", no_ignore_index))
    assert report["verdict"] == "crashes" and "IndexError" in report["properties"][0]["failures"][0]


def test_reading_a_strided_input_as_contiguous_is_wrong(few_widths, planted):
    def ignores_strides(x, shape, weight, eps):
        flat = x.contiguous() if x.is_contiguous() else x.as_strided(x.shape, x.contiguous().stride())
        return F.rms_norm(flat, shape, weight, eps)
    report = conformance.check("rms_norm", planted("rms_norm", "ignores_strides", ignores_strides))
    assert _verdicts(report)["layouts"] == "wrong" and _verdicts(report)["widths"] == "bitwise"


def test_reading_an_expanded_weight_as_contiguous_is_wrong(few_widths, planted):
    """The crash torch's own samples found (a strided or expanded rms_norm weight): a kernel that reads
    its weight's memory as if it were contiguous is caught on the weight's layouts, not on x's."""
    def weight_as_contiguous(x, shape, weight, eps):
        flat = weight if weight.is_contiguous() else weight.as_strided(weight.shape, (1,))
        return F.rms_norm(x, shape, flat, eps)
    report = conformance.check("rms_norm", planted("rms_norm", "weight_as_contiguous", weight_as_contiguous))
    row = next(r for r in report["properties"] if r["property"] == "layouts")
    assert row["verdict"] == "wrong" and _verdicts(report)["widths"] == "bitwise"
    assert {f["case"].split(",", 1)[1] for f in row["worst"]} <= {"weight strided", "weight expanded rows"}
    assert not any("x " in f["case"] for f in row["worst"])


def test_accepting_bad_input_is_wrong(few_widths, planted):
    def no_shape_check(x):
        h = x.shape[-1] // 2
        return reference.swiglu(x[..., : 2 * h])
    report = conformance.check("swiglu", planted("swiglu", "no_shape_check", no_shape_check))
    bad = next(r for r in report["properties"] if r["property"] == "bad_input")
    assert bad["verdict"] == "wrong" and "odd last dimension" in bad["failures"][0]


def test_torchs_own_samples_find_what_the_sweep_does_not(few_widths, planted):
    """OpInfo's rms_norm samples hold an input of 0 rows (the sweep's have 1
    and 3): a kernel that divides by the row count crashes there alone."""
    def per_row_mean_of_rows(x, shape, weight, eps):
        _ = 1 / (x.numel() // x.shape[-1])  # a C kernel's n / rows, here Python's ZeroDivisionError
        return F.rms_norm(x, shape, weight, eps)
    report = conformance.check("rms_norm", planted("rms_norm", "rows", per_row_mean_of_rows))
    verdicts = _verdicts(report)
    assert verdicts["widths"] == "bitwise" and verdicts["torch_inputs"] == "crashes" and report["verdict"] == "crashes"
    torch_inputs = next(r for r in report["properties"] if r["property"] == "torch_inputs")
    assert "(0, 1)" in torch_inputs["failures"][0] and torch_inputs["cases"] >= 4


def test_a_thread_dependent_result_is_nondeterministic(few_widths, planted):
    def by_threads(x):
        y = reference.swiglu(x)
        return y * (1 + 2.0**-20) if torch.get_num_threads() == 2 else y
    report = conformance.check("swiglu", planted("swiglu", "by_threads", by_threads))
    assert _verdicts(report)["threads"] == "nondeterministic" and report["passed"]


def _batch_dependent_rms_norm(x, shape, weight=None, eps=1e-5):
    """planted: a batch-1 fast path with its own rounding (divides by the root, where the batched path
    multiplies by rsqrt)"""
    if x.shape[0] == 1:
        y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y if weight is None else y * weight
    return F.rms_norm(x, shape, weight, eps)


def test_a_batch_dependent_reduction_is_nondeterministic(few_widths, planted):
    """The row's bits change with the batch it sits in: batch_invariance says
    so (check passes it, a gate does not); torch's own count stays beside it."""
    report = conformance.check("rms_norm", planted("rms_norm", "by_batch", _batch_dependent_rms_norm))
    row = next(r for r in report["properties"] if r["property"] == "batch_invariance")
    assert row["verdict"] == "nondeterministic" and report["passed"] and not report["passes_gates"]
    assert row["ours_variant"] > row["torch_variant"] and row["follows_torch"] == 0
    assert "depend on its batch" in row["failures"][0]


def test_own_kernels_are_batch_invariant_or_follow_torchs_variance():
    """ckparity's row kernels: a row's bits never depend on its batch, except a
    lone row of 65537 on 2 threads where torch's rms_norm splits the row's sum
    (ours follows torch there: same count, torch's bits), and linear's, which
    follows MKL's path per batch size and moves only where torch's moves (its
    row alone, MKL's gemv, not followed: as accurate as torch)."""
    from ckparity.gates.kernel_parity import batch_invariance_rows

    rows = {(r["kernel"], r["backend"]): r for r in batch_invariance_rows(torch.float32)}
    assert {("rms_norm", "c"), ("swiglu", "c"), ("cross_entropy", "c"), ("cross_entropy", "c_ptref")} <= set(rows)
    for (kernel, _), r in rows.items():
        assert r["verdict"] in (("bitwise", "as accurate as torch") if kernel == "linear" else ("bitwise",))
        assert r["arrangements"] == 145 and r["ours_variant"] == r["follows_torch"] <= r["torch_variant"]


def test_the_kernel_parity_gate_fails_on_a_batch_dependent_own_kernel(monkeypatch):
    from ckparity import gates

    monkeypatch.setitem(kernels.backends("rms_norm"), "c", _batch_dependent_rms_norm)
    rows = gates.kernel_parity.batch_invariance_rows(torch.float32)
    bad = next(r for r in rows if (r["kernel"], r["backend"]) == ("rms_norm", "c"))
    assert bad["verdict"] == "nondeterministic"


class _NoBiasCorrection(torch.optim.Optimizer):
    """AdamW without its bias corrections: a real slip, far from torch early on."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                p.mul_(1 - group["lr"] * group["weight_decay"])
                state["exp_avg"].lerp_(p.grad, 1 - b1)
                state["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-group["lr"])


def test_adamw_is_checked_by_size_and_thread_count(monkeypatch, planted):
    """ckparity's AdamW: as accurate as torch (params an ULP off where torch's MKL sqrt
    rounds down, moments bit-identical), the same bits at 1 and 2 threads; an AdamW
    without bias correction: wrong."""
    record = kernels.KERNELS["adamw"]
    monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[1, 7, 64, 301, 4097]))
    report = conformance.check("optimizer", "c")
    assert report["kernel"] == "adamw" and report["passed"], conformance.table(report)
    assert _verdicts(report)["sizes"] in ("bitwise", "as accurate as torch") and _verdicts(report)["threads"] == "bitwise"
    wrong = conformance.check("adamw", planted("adamw", "no_bias_correction", _NoBiasCorrection))
    assert _verdicts(wrong)["sizes"] == "wrong" and not wrong["passed"]


_CLI_PLUGIN = """
import ctypes
import ckparity
from ckparity import reference


def no_backward_transpose(q, cos, sin):  # rotates the wrong way: wrong
    return reference.rope(q, cos, -sin, "half")


def segfaults_on_strided_input(x):  # fine on the contract check's input, a C crash on a strided one
    if not x.is_contiguous():
        ctypes.string_at(0)
    return ckparity.swiglu(x)


ckparity.register_backend("rope", "no_backward_transpose", no_backward_transpose)
ckparity.register_backend("swiglu", "segfaults", segfaults_on_strided_input)
"""


def test_cli_exit_codes_and_report(tmp_path, capsys, monkeypatch):
    """The command runs the suite in a child process (with --plugin's backends):
    0 and the report on a conforming kernel, 1 on a wrong one, 1 with the
    verdict crashes when the child is killed by a segfault, 2 on bad arguments."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CKP_PLUGINS", "")  # what --plugin adds to it ends with the test
    for kernel in ("rope", "swiglu"):  # the plugin's registrations end with the test
        monkeypatch.setattr(kernels.KERNELS[kernel], "backends", dict(kernels.backends(kernel)))
    monkeypatch.setattr(kernels.registry, "_loaded", [])
    (tmp_path / "planted.py").write_text(_CLI_PLUGIN)
    out = tmp_path / "check.json"
    assert main(["check", "rope", "--backend", "c", "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["schema"] == "ckparity.check/1" and report["passed"] and report["properties"]
    assert main(["check", "rope", "--plugin", "planted.py", "--backend", "no_backward_transpose",
                 "--json-out", str(out)]) == 1
    assert json.loads(out.read_text())["verdict"] == "wrong"
    assert main(["check", "swiglu", "--plugin", "planted.py", "--backend", "segfaults", "--json-out", str(out)]) == 1
    crashed = json.loads(out.read_text())
    assert crashed["verdict"] == "crashes" and crashed["crash"]["ending"] == "killed by SIGSEGV", crashed
    # the properties before the crash keep their rows; the crash names its property and case
    assert [(r["property"], r["verdict"]) for r in crashed["properties"]] == [
        ("contract", "bitwise"),  # a registered backend's contract check is the child's first property
        ("widths", "bitwise" if "swiglu" in kernels.bit_identical() else "as accurate as torch"),
        ("options", "bitwise" if "swiglu" in kernels.bit_identical() else "as accurate as torch"),
        ("layouts", "crashes")]
    assert (crashed["crash"]["property"], crashed["crash"]["case"]) == ("layouts", "width=8,x strided")
    assert crashed["dtype"] == "float32"
    assert main(["check", "swiglu", "--plugin", "planted.py", "--backend", "segfaults", "--dtype", "bfloat16",
                 "--json-out", str(out)]) == 1
    crashed = json.loads(out.read_text())  # a crashed bf16 check says its dtype (its table repeats --dtype)
    assert crashed["verdict"] == "crashes" and crashed["dtype"] == "bfloat16"
    assert main(["check", "swiglu", "--backend", "nope"]) == 2
    assert "registered: c, " in capsys.readouterr().err
    assert main(["check", "clip_grad_norm", "--backend", "c"]) == 2  # no suite for it yet: refused


_USER_TESTS = '''
from dataclasses import replace

import pytest
import torch

import ckparity
from ckparity import kernels


@pytest.fixture(autouse=True)
def few_widths(monkeypatch):
    record = kernels.KERNELS["rms_norm"]
    monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[1, 7, 64]))


def my_rms_norm(x, shape, weight, eps):  # a user's kernel, bit-identical (ckparity's C: not torch's own op)
    return ckparity.rms_norm(x, shape, weight, eps)


def sloppy_rms_norm(x, shape, weight, eps):  # 1e-3 off: wrong
    return torch.nn.functional.rms_norm(x, shape, weight, eps) * 1.001


def test_mine_is_bitwise(ckparity_check):
    report = ckparity_check("rmsnorm", my_rms_norm, expect="bitwise")
    assert report["verdict"] == "bitwise"


def test_sloppy_is_held_to_torch(ckparity_check):
    ckparity_check("rms_norm", sloppy_rms_norm)


def test_an_engine_of_mine(ckparity_engine):
    report = ckparity_engine({"rms_norm": my_rms_norm}, at_least="bitwise")
    assert report["correct"] == 1 and report["rows"][0]["speedup"] is not None


def test_an_engine_with_the_sloppy_one(ckparity_engine):
    ckparity_engine({"rms_norm": sloppy_rms_norm})
'''


def test_pytest_plugin_holds_a_users_kernel_to_the_checks(pytester):
    """The pytest11 entry point: an installed ckparity gives any test suite
    the ckparity_check and ckparity_engine fixtures; they pass a bit-identical
    kernel and fail a wrong one with the check's (the engine's) table."""
    pytester.makepyfile(test_user=_USER_TESTS)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*expected 'as accurate as torch' or better*",
                                 "*ckparity check rms_norm --backend pytest:test_user.sloppy_rms_norm: wrong*",
                                 "*expected 'as accurate as torch' or better of every slot; rms_norm 'wrong'*",
                                 "*| rms_norm | pytest:test_user.sloppy_rms_norm | wrong |*"])


@pytest.mark.parametrize("kernel", ["cross_entropy", "rms_norm", "swiglu"])
def test_a_kernel_that_hides_nan_and_inf_is_wrong_on_non_finite_rows(few_widths, planted, kernel):
    """The planted backends are torch's op on inputs with NaN and inf replaced by finite numbers (what a
    kernel does that clamps, or skips a row it thinks is padding): every finite case passes, and only the
    non_finite property's rows of special_rows (NaN, inf, -inf) find them."""
    torch_fn = kernels.backends(kernel)["torch"]

    def hides_non_finite(x, *args, **kwargs):
        return torch_fn(torch.nan_to_num(x), *args, **kwargs)
    report = conformance.check(kernel, planted(kernel, "hides_non_finite", hides_non_finite))
    verdicts = _verdicts(report)
    assert verdicts["non_finite"] == "wrong" and not report["passed"]
    assert all(v in ("bitwise", "as accurate as torch") for p, v in verdicts.items() if p != "non_finite"), verdicts
    own = conformance.check(kernel, "c")
    assert _verdicts(own)["non_finite"] in ("bitwise", "as accurate as torch") and own["passed"]
