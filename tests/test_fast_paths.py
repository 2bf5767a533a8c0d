"""The ops' fast paths (a contiguous 2-D CPU input, class-index targets)
give the bits and the errors of their full paths, in every dtype they take."""

from __future__ import annotations

import pytest
import torch

import ckparity
from ckparity.errors import TargetOutOfRange


def _same_bits(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # NaN where all rows are ignored


def _grad(fn, x, *args, scale=1.0, **kwargs):
    x = x.clone().requires_grad_(True)
    out = fn(x, *args, **kwargs)
    (out.sum() * scale).backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("N, C", [(8, 256), (1, 1), (3, 1000), (64, 7)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("scale", [1.0, 0.125, 1 / 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_fast_path_same_bits_as_the_full_path(N, C, reduction, scale, dtype):
    g = torch.Generator().manual_seed(N * C)
    x = (torch.randn(N, C, generator=g) * 4).to(dtype)
    t = torch.randint(0, C, (N,), generator=g)
    t[0] = -100
    fast = _grad(ckparity.cross_entropy, x, t, reduction=reduction, label_smoothing=0.1, scale=scale)
    # (N, C, 1) with (N, 1) targets: the same rows, through the full checks and views
    full = _grad(lambda v: ckparity.cross_entropy(v.unsqueeze(-1), t.unsqueeze(-1), reduction=reduction,
                                                  label_smoothing=0.1).reshape(fast[0].shape), x, scale=scale)
    _same_bits(fast[0], full[0])
    _same_bits(fast[1], full[1])


def test_cross_entropy_fast_path_refuses_what_the_full_path_refuses():
    x = torch.randn(4, 10, requires_grad=True)
    with pytest.raises(TargetOutOfRange):
        ckparity.cross_entropy(x, torch.tensor([0, 1, 10, 2]))
    with pytest.raises(ValueError, match="reduction"):
        ckparity.cross_entropy(x, torch.tensor([0, 1, 2, 3]), reduction="avg")


def test_cross_entropy_retained_graph_gives_the_gradient_each_backward():
    x = torch.randn(8, 32, requires_grad=True)
    loss = ckparity.cross_entropy(x, torch.randint(0, 32, (8,))) * 0.5
    loss.backward(retain_graph=True)
    once = x.grad.clone()
    loss.backward()
    assert torch.equal(x.grad, once * 2)


@pytest.mark.parametrize("N, H", [(8, 128), (1, 1), (5, 301)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_swiglu_fast_path_same_bits_as_the_full_path(N, H, dtype):
    x = (torch.randn(N, 2 * H, generator=torch.Generator().manual_seed(H)) * 3).to(dtype)
    fast = _grad(ckparity.swiglu, x)
    full = _grad(lambda v: ckparity.swiglu(v.unsqueeze(0)).squeeze(0), x)
    _same_bits(fast[0], full[0])
    _same_bits(fast[1], full[1])
