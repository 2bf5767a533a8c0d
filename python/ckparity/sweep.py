"""The bit-identity sweep: every kernel ckparity calls bit-identical, against
torch, over every width 1..300 and some large odd ones, at the CPU capability
this process runs at.

    python -m ckparity.sweep [--kernels swiglu,rms_norm] [--json-out F|-]

Under ``ATEN_CPU_CAPABILITY=default|avx2|avx512`` (torch reads it at start-up)
the same sweep runs at a lower capability: tests/test_capability.py runs it
in one subprocess per capability the CPU can execute. Vector tails and
blockings hide in the widths, so the widths are all of 1..300 plus large odd
ones; the row counts take ATen's row paths (one row, fewer rows than its four
accumulators, leftovers, multi-block). Each kernel's reference is written
plainly next to it. torch runs single-threaded where its thread split could
cut a row, except in the cases that are about that split: a sum torch
reduces to one value of >= 32768 elements is split across its threads, and
ptref and rms_norm follow it for torch's thread count at the call (those
cases run torch, and so the kernel, on 2..4 threads).

The result, per kernel and quantity: how many cases were swept and which
were not bit-identical. It claims exactly what it swept.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys

import torch
import torch.nn.functional as F

from . import cpu, optim, reference
from .ops.cross_entropy import cross_entropy
from .ops.rms_norm import rms_norm
from .ops.rope import rope
from .ops.swiglu import swiglu

WIDTHS = list(range(1, 301)) + [511, 1023, 1376, 4095, 4097, 8191]


@contextlib.contextmanager
def torch_threads(n: int):
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Tally:
    """Per quantity: cases swept, and the cases whose bits differ."""

    def __init__(self):
        self.swept: dict[str, int] = {}
        self.differing: dict[str, list[str]] = {}

    def add(self, quantity: str, case: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
        self.swept[quantity] = self.swept.get(quantity, 0) + 1
        same_nan = ours.isnan() & theirs.isnan()
        if ours.shape != theirs.shape or bool(((ours != theirs) & ~same_nan).any()):
            self.differing.setdefault(quantity, []).append(case)

    def result(self) -> dict:
        return {q: {"swept": n, "differing": len(self.differing.get(q, [])), "examples": self.differing.get(q, [])[:8]}
                for q, n in self.swept.items()}


def _grad_run(fn, inputs, upstream):
    """fn(*inputs) and the gradients of every input that requires one."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point() and t.requires_grad) for t in inputs]
    out = fn(*leaves)
    out.backward(upstream)
    return [out.detach()] + [t.grad for t in leaves if t.requires_grad]


def sweep_swiglu(tally: Tally, g: torch.Generator) -> None:
    def torch_swiglu(x):  # the reference: F.silu(gate) * up
        H = x.shape[-1] // 2
        return F.silu(x[..., :H]) * x[..., H:]

    for N in (1, 3, 17):
        for H in WIDTHS:
            x = (torch.randn(N, 2 * H, generator=g) * 4).requires_grad_(True)
            x.data[0, :H] = torch.linspace(-110.0, 110.0, H)  # both cut-offs of exp(-g)
            up = torch.randn(N, H, generator=g)
            ours = _grad_run(swiglu, [x], up)
            with torch_threads(1):
                theirs = _grad_run(torch_swiglu, [x], up)
            for q, a, b in zip(("out", "dx"), ours, theirs):
                tally.add(q, f"N={N} H={H}", a, b)


def sweep_rms_norm(tally: Tally, g: torch.Generator) -> None:
    for N in (1, 3, 5, 23, 70):
        for D in WIDTHS:
            x = (torch.randn(N, D, generator=g) * 3).requires_grad_(True)
            w = torch.randn(D, generator=g).requires_grad_(True)
            up = torch.randn(N, D, generator=g)
            for weight in (w, None):
                inputs = [x] + ([weight] if weight is not None else [])

                def call(fn):
                    return _grad_run(lambda xx, *ww: fn(xx, (D,), ww[0] if ww else None, 1e-5), inputs, up)

                ours, theirs = call(rms_norm), call(F.rms_norm)
                case = f"N={N} D={D}{'' if weight is not None else ' no weight'}"
                for q, a, b in zip(("y", "dx", "dweight"), ours, theirs):
                    tally.add(q, case, a, b)
    # sums torch reduces to one value, split across its threads from 32768 elements on: the row of
    # a one-row input, dweight's column at D = 1
    for (N, D), threads in itertools.product(RMS_SPLIT_SHAPES, (2, 3)):
        x = (torch.randn(N, D, generator=g) * 3).requires_grad_(True)
        w = torch.randn(D, generator=g).requires_grad_(True)
        up = torch.randn(N, D, generator=g)
        with torch_threads(threads):  # rms_norm reads torch's thread count at the call
            ours, theirs = (_grad_run(lambda xx, ww, fn=fn: fn(xx, (D,), ww, 1e-5), [x, w], up)
                            for fn in (rms_norm, F.rms_norm))
        for q, a, b in zip(("y", "dx", "dweight"), ours, theirs):
            tally.add(q, f"N={N} D={D} torch threads {threads}", a, b)


RMS_SPLIT_SHAPES = [(1, 32768), (1, 40000), (1, 65536), (1, 131071), (32768, 1), (100003, 1)]


def sweep_rope(tally: Tally, g: torch.Generator) -> None:
    T = 5
    for layout in ("half", "interleaved"):
        for d in [d for d in WIDTHS if d % 2 == 0] + [4096]:
            x = torch.randn(3, T, d, generator=g).requires_grad_(True)
            angles = torch.rand(T, d // 2, generator=g) * 50
            cos, sin = angles.cos(), angles.sin()
            up = torch.randn(3, T, d, generator=g)
            ours = _grad_run(lambda xx: rope(xx, cos, sin, layout=layout), [x], up)
            theirs = _grad_run(lambda xx: reference.rope(xx, cos, sin, layout), [x], up)
            for q, a, b in zip(("out", "dx"), ours, theirs):
                tally.add(q, f"{layout} d={d}", a, b)


def sweep_adamw(tally: Tally, g: torch.Generator) -> None:
    """Three steps of each optimizer from one state. params are compared where
    torch's sqrt of the second moment is correctly rounded (its MKL sqrt is
    not, for a fraction of a percent of inputs: the one known difference)."""
    settings = [dict(weight_decay=0.01), dict(weight_decay=0.0, amsgrad=True), dict(weight_decay=0.1, maximize=True)]
    for kwargs in settings:
        for n in WIDTHS:
            p0 = torch.randn(n, generator=g)
            ck_p, torch_p = p0.clone(), p0.clone()
            ck = optim.AdamW([ck_p], lr=1e-2, **kwargs)
            ref = torch.optim.AdamW([torch_p], lr=1e-2, foreach=False, **kwargs)
            for step in range(1, 4):
                grad = torch.randn(n, generator=g) * 10 ** float(torch.randint(-4, 2, (), generator=g))
                ck_p.grad, torch_p.grad = grad.clone(), grad.clone()
                ck.step()
                ref.step()
                case = f"{kwargs} n={n} step={step}"
                ck_state, torch_state = ck.state[ck_p], ref.state[torch_p]
                for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                    if name in torch_state:
                        tally.add(name, case, ck_state[name], torch_state[name])
                v = torch_state["max_exp_avg_sq" if kwargs.get("amsgrad") else "exp_avg_sq"]
                exact = v.sqrt() == v.double().sqrt().float()
                tally.add("param (where torch's sqrt is exact)", case, ck_p.detach()[exact], torch_p.detach()[exact])
                torch_p.data.copy_(ck_p.data)  # each step from one shared state


def _ptref_case(tally: Tally, g: torch.Generator, N: int, V: int, kwargs: dict, threads: int, targets) -> None:
    """One case of variant="ptref" against F.cross_entropy, loss and dlogits,
    both with torch on ``threads`` (ptref reads torch's thread count at the
    call). kwargs may hold weighted=True; ``targets(N, V)`` draws the targets
    (class indices or probabilities) after the logits."""
    kwargs = dict(kwargs)
    weight = torch.rand(V, generator=g) + 0.5 if kwargs.pop("weighted", False) else None
    logits = (torch.randn(N, V, generator=g) * 4).requires_grad_(True)
    target = targets(N, V)
    up = torch.randn(N, generator=g) if kwargs.get("reduction") == "none" else torch.tensor(1.0)
    case = (f"{'probs ' if target.is_floating_point() else ''}N={N} V={V} {kwargs}"
            f"{' weight' if weight is not None else ''}{f' torch threads {threads}' if threads > 1 else ''}")
    with torch_threads(threads):
        ours = _grad_run(lambda x: cross_entropy(x, target, weight, variant="ptref", **kwargs), [logits], up)
        theirs = _grad_run(lambda x: F.cross_entropy(x, target, weight, **kwargs), [logits], up)
    for q, a, b in zip(("loss", "dlogits"), ours, theirs):
        tally.add(q, case, a, b)


def sweep_cross_entropy_ptref(tally: Tally, g: torch.Generator) -> None:
    """variant="ptref" against F.cross_entropy, loss and gradient: class
    targets over reductions, ignore_index, class weights and smoothing, with
    torch on one thread and where its thread split matters on 2..3; then
    probability targets, on one thread and where the split matters on 2..4."""
    settings = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1),
                dict(weighted=True), dict(weighted=True, label_smoothing=0.2),
                dict(weighted=True, label_smoothing=0.2, reduction="sum"),
                dict(weighted=True, label_smoothing=0.05, reduction="none")]

    def classes(N, V, keep_first=False):
        target = torch.randint(0, V, (N,), generator=g)
        target[::3] = -100  # ignored rows
        if keep_first:
            target[0] = 0  # a one-row input keeps its row
        return target

    def probabilities(N, V):
        return torch.softmax(torch.randn(N, V, generator=g), dim=1)

    # rows: one, fewer than a cascade level (16), and enough for nll_loss's
    # cascade to flush levels (300) at a few widths
    shapes = [(N, V) for N in (1, 8, 37) for V in WIDTHS + [32000]] + [(300, V) for V in (7, 64, 1000)]
    for (N, V), kwargs in itertools.product(shapes, settings):
        _ptref_case(tally, g, N, V, kwargs, 1, classes)
    for (N, V), threads, kwargs in itertools.product(CLASS_SPLIT_SHAPES, (2, 3), settings):
        _ptref_case(tally, g, N, V, kwargs, threads, lambda n, v: classes(n, v, keep_first=True))
    # probability targets: -(logp * q * w).sum() over every element, or .sum(1) with none
    prob_settings = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(weighted=True, label_smoothing=0.1),
                     dict(weighted=True, label_smoothing=0.2, reduction="sum")]
    prob_shapes = [(3, V, 1) for V in WIDTHS + [32000]] + [(37, V, 1) for V in (7, 64, 1000)]
    prob_shapes += [(N, V, threads) for N, V in SPLIT_SHAPES for threads in (2, 3, 4)]
    for (N, V, threads), kwargs in itertools.product(prob_shapes, prob_settings):
        _ptref_case(tally, g, N, V, kwargs, threads, probabilities)


# torch splits a sum over every element across its threads from 32768 elements on:
# label smoothing's sum over the rows and, weighted, its kept rows' weights (many
# rows), and a row's own sum when the input is one row (reduction none too)
CLASS_SPLIT_SHAPES = [(1, 65537), (1, 131071), (40000, 7), (100003, 5)]

# probability targets' sum over every element (N*V) split across torch's threads
# (two_pass_reduction): one to several chunks, a chunk past the last element, and a
# thread count above the chunks' (1031 x 64: three chunks)
SPLIT_SHAPES = [(1, 32767), (1, 32768), (128, 256), (257, 255), (1031, 64), (65, 1009), (4097, 33)]


SWEEPS = {
    "swiglu": sweep_swiglu,
    "rms_norm": sweep_rms_norm,
    "rope": sweep_rope,
    "adamw": sweep_adamw,
    "cross_entropy_ptref": sweep_cross_entropy_ptref,
}


def run(kernels=None, seed: int = 0) -> dict:
    """The sweep of ``kernels`` (default: all) at this process's capability."""
    results = {}
    for name in kernels or SWEEPS:
        tally = Tally()
        SWEEPS[name](tally, torch.Generator().manual_seed(seed))
        results[name] = tally.result()
    return {"schema": "ckparity.sweep/1", "capability": cpu.capability(), "torch": torch.__version__,
            "kernels": results}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckparity.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(SWEEPS), help=f"comma-separated, of {', '.join(SWEEPS)}")
    parser.add_argument("--json-out", default="-", help="file, or - for standard output")
    args = parser.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(SWEEPS))
    if unknown:
        parser.error(f"unknown kernels {unknown}; known: {', '.join(SWEEPS)}")
    text = json.dumps(run(kernels), indent=1)
    if args.json_out == "-":
        print(text)
    else:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
