"""rope: rotary position embedding of (B, heads, T, d) with cos, sin (T, d/2);
the CK twin uses the rotate-half layout (Llama's), the op both."""

from __future__ import annotations

import functools

import torch

from .. import reference
from ..ops.rope import rope
from .. import _bindings as C
from .contract import grads_present, tensor_like
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .probing import out
from .layouts import LayoutCase
from .record import WIDTHS, Claim, Conformance, GateCase, Kernel, BadInput
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    leaf = torch.randn(2, 5, 3, 8, generator=g).requires_grad_(True)
    angles = torch.rand(5, 4, generator=g)
    # (B, heads, T, d) as a transposed view of (B, T, heads, d), not contiguous, as the harness passes it
    y = fn(leaf.transpose(1, 2), angles.cos(), angles.sin())
    tensor_like(y, (2, 3, 5, 8), "rope(q (2, 3, 5, 8), cos (5, 4), sin (5, 4))")
    y.backward(torch.randn(y.shape, generator=g))
    grads_present({"q": leaf})


def _make(width, rows, g):
    angles = torch.rand(3, width // 2, generator=g) * 6
    # (B, T, heads, d) stored, passed as the transposed (B, heads, T, d) view the harness passes
    return {"q": torch.randn(1, 3, rows + 1, width, generator=g), "cos": angles.cos(), "sin": angles.sin()}


_BAD = (BadInput("cos of the wrong width", "shape",
                 lambda fn: fn(torch.randn(1, 2, 3, 8), torch.randn(3, 3), torch.randn(3, 3))),)


def _layout_cases(g):
    """x (B, heads, T, d), cos and sin (T, d/2), in both layouts; T = 0 too."""
    for layout in ("half", "interleaved"):
        for B, heads, T, d in ((2, 3, 5, 8), (1, 2, 0, 6)):
            angles = torch.rand(T, d // 2, generator=g) * 6
            yield LayoutCase(f"x {(B, heads, T, d)}, {layout}", functools.partial(rope, layout=layout),
                             functools.partial(reference.rope, layout=layout),
                             lambda f, t: f(t["x"], t["cos"], t["sin"]), ("x",),
                             {"x": torch.randn(B, heads, T, d, generator=g), "cos": angles.cos(), "sin": angles.sin()},
                             claim="rope")


def _gate_cases():
    """Both layouts; a d of 2 (one pair) and a d whose half is not a vector width; the
    (B, heads, T, d) view of a (B, T, heads, d) tensor, as the llama twin calls it."""
    g = torch.Generator().manual_seed(4)
    for B, heads, T, d in ((2, 4, 16, 64), (3, 2, 7, 2), (1, 3, 33, 46)):
        angles = torch.rand(T, d // 2, generator=g) * 6.3
        x = torch.randn(B, T, heads, d, generator=g).transpose(1, 2)
        for layout in ("half", "interleaved"):
            yield f"B={B},heads={heads},T={T},d={d},{layout}", (x, angles.cos(), angles.sin()), {"layout": layout}


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """out and dx against reference.rope on ``dtype`` tensors (x, cos, sin alike)."""
    T = 5
    for layout in ("half", "interleaved"):
        for d in [d for d in WIDTHS if d % 2 == 0] + [4096]:
            x = torch.randn(3, T, d, generator=g).to(dtype).requires_grad_(True)
            angles = torch.rand(T, d // 2, generator=g) * 50
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            up = torch.randn(3, T, d, generator=g).to(dtype)
            ours = grad_run(lambda xx: rope(xx, cos, sin, layout=layout), [x], up)
            theirs = grad_run(lambda xx: reference.rope(xx, cos, sin, layout), [x], up)
            for q, a, b in zip(("out", "dx"), ours, theirs):
                tally.add(q, f"{layout} d={d}", a, b)
        for d in [2, 46] + [d for d in SPECIAL_WIDTHS if d % 2 == 0]:  # rows of NaN, inf, -inf and zeros
            x = special_rows(g, d, dtype).reshape(2, -1, d).requires_grad_(True)  # (2, 13, d): 13 positions
            angles = torch.rand(x.shape[1], d // 2, generator=g) * 50
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            up = torch.randn(x.shape, generator=g).to(dtype)
            ours = grad_run(lambda xx: rope(xx, cos, sin, layout=layout), [x], up)
            theirs = grad_run(lambda xx: reference.rope(xx, cos, sin, layout), [x], up)
            for q, a, b in zip(("out", "dx"), ours, theirs):
                tally.add(q, f"special rows {layout} d={d}", a, b)


def probe_call(L, fill, x, cos, sin, layout):
    y, dx = out(x, fill), out(x, fill)
    C.rope_forward(x, cos, sin, layout, y, library=L)
    C.rope_backward(y, cos, sin, layout, dx, library=L)
    return y, dx


def _probe(g: torch.Generator):
    xq, angles = torch.randn(6, 11, 74, generator=g) * 3, torch.rand(11, 37, generator=g) * 6
    for layout in ("half", "interleaved"):
        yield f"rope {layout}", lambda L, f, lay=layout: probe_call(L, f, xq, angles.cos(), angles.sin(), lay)
    xqt, anglest = torch.randn(16, 64, 66, generator=g), torch.rand(64, 33, generator=g) * 6
    yield "rope threaded", lambda L, f: probe_call(L, f, xqt, anglest.cos(), anglest.sin(), "half")
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "float16")):
        xb, cb, sb = xq.to(dtype), angles.cos().to(dtype), angles.sin().to(dtype)
        for layout in ("half", "interleaved"):
            yield f"rope {name} {layout}", lambda L, f, lay=layout, a=xb, c=cb, s=sb: probe_call(L, f, a, c, s, lay)


def c_calls(x, cos, sin):
    """The C forward and backward of x's dtype alone on preallocated outputs."""
    y, dx = torch.empty_like(x), torch.empty_like(x)

    def run():
        C.rope_forward(x, cos, sin, "half", y)
        C.rope_backward(y, cos, sin, "half", dx)
    return run


def _bench(g: torch.Generator, select):
    for N, T, d in ((64, 512, 128), (4, 8, 16)):
        if select("rope", f"N={N},T={T},d={d}"):
            x = torch.randn(N, T, d, generator=g).requires_grad_(True)
            angles = torch.rand(T, d // 2, generator=g) * 6
            cos, sin = angles.cos(), angles.sin()
            # forward reads x, writes out; backward reads dout, writes dx (the tables stay in cache)
            yield Case("rope", f"N={N},T={T},d={d}", fwd_bwd(rope, x, cos, sin), fwd_bwd(reference.rope, x, cos, sin),
                       16 * N * T * d, c_calls(x.detach(), cos, sin), 2,
                       compiled=compiled_fwd_bwd(reference.rope, x, cos, sin))
    for N, T, d in ((64, 512, 128), (4, 8, 16)):
        if select("rope", f"N={N},T={T},d={d} bf16"):
            xb = torch.randn(N, T, d, generator=g).bfloat16().requires_grad_(True)
            angles = torch.rand(T, d // 2, generator=g) * 6
            cb, sb = angles.cos().bfloat16(), angles.sin().bfloat16()
            yield Case("rope", f"N={N},T={T},d={d} bf16", fwd_bwd(rope, xb, cb, sb),
                       fwd_bwd(reference.rope, xb, cb, sb), 8 * N * T * d, c_calls(xb.detach(), cb, sb), 2,
                       compiled=compiled_fwd_bwd(reference.rope, xb, cb, sb))


KERNEL = Kernel(
    name="rope",
    used_by=lambda config: config.model == "llama",
    exercise=("llama", {"model": "llama"}),
    slot="rope",
    amp_bf16=True,
    flag="ck_rope_backend",
    # the twins' slot: (q or k (B, heads, T, d), cos, sin (T, d/2)), rotate-half layout
    backends={"c": lambda x, cos, sin: rope(x, cos, sin, layout="half"),
              "torch": lambda x, cos, sin: reference.rope(x, cos, sin, "half")},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["q"].transpose(1, 2), t["cos"], t["sin"]), differentiated=("q",),
        widths=[w for w in range(2, 301, 2)] + [512, 1024, 4096, 8192], bad=_BAD,
        speed=lambda g: {"q": torch.randn(4, 256, 8, 128, generator=g),  # (B, T, heads, d) as the twins store it
                         **dict(zip(("cos", "sin"), (lambda a: (a.cos(), a.sin()))(torch.rand(256, 64, generator=g))))}),
    gate_cases={"rope": GateCase(rope, reference.rope, _gate_cases, "default")},
    claims=(Claim("rope", ("out", "dx"), sweep),
            Claim("rope", ("out", "dx"), functools.partial(sweep, dtype=torch.bfloat16), dtype="bfloat16"),
            Claim("rope", ("out", "dx"), functools.partial(sweep, dtype=torch.float16), dtype="float16")),
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
)
