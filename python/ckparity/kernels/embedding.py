"""embedding: F.embedding(tokens, weight) -- the twins' token embedding. A
slot with torch's backend alone so far: a user's embedding (its backward adds
the rows of repeated tokens) is judged here."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .contract import expect, tensor_like
from .record import WIDTHS, BadInput, Conformance, Kernel

VOCAB = 11  # the conformance cases' vocabulary: rows draw tokens with repeats


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, 6, generator=g).requires_grad_(True)
    tokens = torch.tensor([[1, 4, 1], [0, 10, 4]])
    y = fn(tokens, weight)
    tensor_like(y, (2, 3, 6), "embedding(tokens (2, 3), weight (11, 6))")
    y.backward(torch.ones(2, 3, 6))
    expect(weight.grad is not None and bool(weight.grad[1].eq(2).all()),
           "the gradient of a row used twice (token 1) must be the sum of both uses' gradients")


def _make(width, rows, g):
    """weight (VOCAB, D = width), tokens (rows,) with repeats (token 0 in every row past the first third)."""
    tokens = torch.randint(0, VOCAB, (rows,), generator=g)
    tokens[2::3] = 0
    return {"weight": torch.randn(VOCAB, width, generator=g), "tokens": tokens}


_BAD = (BadInput("a token equal to the vocabulary (11)", "value",
                 lambda fn: fn(torch.tensor([0, VOCAB]), torch.randn(VOCAB, 4))),
        BadInput("a negative token", "value", lambda fn: fn(torch.tensor([0, -1]), torch.randn(VOCAB, 4))))


def _opinfo_sample(s):
    weight = s.args[0]
    if s.kwargs or s.input.dtype != torch.int64 or weight.dim() != 2:  # no padding_idx, max_norm, sparse
        return None
    return (lambda f, t: f(t["tokens"], t["weight"])), {"tokens": s.input, "weight": weight}, ("weight",)



KERNEL = Kernel(
    name="embedding",
    flag="ck_embedding_backend",
    slot="embedding",
    # the twins' slot: (tokens (...) int64, weight (V, D)) -> (..., D), F.embedding's contract
    backends={"torch": F.embedding},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["tokens"], t["weight"]), differentiated=("weight",), widths=WIDTHS,
        bad=_BAD, opinfo=("nn.functional.embedding", _opinfo_sample)),
    not_claimed={"embedding": "no C kernel yet: torch's backend, and a user's judged against it"},
)
