"""ckparity.swiglu against F.silu(gate) * up (float32) and float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ckparity
from parity import check_parity


def reference_swiglu(x):
    H = x.shape[-1] // 2
    return F.silu(x[..., :H]) * x[..., H:]


def run(fn, x, upstream, dtype):
    xx = x.detach().to(dtype).requires_grad_(True)
    y = fn(xx)
    y.backward(upstream.to(dtype))
    return y.detach(), xx.grad


def check(name, x):
    upstream = torch.randn(x.shape[:-1] + (x.shape[-1] // 2,))
    ours = run(ckparity.swiglu, x, upstream, torch.float32)
    theirs = run(reference_swiglu, x, upstream, torch.float32)
    reference = run(reference_swiglu, x, upstream, torch.float64)
    for label, a, b, r in zip(("out", "dx"), ours, theirs, reference):
        check_parity(f"swiglu.{label}[{name}]", a, b, r)
    return ours


@pytest.mark.parametrize("H", [1, 7, 4096, 11008])
@pytest.mark.parametrize("N", [1, 9])
def test_matches_torch(N, H):
    check(f"N={N},H={H}", torch.randn(N, 2 * H) * 3)


# ATen runs exp on pairs of 16-lane vectors with AVX-512, on pairs of 8 with
# AVX2 and with libm's expf everywhere at DEFAULT; the kernel follows the
# capability torch runs at (ckparity.cpu), so every width matches at each
# (tests/test_capability.py sweeps widths 1..300 at every capability).
@pytest.mark.parametrize("H", [1, 7, 15, 16, 17, 31, 32, 33, 100, 4096])
@pytest.mark.parametrize("scale", [1.0, 8.0, 120.0])
def test_bits_equal_torch(H, scale):
    """Same float operations, same exp (SLEEF's expf_u10 on vectors, expf on
    row tails), same FMA as torch's build: every bit of out and dx equal.
    torch runs single-threaded so each row is one piece for it too."""
    x = torch.randn(37, 2 * H) * scale
    x[0, :H] = torch.linspace(-110.0, 110.0, H)  # both cut-offs of exp(-g)
    upstream = torch.randn(37, H)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        theirs = run(reference_swiglu, x, upstream, torch.float32)
    finally:
        torch.set_num_threads(threads)
    ours = run(ckparity.swiglu, x, upstream, torch.float32)
    for label, a, b in zip(("out", "dx"), ours, theirs):
        differ = (a != b) & ~(a.isnan() & b.isnan())
        assert not differ.any(), f"{label}: {int(differ.sum())} of {a.numel()} elements differ from torch"


@pytest.mark.parametrize("gate", [20.0, 88.0, 100.0, 1e4])
def test_extreme_gates_give_no_nan(gate):
    x = torch.randn(4, 64)
    x[0, :32] = gate
    x[1, :32] = -gate
    out, dx = check(f"gate=+-{gate}", x)
    torch_out, torch_dx = run(reference_swiglu, x, torch.ones(4, 32), torch.float32)
    assert torch.isfinite(out).all() == torch.isfinite(torch_out).all()
    assert torch.isfinite(dx).all() and torch.isfinite(out).all()


def test_nd_input_and_module():
    x = torch.randn(2, 3, 10)
    torch.testing.assert_close(ckparity.nn.SwiGLU()(x), reference_swiglu(x))
    assert ckparity.swiglu(x).shape == (2, 3, 5)


@pytest.mark.parametrize("threads", [2, 4])
def test_same_bits_for_any_thread_count(threads):
    x = torch.randn(64, 2 * 4099)
    up = torch.randn(64, 4099)
    out = []
    for t in (1, threads):
        ckparity.set_num_threads(t)
        out.append(run(ckparity.swiglu, x, up, torch.float32))
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_a_last_dimension_of_0_is_torchs_empty_output():
    """H = 0 (it was refused; torch's F.silu(x[..., :0]) * x[..., 0:] is empty): an empty output and gradient, as
    are those of no rows."""
    for shape in ((3, 0), (2, 0, 0), (0, 6)):
        x = torch.randn(shape, requires_grad=True)
        out = ckparity.swiglu(x)
        out.backward(torch.ones(out.shape))
        assert out.shape == reference_swiglu(x).shape and x.grad.shape == x.shape


def test_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        ckparity.swiglu(torch.randn(3, 5))
    with pytest.raises(TypeError, match="float32"):
        ckparity.swiglu(torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="CPU only"):
        ckparity.swiglu(torch.randn(3, 4, device="meta"))
    strided = torch.randn(8, 6).t()
    torch.testing.assert_close(ckparity.swiglu(strided), reference_swiglu(strided))
