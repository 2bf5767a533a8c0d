"""ckparity check KERNEL --backend NAME: the conformance suite ckparity runs on
its own kernels, run on any registered backend (yours, loaded by --plugin).

Each property is a set of cases run on the backend and on torch (and on
torch in float64, the exact answer's stand-in), with a verdict:

- ``widths``: the record's widths (kernels.WIDTHS: every width 1..300 and
  large ones up to 8191), 1 and 3 rows: vector tails and blockings hide there;
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
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch

from . import cpu, kernels
from .kernels.record import Accepted, Conformance
from .measure import RULES, differing_elements, max_ulp, parity

SCHEMA = "ckparity.check/1"
VERDICTS = ["bitwise", "as accurate as torch", "less accurate", "nondeterministic", "wrong", "crashes"]
FAILING = {"wrong", "crashes"}  # check's exit code: the report is still worth reading below these
# what a gate lets through: a parity gate asks for torch's accuracy, deterministically
GATE_PASSES = {"bitwise", "as accurate as torch"}
ROWS = (1, 3)


def covered() -> list[str]:
    """The slots check has a suite for: the records with conformance cases."""
    return [name for name, k in kernels.KERNELS.items() if k.conformance is not None]


def _floating(t: dict, dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in t.items()}


def _evaluate(kernel_slot: Conformance, fn: Callable, tensors: dict, dtype=torch.float32,
              strided: str | None = None) -> dict:
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


def _slot_case(kernel_slot: Conformance, tensors: dict) -> Callable[[Callable, torch.dtype], dict]:
    return lambda f, dtype: _evaluate(kernel_slot, f, tensors, dtype)


def _widths(kernel_slot, fn, torch_fn, g) -> _Property:
    prop = _Property("widths")
    for width in kernel_slot.widths:
        for rows in ROWS:
            _run_case(prop, f"width={width},rows={rows}", _slot_case(kernel_slot, kernel_slot.make(width, rows, g)),
                      fn, torch_fn)
    return prop


def _options(kernel_slot, fn, torch_fn, g) -> _Property:
    """What the slot's contract passes besides the plain call, each as the slot with another call."""
    prop = _Property("options")
    for width in (7, 64, 257, 1000):
        for name, call, differentiated in kernel_slot.options:
            variant = replace(kernel_slot, call=call, differentiated=differentiated)
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
    except Accepted as accepted:
        prop.verdict("wrong", f"accepted {accepted} without an error")
    return prop


# ---- torch_inputs: torch's own OpInfo samples, those within the slot's contract --

def _torch_inputs(kernel_slot: Conformance, fn, torch_fn, not_run: dict) -> _Property:
    prop = _Property("torch_inputs")
    if kernel_slot.opinfo is None:
        return prop
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as err:  # torch's test inputs need expecttest
        not_run["torch_inputs"] = f"torch's OpInfo samples need expecttest ({err}); pip install expecttest"
        return prop
    name, adapt = kernel_slot.opinfo
    op = next(o for o in op_db if o.name == name and o.variant_test_name == "")
    for k, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=True)):
        case = adapt(sample)
        if case is None:
            continue
        call, tensors, differentiated = case
        tensors = {key: t.detach() for key, t in tensors.items()}
        sample_slot = Conformance(None, call, differentiated, [], None)
        _run_case(prop, f"{name} sample {k} {tuple(tensors[differentiated[0]].shape)}",
                  _slot_case(sample_slot, tensors), fn, torch_fn)
    return prop


# ---- adamw: the optimizer slot, stepped rather than differentiated ------------

ADAMW_STEPS = 20


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


def _adamw_properties(sizes: list[int], fn: Callable, torch_fn: Callable) -> list[Callable[[], _Property]]:
    """sizes: the record's tensor sizes (1..300 and large ones), against torch's AdamW
    and float64 (torch's AdamW on float64 params); threads: a large tensor at 1 and 2
    threads, the same bits."""
    # 200003 params: several of the C AdamW's 65536-float chunks
    return [lambda: adamw_sizes(fn, torch_fn, sizes),
            lambda: _at_thread_counts(_Property("threads"), "200003 params", lambda: _adamw_run(fn, 200003, 7))]


def _record(kernel: str, backend: str) -> kernels.Kernel:
    """The record of the slot ``kernel`` names, with ``backend`` registered; ValueError if check has no suite."""
    kernel = kernels.slot(kernel)
    if kernel not in covered():
        raise ValueError(f"ckparity check covers {', '.join(covered())}; {kernel!r} is not among them yet")
    kernels.resolve(kernel, backend)
    return kernels.KERNELS[kernel]


def check(kernel: str, backend: str, seed: int = 0) -> dict:
    """The conformance report (schema ckparity.check/1) of one backend of one slot."""
    record = _record(kernel, backend)
    fn, torch_fn = record.backends[backend], record.backends["torch"]
    kernel_slot = record.conformance
    start, not_run = time.perf_counter(), {}
    if record.optimizer:
        runs = _adamw_properties(kernel_slot.widths, fn, torch_fn)
    else:
        g = torch.Generator().manual_seed(seed)
        runs = [lambda: _widths(kernel_slot, fn, torch_fn, g), lambda: _options(kernel_slot, fn, torch_fn, g),
                lambda: _non_contiguous(kernel_slot, fn, g), lambda: _threads(kernel_slot, fn, g),
                lambda: _bad_input(kernel_slot, fn), lambda: _torch_inputs(kernel_slot, fn, torch_fn, not_run)]
    rows = []
    for run in runs:  # in order: the generator's draws follow it
        prop = run()
        if prop.cases:
            rows.append(prop.report())
            if TRACE is not None:
                TRACE(json.dumps({"row": rows[-1]}))
    overall = max((r["verdict"] for r in rows), key=VERDICTS.index)
    return {"schema": SCHEMA, "kernel": record.name, "backend": backend, "capability": cpu.capability(),
            "properties": rows, "not_run": not_run, "verdict": overall, "passed": overall not in FAILING,
            "seconds": round(time.perf_counter() - start, 1)}


# the child writes its report to a file of the parent's choosing: a backend that prints cannot corrupt it
_CHILD = ("import json, sys; from ckparity import check, kernels; kernels.load_configured(); "
          "check.TRACE = lambda line: print(line, file=sys.stderr, flush=True); "
          "report = check.check(sys.argv[1], sys.argv[2], int(sys.argv[3])); "
          "open(sys.argv[4], 'w').write(json.dumps(report))")
DEFAULT_TIMEOUT = 1800.0  # seconds: ckparity's own kernels take seconds; a hang is a verdict, not a wait


def isolated_check(kernel: str, backend: str, seed: int = 0, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """check() in a child process (the same plugins, through CKP_PLUGINS):
    a child that dies -- a segfault or an abort in the backend's C -- or
    runs past ``timeout`` seconds gives the verdict "crashes", with how it
    ended and the property and case it was running (the child's TRACE lines).
    The report comes back through a file, not the child's stdout (which a
    backend may print to). Bad arguments raise ValueError here, before the
    child starts; a signal to this process kills the child."""
    kernel = _record(kernel, backend).name
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "report.json"
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, kernel, backend, str(seed), str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
        timed_out = False
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
            timed_out = True
        except BaseException as stopped:  # a signal to check (Interrupted) ends its child too
            proc.kill()
            _, stderr = proc.communicate()
            if hasattr(stopped, "signum"):  # the report of what ran, for the command to write
                stopped.report = _ended_report(kernel, backend, stderr, start, "interrupted",
                                               f"stopped by {signal.Signals(stopped.signum).name} (killed)")
            raise
        if proc.returncode == 0 and out.is_file():
            return json.loads(out.read_text())
    ending = (f"still running after the --timeout of {timeout:g} s (killed)" if timed_out
              else f"killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
              else f"exit {proc.returncode}")
    return _ended_report(kernel, backend, stderr, start, "crashes", ending)


def _ended_report(kernel: str, backend: str, stderr: str, start: float, verdict: str, ending: str) -> dict:
    """The report of a child that did not finish: the properties it finished
    (its TRACE rows), the one it was in with ``verdict``, and how it ended."""
    rows, cases, other = [], [], []
    for line in stderr.splitlines():
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
                     "bit_identical": None, "max_ulp": None, "verdict": verdict,
                     "failures": [f"{last['case']}: the check's process was {ending}"]})
    return {"schema": SCHEMA, "kernel": kernel, "backend": backend, "capability": cpu.capability(),
            "properties": rows, "verdict": verdict, "passed": False,
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

