"""The same inputs through two builds of the C library, output by output:
which differ, and in how many elements.

Two users: tests/test_clones.py (the target_clones build against the
single-ISA builds: every output must be equal) and ``ckparity mutate`` (a
mutant that no gate kills and whose outputs equal the control build's on
every case here is an equivalent mutant, not a gap in the gates). Each case
is a name and a function of the loaded library (``ffi.dlopen``) and an
output fill, returning its outputs; every entry point of the C API is
covered -- the in-place cross-entropy, rms_norm's backward terms, the
vocab-parallel passes, the comparison -- with odd sizes (vector tails),
ignored rows, weights, smoothing, z-loss, enough rows for several reduction
blocks, and sizes above every OpenMP threshold. Outputs start filled
(``differing`` runs each case with NaN and with 7.25), so a build that
leaves an output unwritten cannot match another by reading the same
leftover memory.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from . import _bindings as C
from .measure import differing_elements

FILLS = (float("nan"), 7.25)


def _out(like: torch.Tensor, fill: float, dtype=None) -> torch.Tensor:
    return torch.full(like.shape if isinstance(like, torch.Tensor) else like, fill,
                      dtype=dtype or (like.dtype if isinstance(like, torch.Tensor) else torch.float32))


def cross_entropy(L, fill, x, target, weight, reduction, variant, row_grad=None, inplace=False, torch_threads=1):
    loss = _out((x.shape[0],) if reduction == "none" else (), fill)
    d = x.clone() if inplace else _out(x, fill)
    options = C.cross_entropy_options(weight, -100, reduction, 0.1, 1e-4, variant, row_grad, torch_threads)
    C.cross_entropy(d if inplace else x, target, options, loss, d, library=L)
    return loss, d


def rms_norm(L, fill, x, w, dy, torch_threads=1):
    y, rstd, dx, dw = _out(x, fill), _out((x.shape[0],), fill), _out(x, fill), _out(w, fill)
    C.rms_norm_forward(x, w, 1e-6, y, rstd, torch_threads=torch_threads, library=L)
    C.rms_norm_backward(dy, x, w, rstd, dx, dw, torch_threads=torch_threads, library=L)
    dx_normalized, dx_rstd, dw_terms = _out(x, fill), _out(x, fill), _out(w, fill)
    C.rms_norm_backward_terms(dy, x, w, rstd, dx_normalized, dx_rstd, dw_terms, torch_threads=torch_threads,
                              library=L)
    return y, rstd, dx, dw, dx_normalized, dx_rstd, dw_terms


def swiglu(L, fill, x, dout):
    out, dx = _out(dout, fill), _out(x, fill)
    C.swiglu_forward(x, out, library=L)
    C.swiglu_backward(dout, x, dx, library=L)
    return out, dx


def rope(L, fill, x, cos, sin, layout):
    out, dx = _out(x, fill), _out(x, fill)
    C.rope_forward(x, cos, sin, layout, out, library=L)
    C.rope_backward(out, cos, sin, layout, dx, library=L)
    return out, dx


def adamw(L, fill, p, g, m, v, amsgrad):
    p, m, v = p.clone(), m.clone(), v.clone()
    vmax = v.clone() if amsgrad else None
    options = C.adamw_options(1e-2, 0.9, 0.999, 1e-8, 0.1, amsgrad)
    for step in range(1, 4):
        C.adamw_step(p, g, m, v, vmax, float(step), options, library=L)
    return (p, m, v) + ((vmax,) if amsgrad else ())


def grad_norm(L, fill, tensors, p):
    return torch.tensor(C.grad_norm(tensors, p, library=L), dtype=torch.float64)


def vocab_parallel_ce(L, fill, x, target, shards):
    """Every pass over shards of the vocabulary, the all-reduces done in between (max, then sum)."""
    N, V = x.shape
    bounds = [round(V * k / shards) for k in range(shards + 1)]
    pieces = [x[:, a:b].contiguous() for a, b in zip(bounds, bounds[1:])]
    maxes = []
    for piece in pieces:
        maxes.append(_out((N,), fill))
        C.vocab_parallel_ce_max(piece, maxes[-1], library=L)
    global_max = torch.stack(maxes).amax(0)
    sums = []
    for piece, start in zip(pieces, bounds):
        sums.append(_out((N, 3), fill, torch.float64))
        C.vocab_parallel_ce_sums(piece, target, start, V, -100, global_max, sums[-1], library=L)
    global_sums = torch.stack(sums).sum(0)
    loss_rows = _out((N,), fill)
    C.vocab_parallel_ce_loss(target, V, -100, 0.1, 1e-4, global_max, global_sums, loss_rows, library=L)
    row_grad = torch.full((N,), 1.0 / N)
    grads = []
    for piece, start in zip(pieces, bounds):
        grads.append(_out(piece, fill))
        C.vocab_parallel_ce_backward(piece, target, start, V, -100, 0.1, 1e-4, global_max, global_sums, row_grad,
                                     grads[-1], library=L)
    return (global_max, global_sums, loss_rows, *grads)


def compare(L, fill, a, b):
    return torch.tensor(C.compare(a, b, library=L), dtype=torch.float64)


def cases() -> Iterator[tuple[str, Callable]]:
    """(name, run): run(library, fill) returns the case's outputs."""
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
            yield f"ce {variant} {reduction}", lambda L, f, v=variant, r=reduction: cross_entropy(L, f, x, t, w, r, v)
        yield f"ce {variant} probs", lambda L, f, v=variant: cross_entropy(L, f, x, probs, None, "mean", v)
        yield f"ce {variant} in place", lambda L, f, v=variant: cross_entropy(L, f, x, t, w, "mean", v, inplace=True)
        yield f"ce {variant} row_grad", lambda L, f, v=variant: cross_entropy(L, f, x, t, None, "none", v, row_grad)
    # 64 x 4097 elements, 8 of ATen's grains: ptref splits the probability targets' sum in 2, 3, 4 chunks as
    # torch does on that many threads (one scalar per case: several, so a split that happens to round alike
    # in one does not hide a build that does not split)
    xs, ps = torch.randn(64, 4097, generator=g) * 4, torch.softmax(torch.randn(64, 4097, generator=g), -1)
    for threads in (2, 3, 4):
        for reduction in ("mean", "sum"):
            yield (f"ce ptref probs {reduction} torch_threads={threads}",
                   lambda L, f, r=reduction, k=threads: cross_entropy(L, f, xs, ps, None, r, "ptref", torch_threads=k))
    xr, wr, dyr = (torch.randn(33, 4099, generator=g), torch.randn(4099, generator=g),
                   torch.randn(33, 4099, generator=g))
    yield "rms_norm", lambda L, f: rms_norm(L, f, xr, wr, dyr)
    xs = torch.randn(9, 200, generator=g) * 30
    ds = torch.randn(9, 100, generator=g)
    yield "swiglu", lambda L, f: swiglu(L, f, xs, ds)
    xq, angles = torch.randn(6, 11, 74, generator=g) * 3, torch.rand(11, 37, generator=g) * 6
    for layout in ("half", "interleaved"):
        yield f"rope {layout}", lambda L, f, lay=layout: rope(L, f, xq, angles.cos(), angles.sin(), lay)
    for n in (1003, 200003):  # one chunk, and several (threaded)
        pa, ga, ma = (torch.randn(n, generator=g) for _ in range(3))
        va = torch.rand(n, generator=g)
        for amsgrad in (False, True):
            yield f"adamw n={n} amsgrad={amsgrad}", lambda L, f, a=amsgrad, p=(pa, ga, ma, va): adamw(L, f, *p, a)
    # widths around the vector and block boundaries, and enough rows for several reduction blocks
    for V in (1, 7, 8, 9, 15, 16, 17, 31, 33, 255, 257, 4097):
        xv, tv = torch.randn(64, V, generator=g) * 3, torch.randint(0, V, (64,), generator=g)
        for variant in ("default", "ptref"):
            yield f"ce {variant} V={V}", lambda L, f, xv=xv, tv=tv, v=variant: cross_entropy(L, f, xv, tv, None,
                                                                                              "mean", v)
    xb, tb = torch.randn(4096, 67, generator=g) * 3, torch.randint(0, 67, (4096,), generator=g)
    tb[::7] = -100
    for reduction in ("mean", "sum"):
        yield f"ce default N=4096 {reduction}", lambda L, f, r=reduction: cross_entropy(L, f, xb, tb, None, r,
                                                                                        "default")
    for D in (1, 7, 8, 9, 63, 65, 257):
        xd, wd, dyd = torch.randn(17, D, generator=g), torch.randn(D, generator=g), torch.randn(17, D, generator=g)
        yield f"rms_norm D={D}", lambda L, f, a=xd, b=wd, c=dyd: rms_norm(L, f, a, b, c)
    # sums reduced to one value, split as torch splits them on 3 threads: one row's, dweight's at D = 1
    for N, D in ((1, 40000), (40000, 1)):
        xs, ws, dys = torch.randn(N, D, generator=g), torch.randn(D, generator=g), torch.randn(N, D, generator=g)
        yield (f"rms_norm N={N} D={D} torch_threads=3",
               lambda L, f, a=xs, b=ws, c=dys: rms_norm(L, f, a, b, c, torch_threads=3))
    for H in (1, 15, 16, 17, 31, 32, 33, 100):
        xh, dh = torch.randn(5, 2 * H, generator=g) * 8, torch.randn(5, H, generator=g)
        yield f"swiglu H={H}", lambda L, f, a=xh, b=dh: swiglu(L, f, a, b)
    xt, dt = torch.randn(64, 2 * 1025, generator=g) * 4, torch.randn(64, 1025, generator=g)
    yield "swiglu threaded", lambda L, f: swiglu(L, f, xt, dt)
    xqt, anglest = torch.randn(16, 64, 66, generator=g), torch.rand(64, 33, generator=g) * 6
    yield "rope threaded", lambda L, f: rope(L, f, xqt, anglest.cos(), anglest.sin(), "half")
    grads = [torch.randn(100003, generator=g), torch.randn(7, generator=g)]
    for p in (1.0, 2.0, 3.0, float("inf")):
        yield f"grad_norm p={p}", lambda L, f, p=p: grad_norm(L, f, grads, p)
    xp, tp = torch.randn(40, 1001, generator=g) * 3, torch.randint(0, 1001, (40,), generator=g)
    tp[::5] = -100
    tp[1:7] = torch.tensor([0, 333, 334, 666, 667, 1000])  # each of 3 shards' first and last column
    for shards in (1, 3):
        yield f"vocab_parallel_ce shards={shards}", lambda L, f, k=shards: vocab_parallel_ce(L, f, xp, tp, k)
    for n in (37, 70001):
        ca, cb = torch.randn(n, generator=g), torch.randn(n, generator=g)
        cb[::3] = ca[::3]
        # NaN on one side, on the other, on both; infinities; signed zeros -- in the body and the tail
        for at in (1, n - 2):
            ca[at], cb[at + 1], ca[at - 1], cb[at - 1] = float("nan"), float("nan"), float("nan"), float("nan")
        ca[4], cb[4], ca[5], cb[5], ca[7], cb[7] = float("inf"), float("inf"), float("-inf"), 1.0, -0.0, 0.0
        yield f"compare n={n}", lambda L, f, a=ca, b=cb: compare(L, f, a, b)


def differing(run: Callable, library_a, library_b) -> list[tuple[int, int]]:
    """(elements, of which differ) per output of one case (NaN equals NaN),
    the case run with each of FILLS in the outputs; an output counts the
    differing elements of the fill that shows more."""
    counts = []
    for fill in FILLS:
        a, b = run(library_a, fill), run(library_b, fill)
        a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
        counts.append([(x.numel(), differing_elements(x, y)) for x, y in zip(a, b)])
    return [max(pair, key=lambda c: c[1]) for pair in zip(*counts)]


def differences(library_a, library_b) -> dict:
    """Every case through both libraries: outputs compared, and those that differ."""
    compared, differ = 0, []
    for name, run in cases():
        for k, (elements, count) in enumerate(differing(run, library_a, library_b)):
            compared += 1
            if count:
                differ.append({"case": name, "output": k, "elements": elements, "differing": count})
    return {"outputs_compared": compared, "outputs_differing": differ}
