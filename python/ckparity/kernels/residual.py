"""residual: the residual stream's add, x + y -- the stacked and llama
blocks' two adds a layer. A slot with torch's backend alone so far: a user's
add (and its gradient fan-out: autograd hands both inputs the upstream
gradient) is judged here."""

from __future__ import annotations

import operator

import torch

from .contract import grads_present, tensor_like
from .record import WIDTHS, BadInput, Conformance, Kernel


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(2, 3, 10, generator=g).requires_grad_(True) for _ in range(2))
    out = fn(x, y)
    tensor_like(out, (2, 3, 10), "residual(x (2, 3, 10), y (2, 3, 10))")
    out.backward(torch.randn(2, 3, 10, generator=g))
    grads_present({"x": x, "y": y})


def _make(width, rows, g):
    return {"x": torch.randn(rows, width, generator=g), "y": torch.randn(rows, width, generator=g)}


_BAD = (BadInput("y of width 5 for x of width 8", "shape", lambda fn: fn(torch.randn(3, 8), torch.randn(3, 5))),)



KERNEL = Kernel(
    name="residual",
    used_by=lambda config: config.model != "tiny",
    exercise=("stacked", {"model": "stacked"}),
    flag="ck_residual_backend",
    slot="residual",
    spellings=("add",),
    # the twins' slot: (x, y of one shape) -> x + y
    backends={"torch": operator.add},
    contract=_contract,
    conformance=Conformance(make=_make, call=lambda fn, t: fn(t["x"], t["y"]), differentiated=("x", "y"),
                            widths=WIDTHS, bad=_BAD),
    not_claimed={"residual": "no C kernel yet: torch's backend, and a user's judged against it"},
)
