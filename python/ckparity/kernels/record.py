"""The shape of a kernel's record: what every suite needs to know of one
kernel, and nothing about how a suite runs (that is the suite's own module).

A record is data and small functions that make inputs. The procedures that
consume them live above this package: check/ (conformance), gates/
(kernel_parity's cases), sweep.py (bit-identity), the harness (the CK twin's ops),
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

# the run that calls GPT-2's kernels (a record's ``exercise``), every other slot at a backend bit-identical to
# torch's: GPT-2's key bias has a gradient that is zero in exact arithmetic (softmax ignores a shift of every
# score of a row), so it is rounding noise, and AdamW turns a last-bit difference of it into an lr-sized step --
# with the default loss (not torch's bits) or the C AdamW (a sqrt torch's MKL rounds otherwise) the params
# leave tolerance in tens of steps whatever the kernel under judgment does (c_attn.bias at step 13 at the
# defaults: tests/test_gpt2.py)
GPT2_RUN = ("gpt2", {"model": "gpt2", "ck_loss_backend": "c_ptref", "ck_optimizer_backend": "torch"})


@dataclass(frozen=True)
class Conformance:
    """What ``ckparity check`` calls a backend of this slot with.

    ``make(width, rows, gen)`` draws one case's tensors (float32);
    ``call(fn, tensors)`` calls a backend as the harness does; the gradients
    of ``differentiated`` are compared; ``bad(fn)`` calls fn with inputs it
    must refuse, as ``BadInput`` rows (a shape the slot cannot take, or a
    value out of its domain: the ckparity.plugin helpers check shapes
    themselves, so a helper-built backend's C sees only the value rows);
    an optimizer slot uses ``widths`` alone (its tensor sizes);
    ``options`` are the contract's other calls, as (name, call,
    differentiated), the name the one a backend declares ``unsupported``
    (``register_backend(..., unsupported=[name])``); ``opinfo`` names torch's OpInfo whose samples stand for
    the slot and adapts one sample to (call, tensors, differentiated), or
    None where the sample is outside the slot's contract."""
    make: Callable[[int, int, torch.Generator], dict] | None
    call: Callable[[Callable, dict], torch.Tensor] | None
    differentiated: tuple[str, ...]
    widths: list[int]
    bad: tuple[BadInput, ...] = ()
    options: tuple[tuple[str, Callable, tuple[str, ...]], ...] = ()
    opinfo: tuple[str, Callable] | None = None
    batch_widths: tuple[int, ...] | None = None  # batch_invariance's widths, where not check's own
    rows: tuple[int, ...] | None = None  # the widths property's row counts, where not check's own (1 and 3)
    # (gen) -> the tensors a backend is timed on against torch (check/speed.py), where make(4096, 256) is not
    # the slot's realistic shape
    speed: Callable[[torch.Generator], dict] | None = None


@dataclass(frozen=True)
class BadInput:
    """An input a backend must refuse (raise on): ``call(fn)`` passes it."""
    what: str
    kind: str  # "shape" or "value"
    call: Callable[[Callable], object]


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
    # where the claim rests on more than torch's capability (linear: MKL's branch): () -> None where it holds
    # in this process, else why not (the sweep still runs and reports its figures, as not claimed here)
    holds: Callable[[], str | None] | None = None
    condition: str = ""  # that condition in words, for the docs' table

    def reason_not_here(self) -> str | None:
        return self.holds() if self.holds else None


@dataclass(frozen=True)
class CBuffer:
    """One buffer argument of a C entry point: ``kind`` "f" (float32), "h" (bf16 or float16 bits), "i"
    (int64) or "d" (float64); ``count(sizes)`` its elements for the entry's size arguments; ``output``
    whether the call writes it (``reads``: and reads it first, an in-out buffer)."""
    name: str
    kind: str
    count: Callable[[dict], int]
    output: bool = False
    reads: bool = False


@dataclass(frozen=True)
class CEntry:
    """A C entry point as the C API's tests call it: ``sizes`` its size arguments (name -> a small valid
    value), ``call(library, pointers, sizes)`` one call (pointers by buffer name, NULL for an absent one).
    tests/test_overlaps.py and tests/test_fuzz_c_api.py cover a record's entries (every pair of buffers
    overlapping; NULLs, sizes out of range, aliasing) without a table of their own."""
    name: str  # the C function's name without ckp_
    buffers: tuple[CBuffer, ...]
    sizes: dict[str, int]
    call: Callable[[object, dict, dict], int]


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
    # the twins' op this kernel is (the models call ops.<slot>); None: not a model op (the optimizer, clip)
    slot: str | None = None
    # under --amp the CK backend meets bf16 tensors (a bf16 linear feeds it), so it must take them
    amp_bf16: bool = False
    # whether a run's CK twin calls the kernel, of its config (harness RunConfig); None: every run does
    used_by: Callable[[object], bool] | None = None
    # how a run whose CK twin does not call the kernel is changed to (a label, RunConfig fields): a gate given
    # a user's backend of it (gate --backend) runs that; None where every run calls it
    exercise: tuple[str, dict] | None = None
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
    # (gen) -> the calls whose every tensor argument the layouts sweep lays out anew (layouts.LayoutCase)
    layouts: Callable[[torch.Generator], Iterator] | None = None
    # the names of torch's functions that are the slot's op (check's cheats property: a backend calling one
    # hands torch's work back to torch)
    torch_ops: tuple[str, ...] = ()
    # the C entry points as the C API's tests call them (CEntry); families before residual have theirs in those tests
    c_entries: tuple[CEntry, ...] = ()
    # (gen, select) -> the rows of ckparity bench (kernels.benching.Case) whose (kernel, shape) select accepts
    bench: Callable[[torch.Generator, Callable[[str, str], bool]], Iterator] | None = None
    builtin: tuple[str, ...] = ()
    # what register_backend knows of a user's backend (name -> Registration)
    registrations: dict[str, "Registration"] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.builtin = tuple(self.backends)

    def options(self) -> tuple[str, ...]:
        """The names of the slot's options a backend may declare unsupported."""
        return tuple(name for name, _, _ in self.conformance.options) if self.conformance else ()


@dataclass(frozen=True)
class Registration:
    """A user's backend as registered: ``unsupported`` options (the record's
    Conformance.options names) it refuses by design; ``origin`` what makes a
    fresh process register it again (a plugin spec, or ``module:attr``; None
    where nothing does: a backend defined in a function or in __main__);
    ``contract_checked`` False where the contract check was deferred to the
    process that checks it (ckparity check's child)."""
    unsupported: frozenset[str] = frozenset()
    origin: str | None = None
    contract_checked: bool = True
