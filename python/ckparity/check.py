"""ckparity check KERNEL --backend NAME: the conformance suite ckparity runs on
its own kernels, run on any registered backend (yours, loaded by --plugin).

Each property is a set of cases run on the backend and on torch (and on
torch in float64, the exact answer's stand-in), with a verdict:

- ``widths``: every width 1..300 and large odd ones (511 .. 8191), 1 and 3
  rows: vector tails and blockings hide there;
- ``options``: what the slot's contract passes besides the plain call
  (ignored rows and label smoothing; no weight; a 3-D input);
- ``non_contiguous``: the input as a strided view must give the bits the
  same values give contiguous;
- ``threads``: a large case at 1 and 2 torch threads, the same bits;
- ``bad_input``: a wrong shape or an out-of-range target must raise, not
  return;
- ``torch_inputs``: torch's own OpInfo sample inputs of the op the slot
  stands for (nn.functional.rms_norm, cross_entropy, and silu through swiglu
  with up = 1) that fall within the slot's contract -- empty rows, width 1,
  no weight: inputs ckparity's authors did not choose (needs expecttest; the
  report's ``not_run`` says so when it is missing).

Verdicts, worst last: ``bitwise`` (every output and gradient has torch's
bits), ``as accurate as torch`` (ckparity.measure.parity: close to torch, and
a float64 error at most twice torch's), ``less accurate`` (close to torch,
further from float64), ``nondeterministic`` (threads only), ``wrong`` (not
close to torch, or bad input accepted), ``crashes`` (raised on valid input).
The overall verdict is the worst; exit 0 unless it is ``wrong`` or
``crashes``. ``ckparity check`` runs the suite in a child process
(isolated_check): a crash in C -- a segfault, an abort -- ends the child, not
the command, and is the verdict ``crashes`` with the signal that ended it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from . import cpu
from .harness import backends
from .measure import RULES, differing_elements, max_ulp, parity
from .plugins import resolve, slot

SCHEMA = "ckparity.check/1"
VERDICTS = ["bitwise", "as accurate as torch", "less accurate", "nondeterministic", "wrong", "crashes"]
FAILING = {"wrong", "crashes"}  # check's exit code: the report is still worth reading below these
# what a gate lets through: a parity gate asks for torch's accuracy, deterministically
GATE_PASSES = {"bitwise", "as accurate as torch"}
WIDTHS = list(range(1, 301)) + [511, 1023, 4095, 4097, 8191]
ROWS = (1, 3)


@dataclass(frozen=True)
class Slot:
    make: Callable[[int, int, torch.Generator], dict]  # (width, rows, gen) -> the case's tensors, float32
    call: Callable[[Callable, dict], torch.Tensor]      # (fn, tensors) -> the output
    differentiated: tuple[str, ...]                      # the tensors whose gradients are compared
    widths: list[int]
    bad: Callable[[Callable], None]                      # calls fn with bad input (must raise)


def _rms_norm_make(width, rows, g):
    return {"x": torch.randn(rows, width, generator=g), "weight": torch.randn(width, generator=g)}


def _swiglu_make(width, rows, g):
    return {"x": torch.randn(rows, 2 * width, generator=g) * 4}


def _ce_make(width, rows, g):
    targets = torch.randint(0, width, (rows,), generator=g)
    targets[1::3] = -100  # ignored rows; row 0 is always kept (a mean over no rows is NaN)
    return {"logits": torch.randn(rows, width, generator=g) * 3, "targets": targets}


def _rope_make(width, rows, g):
    angles = torch.rand(3, width // 2, generator=g) * 6
    # (B, T, heads, d) stored, passed as the transposed (B, heads, T, d) view the harness passes
    return {"q": torch.randn(1, 3, rows + 1, width, generator=g), "cos": angles.cos(), "sin": angles.sin()}


def _floating(t: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in t.items()}


def _expect_raise(what: str, call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 -- any clear refusal will do; returning is the failure
        return
    raise _Accepted(what)


class _Accepted(Exception):
    """A bad input was accepted (returned a value)."""


def _rms_norm_bad(fn):
    x, w = torch.randn(3, 8), torch.randn(8)
    _expect_raise("normalized_shape (7,) on rows of 8", lambda: fn(x, (7,), w, 1e-5))
    _expect_raise("a weight of 5 on rows of 8", lambda: fn(x, (8,), torch.randn(5), 1e-5))


def _swiglu_bad(fn):
    _expect_raise("an odd last dimension (7)", lambda: fn(torch.randn(3, 7)))


def _ce_bad(fn):
    _expect_raise("a target equal to V (5)", lambda: fn(torch.randn(3, 5), torch.tensor([0, 5, 1])))
    _expect_raise("a negative target other than ignore_index", lambda: fn(torch.randn(3, 5), torch.tensor([0, -2, 1])))
    _expect_raise("3 targets for 4 rows", lambda: fn(torch.randn(4, 5), torch.tensor([0, 1, 2])))


def _rope_bad(fn):
    _expect_raise("cos of the wrong width", lambda: fn(torch.randn(1, 2, 3, 8), torch.randn(3, 3), torch.randn(3, 3)))


SLOTS: dict[str, Slot] = {
    "rms_norm": Slot(_rms_norm_make, lambda fn, t: fn(t["x"], (t["x"].shape[-1],), t["weight"], 1e-5),
                     ("x", "weight"), WIDTHS, _rms_norm_bad),
    "swiglu": Slot(_swiglu_make, lambda fn, t: fn(t["x"]), ("x",), WIDTHS, _swiglu_bad),
    "cross_entropy": Slot(_ce_make, lambda fn, t: fn(t["logits"], t["targets"]), ("logits",), WIDTHS, _ce_bad),
    "rope": Slot(_rope_make, lambda fn, t: fn(t["q"].transpose(1, 2), t["cos"], t["sin"]), ("q",),
                 [w for w in range(2, 301, 2)] + [512, 1024, 4096, 8192], _rope_bad),
}


COVERED = [*SLOTS, "adamw"]  # the slots check has a suite for


def _evaluate(kernel_slot: Slot, fn: Callable, tensors: dict, dtype=torch.float32, strided: str | None = None) -> dict:
    """The output and the gradients of a fixed random weighting of it; with
    ``strided``, that input reaches fn as a column slice of a wider tensor
    (the same values, other strides; its gradient flows back through the copy)."""
    leaves = {k: v.detach().clone().requires_grad_(k in kernel_slot.differentiated)
              for k, v in _floating(tensors, dtype).items()}
    given = dict(leaves)
    if strided is not None:
        width = leaves[strided].shape[-1]
        wide = torch.zeros(*leaves[strided].shape[:-1], 2 * width + 1, dtype=dtype)
        given[strided] = wide[..., 1 : 1 + width]
        given[strided].copy_(leaves[strided])
    out = kernel_slot.call(fn, given)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(upstream)
    return {"out": out.detach(), **{f"d{k}": leaves[k].grad for k in kernel_slot.differentiated}}


# where a case is about to run: isolated_check's child says so on stderr, so a
# crash that ends it names its property and case
TRACE: Callable[[str], None] | None = None


def _at(prop: "_Property", label: str) -> None:
    if TRACE is not None:
        TRACE(json.dumps({"property": prop.name, "case": label}))


class _Property:
    """Figures and the verdict of one property, filled case by case."""

    def __init__(self, name: str) -> None:
        self.name, self.cases, self.bit_identical, self.max_ulp = name, 0, 0, 0
        self.worst = "bitwise"
        self.failures: list[str] = []

    def verdict(self, verdict: str, why: str | None = None) -> None:
        if VERDICTS.index(verdict) > VERDICTS.index(self.worst):
            self.worst = verdict
        if why is not None and len(self.failures) < 5:
            self.failures.append(why)

    def compare(self, label: str, ours: dict, theirs: dict, exact: dict) -> None:
        self.cases += 1
        same = all(differing_elements(ours[k], theirs[k]) == 0 for k in theirs)
        self.bit_identical += same
        for k in theirs:
            if ours[k] is None or ours[k].shape != theirs[k].shape:
                self.verdict("wrong", f"{label} {k}: shape {None if ours[k] is None else tuple(ours[k].shape)}, "
                                      f"torch's {tuple(theirs[k].shape)}")
                return
            self.max_ulp = max(self.max_ulp, max_ulp(ours[k], theirs[k]))
            fig = parity(f"{label} {k}", ours[k], theirs[k], exact[k], *RULES["default"])
            if not fig["ok"]:
                bad = "wrong" if fig["reason"].startswith("not close") else "less accurate"
                self.verdict(bad, f"{fig['name']}: {fig['reason']}")
        if not same:
            self.verdict("as accurate as torch")

    def report(self) -> dict:
        return {"property": self.name, "cases": self.cases, "bit_identical": self.bit_identical,
                "max_ulp": self.max_ulp, "verdict": self.worst, "failures": self.failures}


def _run_case(prop: _Property, label: str, evaluate: Callable[[Callable, torch.dtype], dict], fn, torch_fn) -> None:
    """evaluate(f, dtype) -> the outputs: the backend's against torch's and torch's in float64."""
    _at(prop, label)
    try:
        ours = evaluate(fn, torch.float32)
    except Exception as err:  # noqa: BLE001 -- a backend raising on valid input is the finding
        prop.cases += 1
        prop.verdict("crashes", f"{label}: {type(err).__name__}: {err}")
        return
    prop.compare(label, ours, evaluate(torch_fn, torch.float32), evaluate(torch_fn, torch.float64))


def _slot_case(kernel_slot: Slot, tensors: dict) -> Callable[[Callable, torch.dtype], dict]:
    return lambda f, dtype: _evaluate(kernel_slot, f, tensors, dtype)


def _widths(kernel_slot, fn, torch_fn, g) -> _Property:
    prop = _Property("widths")
    for width in kernel_slot.widths:
        for rows in ROWS:
            _run_case(prop, f"width={width},rows={rows}", _slot_case(kernel_slot, kernel_slot.make(width, rows, g)),
                      fn, torch_fn)
    return prop


def _options(kernel, kernel_slot, fn, torch_fn, g) -> _Property:
    """What the slot's contract passes besides the plain call, each as the slot with another call."""
    prop = _Property("options")
    variants = {
        "rms_norm": [("no weight", replace(kernel_slot, differentiated=("x",),
                                           call=lambda f, t: f(t["x"], (t["x"].shape[-1],), None, 1e-5)))],
        "swiglu": [("3-D input", replace(kernel_slot, call=lambda f, t: f(t["x"].reshape(3, 1, -1))))],
        "cross_entropy": [("label_smoothing=0.1", replace(
            kernel_slot, call=lambda f, t: f(t["logits"], t["targets"], label_smoothing=0.1)))],
        "rope": [],
    }[kernel]
    for width in (7, 64, 257, 1000):
        for name, variant in variants:
            _run_case(prop, f"width={width},{name}", _slot_case(variant, kernel_slot.make(width, 3, g)), fn, torch_fn)
    return prop


def _non_contiguous(kernel_slot, fn, g) -> _Property:
    """The first differentiated input as a column slice of a wider tensor: the same bits as contiguous."""
    prop = _Property("non_contiguous")
    first = kernel_slot.differentiated[0]
    for width in (8, 34, 1000):  # even: rope's head dim is
        tensors = kernel_slot.make(width, 3, g)
        label = f"width={width}"
        _at(prop, label)
        try:
            plain = _evaluate(kernel_slot, fn, tensors)
            view = _evaluate(kernel_slot, fn, tensors, strided=first)
        except Exception as err:  # noqa: BLE001
            prop.cases += 1
            prop.verdict("crashes", f"{label}: {type(err).__name__}: {err}")
            continue
        prop.cases += 1
        if all(differing_elements(view[k], plain[k]) == 0 for k in plain):
            prop.bit_identical += 1
        else:
            prop.verdict("wrong", f"{label}: a strided {first} gives other values than a contiguous one")
    return prop


def _at_thread_counts(prop: _Property, what: str, run: Callable[[], dict]) -> _Property:
    """run() at 1 and 2 torch threads: one case, bit-identical or nondeterministic."""
    before = torch.get_num_threads()
    results = []
    _at(prop, what)
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(run())
    except Exception as err:  # noqa: BLE001
        prop.verdict("crashes", f"{type(err).__name__}: {err}")
    finally:
        torch.set_num_threads(before)
    prop.cases += 1
    if len(results) == 2:
        if all(differing_elements(results[0][k], results[1][k]) == 0 for k in results[0]):
            prop.bit_identical += 1
        else:
            prop.verdict("nondeterministic", f"1 and 2 torch threads give different bits ({what})")
    return prop


def _threads(kernel_slot, fn, g) -> _Property:
    tensors = kernel_slot.make(4096, 64, g)  # above every OpenMP threshold of ckparity's kernels
    return _at_thread_counts(_Property("threads"), "64 rows of 4096", lambda: _evaluate(kernel_slot, fn, tensors))


def _bad_input(kernel_slot, fn) -> _Property:
    prop = _Property("bad_input")
    _at(prop, "bad shapes and targets")
    prop.cases += 1
    try:
        kernel_slot.bad(fn)
        prop.bit_identical += 1
    except _Accepted as accepted:
        prop.verdict("wrong", f"accepted {accepted} without an error")
    return prop


# ---- torch_inputs: torch's own OpInfo samples, those within the slot's contract --

def _rms_norm_sample(s):
    shape, weight = s.args[0], (s.args[1] if len(s.args) > 1 else s.kwargs.get("weight"))
    eps = s.kwargs.get("eps", 1e-5)
    if len(shape) != 1 or eps is None or eps < 0:  # the slot normalizes the last dimension, eps >= 0
        return None
    tensors = {"x": s.input, **({"weight": weight} if weight is not None else {})}
    return (lambda f, t: f(t["x"], tuple(shape), t.get("weight"), eps)), tensors, tuple(tensors)


def _ce_sample(s):
    target = s.args[0]
    extra = {k: v for k, v in s.kwargs.items() if not (k == "reduction" and v == "mean")}
    if s.input.dim() != 2 or target.dtype != torch.int64 or extra:  # (N, V) logits, class targets, the mean
        return None
    return (lambda f, t: f(t["logits"], t["targets"])), {"logits": s.input, "targets": target}, ("logits",)


def _silu_sample(s):
    if s.input.dim() == 0:  # swiglu needs a last dimension of 2H
        return None
    x = torch.cat([s.input.detach(), torch.ones_like(s.input.detach())], dim=-1)  # silu(gate) * 1 is silu(gate)
    return (lambda f, t: f(t["x"])), {"x": x}, ("x",)


OPINFO = {"rms_norm": ("nn.functional.rms_norm", _rms_norm_sample),
          "cross_entropy": ("nn.functional.cross_entropy", _ce_sample),
          "swiglu": ("nn.functional.silu", _silu_sample)}


def _torch_inputs(kernel: str, fn, torch_fn, not_run: dict) -> _Property:
    prop = _Property("torch_inputs")
    if kernel not in OPINFO:
        return prop
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as err:  # torch's test inputs need expecttest
        not_run["torch_inputs"] = f"torch's OpInfo samples need expecttest ({err}); pip install expecttest"
        return prop
    name, adapt = OPINFO[kernel]
    op = next(o for o in op_db if o.name == name and o.variant_test_name == "")
    for k, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=True)):
        case = adapt(sample)
        if case is None:
            continue
        call, tensors, differentiated = case
        tensors = {key: t.detach() for key, t in tensors.items()}
        kernel_slot = Slot(None, call, differentiated, [], None)
        _run_case(prop, f"{name} sample {k} {tuple(tensors[differentiated[0]].shape)}",
                  _slot_case(kernel_slot, tensors), fn, torch_fn)
    return prop


# ---- adamw: the optimizer slot, stepped rather than differentiated ------------

ADAMW_STEPS = 20
ADAMW_SIZES = list(range(1, 301)) + [511, 1023, 4095, 4097, 8191, 65537]


def _adamw_run(make: Callable, size: int, seed: int, dtype=torch.float32) -> dict:
    """ADAMW_STEPS steps of the optimizer ``make`` builds, as the harness calls it, on one
    tensor of ``size`` with seeded gradients: the param and the moments under torch's names."""
    g = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(size, generator=g).to(dtype))
    optimizer = make([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    for _ in range(ADAMW_STEPS):
        p.grad = torch.randn(size, generator=g).to(dtype)
        optimizer.step()
    state = optimizer.state[p]
    return {"param": p.detach(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}


def adamw_sizes(fn: Callable, torch_fn: Callable, sizes: list[int]) -> _Property:
    """The optimizer ``fn`` makes against torch's AdamW and float64, one case per size."""
    prop = _Property("sizes")
    for size in sizes:
        _run_case(prop, f"size={size}", lambda f, dtype, size=size: _adamw_run(f, size, size, dtype), fn, torch_fn)
    return prop


def _adamw_properties(fn: Callable, torch_fn: Callable) -> list[Callable[[], _Property]]:
    """sizes: every tensor size 1..300 and large odd ones, against torch's AdamW and
    float64 (torch's AdamW on float64 params); threads: a large tensor at 1 and 2
    threads, the same bits."""
    # 200003 params: several of the C AdamW's 65536-float chunks
    return [lambda: adamw_sizes(fn, torch_fn, ADAMW_SIZES),
            lambda: _at_thread_counts(_Property("threads"), "200003 params", lambda: _adamw_run(fn, 200003, 7))]


def check(kernel: str, backend: str, seed: int = 0) -> dict:
    """The conformance report (schema ckparity.check/1) of one backend of one slot."""
    kernel = slot(kernel)
    if kernel not in COVERED:
        raise ValueError(f"ckparity check covers {', '.join(COVERED)}; {kernel!r} is not among them yet")
    resolve(kernel, backend)
    fn, torch_fn = backends.BACKENDS[kernel][backend], backends.BACKENDS[kernel]["torch"]
    start, not_run = time.perf_counter(), {}
    if kernel == "adamw":
        runs = _adamw_properties(fn, torch_fn)
    else:
        kernel_slot, g = SLOTS[kernel], torch.Generator().manual_seed(seed)
        runs = [lambda: _widths(kernel_slot, fn, torch_fn, g), lambda: _options(kernel, kernel_slot, fn, torch_fn, g),
                lambda: _non_contiguous(kernel_slot, fn, g), lambda: _threads(kernel_slot, fn, g),
                lambda: _bad_input(kernel_slot, fn), lambda: _torch_inputs(kernel, fn, torch_fn, not_run)]
    rows = []
    for run in runs:  # in order: the generator's draws follow it
        prop = run()
        if prop.cases:
            rows.append(prop.report())
            if TRACE is not None:
                TRACE(json.dumps({"row": rows[-1]}))
    overall = max((r["verdict"] for r in rows), key=VERDICTS.index)
    return {"schema": SCHEMA, "kernel": kernel, "backend": backend, "capability": cpu.capability(),
            "properties": rows, "not_run": not_run, "verdict": overall, "passed": overall not in FAILING,
            "seconds": round(time.perf_counter() - start, 1)}


_CHILD = ("import json, sys; from ckparity import check, plugins; plugins.load_configured(); "
          "check.TRACE = lambda line: print(line, file=sys.stderr, flush=True); "
          "print(json.dumps(check.check(sys.argv[1], sys.argv[2], int(sys.argv[3]))))")


def isolated_check(kernel: str, backend: str, seed: int = 0) -> dict:
    """check() in a child process (the same plugins, through CKP_PLUGINS):
    a child that dies -- a segfault or an abort in the backend's C -- gives
    the verdict "crashes", with how it ended and the property and case it
    was running (the child's TRACE lines). Bad arguments raise ValueError
    here, before the child starts."""
    kernel = slot(kernel)
    if kernel not in COVERED:
        raise ValueError(f"ckparity check covers {', '.join(COVERED)}; {kernel!r} is not among them yet")
    resolve(kernel, backend)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHILD, kernel, backend, str(seed)], capture_output=True, text=True,
                          env=os.environ)
    if done.returncode == 0:
        return json.loads(done.stdout)
    ending = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
              else f"exit {done.returncode}")
    rows, cases, other = [], [], []
    for line in done.stderr.splitlines():
        traced = json.loads(line) if line.startswith(('{"property"', '{"row"')) else None
        if traced is None:
            other.append(line)
        elif "row" in traced:
            rows.append(traced["row"])  # a property that finished before the crash
        else:
            cases.append(traced)
    last = cases[-1] if cases else {"property": None, "case": None}
    if last["property"] is not None and last["property"] not in {r["property"] for r in rows}:
        rows.append({"property": last["property"], "cases": sum(c["property"] == last["property"] for c in cases),
                     "bit_identical": None, "max_ulp": None, "verdict": "crashes",
                     "failures": [f"{last['case']}: the check's process was {ending}"]})
    return {"schema": SCHEMA, "kernel": kernel, "backend": backend, "capability": cpu.capability(),
            "properties": rows, "verdict": "crashes", "passed": False,
            "crash": {"ending": ending, "property": last["property"], "case": last["case"],
                      "stderr": " ".join(other[-3:])[-500:]},
            "seconds": round(time.perf_counter() - start, 1)}


def table(report: dict) -> str:
    lines = [f"ckparity check {report['kernel']} --backend {report['backend']}: {report['verdict']} "
             f"({report['seconds']} s)", "| property | cases | bit-identical | max ULP | verdict | first failure |",
             "|---|---|---|---|---|---|"]
    for r in report["properties"]:
        lines.append(f"| {r['property']} | {r['cases']} | {r['bit_identical']} | {r['max_ulp']} | {r['verdict']} | "
                     f"{(r['failures'] or ['-'])[0]} |")
    if report.get("crash"):
        crash = report["crash"]
        lines.append(f"the check's process was {crash['ending']} in {crash['property']}, case {crash['case']}; "
                     "the properties after it did not run")
    return "\n".join(lines)

