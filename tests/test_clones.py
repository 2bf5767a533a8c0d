"""Every build of the hot loops gives the same bits.

The installed library picks AVX-512, AVX2+FMA or baseline code at load time
(target_clones); CKP_BASELINE_LIB names a build with only the baseline code
(meson -Dclones=false; ./scripts/test.sh builds it in build/baseline). Each
kernel runs through both on the same inputs, and every output must be equal
bit for bit: the claim that the vector code does each element's IEEE
operations as written, whatever the vector width.
"""

from __future__ import annotations

import os

import pytest
import torch

from ckparity import _bindings as C
from ckparity._native import ffi, lib

BASELINE = os.environ.get("CKP_BASELINE_LIB")
pytestmark = pytest.mark.skipif(not BASELINE, reason="CKP_BASELINE_LIB is not set (./scripts/test.sh sets it)")


def cross_entropy(L, x, target, weight, reduction, variant, row_grad=None):
    loss = torch.empty(x.shape[0] if reduction == "none" else ())
    d = torch.empty_like(x)
    C.cross_entropy(x, target, C.cross_entropy_options(weight, -100, reduction, 0.1, 1e-4, variant, row_grad),
                    loss, d, library=L)
    return loss, d


def rms_norm(L, x, w, dy):
    y, rstd, dx, dw = torch.empty_like(x), torch.empty(x.shape[0]), torch.empty_like(x), torch.empty_like(w)
    C.rms_norm_forward(x, w, 1e-6, y, rstd, library=L)
    C.rms_norm_backward(dy, x, w, rstd, dx, dw, library=L)
    return y, rstd, dx, dw


def swiglu(L, x, dout):
    out, dx = torch.empty_like(dout), torch.empty_like(x)
    C.swiglu_forward(x, out, library=L)
    C.swiglu_backward(dout, x, dx, library=L)
    return out, dx


def rope(L, x, cos, sin, layout):
    out, dx = torch.empty_like(x), torch.empty_like(x)
    C.rope_forward(x, cos, sin, layout, out, library=L)
    C.rope_backward(out, cos, sin, layout, dx, library=L)
    return out, dx


def adamw(L, p, g, m, v, amsgrad):
    p, m, v = p.clone(), m.clone(), v.clone()
    vmax = v.clone() if amsgrad else None
    options = C.adamw_options(1e-2, 0.9, 0.999, 1e-8, 0.1, amsgrad)
    for step in range(1, 4):
        C.adamw_step(p, g, m, v, vmax, float(step), options, library=L)
    return (p, m, v) + ((vmax,) if amsgrad else ())


def grad_norm(L, tensors, p):
    return torch.tensor(C.grad_norm(tensors, p, library=L), dtype=torch.float64)


def cases():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(37, 1003, generator=g) * 4
    x[3, :] = -1e4  # a row far from its max
    t = torch.randint(0, 1003, (37,), generator=g)
    t[5] = -100
    probs = torch.softmax(torch.randn(37, 1003, generator=g), -1)
    w = torch.rand(1003, generator=g) + 0.5
    row_grad = torch.randn(37, generator=g)
    for variant in ("default", "ptref"):
        for reduction in ("mean", "sum", "none"):
            yield f"ce {variant} {reduction}", lambda L, v=variant, r=reduction: cross_entropy(L, x, t, w, r, v)
        yield f"ce {variant} probs", lambda L, v=variant: cross_entropy(L, x, probs, None, "mean", v)
    yield "ce row_grad", lambda L: cross_entropy(L, x, t, None, "none", "default", row_grad)
    xr, wr, dyr = (torch.randn(33, 4099, generator=g), torch.randn(4099, generator=g),
                   torch.randn(33, 4099, generator=g))
    yield "rms_norm", lambda L: rms_norm(L, xr, wr, dyr)
    xs = torch.randn(9, 200, generator=g) * 30
    ds = torch.randn(9, 100, generator=g)
    yield "swiglu", lambda L: swiglu(L, xs, ds)
    xq, angles = torch.randn(6, 11, 74, generator=g) * 3, torch.rand(11, 37, generator=g) * 6
    for layout in ("half", "interleaved"):
        yield f"rope {layout}", lambda L, lay=layout: rope(L, xq, angles.cos(), angles.sin(), lay)
    n = 1003
    pa, ga, ma = (torch.randn(n, generator=g) for _ in range(3))
    va = torch.rand(n, generator=g)
    for amsgrad in (False, True):
        yield f"adamw amsgrad={amsgrad}", lambda L, a=amsgrad: adamw(L, pa, ga, ma, va, a)
    grads = [torch.randn(100003, generator=g), torch.randn(7, generator=g)]
    for p in (1.0, 2.0, 3.0, float("inf")):
        yield f"grad_norm p={p}", lambda L, p=p: grad_norm(L, grads, p)


@pytest.fixture(scope="module")
def baseline():
    return ffi.dlopen(BASELINE)


@pytest.mark.parametrize("name,run", list(cases()), ids=[name for name, _ in cases()])
def test_same_bits_as_baseline_build(baseline, name, run):
    ours, theirs = run(lib), run(baseline)
    ours = ours if isinstance(ours, tuple) else (ours,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    for k, (a, b) in enumerate(zip(ours, theirs)):
        same = (a == b) | (a.isnan() & b.isnan())
        assert same.all(), f"{name} output {k}: {int((~same).sum())} of {a.numel()} elements differ"
