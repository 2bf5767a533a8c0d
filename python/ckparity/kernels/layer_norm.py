"""layer_norm: F.layer_norm(x, normalized_shape, weight, bias, eps) -- GPT-2's norm. Its C kernel
(csrc/layer_norm.c) is torch's bit for bit in float32 at every capability and at torch's thread count: ATen's
row moments (8-lane Welford in chunks of 16 with a cascade), its reductions and its compiler's FMAs, and dweight
and dbias as one partial sum per torch thread. The GPT-2 twin's norms (--model gpt2) call it."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..ops.layer_norm import layer_norm, layer_norm_backward, layer_norm_forward
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .contract import grads_present, tensor_like
from .layouts import LayoutCase
from .probing import out
from .record import GPT2_RUN, WIDTHS, BadInput, CBuffer, CEntry, Claim, Conformance, Kernel
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows, torch_threads


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, generator=g).requires_grad_(True)
    w, b = (torch.randn(10, generator=g).requires_grad_(True) for _ in range(2))
    y = fn(x, (10,), w, b)
    tensor_like(y, (2, 3, 10), "layer_norm(x (2, 3, 10), (10,), weight (10), bias (10))")
    y.backward(torch.randn(2, 3, 10, generator=g))
    grads_present({"x": x, "weight": w, "bias": b})


def _make(width, rows, g):
    return {"x": torch.randn(rows, width, generator=g) * 2 + 0.5, "weight": torch.randn(width, generator=g),
            "bias": torch.randn(width, generator=g)}


def _call(fn, t, **options):
    return fn(t["x"], (t["x"].shape[-1],), t["weight"], t["bias"], **options)


_BAD = (BadInput("a weight of 5 for normalized_shape (8,)", "shape",
                 lambda fn: fn(torch.randn(3, 8), (8,), torch.randn(5), None)),
        BadInput("normalized_shape (7,) for x (3, 8)", "shape", lambda fn: fn(torch.randn(3, 8), (7,), None, None)))


def _opinfo_sample(s):
    """torch's layer_norm samples of float32 or bfloat16 (params of x's dtype) with their weight and bias (eps
    kept)."""
    shape = s.args[0]
    weight = s.args[1] if len(s.args) > 1 else s.kwargs.get("weight")
    bias = s.args[2] if len(s.args) > 2 else s.kwargs.get("bias")
    if s.input.dtype not in (torch.float32, torch.bfloat16) or not len(shape) or any(d == 0 for d in s.input.shape):
        return None
    if any(t is not None and t.dtype != s.input.dtype for t in (weight, bias)) and weight is None:
        return None  # a bf16 x with a float32 bias alone: torch's own backward raises (it reads mean as bf16)
    eps = s.kwargs.get("eps", 1e-5) if len(s.args) < 4 else s.args[3]
    tensors = {"x": s.input.detach(), **({"weight": weight.detach()} if weight is not None else {}),
               **({"bias": bias.detach()} if bias is not None else {})}
    return ((lambda f, t: f(t["x"], tuple(shape), t.get("weight"), t.get("bias"), eps=eps)), tensors,
            tuple(tensors))


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32, mixed: bool = False) -> None:
    """y, dx, dweight and dbias against F.layer_norm: every width at 1, 5 and 33 rows, with weight and bias,
    without either, and with one of them; 64 rows at 2 torch threads (dweight's and dbias's per-thread sums);
    a 2-D normalized shape; rows of NaN, infs and zeros; and rows of one value (variance 0). ``mixed``: float32
    weight and bias for the (bfloat16) x, torch's mixed types -- with a weight (a bias alone: torch's backward
    raises)."""
    def case(label, x, params=(True, True), shape=None, threads=1):
        shape = shape or (x.shape[-1],)
        w, b = (torch.randn(shape, generator=g).to(torch.float32 if mixed else dtype).requires_grad_(True) if on
                else None for on in params)
        x = x.to(dtype).requires_grad_(True)
        up = torch.randn(x.shape, generator=g).to(dtype)
        inputs = [t for t in (x, w, b) if t is not None]

        def call(fn):
            def run(*ts):
                it = iter(ts)
                args = [next(it), shape] + [next(it) if on else None for on in params]
                return fn(*args)
            return run
        with torch_threads(threads):
            ours, theirs = grad_run(call(layer_norm), inputs, up), grad_run(call(F.layer_norm), inputs, up)
        names = ["y", "dx"] + [q for q, on in zip(("dweight", "dbias"), params) if on]
        for q, a, bb in zip(names, ours, theirs):
            tally.add(q, label, a, bb)

    for params in ((True, True), (True, False)) if mixed else ((True, True), (False, False), (True, False), (False, True)):
        for M in (1, 5, 33):
            for W in WIDTHS:
                case(f"M={M} W={W} weight,bias={params}", torch.randn(M, W, generator=g) * 2 + 0.5, params)
    for W in (7, 64, 100, 768, 1023):
        case(f"M=64 W={W} torch threads 2", torch.randn(64, W, generator=g) * 2 + 0.5, threads=2)
    case("2-D normalized shape (4, 24)", torch.randn(3, 4, 24, generator=g), shape=(4, 24))
    for W in SPECIAL_WIDTHS:
        case(f"special rows W={W}", special_rows(g, W, dtype))
    case("rows of one value", torch.full((4, 37), 3.25))


def _layout_cases(g):
    """x 2-D and 3-D, and with 0 rows (weight and bias given)."""
    for shape in ((4, 18), (2, 3, 18), (0, 18)):
        tensors = {"x": torch.randn(shape, generator=g), "weight": torch.randn(18, generator=g),
                   "bias": torch.randn(18, generator=g)}
        yield LayoutCase(f"x {shape}", layer_norm, F.layer_norm, _call, ("x", "weight", "bias"), tensors,
                         claim="layer_norm")


def _probe(g: torch.Generator):
    for M, N in ((1, 1), (3, 7), (2, 8), (5, 17), (4, 100), (33, 257), (64, 1023)):
        for dtype, params in ((torch.float32,) * 2, (torch.bfloat16,) * 2, (torch.bfloat16, torch.float32)):
            x, dy = (torch.randn(M, N, generator=g) * 2).to(dtype), torch.randn(M, N, generator=g).to(dtype)
            w, b = torch.randn(N, generator=g).to(params), torch.randn(N, generator=g).to(params)

            def run(L, fill, x=x, dy=dy, w=w, b=b):
                y, mean, rstd = out(x, fill), out((x.shape[0],), fill, w.dtype), out((x.shape[0],), fill, w.dtype)
                layer_norm_forward(x, w, b, 1e-5, y, mean, rstd, library=L)
                dx, dw, db = out(x, fill), out(w, fill), out(b, fill)
                layer_norm_backward(dy, x, mean, rstd, w, dx, dw, db, library=L)
                return y, mean, rstd, dx, dw, db
            yield f"layer_norm M={M} N={N} {dtype} params {params}", run


def _entries(suffix: str, kind: str, pkind: str | None = None) -> tuple[CEntry, ...]:
    """The float32 entry points (suffix "", kind "f"), the bf16 ones ("_bf16", "h"), or the mixed ones
    ("_bf16_mixed", "h", with ``pkind`` "f": the params, mean, rstd and their gradients float32)."""
    pk = pkind or kind
    mn, m, n = (lambda s: s["M"] * s["N"]), (lambda s: s["M"]), (lambda s: s["N"])
    forward, backward = f"ckp_layer_norm_forward{suffix}", f"ckp_layer_norm_backward{suffix}"
    return (CEntry(f"layer_norm_forward{suffix}",
                   (CBuffer("x", kind, mn), CBuffer("weight", pk, n), CBuffer("bias", pk, n),
                    CBuffer("y", kind, mn, output=True), CBuffer("mean", pk, m, output=True),
                    CBuffer("rstd", pk, m, output=True)), {"M": 3, "N": 5},
                   lambda L, p, s: getattr(L, forward)(p["x"], p["weight"], p["bias"], s["M"], s["N"], 1e-5, p["y"],
                                                       p["mean"], p["rstd"])),
            CEntry(f"layer_norm_backward{suffix}",
                   (CBuffer("dy", kind, mn), CBuffer("x", kind, mn), CBuffer("mean", pk, m),
                    CBuffer("rstd", pk, m), CBuffer("weight", pk, n), CBuffer("dx", kind, mn, output=True),
                    CBuffer("dweight", pk, n, output=True), CBuffer("dbias", pk, n, output=True)),
                   {"M": 3, "N": 5},
                   lambda L, p, s: getattr(L, backward)(p["dy"], p["x"], p["mean"], p["rstd"], p["weight"], s["M"],
                                                        s["N"], 1, p["dx"], p["dweight"], p["dbias"])))


def _bench(g: torch.Generator, select):
    if select("layer_norm", "N=2048,D=768"):  # GPT-2 small: 2048 tokens of 768
        x = (torch.randn(2048, 768, generator=g) * 2).requires_grad_(True)
        w, b = torch.randn(768, generator=g).requires_grad_(True), torch.randn(768, generator=g).requires_grad_(True)
        # forward reads x, writes y; backward reads dy and x, writes dx (the parameters' traffic is small)
        yield Case("layer_norm", "N=2048,D=768", fwd_bwd(layer_norm, x, (768,), w, b),
                   fwd_bwd(F.layer_norm, x, (768,), w, b), 5 * x.numel() * 4,
                   compiled=compiled_fwd_bwd(F.layer_norm, x, (768,), w, b))


KERNEL = Kernel(
    name="layer_norm",
    used_by=lambda config: config.model == "gpt2",
    exercise=GPT2_RUN,
    slot="layer_norm",
    flag="ck_layer_norm_backend",
    torch_ops=("layer_norm", "native_layer_norm"),
    # the slot: (x, normalized_shape, weight=None, bias=None, eps=1e-5) -> F.layer_norm's result
    backends={"c": layer_norm, "torch": F.layer_norm},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=_call, differentiated=("x", "weight", "bias"), widths=WIDTHS, bad=_BAD,
        options=(("eps", lambda f, t: _call(f, t, eps=0.25), ("x", "weight", "bias")),
                 ("no weight or bias", lambda f, t: f(t["x"], (t["x"].shape[-1],)), ("x",))),
        opinfo=("nn.functional.layer_norm", _opinfo_sample)),
    claims=(Claim("layer_norm", ("y", "dx", "dweight", "dbias"), sweep),
            Claim("layer_norm", ("y", "dx", "dweight", "dbias"), functools.partial(sweep, dtype=torch.bfloat16),
                  dtype="bfloat16"),
            Claim("layer_norm.mixed", ("y", "dx", "dweight", "dbias"),
                  functools.partial(sweep, dtype=torch.bfloat16, mixed=True), dtype="bfloat16",
                  condition="a bfloat16 x with float32 weight (and bias)")),
    not_claimed={"layer_norm": "float16 (not built); a bfloat16 x with a float32 bias and no weight: ckparity computes "
                               "its gradients, torch's backward raises"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
    c_entries=_entries("", "f") + _entries("_bf16", "h") + _entries("_bf16_mixed", "h", "f"),
)
