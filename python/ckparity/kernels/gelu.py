"""gelu: F.gelu(x, approximate="tanh") -- GPT-2's GELU -- and F.gelu's default erf form. The tanh form's C kernel
(csrc/gelu.c) is torch's bit for bit in float32 and bfloat16 at every capability and at torch's thread count (torch
splits a large tensor between its threads and computes each piece's last elements with libm's tanhf, the rest with
SLEEF's); the GPT-2 twin's MLP (--model gpt2) calls it, as the slot does. The erf form's (csrc/gelu_erf.c) is
oneDNN's gelu_erf, which torch runs for it, at the ISA oneDNN runs (claim gelu.erf)."""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.nn.functional as F

from .. import cpu
from ..ops.gelu import gelu, gelu_backward, gelu_erf_backward, gelu_erf_forward, gelu_forward, torch_runs_onednn
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .contract import grads_present, tensor_like
from .layouts import LayoutCase
from .probing import out
from .record import GPT2_RUN, WIDTHS, BadInput, CBuffer, CEntry, Claim, Conformance, Kernel
from .sweeping import SPECIAL_WIDTHS, Tally, grad_run, special_rows, torch_threads

# the flat sizes where torch's threads split the tensor (forward past 16384 elements, backward past 32768) and
# where a piece's end falls inside a vector pair: odd sizes, and multiples of a pair either side of the grains
SPLIT_SIZES = (16385, 16417, 32769, 40007, 65536, 65537, 100003)


def gelu_tanh(x, approximate: str = "tanh"):
    """torch's GELU as the slot calls it: the tanh form unless asked otherwise."""
    return F.gelu(x, approximate=approximate)


def _tanh_form(x):
    return gelu(x, approximate="tanh")


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, generator=g).requires_grad_(True)
    y = fn(x, approximate="tanh")
    tensor_like(y, (2, 3, 10), "gelu(x (2, 3, 10), approximate='tanh')")
    y.backward(torch.randn(2, 3, 10, generator=g))
    grads_present({"x": x})


def _make(width, rows, g):
    return {"x": torch.randn(rows, width, generator=g) * 3}


_BAD = (BadInput("approximate='sigmoid'", "value", lambda fn: fn(torch.randn(3, 4), approximate="sigmoid")),)


def _opinfo_sample(s):
    """torch's gelu samples in the tanh form (the erf form is not the slot's)."""
    if s.kwargs.get("approximate", "none") != "tanh" or s.input.dtype not in (torch.float32, torch.bfloat16):
        return None
    return (lambda f, t: f(t["x"], approximate="tanh")), {"x": s.input.detach()}, ("x",)


def _case(tally: Tally, g: torch.Generator, dtype: torch.dtype, ours, theirs):
    """case(label, x, threads=1): y and dx of ``ours`` against ``theirs`` on x in ``dtype``, at torch's threads."""
    def case(label, x, threads=1):
        x = x.to(dtype).requires_grad_(True)
        up = torch.randn(x.shape, generator=g).to(dtype)
        with torch_threads(threads):
            mine, torchs = grad_run(ours, [x], up), grad_run(theirs, [x], up)
        for q, a, b in zip(("y", "dx"), mine, torchs):
            tally.add(q, label, a, b)
    return case


def _shared_cases(case, g: torch.Generator, dtype: torch.dtype, rows=(1, 3, 17), label: str = "") -> None:
    """What both forms' sweeps take: every width in ``rows`` rows; the sizes torch splits (SPLIT_SIZES) at 1 and 2
    threads; rows of NaN, infs and signed zeros."""
    for N in rows:
        for W in WIDTHS:
            case(f"{label}N={N} W={W}", torch.randn(N, W, generator=g) * 3)
    for n in SPLIT_SIZES:
        for threads in (1, 2):
            case(f"{label}n={n} threads={threads}", torch.randn(n, generator=g) * 3, threads)
    for W in SPECIAL_WIDTHS:
        case(f"{label}special rows W={W}", special_rows(g, W, dtype))


def sweep(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """y and dx against F.gelu(x, approximate="tanh") on ``dtype`` tensors: _shared_cases, at torch's one thread
    but the split sizes; and x sweeping past tanh's cut-off (|inner| 8.66) and x^3's overflow."""
    case = _case(tally, g, dtype, _tanh_form, gelu_tanh)
    _shared_cases(case, g, dtype)
    case("x from -1e13 to 1e13", torch.cat([-torch.logspace(13, -8, 250), torch.logspace(-8, 13, 250)]))


def _erf_form(x):
    return gelu(x, approximate="none")


def sweep_erf(tally: Tally, g: torch.Generator, dtype: torch.dtype = torch.float32) -> None:
    """y and dx of the erf form against F.gelu(x) on ``dtype`` tensors: _shared_cases (oneDNN's code), one element
    (ATen's scalar code), x from -1e13 to 1e13 (every one of oneDNN's 25 intervals, its exp's underflow) and from
    -12 to 12; and with oneDNN disabled (ATen's own erf GELU: its vector pairs, scalar tails and thread pieces,
    which torch runs for bf16 below avx512_core too) _shared_cases in 3 rows."""
    case = _case(tally, g, dtype, _erf_form, F.gelu)
    _shared_cases(case, g, dtype)
    case("x from -1e13 to 1e13", torch.cat([-torch.logspace(13, -40, 500), torch.logspace(-40, 13, 500)]))
    case("x from -12 to 12", torch.linspace(-12, 12, 100003))
    for v in (0.0, -0.0, 5.5, 5.6, -9.0, 1e-30, float("inf"), float("nan")):
        case(f"one element {v}", torch.tensor([v]))
    with _onednn_disabled():
        _shared_cases(case, g, dtype, rows=(3,), label="oneDNN disabled ")


@contextlib.contextmanager
def _onednn_disabled():
    """torch.backends.mkldnn disabled for the block: its flags() context (an assignment is refused once torch's
    test utilities have frozen the global flags), whose warning about TF32 on Intel GPUs is not ours to show."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def _erf_followed(dtype: torch.dtype) -> str | None:
    """None where ckparity's erf GELU is the code torch runs on a contiguous ``dtype`` tensor, else why not (ATen's
    own, where torch does not hand it to oneDNN, is followed at every capability)."""
    isa = cpu.onednn_isa()
    if not torch_runs_onednn(dtype) or isa.startswith("AVX512") or isa == "AVX2":
        return None
    return f"oneDNN runs {isa} code here (no FMA): not followed"


def _layout_cases(g):
    """x 1-D, 2-D and 3-D, and empty."""
    for shape in ((37,), (4, 18), (2, 3, 18), (0, 18)):
        yield LayoutCase(f"x {shape}", gelu, gelu_tanh, lambda f, t: f(t["x"], approximate="tanh"), ("x",),
                         {"x": torch.randn(shape, generator=g) * 3}, claim="gelu")


def _probe(g: torch.Generator):
    for n in (1, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 70001):  # vector pairs' tails; a size torch splits
        for dtype in (torch.float32, torch.bfloat16):
            x, dy = (torch.randn(n, generator=g) * 4).to(dtype), torch.randn(n, generator=g).to(dtype)

            def run(L, fill, x=x, dy=dy):
                y, dx = out(x, fill), out(x, fill)
                gelu_forward(x, y, library=L)
                gelu_backward(dy, x, dx, library=L)
                return y, dx
            yield f"gelu n={n} {dtype}", run

            def run_erf(L, fill, x=x, dy=dy):
                y, dx = out(x, fill), out(x, fill)
                gelu_erf_forward(x, y, library=L)
                gelu_erf_backward(dy, x, dx, library=L)
                return y, dx
            yield f"gelu erf n={n} {dtype}", run_erf


def _entries(name: str, suffix: str, kind: str) -> tuple[CEntry, ...]:
    """The forward and backward entries of ``name`` (gelu: torch's threads; gelu_erf: the form, then torch's threads)."""
    n = lambda s: s["n"]  # noqa: E731 - every buffer holds n elements
    extra = (1,) if name == "gelu" else (0, 1)
    forward, backward = f"{name}_forward{suffix}", f"{name}_backward{suffix}"
    return (CEntry(forward, (CBuffer("x", kind, n), CBuffer("y", kind, n, output=True)), {"n": 5},
                   lambda L, p, s: getattr(L, "ckp_" + forward)(p["x"], s["n"], *extra, p["y"])),
            CEntry(backward, (CBuffer("dy", kind, n), CBuffer("x", kind, n), CBuffer("dx", kind, n, output=True)),
                   {"n": 5}, lambda L, p, s: getattr(L, "ckp_" + backward)(p["dy"], p["x"], s["n"], *extra, p["dx"])))


def _bench(g: torch.Generator, select):
    if select("gelu", "N=2048,D=3072"):  # GPT-2 small's MLP: 4 x 768 columns, 2048 tokens
        x = (torch.randn(2048, 3072, generator=g) * 3).requires_grad_(True)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        ones = torch.ones_like(x)

        def c_calls():
            gelu_forward(x.detach(), y)
            gelu_backward(ones, x.detach(), dx)
        # forward reads x, writes y; backward reads dy and x, writes dx
        yield Case("gelu", "N=2048,D=3072", fwd_bwd(gelu, x, "tanh"), fwd_bwd(gelu_tanh, x, "tanh"),
                   5 * x.numel() * 4, c_calls, compiled=compiled_fwd_bwd(gelu_tanh, x, "tanh"))
    if select("gelu", "erf N=2048,D=3072"):  # the same in F.gelu's default form (oneDNN's in torch)
        x = (torch.randn(2048, 3072, generator=g) * 3).requires_grad_(True)
        y, dx, ones = torch.empty_like(x), torch.empty_like(x), torch.ones_like(x)

        def c_erf_calls():
            gelu_erf_forward(x.detach(), y)
            gelu_erf_backward(ones, x.detach(), dx)
        yield Case("gelu", "erf N=2048,D=3072", fwd_bwd(gelu, x, "none"), fwd_bwd(gelu_tanh, x, "none"),
                   5 * x.numel() * 4, c_erf_calls, compiled=compiled_fwd_bwd(gelu_tanh, x, "none"))


KERNEL = Kernel(
    name="gelu",
    used_by=lambda config: config.model == "gpt2",
    exercise=GPT2_RUN,
    slot="gelu",
    flag="ck_gelu_backend",
    torch_ops=("gelu",),
    # the slot: (x, approximate="tanh") -> F.gelu(x, approximate=...)
    backends={"c": gelu, "torch": gelu_tanh},
    contract=_contract,
    # the slot's call is GPT-2's tanh form; its option "erf" F.gelu's default (--model gpt2 --gelu erf), which a
    # backend of the tanh form alone declares unsupported
    conformance=Conformance(make=_make, call=lambda fn, t: fn(t["x"], approximate="tanh"), differentiated=("x",),
                            widths=WIDTHS, bad=_BAD, opinfo=("nn.functional.gelu", _opinfo_sample),
                            options=(("erf", lambda fn, t: fn(t["x"], approximate="none"), ("x",)),)),
    amp_bf16=True,
    claims=(Claim("gelu", ("y", "dx"), sweep),
            Claim("gelu", ("y", "dx"), functools.partial(sweep, dtype=torch.bfloat16), dtype="bfloat16"),
            Claim("gelu.erf", ("y", "dx"), sweep_erf, holds=functools.partial(_erf_followed, torch.float32),
                  condition="contiguous x; oneDNN at an avx512 or avx2 ISA, or disabled"),
            Claim("gelu.erf", ("y", "dx"), functools.partial(sweep_erf, dtype=torch.bfloat16), dtype="bfloat16",
                  holds=functools.partial(_erf_followed, torch.bfloat16),
                  condition="contiguous x; oneDNN at an avx512 ISA, or ATen's erf below it")),
    not_claimed={"gelu": "float16 (not built)",
                 "gelu.erf": "a strided x (torch runs ATen's vectorized erf on it in memory order; ckparity computes "
                             "its contiguous copy), oneDNN below avx2 (no FMA); float16 (not built)"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
    c_entries=tuple(entry for name in ("gelu", "gelu_erf") for entry in _entries(name, "", "f") + _entries(name, "_bf16", "h")),
)
