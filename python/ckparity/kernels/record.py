"""The shape of a kernel's record: what every suite needs to know of one
kernel, and nothing about how a suite runs (that is the suite's own module).

A record is data and small functions that make inputs. The procedures that
consume them live above this package: check.py (conformance), gates.py
(kernel_parity), sweep.py (bit-identity), the harness (the CK twin's ops),
``ckparity info`` (the claims).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

# The widths every width sweep covers: all of 1..300 (vector tails and
# blockings hide there) and some large ones, odd and even, past every
# vector and block size the kernels use (1376: a width the seed's model uses).
WIDTHS = list(range(1, 301)) + [511, 1023, 1376, 4095, 4097, 8191]

# torch's CPU capabilities, as torch.backends.cpu.get_cpu_capability() names them
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")


@dataclass(frozen=True)
class Conformance:
    """What ``ckparity check`` calls a backend of this slot with.

    ``make(width, rows, gen)`` draws one case's tensors (float32);
    ``call(fn, tensors)`` calls a backend as the harness does; the gradients
    of ``differentiated`` are compared; ``bad(fn)`` calls fn with inputs it
    must refuse (raising ``Accepted`` via ``expect_raise`` when it does not);
    an optimizer slot uses ``widths`` alone (its tensor sizes);
    ``options`` are the contract's other calls, as (name, call,
    differentiated); ``opinfo`` names torch's OpInfo whose samples stand for
    the slot and adapts one sample to (call, tensors, differentiated), or
    None where the sample is outside the slot's contract."""
    make: Callable[[int, int, torch.Generator], dict] | None
    call: Callable[[Callable, dict], torch.Tensor] | None
    differentiated: tuple[str, ...]
    widths: list[int]
    bad: Callable[[Callable], None] | None
    options: tuple[tuple[str, Callable, tuple[str, ...]], ...] = ()
    opinfo: tuple[str, Callable] | None = None


@dataclass(frozen=True)
class GateCase:
    """What the kernel_parity gate holds one entry point to: fixed shapes,
    against torch in float32 and float64, by the rule ``rule`` (a key of
    ckparity.measure.RULES)."""
    ours: Callable      # the ckparity op
    theirs: Callable    # torch's counterpart
    cases: Callable[[], Iterator]  # () -> (label, inputs, kwargs); inputs[0] is differentiated
    rule: str
    weight: int | None = None  # the index in a case's inputs of a second differentiated input (dweight)


@dataclass(frozen=True)
class Claim:
    """Quantities bit-identical to torch, at the capabilities named, for one
    dtype: ``sweep(tally, gen)`` is the sweep that shows it (ckparity.sweep
    runs it; tests/test_capability.py at every capability the CPU runs)."""
    key: str                      # "rms_norm", "cross_entropy.ptref": the kernel, or kernel.variant
    quantities: tuple[str, ...]
    sweep: Callable
    dtype: str = "float32"
    capabilities: tuple[str, ...] = CAPABILITIES


@dataclass
class Kernel:
    """One kernel: every layer's knowledge of it in one place.

    ``backends`` is the live registry of the slot (name -> callable): the
    builtin ones here, users' added by ``kernels.register_backend``; the torch
    twin always takes ``backends["torch"]``. ``flag`` is the RunConfig field
    and seed flag that chooses the CK twin's backend; ``spellings`` the other
    names a user may give the slot (the flag's word)."""
    name: str
    flag: str
    backends: dict[str, Callable]
    contract: Callable[[Callable], None]
    spellings: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    optimizer: bool = False  # stepped (a factory of torch.optim.Optimizer), not differentiated
    conformance: Conformance | None = None
    gate_cases: dict[str, GateCase] = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()
    not_claimed: dict[str, str] = field(default_factory=dict)  # what is not bit-identical, and why
    # (gen) -> (name, run(library, fill) -> outputs): every C entry point of the kernel through a given
    # build, for tests/test_clones.py and mutate's equivalence probe (ckparity.builds)
    probe: Callable[[torch.Generator], Iterator[tuple[str, Callable]]] | None = None
    # (gen, select) -> the rows of ckparity bench (kernels.benching.Case) whose (kernel, shape) select accepts
    bench: Callable[[torch.Generator, Callable[[str, str], bool]], Iterator] | None = None
    builtin: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.builtin = tuple(self.backends)


class Accepted(Exception):
    """A bad input was accepted (returned a value)."""


def expect_raise(what: str, call: Callable[[], object]) -> None:
    """For Conformance.bad: ``call`` must raise; returning is the failure."""
    try:
        call()
    except Exception:  # noqa: BLE001 -- any clear refusal will do; returning is the failure
        return
    raise Accepted(what)
