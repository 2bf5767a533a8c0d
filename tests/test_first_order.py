"""First order only, never silently: a gradient taken with create_graph=True
and differentiated again raises, also under allow_unused=True (where it used
to come back None while torch gives a nonzero second-order gradient); used as
a value it is the ordinary gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ckparity

CASES = {
    "cross_entropy": (lambda x: ckparity.cross_entropy(x, torch.tensor([1, 0, 3])),
                      lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3])), (3, 5)),
    "cross_entropy.ptref": (lambda x: ckparity.cross_entropy(x, torch.tensor([1, 0, 3]), variant="ptref"),
                            lambda x: F.cross_entropy(x, torch.tensor([1, 0, 3])), (3, 5)),
    "rms_norm": (lambda x: ckparity.rms_norm(x, (6,)).pow(3).sum(), lambda x: F.rms_norm(x, (6,)).pow(3).sum(), (4, 6)),
    "swiglu": (lambda x: ckparity.swiglu(x).pow(2).sum(),
               lambda x: (F.silu(x[..., :3]) * x[..., 3:]).pow(2).sum(), (4, 6)),
}


@pytest.mark.parametrize("name", CASES)
def test_second_derivative_raises_even_with_allow_unused(name):
    ours, theirs, shape = CASES[name]
    x = torch.randn(shape, dtype=torch.float32, requires_grad=True)
    # torch's own composite has a second derivative: None would be a wrong answer
    (g_ref,) = torch.autograd.grad(theirs(x), x, create_graph=True)
    (second,) = torch.autograd.grad(g_ref.pow(2).sum(), x, allow_unused=True)
    assert second is not None and bool(second.abs().sum() > 0)
    (g,) = torch.autograd.grad(ours(x), x, create_graph=True)
    torch.testing.assert_close(g.detach(), g_ref.detach())  # as a value, the ordinary gradient
    for allow_unused in (False, True):
        with pytest.raises(RuntimeError, match="differentiable once"):
            torch.autograd.grad(g.pow(2).sum(), x, allow_unused=allow_unused)
