"""embedding: F.embedding(tokens, weight) -- the twins' token embedding. Its C
kernel (csrc/embedding.c) is torch's bit for bit in float32 and bfloat16: the
lookup a copy, the weight gradient each row's gradients added in index order
(ATen's embedding_dense_backward_cpu). A user's embedding (its backward adds
the rows of repeated tokens) is judged here."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..ops.embedding import embedding, embedding_backward, embedding_forward
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .contract import expect, tensor_like
from .layouts import LayoutCase
from .probing import out
from .record import WIDTHS, BadInput, CBuffer, CEntry, Claim, Conformance, Kernel
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows, torch_threads

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



def _tokens(n: int, V: int, g: torch.Generator) -> torch.Tensor:
    """n tokens in [0, V) with repeats: every third one is token 1 (a row summed many times)."""
    tokens = torch.randint(0, V, (n,), generator=g)
    tokens[::3] = min(1, V - 1)
    return tokens


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """out and dweight against F.embedding on ``dtype`` weights: every width as D, vocabularies from 1 row,
    padding_idx, a token repeated hundreds of times, 0-d and 2-D token tensors, non-finite gradients."""
    def case(label, tokens, V, D, padding_idx=None, special=False):
        weight = torch.randn(V, D, generator=g).to(dtype).requires_grad_(True)
        up = (special_rows(g, D, dtype)[torch.arange(tokens.numel()) % 26] if special
              else torch.randn(tokens.numel(), D, generator=g).to(dtype)).reshape(*tokens.shape, D)
        ours = grad_run(lambda w: embedding(tokens, w, padding_idx), [weight], up)
        with torch_threads(1):
            theirs = grad_run(lambda w: F.embedding(tokens, w, padding_idx), [weight], up)
        for q, a, b in zip(("out", "dweight"), ours, theirs):
            tally.add(q, label, a, b)

    for D in WIDTHS:
        case(f"V=37 D={D}", _tokens(50, 37, g), 37, D, padding_idx=5 if D % 2 else None)
    for V in (1, 2, 7, 1000, 32000):
        case(f"V={V} D=64 n=2000", _tokens(2000, V, g), V, 64)
    case("2-D tokens (4, 300)", _tokens(1200, 90, g).reshape(4, 300), 90, 48, padding_idx=-1)
    case("one token", torch.tensor(3), 9, 16)
    for D in SPECIAL_WIDTHS:
        case(f"non-finite gradients D={D}", _tokens(60, 20, g), 20, D, special=True)


def _layout_cases(g):
    """the weight and the tokens 1-D and 2-D (a transposed or strided weight is read as torch reads it)."""
    for label, shape in (("(30,)", (30,)), ("(3, 10)", (3, 10))):
        yield LayoutCase(f"tokens {label}, weight (13, 40)", embedding, F.embedding,
                         lambda f, t: f(t["tokens"], t["weight"]), ("weight",),
                         {"tokens": _tokens(30, 13, g).reshape(shape), "weight": torch.randn(13, 40, generator=g)},
                         claim="embedding")


def _probe(g: torch.Generator):
    for V, D, n in ((7, 1, 5), (50, 33, 200), (1000, 256, 5000)):
        for dtype in (torch.float32, torch.bfloat16):
            idx, w = _tokens(n, V, g), torch.randn(V, D, generator=g).to(dtype)
            dout = torch.randn(n, D, generator=g).to(dtype)

            def run(L, fill, idx=idx, w=w, dout=dout):
                y, dw = out((idx.numel(), w.shape[1]), fill, w.dtype), out(w, fill)
                embedding_forward(idx, w, y, library=L)
                embedding_backward(dout, idx, 1, dw, library=L)
                return y, dw
            yield f"embedding V={V} D={D} n={n} {dtype}", run


def _entries():
    for suffix, kind in (("", "f"), ("_bf16", "h")):
        yield CEntry(f"embedding_forward{suffix}", (CBuffer("idx", "i", lambda s: s["n"]),
                                                    CBuffer("weight", kind, lambda s: s["V"] * s["D"]),
                                                    CBuffer("out", kind, lambda s: s["n"] * s["D"], True)),
                     {"n": 4, "V": 3, "D": 5},
                     lambda L, p, s, e=f"ckp_embedding_forward{suffix}": getattr(L, e)(
                         p["idx"], s["n"], p["weight"], s["V"], s["D"], p["out"]))
        yield CEntry(f"embedding_backward{suffix}", (CBuffer("dout", kind, lambda s: s["n"] * s["D"]),
                                                     CBuffer("idx", "i", lambda s: s["n"]),
                                                     CBuffer("dweight", kind, lambda s: s["V"] * s["D"], True)),
                     {"n": 4, "V": 3, "D": 5},
                     lambda L, p, s, e=f"ckp_embedding_backward{suffix}": getattr(L, e)(
                         p["dout"], p["idx"], s["n"], s["V"], s["D"], -1, p["dweight"]))


def _bench(g: torch.Generator, select):
    for V, D, n in ((32000, 4096, 8192), (256, 64, 512)):
        shape = f"V={V},D={D},n={n}"
        if select("embedding", shape):
            tokens, w = _tokens(n, V, g), torch.randn(V, D, generator=g).requires_grad_(True)
            y, dw, dout = torch.empty(n, D), torch.empty(V, D), torch.randn(n, D, generator=g)

            def c_calls(tokens=tokens, w=w.detach(), y=y, dw=dw, dout=dout):
                embedding_forward(tokens, w, y)
                embedding_backward(dout, tokens, -1, dw)
            # forward reads n rows and writes them; backward zeroes dW and adds n rows into it
            yield Case("embedding", shape, fwd_bwd(lambda w: embedding(tokens, w), w),
                       fwd_bwd(lambda w: F.embedding(tokens, w), w), 4 * (4 * n * D + V * D), c_calls, 2,
                       compiled=compiled_fwd_bwd(lambda w: F.embedding(tokens, w), w))


KERNEL = Kernel(
    name="embedding",
    flag="ck_embedding_backend",
    slot="embedding",
    torch_ops=("embedding", "index_select"),
    # the twins' slot: (tokens (...) int64, weight (V, D)) -> (..., D), F.embedding's contract
    amp_bf16=True,
    backends={"c": embedding, "torch": F.embedding},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["tokens"], t["weight"]), differentiated=("weight",), widths=WIDTHS,
        bad=_BAD, opinfo=("nn.functional.embedding", _opinfo_sample),
        speed=lambda g: {"weight": torch.randn(32000, 512, generator=g),  # a llama-sized vocabulary, 2048 tokens
                         "tokens": torch.randint(0, 32000, (2048,), generator=g)}),
    claims=(Claim("embedding", ("out", "dweight"), sweep),
            Claim("embedding", ("out", "dweight"), functools.partial(sweep, dtype=torch.bfloat16), dtype="bfloat16")),
    not_claimed={"embedding": "max_norm, scale_grad_by_freq and sparse gradients: refused by name"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
    c_entries=tuple(_entries()),
)
