"""The same inputs through two builds of the C library, output by output:
which differ, and in how many elements.

Two users: tests/test_clones.py (the target_clones build against the
single-ISA builds: every output must be equal) and ``ckparity mutate`` (a
mutant that no gate kills and whose outputs equal the control build's on
every case here is an equivalent mutant, not a gap in the gates). Each case
is a name and a function of the loaded library (``ffi.dlopen``) and an
output fill, returning its outputs: each kernel record's probe and the
comparison; every entry point of the C API is covered -- the in-place
cross-entropy, rms_norm's backward terms, the vocab-parallel passes, the
comparison -- with odd sizes (vector tails),
ignored rows, weights, smoothing, z-loss, enough rows for several reduction
blocks, and sizes above every OpenMP threshold. Outputs start filled
(``differing`` runs each case with NaN and with 7.25), so a build that
leaves an output unwritten cannot match another by reading the same
leftover memory.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from . import _bindings as C
from . import kernels
from .measure import differing_elements

FILLS = (float("nan"), 7.25)


def _compare_probe(g: torch.Generator):
    """The harness's own comparison (ckp_compare), which every gate reads."""
    for n in (37, 70001):
        ca, cb = torch.randn(n, generator=g), torch.randn(n, generator=g)
        cb[::3] = ca[::3]
        # NaN on one side, on the other, on both; infinities; signed zeros -- in the body and the tail
        for at in (1, n - 2):
            ca[at], cb[at + 1], ca[at - 1], cb[at - 1] = float("nan"), float("nan"), float("nan"), float("nan")
        ca[4], cb[4], ca[5], cb[5], ca[7], cb[7] = float("inf"), float("inf"), float("-inf"), 1.0, -0.0, 0.0
        yield f"compare n={n}", lambda L, f, a=ca, b=cb: torch.tensor(C.compare(a, b, library=L), dtype=torch.float64)


def cases() -> Iterator[tuple[str, Callable]]:
    """(name, run): run(library, fill) returns the case's outputs -- every
    kernel record's probe (kernels/<kernel>.py), then the comparison. Each
    draws from its own generator: a record added or moved changes no other's
    inputs."""
    for record in kernels.KERNELS.values():
        if record.probe is not None:
            yield from record.probe(torch.Generator().manual_seed(7))
    yield from _compare_probe(torch.Generator().manual_seed(7))


def differing(run: Callable, library_a, library_b) -> list[tuple[int, int]]:
    """(elements, of which differ) per output of one case (NaN equals NaN),
    the case run with each of FILLS in the outputs; an output counts the
    differing elements of the fill that shows more."""
    counts = []
    for fill in FILLS:
        a, b = run(library_a, fill), run(library_b, fill)
        a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
        counts.append([(x.numel(), differing_elements(x, y)) for x, y in zip(a, b)])
    return [max(pair, key=lambda c: c[1]) for pair in zip(*counts)]


def differences(library_a, library_b) -> dict:
    """Every case through both libraries: outputs compared, and those that differ."""
    compared, differ = 0, []
    for name, run in cases():
        for k, (elements, count) in enumerate(differing(run, library_a, library_b)):
            compared += 1
            if count:
                differ.append({"case": name, "output": k, "elements": elements, "differing": count})
    return {"outputs_compared": compared, "outputs_differing": differ}
