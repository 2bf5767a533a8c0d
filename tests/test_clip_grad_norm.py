"""ckparity.clip_grad_norm_ against torch.nn.utils.clip_grad_norm_."""

from __future__ import annotations

import math

import pytest
import torch

import ckparity
from parity import check_parity


def twin_params(shapes, fill=None):
    ours, theirs = [], []
    for shape in shapes:
        grad = torch.randn(shape) * 3
        if fill is not None:
            grad.view(-1)[len(grad.view(-1)) // 2] = fill
        for group in (ours, theirs):
            p = torch.nn.Parameter(torch.zeros(shape))
            p.grad = grad.clone()
            group.append(p)
    return ours, theirs


SHAPES = [(7,), (64, 33), (100_003,), (1,)]


@pytest.mark.parametrize("norm_type", [2.0, float("inf"), 1.0, 3.0])
@pytest.mark.parametrize("max_norm", [0.5, 1e6])
def test_matches_torch(norm_type, max_norm):
    ours, theirs = twin_params(SHAPES)
    exact = torch.linalg.vector_norm(torch.cat([p.grad.double().flatten() for p in ours]), norm_type)
    n1 = ckparity.clip_grad_norm_(ours, max_norm, norm_type)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    check_parity(f"clip_grad_norm.norm[p={norm_type},max={max_norm}]", n1, n2, exact)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)
    clipped = float(torch.linalg.vector_norm(torch.cat([p.grad.double().flatten() for p in ours]), norm_type))
    assert clipped == pytest.approx(min(max_norm, float(exact)), rel=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")])
def test_nonfinite_gradients(bad, norm_type):
    ours, theirs = twin_params(SHAPES, fill=bad)
    n1 = ckparity.clip_grad_norm_(ours, 1.0, norm_type)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type)
    assert not math.isfinite(float(n1))
    assert math.isnan(float(n1)) == math.isnan(float(n2))
    ours, theirs = twin_params(SHAPES, fill=bad)
    with pytest.raises(RuntimeError, match="non-finite"):
        ckparity.clip_grad_norm_(ours, 1.0, norm_type, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="non-finite"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type, error_if_nonfinite=True)


@pytest.mark.parametrize("threads", [2, 4])
def test_same_bits_for_any_thread_count(threads):
    grads = [torch.randn(1_000_003), torch.randn(77)]
    norms = []
    for t in (1, threads):
        ckparity.set_num_threads(t)
        norms.append(ckparity.ops.clip_grad_norm.grad_norm(grads, 2.0))
    assert norms[0] == norms[1]


def test_bad_inputs():
    ours, _ = twin_params([(3,)])
    with pytest.raises(ValueError, match="norm_type"):
        ckparity.clip_grad_norm_(ours, 1.0, norm_type=-1)
    with pytest.raises(RuntimeError, match="norm_type"):  # torch's callers catch RuntimeError
        ckparity.clip_grad_norm_(ours, 1.0, norm_type=float("nan"))
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    p.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="float32"):
        ckparity.clip_grad_norm_([p], 1.0)


@pytest.mark.parametrize("norm_type", [0.0, float("-inf")])
def test_norm_types_zero_and_minus_inf_match_torch(norm_type):
    ours, theirs = twin_params([(3, 4), (7,), (1,)])
    for p in ours + theirs:
        p.grad.view(-1)[0] = 0.0  # a zero, so the count of nonzeros and the minimum are not trivial
    total_ours = ckparity.clip_grad_norm_(ours, 0.5, norm_type=norm_type)
    total_theirs = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type=norm_type)
    assert torch.equal(total_ours, total_theirs)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)


def test_foreach_keyword():
    ours, theirs = twin_params([(5,)])
    assert torch.equal(ckparity.clip_grad_norm_(ours, 1.0, foreach=False),
                       torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=False))
    with pytest.raises(ValueError, match="foreach=True"):
        ckparity.clip_grad_norm_(ours, 1.0, foreach=True)


def test_bf16_gradients_are_clipped_in_torchs_dtype_with_a_more_accurate_norm():
    """bf16 gradients: the norm of their exact values (torch's bf16 norm is rounded on the way), returned in
    bf16 as torch's is; the coefficient and the scaling are torch's bf16 ops. Mixed dtypes are refused."""
    g = torch.Generator().manual_seed(5)
    for sizes in ([3], [1, 17, 1000], [65537, 5]):
        grads = [(torch.randn(n, generator=g) * 3).bfloat16() for n in sizes]
        exact = torch.linalg.vector_norm(torch.cat([t.double() for t in grads]))
        ours = [torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16)) for n in sizes]
        theirs = [torch.nn.Parameter(torch.zeros(n, dtype=torch.bfloat16)) for n in sizes]
        for a, b, t in zip(ours, theirs, grads):
            a.grad, b.grad = t.clone(), t.clone()
        n_ours, n_theirs = ckparity.clip_grad_norm_(ours, 1.0), torch.nn.utils.clip_grad_norm_(theirs, 1.0)
        assert n_ours.dtype == n_theirs.dtype == torch.bfloat16
        assert abs(float(n_ours) - float(exact)) <= abs(float(n_theirs) - float(exact))
        assert abs(float(n_ours) - float(exact)) <= 2.0**-8 * float(exact)  # rounded once to bf16 (via float32)
        if torch.equal(n_ours, n_theirs):  # the same norm gives the same scaled gradients
            assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))
        assert all(a.grad.dtype == torch.bfloat16 for a in ours)
        assert float(torch.linalg.vector_norm(torch.cat([a.grad.double() for a in ours]))) < float(exact)
    mixed = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    mixed[0].grad, mixed[1].grad = torch.ones(3), torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="one dtype for all"):
        ckparity.clip_grad_norm_(mixed, 1.0)
