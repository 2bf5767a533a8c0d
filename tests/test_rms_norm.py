"""ckparity.rms_norm against F.rms_norm (float32) and float64.

The kernel repeats torch's float operations and summation order, so beyond
the float32/float64 rule every output is asserted bit-identical to torch's."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity.kernels.sweeping import grad_run, same_bits
from parity import check_parity


def run(fn, x, weight, eps, upstream, dtype):
    # eps=None means float32's epsilon for the float32 op; the float64
    # reference must use the same eps, not float64's.
    if eps is None and dtype == torch.float64:
        eps = torch.finfo(torch.float32).eps
    xx = x.detach().to(dtype).requires_grad_(True)
    ww = weight.detach().to(dtype).requires_grad_(True) if weight is not None else None
    y = fn(xx, (x.shape[-1],), ww, eps)
    y.backward(upstream.to(dtype))
    return y.detach(), xx.grad, (ww.grad if ww is not None else None)


def check(name, x, weight, eps):
    upstream = torch.randn_like(x)
    ours = run(ckparity.rms_norm, x, weight, eps, upstream, torch.float32)
    theirs = run(F.rms_norm, x, weight, eps, upstream, torch.float32)
    reference = run(F.rms_norm, x, weight, eps, upstream, torch.float64)
    for label, a, b, r in zip(("y", "dx", "dweight"), ours, theirs, reference):
        if a is None:
            continue
        check_parity(f"rms_norm.{label}[{name}]", a, b, r)
        assert torch.equal(a, b), f"rms_norm.{label}[{name}] is not bit-identical to torch"
    return ours


@pytest.mark.parametrize("D", [1, 3, 64, 4096, 4097])
@pytest.mark.parametrize("N", [1, 5, 1000])
@pytest.mark.parametrize("eps", [None, 1e-5, 1e-6])
@pytest.mark.parametrize("with_weight", [False, True])
def test_matches_torch(N, D, eps, with_weight):
    x = torch.randn(N, D) * 2
    weight = torch.randn(D) if with_weight else None
    check(f"N={N},D={D},eps={eps},weight={with_weight}", x, weight, eps)


def test_rows_of_zeros():
    x = torch.randn(6, 64)
    x[2] = 0
    y, dx, dw = check("zero-row", x, torch.randn(64), None)
    assert (y[2] == 0).all() and torch.isfinite(dx).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_keep_torchs_sign(dtype):
    """Signed zeros are bits too (torch.equal does not see them; same_bits does). At D = 1 autograd's sum_to_size
    of the one column is no sum, so a -0 term (a zero x and weight, a negative dy) stays -0 in grad_rstd and dx
    comes out +0 -- ckparity summed it from +0 and gave -0; from D = 2 both give -0. Every sign of x, weight and
    dy, at D 1..3, one and three rows."""
    for D, M, xs, ws, us in itertools.product((1, 2, 3), (1, 3), (0.0, 1.0, -1.0), (0.0, 1.0, -1.0), (-2.0, 0.0, 2.0)):
        x = torch.full((M, D), xs, dtype=dtype, requires_grad=True)
        w = torch.full((D,), ws, dtype=dtype, requires_grad=True)
        up = torch.full((M, D), us, dtype=dtype)
        ours, theirs = (grad_run(lambda x, w, f=f: f(x, (D,), w), [x, w], up) for f in (ckparity.rms_norm, F.rms_norm))
        for q, a, b in zip(("y", "dx", "dweight"), ours, theirs):
            assert same_bits(a, b), (q, D, M, xs, ws, us)


@pytest.mark.parametrize("scale", [1e-20, 1e-6, 1e6, 1e18])
def test_large_and_small_magnitudes(scale):
    x = torch.randn(8, 128) * scale
    check(f"scale={scale}", x, torch.randn(128), 1e-6)


def test_nd_input_and_module():
    x = torch.randn(2, 3, 64)
    module = ckparity.nn.RMSNorm(64, eps=1e-5)
    reference = torch.nn.RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        module.weight.copy_(torch.randn(64))
        reference.weight.copy_(module.weight)
    torch.testing.assert_close(module(x), reference(x))
    assert module.state_dict().keys() == reference.state_dict().keys()
    no_affine = ckparity.nn.RMSNorm((64,), elementwise_affine=False)
    assert no_affine.weight is None
    torch.testing.assert_close(no_affine(x), F.rms_norm(x, (64,)))


@pytest.mark.parametrize("threads", [2, 4])
def test_same_bits_for_any_thread_count(threads):
    x = torch.randn(300, 4097)
    w = torch.randn(4097)
    up = torch.randn(300, 4097)
    out = []
    for t in (1, threads):
        ckparity.set_num_threads(t)
        out.append(run(ckparity.rms_norm, x, w, None, up, torch.float32))
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_bad_inputs():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="normalized_shape"):
        ckparity.rms_norm(x, (7,))
    with pytest.raises(ValueError, match="weight must have shape"):
        ckparity.rms_norm(x, (8,), torch.ones(7))
    with pytest.raises(TypeError, match="float32"):
        ckparity.rms_norm(x.double(), (8,))
    with pytest.raises(TypeError, match="float32"):
        ckparity.rms_norm(x, (8,), torch.ones(8, dtype=torch.float64))
    with pytest.raises(TypeError, match="CPU only"):
        ckparity.rms_norm(torch.randn(4, 8, device="meta"), (8,))
    with pytest.raises(ValueError, match="eps"):
        ckparity.rms_norm(x, (8,), eps=-1.0)
    strided = torch.randn(8, 4).t()
    torch.testing.assert_close(ckparity.rms_norm(strided, (8,)), F.rms_norm(strided, (8,)))


# Every width 1..300 and large ones, at row counts that take each of ATen's
# summation paths: the rms_norm record's sweep (kernels/rms_norm.py), run at
# every capability by tests/test_capability.py.


def test_sums_to_one_value_split_as_torch_splits_them_on_its_threads():
    """One row of D >= 32768 (its mean of squares and the backward's row sum)
    and dweight at D = 1 over N >= 32768 rows are sums torch reduces to one
    value, split across its threads (the two-pass reduction); rms_norm reads
    torch's thread count and splits them the same way. Without the split
    these differ (the sweep's figures: docs/kernels.md)."""
    from ckparity.kernels.rms_norm import SPLIT_SHAPES as RMS_SPLIT_SHAPES
    from ckparity.kernels.sweeping import torch_threads

    g = torch.Generator().manual_seed(11)
    torch_changed = 0
    for N, D in RMS_SPLIT_SHAPES:
        x, w, upstream = torch.randn(N, D, generator=g) * 3, torch.randn(D, generator=g), torch.randn(N, D, generator=g)
        theirs_by_threads = {}
        for threads in (1, 2, 3):
            with torch_threads(threads):
                ours, theirs = (run(fn, x, w, 1e-5, upstream, torch.float32) for fn in (ckparity.rms_norm, F.rms_norm))
            for label, a, b in zip(("y", "dx", "dweight"), ours, theirs):
                assert torch.equal(a, b), f"N={N} D={D} {label}, torch on {threads} threads"
            theirs_by_threads[threads] = theirs
        torch_changed += any(not torch.equal(a, b) for t in (2, 3)
                             for a, b in zip(theirs_by_threads[1], theirs_by_threads[t]))
    assert torch_changed >= 3, "torch's bits no longer depend on its threads here: the case checks nothing"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_backward_in_blocks_of_rows_keeps_torchs_bits(dtype):
    """The backward walks dy and x a block of rows at a time, dweight's cascades carried from block to block
    ([Note: the backward's blocks of rows]): at 4500 rows of 1030 (about 40 blocks, a tail of rows past the
    last whole cascade step, 6 columns outside the vector cascades) dx and dweight are torch's bits; float32
    in place on dy gives the same bits as into a separate dx."""
    from ckparity import _bindings

    g = torch.Generator().manual_seed(7)
    x = torch.randn(4500, 1030, generator=g).to(dtype)
    w = torch.randn(1030, generator=g).to(dtype)
    upstream = torch.randn(4500, 1030, generator=g).to(dtype)
    ours = [t for t in run(ckparity.rms_norm, x, w, 1e-6, upstream, dtype)]
    theirs = [t for t in run(F.rms_norm, x, w, 1e-6, upstream, dtype)]
    for label, a, b in zip(("y", "dx", "dweight"), ours, theirs):
        assert a.dtype == dtype and torch.equal(a, b), label
    if dtype == torch.float32:
        y, rstd = torch.empty_like(x), torch.empty(4500)
        _bindings.rms_norm_forward(x, w, 1e-6, y, rstd)
        dy, dweight = upstream.clone(), torch.empty_like(w)
        _bindings.rms_norm_backward(dy, x, w, rstd, dy, dweight)  # dx written over dy
        separate_dx, separate_dweight = torch.empty_like(x), torch.empty_like(w)
        _bindings.rms_norm_backward(upstream, x, w, rstd, separate_dx, separate_dweight)
        assert torch.equal(dy, separate_dx) and torch.equal(dweight, separate_dweight)
        assert torch.equal(dweight, theirs[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_weight_without_grad_gets_no_dweight_and_dx_keeps_torchs_bits(dtype, monkeypatch):
    """A weight that needs no gradient (frozen, or a model under inference-style fine-tuning of x only) is
    not differentiated: the C backward is called without dweight (it skips the cascades' walk, as torch's
    backward skips an output nobody asked for), x's gradient is still torch's bits, weight.grad stays None."""
    from ckparity import _bindings

    entry = "rms_norm_backward_16" if dtype == torch.bfloat16 else "rms_norm_backward_terms"
    dweights = []
    real = getattr(_bindings, entry)

    def spy(*args, **kwargs):
        dweights.append(args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(_bindings, entry, spy)
    g = torch.Generator().manual_seed(3)
    x, w, upstream = torch.randn(300, 1030, generator=g), torch.randn(1030, generator=g), torch.randn(300, 1030, generator=g)
    grads = []
    for fn in (ckparity.rms_norm, F.rms_norm):
        xx, ww = x.to(dtype).requires_grad_(True), w.to(dtype)
        y = fn(xx, (1030,), ww, 1e-6)
        y.backward(upstream.to(dtype))
        grads.append((y.detach(), xx.grad, ww.grad))
    (y, dx, dw), (ty, tdx, tdw) = grads
    assert dweights == [None], "the C backward was asked for a dweight nobody needs"
    assert torch.equal(y, ty) and torch.equal(dx, tdx) and dw is None and tdw is None
    # with dweight asked for, the same call gives the same dx
    ww = w.to(dtype).requires_grad_(True)
    xx = x.to(dtype).requires_grad_(True)
    ckparity.rms_norm(xx, (1030,), ww, 1e-6).backward(upstream.to(dtype))
    assert dweights[-1] is not None and torch.equal(xx.grad, dx) and ww.grad is not None


def test_an_int_normalized_shape_is_a_type_error_as_in_torch():
    """F.rms_norm(x, 8, w) raises TypeError (torch's argument parser wants a tuple); so does ckparity's op.
    The modules take an int, as nn.RMSNorm does."""
    x, w = torch.randn(3, 8), torch.randn(8)
    with pytest.raises(TypeError):
        F.rms_norm(x, 8, w)
    with pytest.raises(TypeError, match=r"write \(8,\)"):
        ckparity.rms_norm(x, 8, w)
    for shape in ((8,), [8], torch.Size([8])):
        assert torch.equal(ckparity.rms_norm(x, shape, w), F.rms_norm(x, (8,), w))
    assert torch.equal(ckparity.nn.RMSNorm(8)(x), torch.nn.RMSNorm(8)(x))
