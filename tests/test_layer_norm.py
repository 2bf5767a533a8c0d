"""ckparity.layer_norm (csrc/layer_norm.c): F.layer_norm bit for bit in float32 -- y, dx, dweight, dbias, and
the mean and rstd torch's native_layer_norm saves -- at torch's thread count (dweight and dbias are one partial
sum per torch thread), at any thread count of its own, for any normalized shape; bad input refused. (The width
sweep at each capability: the record's claim, tests/test_capability.py; check's properties, torch's OpInfo
samples among them: tests/test_slots.py; its C API: tests/test_fuzz_c_api.py and tests/test_overlaps.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity.errors import InvalidArgument, InvalidType
from ckparity.kernels.sweeping import same_bits, torch_threads
from ckparity.ops.layer_norm import layer_norm_forward


def _grads(fn, x, w, b, dy, shape):
    x, w, b = (t.clone().requires_grad_(True) for t in (x, w, b))
    y = fn(x, shape, w, b)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def test_torchs_bits_at_one_and_two_torch_threads_and_any_of_ours():
    """dweight and dbias: torch sums each thread's rows apart, then the partial sums in thread order, so its
    bits move with its thread count on many rows; ours follow at each count, whatever ckparity's own."""
    g = torch.Generator().manual_seed(0)
    torch_moved = 0
    for M, N in ((64, 100), (257, 768), (9, 1023)):
        x, dy = torch.randn(M, N, generator=g) * 2 + 0.5, torch.randn(M, N, generator=g)
        w, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
        per_count = {}
        for threads in (1, 2):
            with torch_threads(threads):
                theirs = _grads(F.layer_norm, x, w, b, dy, (N,))
                for ours_threads in (1, 2):
                    previous = ckparity.get_num_threads()
                    ckparity.set_num_threads(ours_threads)
                    try:
                        ours = _grads(ckparity.layer_norm, x, w, b, dy, (N,))
                    finally:
                        ckparity.set_num_threads(previous)
                    for a, c, what in zip(ours, theirs, ("y", "dx", "dweight", "dbias")):
                        assert same_bits(a, c), f"{what}, ({M}, {N}): torch at {threads} threads, ours at {ours_threads}"
            per_count[threads] = theirs
        torch_moved += sum(int((a != c).sum()) for a, c in zip(per_count[1][2:], per_count[2][2:]))
    assert torch_moved > 0, "torch's dweight and dbias did not depend on its thread count: the split was not exercised"


def test_the_saved_moments_are_torchs():
    g = torch.Generator().manual_seed(1)
    for N in (1, 7, 8, 129, 130 * 8 + 3):  # the lanes' tail, and a cascade of chunks
        x = torch.randn(6, N, generator=g) * 3 + 10
        _, mean, rstd = torch.native_layer_norm(x, [N], None, None, 1e-5)
        y, m, r = torch.empty_like(x), torch.empty(6), torch.empty(6)
        layer_norm_forward(x, None, None, 1e-5, y, m, r)
        assert same_bits(m, mean.flatten()) and same_bits(r, rstd.flatten()), N


def test_normalized_shapes_and_refusals():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 4, 5, generator=g)
    w, b = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    assert same_bits(ckparity.layer_norm(x, (4, 5), w, b), F.layer_norm(x, (4, 5), w, b))
    assert same_bits(ckparity.layer_norm(x, 5), F.layer_norm(x, (5,)))
    with pytest.raises(InvalidArgument, match="last dimensions"):
        ckparity.layer_norm(x, (3, 5))
    with pytest.raises(InvalidArgument, match="weight of shape"):
        ckparity.layer_norm(x, (5,), torch.randn(4))
    with pytest.raises(InvalidType, match="a bfloat16 x with float32 weight and bias"):  # float32 x, bf16 params
        ckparity.layer_norm(x, (4, 5), w.bfloat16(), b.bfloat16())
    with pytest.raises(InvalidType, match="the params of one dtype"):
        ckparity.layer_norm(x.bfloat16(), (4, 5), w, b.bfloat16())
    with pytest.raises(InvalidType, match="float32 or bfloat16"):
        ckparity.layer_norm(x.half(), (5,))
    with pytest.raises(InvalidArgument, match="eps must be a number"):
        ckparity.layer_norm(x, (5,), eps="small")


@pytest.mark.parametrize("dtypes", [(torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.bfloat16, torch.float32)])
def test_a_normalized_shape_of_no_element_is_torchs_empty_y_and_gradients(dtypes):
    """normalized_shape (0,) or (0, 3) (it was refused as holding no element; torch takes it): torch's empty y of
    x's dtype and empty gradients of x, weight and bias, with and without the params."""
    from ckparity.kernels.sweeping import grad_run

    xdt, pdt = dtypes
    for shape, rows in (((0,), (3,)), ((0, 3), (2,)), ((4, 0), (0,))):
        for with_params in (False, True):
            x = torch.randn(*rows, *shape, dtype=xdt, requires_grad=True)
            params = [torch.randn(shape, dtype=pdt, requires_grad=True) for _ in range(2)] if with_params else []
            up = torch.randn(*rows, *shape, dtype=xdt)
            ours = grad_run(lambda x, *p: ckparity.layer_norm(x, shape, *p), [x, *params], up)
            theirs = grad_run(lambda x, *p: F.layer_norm(x, shape, *p), [x, *params], up)
            for a, b in zip(ours, theirs, strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype, (shape, with_params, a.shape, b.shape)


@pytest.mark.parametrize("threads", [1, 2])
def test_bfloat16_is_torchs_bits_mean_and_rstd_in_bf16(threads):
    """x, weight and bias of bf16 (torch keeps mean and rstd in bf16 then, its per-thread dweight and dbias
    buffers in bf16 too): forward and backward torch's bits at torch's thread count (the record's sweep covers
    every width at every capability)."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(64, 100, generator=g) * 2 + 0.5).bfloat16()
    w, b = torch.randn(100, generator=g).bfloat16(), torch.randn(100, generator=g).bfloat16()
    up = torch.randn(64, 100, generator=g).bfloat16()
    with torch_threads(threads):
        outs = []
        for fn in (ckparity.layer_norm, F.layer_norm):
            xx, ww, bb = (t.clone().requires_grad_(True) for t in (x, w, b))
            y = fn(xx, (100,), ww, bb)
            y.backward(up)
            outs.append((y, xx.grad, ww.grad, bb.grad))
    for name, a, t in zip(("y", "dx", "dweight", "dbias"), *outs):
        assert a.dtype == torch.bfloat16 and same_bits(a, t), name


@pytest.mark.parametrize("threads", [1, 2])
def test_a_bf16_x_with_float32_params_is_torchs_mixed_type_layer_norm(threads):
    """torch's mixed types (a bf16 x, float32 weight and bias): mean and rstd float32, dweight and dbias float32
    sums of per-thread bf16 buffers, ds and db by the mixed frame's own loop -- bit for bit, rows under and over a
    vector of 16 and the 8 < N < 16 rows whose upper half is added into the lower, at 1 and 2 torch threads."""
    g = torch.Generator().manual_seed(7)
    for M, N in ((1, 5), (3, 9), (3, 15), (5, 16), (4, 37), (64, 257), (33, 768)):
        x = (torch.randn(M, N, generator=g) * 2 + 0.5).bfloat16()
        w, b = torch.randn(N, generator=g), torch.randn(N, generator=g)
        dy = torch.randn(M, N, generator=g).bfloat16()
        with torch_threads(threads):
            ours = _grads(ckparity.layer_norm, x, w, b, dy, (N,))
            theirs = _grads(F.layer_norm, x, w, b, dy, (N,))
        assert [t.dtype for t in ours] == [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
        assert all(same_bits(a, c) for a, c in zip(ours, theirs)), (M, N)
    stats = torch.ops.aten.native_layer_norm(x, (N,), w, b, 1e-5)
    assert stats[1].dtype == torch.float32  # torch keeps mean and rstd as floats here: so does ckparity


def test_a_float32_bias_alone_on_a_bf16_x_has_gradients_where_torchs_backward_raises():
    """A bf16 x with a float32 bias and no weight: torch's forward takes it, its backward raises (it reads the
    float mean as bf16); ckparity's forward is torch's bits and its backward computes the mixed gradients."""
    x = torch.randn(3, 8).bfloat16().requires_grad_(True)
    b = torch.randn(8, requires_grad=True)
    y = ckparity.layer_norm(x, (8,), None, b)
    assert same_bits(y, F.layer_norm(x, (8,), None, b))
    dx, db = torch.autograd.grad(y, (x, b), torch.ones(3, 8).bfloat16())
    assert torch.equal(db, torch.full((8,), 3.0)) and dx.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="expected scalar type BFloat16 but found Float"):
        F.layer_norm(x, (8,), None, b).sum().backward()

