"""The ops' fast paths (a contiguous 2-D CPU input, class-index targets)
give the bits and the errors of their full paths, in every dtype they take."""

from __future__ import annotations

import pytest
import torch

import ckparity
from ckparity.errors import TargetOutOfRange
from ckparity.ops.attention import attention
from ckparity.ops.embedding import embedding
from ckparity.ops.linear import linear
from ckparity.ops.rms_norm import rms_norm
from ckparity.ops.rope import rope
from ckparity.ops.swiglu import swiglu


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


def _nodes_between(out: torch.Tensor, leaf: torch.Tensor) -> int | None:
    """How many autograd nodes lie between out's own node and leaf's AccumulateGrad (0: leaf is a direct
    input of out's node); None if leaf is not reached."""
    seen, frontier, depth = set(), [out.grad_fn], 0
    while frontier:
        nxt = []
        for node in frontier:
            for child, _ in node.next_functions:
                if child is None or child in seen:
                    continue
                if getattr(child, "variable", None) is leaf:
                    return depth
                seen.add(child)
                nxt.append(child)
        frontier, depth = nxt, depth + 1
    return None


def test_a_twins_ops_make_one_autograd_node_each():
    """The twins' ops on their own layouts (3-D and 4-D activations, a 1-D norm weight) add their Function's node
    and nothing else: a reshape around a Function to its own shape was an autograd node and a backward step more
    per call, a third of a small linear's overhead over torch's (docs/harness.md)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 64, generator=g, requires_grad=True)
    w = torch.randn(32, 64, generator=g, requires_grad=True)
    norm_w = torch.randn(64, generator=g, requires_grad=True)
    h = torch.randn(1, 8, 256, generator=g, requires_grad=True)
    q = torch.randn(1, 4, 8, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 2, 8, 16, generator=g, requires_grad=True) for _ in range(2))
    cos, sin = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    emb = torch.randn(50, 64, generator=g, requires_grad=True)
    cases = [(linear(x, w), (x, w)),
             (rms_norm(x, (64,), norm_w), (x, norm_w)),
             (swiglu(h), (h,)),
             (rope(q, cos, sin), (q,)),
             (attention(q, k, v, is_causal=True, enable_gqa=True), (q, k, v)),
             (embedding(torch.tensor([[1, 2, 3]]), emb), (emb,))]
    for out, leaves in cases:
        assert all(_nodes_between(out, leaf) == 0 for leaf in leaves), out.grad_fn
