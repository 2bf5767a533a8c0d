"""rms_norm: F.rms_norm(x, (D,), weight, eps) over the last dimension."""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F

from ..ops.rms_norm import rms_norm
from .. import _bindings as C
from .contract import grads_present, tensor_like
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .probing import out
from .layouts import LayoutCase
from .record import WIDTHS, Claim, Conformance, GateCase, Kernel, BadInput
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows, torch_threads


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g).requires_grad_(True)
    w = torch.randn(10, generator=g).requires_grad_(True)
    y = fn(x, (10,), w, 1e-5)
    tensor_like(y, (6, 10), "rms_norm(x (6, 10), (10,), weight, eps)")
    y.backward(torch.randn(6, 10, generator=g))
    grads_present({"x": x, "weight": w})


def _make(width, rows, g):
    return {"x": torch.randn(rows, width, generator=g), "weight": torch.randn(width, generator=g)}


_BAD = (BadInput("normalized_shape (7,) on rows of 8", "shape",
                 lambda fn: fn(torch.randn(3, 8), (7,), torch.randn(8), 1e-5)),
        BadInput("a weight of 5 on rows of 8", "shape", lambda fn: fn(torch.randn(3, 8), (8,), torch.randn(5), 1e-5)))


def _opinfo_sample(s):
    shape, weight = s.args[0], (s.args[1] if len(s.args) > 1 else s.kwargs.get("weight"))
    eps = s.kwargs.get("eps", 1e-5)
    if len(shape) != 1 or eps is None or eps < 0:  # the slot normalizes the last dimension, eps >= 0
        return None
    tensors = {"x": s.input, **({"weight": weight} if weight is not None else {})}
    return (lambda f, t: f(t["x"], tuple(shape), t.get("weight"), eps)), tensors, tuple(tensors)


def _layout_cases(g):
    """Every tensor argument of ckparity.rms_norm: x and weight, over one and two normalized dimensions
    (a 2-D weight can be transposed), without a weight, and x with 0 rows."""
    def call(shape):
        return lambda f, t: f(t["x"], shape, t.get("weight"), 1e-5)
    for x_shape, shape in (((4, 9), (9,)), ((2, 3, 9), (9,)), ((3, 4, 6), (4, 6)), ((0, 9), (9,))):
        x = torch.randn(x_shape, generator=g) * 3
        yield LayoutCase(f"x {x_shape}, normalized_shape {shape}", rms_norm, F.rms_norm, call(shape), ("x", "weight"),
                         {"x": x, "weight": torch.randn(shape, generator=g)}, claim="rms_norm")
    yield LayoutCase("x (4, 9), no weight", rms_norm, F.rms_norm, call((9,)), ("x",), {"x": torch.randn(4, 9, generator=g)},
                     claim="rms_norm")


def _gate_cases():
    g = torch.Generator().manual_seed(0)
    # D = 1 and a small odd D take dweight's column paths (rms_norm.c), not its vector one
    for N, D in ((1000, 64), (64, 4097), (300, 1), (257, 3)):
        x = torch.randn(N, D, generator=g)
        yield f"N={N},D={D}", (x, (D,), torch.randn(D, generator=g)), {"eps": 1e-5}


# sums torch reduces to one value, split across its threads from 32768 elements on: the row of
# a one-row input, dweight's column at D = 1
SPLIT_SHAPES = [(1, 32768), (1, 40000), (1, 65536), (1, 131071), (32768, 1), (100003, 1)]


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """y, dx and dweight against F.rms_norm on ``dtype`` tensors (bfloat16, float16: torch's eager in that
    dtype), and the mixed calls torch takes, its float composite: 16-bit activations with a float32 weight
    (dweight float32), float32 activations with a bfloat16 or float16 weight (dweight rounded to it)."""
    for N in (1, 3, 5, 23, 70):
        for D in WIDTHS:
            x = (torch.randn(N, D, generator=g) * 3).to(dtype).requires_grad_(True)
            w = torch.randn(D, generator=g).to(dtype).requires_grad_(True)
            up = torch.randn(N, D, generator=g).to(dtype)
            others = (torch.bfloat16, torch.float16) if dtype == torch.float32 else (torch.float32,)
            mixed = [w.detach().to(d).requires_grad_(True) for d in others] if N in (1, 3) else []
            for weight in [w, None] + mixed:
                inputs = [x] + ([weight] if weight is not None else [])

                def call(fn):
                    return grad_run(lambda xx, *ww: fn(xx, (D,), ww[0] if ww else None, 1e-5), inputs, up)

                ours, theirs = call(rms_norm), call(F.rms_norm)
                case = f"N={N} D={D}" + (" no weight" if weight is None else "" if weight.dtype == dtype else
                                          f" {str(weight.dtype).removeprefix('torch.')} weight")
                for q, a, b in zip(("y", "dx", "dweight"), ours, theirs):
                    tally.add(q, case, a, b)
    for (N, D), threads in itertools.product(SPLIT_SHAPES, (2, 3)):
        x = (torch.randn(N, D, generator=g) * 3).to(dtype).requires_grad_(True)
        w = torch.randn(D, generator=g).to(dtype).requires_grad_(True)
        up = torch.randn(N, D, generator=g).to(dtype)
        with torch_threads(threads):  # rms_norm reads torch's thread count at the call
            ours, theirs = (grad_run(lambda xx, ww, fn=fn: fn(xx, (D,), ww, 1e-5), [x, w], up)
                            for fn in (rms_norm, F.rms_norm))
        for q, a, b in zip(("y", "dx", "dweight"), ours, theirs):
            tally.add(q, f"N={N} D={D} torch threads {threads}", a, b)
    for D in SPECIAL_WIDTHS:  # rows of NaN, inf, -inf and zeros
        x = special_rows(g, D, dtype).requires_grad_(True)
        w = torch.randn(D, generator=g).to(dtype).requires_grad_(True)
        up = torch.randn(x.shape, generator=g).to(dtype)
        ours, theirs = (grad_run(lambda xx, ww, fn=fn: fn(xx, (D,), ww, 1e-5), [x, w], up) for fn in (rms_norm, F.rms_norm))
        for q, a, b in zip(("y", "dx", "dweight"), ours, theirs):
            tally.add(q, f"special rows D={D}", a, b)


def probe_call(L, fill, x, w, dy, torch_threads=1):
    y, rstd, dx, dw = out(x, fill), out((x.shape[0],), fill), out(x, fill), out(w, fill)
    C.rms_norm_forward(x, w, 1e-6, y, rstd, torch_threads=torch_threads, library=L)
    C.rms_norm_backward(dy, x, w, rstd, dx, dw, torch_threads=torch_threads, library=L)
    dx_normalized, dx_rstd, dw_terms = out(x, fill), out(x, fill), out(w, fill)
    C.rms_norm_backward_terms(dy, x, w, rstd, dx_normalized, dx_rstd, dw_terms, torch_threads=torch_threads,
                              library=L)
    return y, rstd, dx, dw, dx_normalized, dx_rstd, dw_terms


def probe_call_16(L, fill, x, w, dy, torch_threads=1):
    y, rstd, dx, dw = out(x, fill), out((x.shape[0],), fill), out(x, fill), out(w, fill)
    C.rms_norm_forward_16(x, w, 1e-6, y, rstd, torch_threads=torch_threads, library=L)
    C.rms_norm_backward_16(dy, x, w, rstd, dx, dw, torch_threads=torch_threads, library=L)
    return y, rstd, dx, dw


def _probe(g: torch.Generator):
    xr, wr, dyr = (torch.randn(33, 4099, generator=g), torch.randn(4099, generator=g),
                   torch.randn(33, 4099, generator=g))
    yield "rms_norm", lambda L, f: probe_call(L, f, xr, wr, dyr)
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "float16")):
        xb, wb, dyb = xr.to(dtype), wr.to(dtype), dyr.to(dtype)
        yield f"rms_norm {name}", lambda L, f, a=xb, b=wb, c=dyb: probe_call_16(L, f, a, b, c)
        yield f"rms_norm {name}, float32 weight", lambda L, f, a=xb, c=dyb: probe_call_16(L, f, a, wr, c)
    for D in (1, 7, 8, 9, 63, 65, 257):
        xd, wd, dyd = torch.randn(17, D, generator=g), torch.randn(D, generator=g), torch.randn(17, D, generator=g)
        yield f"rms_norm D={D}", lambda L, f, a=xd, b=wd, c=dyd: probe_call(L, f, a, b, c)
    # sums reduced to one value, split as torch splits them on 3 threads: one row's, dweight's at D = 1
    for N, D in ((1, 40000), (40000, 1)):
        xs, ws, dys = torch.randn(N, D, generator=g), torch.randn(D, generator=g), torch.randn(N, D, generator=g)
        yield (f"rms_norm N={N} D={D} torch_threads=3",
               lambda L, f, a=xs, b=ws, c=dys: probe_call(L, f, a, b, c, torch_threads=3))


def c_calls(x, w):
    """The C forward and backward of x's dtype alone on preallocated outputs (dweight where w requires
    grad, as the op asks for it)."""
    y, rstd, dx = torch.empty_like(x), torch.empty(x.shape[0]), torch.empty_like(x)
    dw = torch.empty_like(w) if w.requires_grad else None
    w = w.detach()
    dy = torch.ones_like(x)
    forward, backward = ((C.rms_norm_forward, C.rms_norm_backward) if x.dtype == torch.float32
                         else (C.rms_norm_forward_16, C.rms_norm_backward_16))

    def run():
        forward(x, w, 1e-6, y, rstd)
        backward(dy, x, w, rstd, dx, dw)
    return run


def _bench(g: torch.Generator, select):
    """The large rows twice: a frozen weight (no dweight, as torch skips it) and a trained one."""
    for N, D, trained in ((8192, 4096, False), (8192, 4096, True), (8, 64, False)):
        shape = f"N={N},D={D}" + (",dweight" if trained else "")
        if select("rms_norm", shape):
            x = torch.randn(N, D, generator=g).requires_grad_(True)
            w = torch.randn(D, generator=g).requires_grad_(trained)
            # forward reads x, writes y; backward reads dy and x, writes dx
            yield Case("rms_norm", shape, fwd_bwd(rms_norm, x, (D,), w), fwd_bwd(F.rms_norm, x, (D,), w),
                       20 * N * D, c_calls(x.detach(), w), 2, compiled=compiled_fwd_bwd(F.rms_norm, x, (D,), w))
    for N, D, trained in ((8192, 4096, False), (8192, 4096, True), (8, 64, False)):
        shape = f"N={N},D={D}" + (",dweight" if trained else "") + " bf16"
        if select("rms_norm", shape):
            xb = torch.randn(N, D, generator=g).bfloat16().requires_grad_(True)
            wb = torch.randn(D, generator=g).bfloat16().requires_grad_(trained)
            yield Case("rms_norm", shape, fwd_bwd(rms_norm, xb, (D,), wb), fwd_bwd(F.rms_norm, xb, (D,), wb),
                       10 * N * D, c_calls(xb.detach(), wb), 2, compiled=compiled_fwd_bwd(F.rms_norm, xb, (D,), wb))


KERNEL = Kernel(
    name="rms_norm",
    slot="rms_norm",
    used_by=lambda config: config.model != "gpt2",  # GPT-2 normalizes with layer_norm
    exercise=("tiny", {"model": "tiny"}),
    torch_ops=("rms_norm",),
    flag="ck_rmsnorm_backend",
    spellings=("rmsnorm",),
    backends={"c": rms_norm, "torch": F.rms_norm},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["x"], (t["x"].shape[-1],), t["weight"], 1e-5),
        differentiated=("x", "weight"), widths=WIDTHS, bad=_BAD,
        options=(("no_weight", lambda f, t: f(t["x"], (t["x"].shape[-1],), None, 1e-5), ("x",)),),
        opinfo=("nn.functional.rms_norm", _opinfo_sample)),
    gate_cases={"rms_norm": GateCase(rms_norm, F.rms_norm, _gate_cases, "default", weight=2)},
    claims=(Claim("rms_norm", ("y", "dx", "dweight"), sweep),
            Claim("rms_norm", ("y", "dx", "dweight"), functools.partial(sweep, dtype=torch.bfloat16),
                  dtype="bfloat16"),
            Claim("rms_norm", ("y", "dx", "dweight"), functools.partial(sweep, dtype=torch.float16),
                  dtype="float16")),
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
)
