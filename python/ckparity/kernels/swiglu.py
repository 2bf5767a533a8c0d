"""swiglu: silu(gate) * up over [..., 2H] (gate = the first H columns)."""

from __future__ import annotations

import functools

import torch

from .. import reference
from ..ops.swiglu import swiglu
from .. import _bindings as C
from .contract import grads_present, tensor_like
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .probing import out
from .layouts import LayoutCase
from .record import WIDTHS, Claim, Conformance, GateCase, Kernel, BadInput
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows, torch_threads


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 12, generator=g).requires_grad_(True)
    y = fn(x)
    tensor_like(y, (5, 2, 6), "swiglu(x (5, 2, 12))")
    y.backward(torch.randn(5, 2, 6, generator=g))
    grads_present({"x": x})


def _make(width, rows, g):
    return {"x": torch.randn(rows, 2 * width, generator=g) * 4}


_BAD = (BadInput("an odd last dimension (7)", "shape", lambda fn: fn(torch.randn(3, 7))),)


def _silu_sample(s):
    """torch's silu samples as swiglu with up = 1 (silu(gate) * 1 is silu(gate))."""
    if s.input.dim() == 0:  # swiglu needs a last dimension of 2H
        return None
    x = torch.cat([s.input.detach(), torch.ones_like(s.input.detach())], dim=-1)
    return (lambda f, t: f(t["x"])), {"x": x}, ("x",)


def _layout_cases(g):
    """x, 2-D and 3-D, and with 0 rows."""
    for shape in ((4, 18), (2, 3, 18), (0, 18)):
        yield LayoutCase(f"x {shape}", swiglu, reference.swiglu, lambda f, t: f(t["x"]), ("x",),
                         {"x": torch.randn(shape, generator=g) * 4}, claim="swiglu")


def _gate_cases():
    g = torch.Generator().manual_seed(0)
    for N, H in ((64, 128), (4, 11008)):
        yield f"N={N},H={H}", (torch.randn(N, 2 * H, generator=g) * 4,), {}


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """out and dx against F.silu(g) * u on ``dtype`` tensors (bfloat16, float16: torch's eager in that dtype,
    two ops)."""
    for N in (1, 3, 17):
        for H in WIDTHS:
            x = (torch.randn(N, 2 * H, generator=g) * 4).to(dtype).requires_grad_(True)
            x.data[0, :H] = torch.linspace(-110.0, 110.0, H)  # both cut-offs of exp(-g)
            up = torch.randn(N, H, generator=g).to(dtype)
            ours = grad_run(swiglu, [x], up)
            with torch_threads(1):
                theirs = grad_run(reference.swiglu, [x], up)
            for q, a, b in zip(("out", "dx"), ours, theirs):
                tally.add(q, f"N={N} H={H}", a, b)
    for H in SPECIAL_WIDTHS:  # NaN, inf, -inf and zeros in the gate and (other rows) in the up half
        x = torch.cat([special_rows(g, H, dtype), special_rows(g, H, dtype).roll(5, 0)], 1).requires_grad_(True)
        up = torch.randn(x.shape[0], H, generator=g).to(dtype)
        ours = grad_run(swiglu, [x], up)
        with torch_threads(1):
            theirs = grad_run(reference.swiglu, [x], up)
        for q, a, b in zip(("out", "dx"), ours, theirs):
            tally.add(q, f"special rows H={H}", a, b)


def probe_call(L, fill, x, dout):
    y, dx = out(dout, fill), out(x, fill)
    C.swiglu_forward(x, y, library=L)
    C.swiglu_backward(dout, x, dx, library=L)
    return y, dx


def _probe(g: torch.Generator):
    xs, ds = torch.randn(9, 200, generator=g) * 30, torch.randn(9, 100, generator=g)
    yield "swiglu", lambda L, f: probe_call(L, f, xs, ds)
    for H in (1, 15, 16, 17, 31, 32, 33, 100):
        xh, dh = torch.randn(5, 2 * H, generator=g) * 8, torch.randn(5, H, generator=g)
        yield f"swiglu H={H}", lambda L, f, a=xh, b=dh: probe_call(L, f, a, b)
    xt, dt = torch.randn(64, 2 * 1025, generator=g) * 4, torch.randn(64, 1025, generator=g)
    yield "swiglu threaded", lambda L, f: probe_call(L, f, xt, dt)
    for H in (1, 33, 64, 65, 1025):  # bf16, float16: the vector loop steps 64 (AVX-512) or 32 (AVX2) values
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "float16")):
            xb, db = (torch.randn(5, 2 * H, generator=g) * 8).to(dtype), torch.randn(5, H, generator=g).to(dtype)
            yield f"swiglu {name} H={H}", lambda L, f, a=xb, b=db: probe_call(L, f, a, b)


def c_calls(x):
    """The C forward and backward of x's dtype alone on preallocated outputs."""
    N, H = x.shape[0], x.shape[1] // 2
    y, dout, dx = torch.empty(N, H, dtype=x.dtype), torch.ones(N, H, dtype=x.dtype), torch.empty_like(x)

    def run():
        C.swiglu_forward(x, y)
        C.swiglu_backward(dout, x, dx)
    return run


def _bench(g: torch.Generator, select):
    for N, H in ((2048, 8192), (8, 128)):
        if select("swiglu", f"N={N},H={H}"):
            x = torch.randn(N, 2 * H, generator=g).requires_grad_(True)
            # forward reads x (2H) and writes out (H); backward reads dout (H) and x (2H), writes dx (2H)
            yield Case("swiglu", f"N={N},H={H}", fwd_bwd(swiglu, x), fwd_bwd(reference.swiglu, x),
                       32 * N * H, c_calls(x.detach()), 2, compiled=compiled_fwd_bwd(reference.swiglu, x))
    for N, H in ((2048, 8192), (8, 128)):
        if select("swiglu", f"N={N},H={H} bf16"):
            xb = torch.randn(N, 2 * H, generator=g).bfloat16().requires_grad_(True)
            yield Case("swiglu", f"N={N},H={H} bf16", fwd_bwd(swiglu, xb), fwd_bwd(reference.swiglu, xb), 16 * N * H,
                       c_calls(xb.detach()), 2, compiled=compiled_fwd_bwd(reference.swiglu, xb))


KERNEL = Kernel(
    name="swiglu",
    slot="swiglu",
    used_by=lambda config: config.model != "gpt2",  # GPT-2's MLP is gelu's
    exercise=("tiny", {"model": "tiny"}),
    amp_bf16=True,
    flag="ck_swiglu_backend",
    backends={"c": swiglu, "torch": reference.swiglu},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["x"]), differentiated=("x",), widths=WIDTHS, bad=_BAD,
        options=(("3d_input", lambda f, t: f(t["x"].reshape(3, 1, -1)), ("x",)),),
        opinfo=("nn.functional.silu", _silu_sample)),
    gate_cases={"swiglu": GateCase(swiglu, reference.swiglu, _gate_cases, "default")},
    claims=(Claim("swiglu", ("out", "dx"), sweep),
            Claim("swiglu", ("out", "dx"), functools.partial(sweep, dtype=torch.bfloat16), dtype="bfloat16"),
            Claim("swiglu", ("out", "dx"), functools.partial(sweep, dtype=torch.float16), dtype="float16")),
    not_claimed={"swiglu": "an x whose last dim is strided (torch's silu of such a view runs its scalar loop, libm's "
                           "expf on every element; ckparity the vector code on a contiguous copy: 3 of 20 outputs of "
                           "torch's strided sample differ on an AVX2 AMD): as accurate as torch"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
)
