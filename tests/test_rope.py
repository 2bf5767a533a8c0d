"""ckparity.rope against the torch formulation it mirrors
(ckparity.reference.rope): forward and backward bit for bit, in both
layouts, at every even head dim 2..130 and some large ones, for any thread
count; bad arguments refused clearly."""

from __future__ import annotations

import math

import pytest
import torch

import ckparity
from ckparity import reference


def tables(T: int, d: int, theta: float = 10000.0):
    """Llama's angles: position t times 1 / theta**(2i/d)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def forward_backward(fn, x, cos, sin, layout, upstream):
    xx = x.clone().requires_grad_(True)
    out = fn(xx, cos, sin, layout=layout)
    out.backward(upstream)
    return out.detach(), xx.grad


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bit_identical_at_every_head_dim(layout):
    g = torch.Generator().manual_seed(0)
    differing = []
    for d in list(range(2, 131, 2)) + [256, 1026]:
        x = torch.randn(2, 3, 5, d, generator=g) * 4
        cos, sin = tables(5, d)
        upstream = torch.randn(x.shape, generator=g)
        ours = forward_backward(ckparity.rope, x, cos, sin, layout, upstream)
        theirs = forward_backward(reference.rope, x, cos, sin, layout, upstream)
        differing += [f"d={d} {name}" for name, a, b in zip(("out", "dx"), ours, theirs) if not torch.equal(a, b)]
    assert not differing, differing[:10]


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_same_bits_for_any_thread_count(layout):
    x = torch.randn(8, 16, 128, 64)  # large enough to run threaded
    cos, sin = tables(128, 64)
    outs = []
    for threads in (1, 2, 4):
        ckparity.set_num_threads(threads)
        outs.append(ckparity.rope(x, cos, sin, layout=layout))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_rotation_keeps_norms():
    x = torch.randn(4, 9, 32)
    cos, sin = tables(9, 32)
    for layout in ("half", "interleaved"):
        out = ckparity.rope(x, cos, sin, layout=layout)
        torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
        assert not torch.allclose(out[:, 1:], x[:, 1:])  # position 0 has angle 0, the others rotate


def test_bad_arguments():
    x = torch.randn(2, 4, 8)
    cos, sin = tables(4, 8)
    with pytest.raises(ValueError, match="even head dim"):
        ckparity.rope(torch.randn(2, 4, 7), *tables(4, 8))
    with pytest.raises(ValueError, match=r"\(T, d/2\)"):
        ckparity.rope(x, *tables(5, 8))
    with pytest.raises(ValueError, match="layout"):
        ckparity.rope(x, cos, sin, layout="pairs")
    with pytest.raises(TypeError, match="float32"):
        ckparity.rope(x.double(), cos, sin)
    with pytest.raises(NotImplementedError, match="not cos or sin"):
        ckparity.rope(x, cos.requires_grad_(True), sin)
    assert ckparity.rope(torch.randn(0, 4, 8), *tables(4, 8)).shape == (0, 4, 8)
    assert math.isfinite(float(ckparity.rope(x, *tables(4, 8)).sum()))
