"""linear: F.linear(x, weight, bias) -- every projection of the twins (fc1,
fc2, q/k/v/o) and the lm_head. A slot with torch's backend alone so far: a
user's GEMM is judged here ("as accurate as torch" unless bitwise) until
ckparity's own C follows torch's matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .contract import grads_present, tensor_like
from .record import WIDTHS, BadInput, Conformance, Kernel

OUT = 7  # the conformance cases' output width (an odd one: no vector multiple)


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, generator=g).requires_grad_(True)
    w = torch.randn(6, 10, generator=g).requires_grad_(True)
    y = fn(x, w)
    tensor_like(y, (2, 3, 6), "linear(x (2, 3, 10), weight (6, 10))")
    y.backward(torch.randn(2, 3, 6, generator=g))
    grads_present({"x": x, "weight": w})


def _make(width, rows, g):
    """x (rows, K = width), weight (OUT, K), bias (OUT): the width is the reduction's length."""
    return {"x": torch.randn(rows, width, generator=g), "weight": torch.randn(OUT, width, generator=g) / width ** 0.5,
            "bias": torch.randn(OUT, generator=g)}


_BAD = (BadInput("a weight of K 5 for x of K 8", "shape", lambda fn: fn(torch.randn(3, 8), torch.randn(4, 5))),)


def _opinfo_sample(s):
    weight = s.args[0]
    bias = s.args[1] if len(s.args) > 1 else s.kwargs.get("bias")
    if s.input.dim() < 1 or weight.dim() != 2:  # the slot: (..., K) x (OUT, K)
        return None
    tensors = {"x": s.input, "weight": weight, **({"bias": bias} if bias is not None else {})}
    return (lambda f, t: f(t["x"], t["weight"], t.get("bias"))), tensors, tuple(tensors)



KERNEL = Kernel(
    name="linear",
    flag="ck_linear_backend",
    slot="linear",
    spellings=("gemm", "matmul"),
    # the twins' slot: (x (..., K), weight (OUT, K), bias (OUT) or None) -> (..., OUT), F.linear's contract
    backends={"torch": F.linear},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["x"], t["weight"]), differentiated=("x", "weight"), widths=WIDTHS,
        bad=_BAD, options=(("bias", lambda f, t: f(t["x"], t["weight"], t["bias"]), ("x", "weight", "bias")),),
        opinfo=("nn.functional.linear", _opinfo_sample)),
    not_claimed={"linear": "no C kernel yet: torch's backend, and a user's judged against it"},
)
