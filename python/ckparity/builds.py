"""The same inputs through two builds of the C library, output by output:
which differ, and in how many elements.

Two users: tests/test_clones.py (the target_clones build against the
baseline-only build: every output must be equal) and ``ckparity mutate``
(a mutant that no gate kills and whose outputs equal the control build's on
every case here is an equivalent mutant, not a gap in the gates). Each case
is a name and a function of the loaded library (``ffi.dlopen``) returning
its outputs; every kernel of the C API is covered, with odd sizes (vector
tails), ignored rows, weights, smoothing, z-loss and enough rows for
several reduction blocks.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from . import _bindings as C
from .measure import differing_elements


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


def cases() -> Iterator[tuple[str, Callable]]:
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
    # widths around the vector and block boundaries, and enough rows for several reduction blocks
    for V in (1, 7, 8, 9, 31, 33, 255, 257, 4097):
        xv, tv = torch.randn(64, V, generator=g) * 3, torch.randint(0, V, (64,), generator=g)
        yield f"ce default V={V}", lambda L, xv=xv, tv=tv: cross_entropy(L, xv, tv, None, "mean", "default")
    xb, tb = torch.randn(4096, 67, generator=g) * 3, torch.randint(0, 67, (4096,), generator=g)
    tb[::7] = -100
    for reduction in ("mean", "sum"):
        yield f"ce default N=4096 {reduction}", lambda L, r=reduction: cross_entropy(L, xb, tb, None, r, "default")
    for D in (1, 7, 8, 9, 63, 65, 257):
        xd, wd, dyd = torch.randn(17, D, generator=g), torch.randn(D, generator=g), torch.randn(17, D, generator=g)
        yield f"rms_norm D={D}", lambda L, a=xd, b=wd, c=dyd: rms_norm(L, a, b, c)
    for H in (1, 31, 32, 33, 100):
        xh, dh = torch.randn(5, 2 * H, generator=g) * 8, torch.randn(5, H, generator=g)
        yield f"swiglu H={H}", lambda L, a=xh, b=dh: swiglu(L, a, b)
    grads = [torch.randn(100003, generator=g), torch.randn(7, generator=g)]
    for p in (1.0, 2.0, 3.0, float("inf")):
        yield f"grad_norm p={p}", lambda L, p=p: grad_norm(L, grads, p)


def differing(run: Callable, library_a, library_b) -> list[tuple[int, int]]:
    """(elements, of which differ) per output of one case (NaN equals NaN)."""
    a, b = run(library_a), run(library_b)
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return [(x.numel(), differing_elements(x, y)) for x, y in zip(a, b)]


def differences(library_a, library_b) -> dict:
    """Every case through both libraries: outputs compared, and those that differ."""
    compared, differ = 0, []
    for name, run in cases():
        for k, (elements, count) in enumerate(differing(run, library_a, library_b)):
            compared += 1
            if count:
                differ.append({"case": name, "output": k, "elements": elements, "differing": count})
    return {"outputs_compared": compared, "outputs_differing": differ}
