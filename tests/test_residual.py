"""ckparity.residual (csrc/residual.c): torch's add bit for bit in float32 and bfloat16 -- broadcasting,
float32 with bfloat16, in place, any thread count -- its gradient autograd's, and the twins' residual slot
on it still torch's bits. (The width sweep and its capabilities: the record's claims, tests/test_capability.py;
its C API: tests/test_fuzz_c_api.py and tests/test_overlaps.py from the record's c_entries.)"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import ckparity
from ckparity import kernels
from ckparity.check import suite
from ckparity.errors import InvalidArgument, InvalidType
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.loop.run import train
from ckparity.kernels.sweeping import same_bits
from ckparity.ops.residual import residual, residual_add


@pytest.mark.parametrize("xs, ys, xd, yd", [
    ((4, 33), (4, 33), torch.float32, torch.float32),
    ((4, 33), (4, 33), torch.bfloat16, torch.bfloat16),
    ((2, 3, 17), (17,), torch.float32, torch.float32),          # y broadcast over the rows
    ((5, 1, 8), (1, 6, 8), torch.bfloat16, torch.bfloat16),    # both broadcast
    ((3, 40), (3, 40), torch.float32, torch.bfloat16),          # promoted to float32
    ((3, 40), (40,), torch.bfloat16, torch.float32)])
def test_the_sum_and_its_gradients_are_torchs(xs, ys, xd, yd):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(s, generator=g).to(d) * 30 for s, d in ((xs, xd), (ys, yd)))
    x[..., 0], y[..., -1] = float("nan"), float("-inf")
    results = []
    for fn in (residual, torch.add):
        a, b = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        out = fn(a, b)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype))
        results.append((out.detach(), a.grad, b.grad))
    for ours, theirs in zip(*results):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert same_bits(ours, theirs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_and_at_any_thread_count_the_same_bits(dtype):
    n = 300_001  # split over threads, an odd tail
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randn(n, generator=g).to(dtype) for _ in range(2))
    expected = x + y
    before = ckparity.get_num_threads()
    try:
        for threads in (1, 2):
            ckparity.set_num_threads(threads)
            out = torch.empty_like(x)
            residual_add(x, y, out)
            assert same_bits(out, expected), threads
    finally:
        ckparity.set_num_threads(before)
    in_place = x.clone()
    residual_add(in_place, y, in_place)  # out is x: x += y
    assert same_bits(in_place, expected)


def test_second_order_gradients_flow_as_through_torchs_add():
    """The backward does no arithmetic of its own, so a gradient penalty differentiates through it."""
    x, y = torch.randn(4, 5).requires_grad_(True), torch.randn(4, 5).requires_grad_(True)
    grads = []
    for fn in (residual, torch.add):
        (gx,) = torch.autograd.grad((fn(x, y) ** 2).sum(), x, create_graph=True)
        grads.append(torch.autograd.grad(gx.sum(), (x, y)))
    for ours, theirs in zip(*grads):
        assert torch.equal(ours, theirs)


def test_bad_input_is_refused_by_name():
    with pytest.raises(InvalidType, match="float64"):
        residual(torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
    with pytest.raises(InvalidArgument, match=r"\(3, 8\) and y \(3, 5\) do not broadcast"):
        residual(torch.randn(3, 8), torch.randn(3, 5))
    with pytest.raises(InvalidType, match="torch.Tensor"):
        residual([1.0], torch.randn(1))


def test_check_finds_the_c_backend_bitwise(monkeypatch):
    record = kernels.KERNELS["residual"]
    monkeypatch.setattr(record, "conformance", replace(record.conformance, widths=[1, 7, 64, 301, 4097]))
    report = suite.check("residual", "c")
    assert report["verdict"] == "bitwise", suite.table(report)


@pytest.mark.parametrize("model", ["stacked", "llama"])
def test_the_twins_stay_bit_identical_with_the_c_residual(model):
    """Both twins' every other op the same, the CK twin's residual adds in C: the same bits every step."""
    config = RunConfig(model=model, max_steps=6, grad_accum=2, total_tokens=4096, no_progress=True,
                       ck_residual_backend="c", ck_loss_backend="c_ptref", ck_optimizer_backend="torch",
                       **({"num_layers": 2, "heads": 4, "kv_heads": 2, "seq_len": 16} if model == "llama" else {}))
    report = train(config)
    assert report["status"] == "pass", report.get("error")
    assert report["divergence"]["first_step"] is None, report["divergence"]
    assert report["max_param_abs_diff"] == 0.0 and report["max_grad_abs_diff"] == 0.0
