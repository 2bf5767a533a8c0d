"""residual: the residual stream's add, x + y -- the stacked and llama
blocks' two adds a layer. Its C kernel (csrc/residual.c) is torch's add
bit for bit in float32 and bfloat16; a user's add (and its gradient
fan-out: autograd hands both inputs the upstream gradient) is judged here."""

from __future__ import annotations

import functools
import operator

import torch

from ..ops.residual import residual, residual_add
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .contract import grads_present, tensor_like
from .layouts import LayoutCase
from .probing import out
from .record import WIDTHS, BadInput, CBuffer, CEntry, Claim, Conformance, Kernel
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(2, 3, 10, generator=g).requires_grad_(True) for _ in range(2))
    result = fn(x, y)
    tensor_like(result, (2, 3, 10), "residual(x (2, 3, 10), y (2, 3, 10))")
    result.backward(torch.randn(2, 3, 10, generator=g))
    grads_present({"x": x, "y": y})


def _make(width, rows, g):
    return {"x": torch.randn(rows, width, generator=g), "y": torch.randn(rows, width, generator=g)}


_BAD = (BadInput("y of width 5 for x of width 8", "shape", lambda fn: fn(torch.randn(3, 8), torch.randn(3, 5))),)


def _add_sample(s):
    """torch's add samples as the slot's call: a tensor plus a tensor, alpha 1 (the residual add has no alpha)."""
    other = s.args[0] if s.args else None
    if s.kwargs or not isinstance(other, torch.Tensor) or other.dtype != s.input.dtype:
        return None
    return (lambda f, t: f(t["x"], t["y"])), {"x": s.input.detach(), "y": other.detach()}, ("x", "y")


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """out, dx and dy against torch's x + y on ``dtype`` tensors, every width, and rows of NaN, infs of both
    signs (inf + -inf: NaN) and signed zeros (-0 + -0 is -0, -0 + 0 is +0)."""
    for N in (1, 3, 17):
        for W in WIDTHS:
            x, y = (torch.randn(N, W, generator=g).to(dtype).requires_grad_(True) for _ in range(2))
            up = torch.randn(N, W, generator=g).to(dtype)
            for q, a, b in zip(("out", "dx", "dy"), grad_run(residual, [x, y], up), grad_run(operator.add, [x, y], up)):
                tally.add(q, f"N={N} W={W}", a, b)
    for W in SPECIAL_WIDTHS:
        x = special_rows(g, W, dtype).requires_grad_(True)
        y = special_rows(g, W, dtype).roll(3, 0).requires_grad_(True)
        up = torch.randn(x.shape, generator=g).to(dtype)
        for q, a, b in zip(("out", "dx", "dy"), grad_run(residual, [x, y], up), grad_run(operator.add, [x, y], up)):
            tally.add(q, f"special rows W={W}", a, b)


def _layout_cases(g):
    """x and y 2-D and 3-D, y broadcast over the rows, 0 rows."""
    for label, xs, ys in (("(4, 18)", (4, 18), (4, 18)), ("(2, 3, 18)", (2, 3, 18), (2, 3, 18)),
                          ("(4, 18) + (18,)", (4, 18), (18,)), ("(0, 18)", (0, 18), (0, 18))):
        yield LayoutCase(f"x, y {label}", residual, operator.add, lambda f, t: f(t["x"], t["y"]), ("x", "y"),
                         {"x": torch.randn(xs, generator=g), "y": torch.randn(ys, generator=g)}, claim="residual")


def _probe(g: torch.Generator):
    for n in (1, 7, 15, 16, 17, 33, 100, 70000):  # vector tails, and a size split over threads
        for dtype in (torch.float32, torch.bfloat16):
            x, y = (torch.randn(n, generator=g).to(dtype) * 8 for _ in range(2))

            def run(L, fill, x=x, y=y):
                result = out(x, fill)
                residual_add(x, y, result, library=L)
                return (result,)
            yield f"residual n={n} {dtype}", run


def _entry(name: str, kind: str) -> CEntry:
    n = lambda s: s["n"]  # noqa: E731 - every buffer holds n elements
    return CEntry(name, (CBuffer("x", kind, n), CBuffer("y", kind, n), CBuffer("out", kind, n, output=True)),
                  {"n": 5}, lambda L, p, s: getattr(L, "ckp_" + name)(p["x"], p["y"], s["n"], p["out"]))


def _bench(g: torch.Generator, select):
    for dtype, tag in ((torch.float32, ""), (torch.bfloat16, " bf16")):
        if select("residual", f"N=2048,D=4096{tag}"):
            x = torch.randn(2048, 4096, generator=g).to(dtype).requires_grad_(True)
            y = torch.randn(2048, 4096, generator=g).to(dtype)
            c_out = torch.empty_like(x)
            yield Case("residual", f"N=2048,D=4096{tag}", fwd_bwd(residual, x, y), fwd_bwd(operator.add, x, y),
                       3 * x.numel() * x.element_size(), lambda: residual_add(x.detach(), y, c_out),
                       compiled=compiled_fwd_bwd(operator.add, x, y))


KERNEL = Kernel(
    name="residual",
    used_by=lambda config: config.model != "tiny",
    exercise=("stacked", {"model": "stacked"}),
    flag="ck_residual_backend",
    slot="residual",
    torch_ops=("add", "__add__", "__radd__", "add_", "__iadd__"),
    amp_bf16=True,
    spellings=("add",),
    # the twins' slot: (x, y of one shape) -> x + y
    backends={"c": residual, "torch": operator.add},
    contract=_contract,
    conformance=Conformance(make=_make, call=lambda fn, t: fn(t["x"], t["y"]), differentiated=("x", "y"),
                            widths=WIDTHS, bad=_BAD, opinfo=("add", _add_sample)),
    claims=(Claim("residual", ("out", "dx", "dy"), sweep),
            Claim("residual", ("out", "dx", "dy"), functools.partial(sweep, dtype=torch.bfloat16), dtype="bfloat16")),
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
    c_entries=(_entry("residual_add", "f"), _entry("residual_add_bf16", "h")),
)
