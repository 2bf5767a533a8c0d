"""The suite ``ckparity check`` runs in one process: the properties of one
backend, in order, and the report (schema ckparity.check/1)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import torch

from .. import cpu, kernels
from .._tensors import DTYPES
from . import cheats, properties
from .properties import adamw_sizes
from ..harness.basics.junit import TestCase
from .rule import check_passes, gate_passes, worst

SCHEMA = "ckparity.check/1"
HELPER_NOT_APPLICABLE = ("not applicable: the ckparity.plugin helper hands your C contiguous float32 copies and "
                         "checks shapes itself, so this would test the helper, not your kernel")


def covered() -> list[str]:
    """The slots check has a suite for: the records with conformance cases."""
    return [name for name, k in kernels.KERNELS.items() if k.conformance is not None]


def record_of(kernel: str) -> kernels.Kernel:
    """The record of the slot ``kernel`` names; ValueError if check has no suite for it."""
    kernel = kernels.slot(kernel)
    if kernel not in covered():
        raise ValueError(f"ckparity check covers {', '.join(covered())}; {kernel!r} is not among them yet")
    return kernels.KERNELS[kernel]




def _in_dtype(kernel_slot, dtype: torch.dtype):
    """The slot with its cases' values rounded to ``dtype`` (so that torch in
    float64 evaluates the very values the backend and torch get in ``dtype``)."""
    if dtype == torch.float32:
        return kernel_slot

    def make(width, rows, g):
        return {k: v.to(dtype).float() if v.is_floating_point() else v
                for k, v in kernel_slot.make(width, rows, g).items()}
    return replace(kernel_slot, make=make)


def refuses(kernel: str, backend: str, dtype: str) -> str | None:
    """Why ``backend`` of ``kernel`` refuses ``dtype`` inputs, or None where
    it takes them: a run in ``dtype`` asks before it starts (a slot without
    check cases is called once on a small case of its own)."""
    record = kernels.KERNELS[kernels.slot(kernel)]
    fn, torch_dtype = record.backends[backend], DTYPES[dtype]
    if record.conformance is None:  # clip_grad_norm: a (3,) parameter's gradient
        p = torch.nn.Parameter(torch.ones(3, dtype=torch_dtype))
        p.grad = torch.ones(3, dtype=torch_dtype)
        try:
            fn([p], 1.0)
        except TypeError as err:
            return f"{type(err).__name__}: {err}"
        return None
    return _refuses(record, fn, _in_dtype(record.conformance, torch_dtype), torch_dtype)


def _refuses(record, fn, kernel_slot, dtype: torch.dtype) -> str | None:
    """Why ``fn`` refuses ``dtype`` inputs (a TypeError, ckparity's InvalidType
    among them, on a small case), or None where it takes them."""
    try:
        if record.optimizer:
            properties.adamw_run(fn, 3, 0, 1, dtype, values=dtype)
        else:
            properties.evaluate(kernel_slot, fn, kernel_slot.make(8, 3, torch.Generator().manual_seed(0)), dtype)
    except TypeError as err:
        return f"{type(err).__name__}: {err}"
    except Exception:  # noqa: BLE001 -- any other failure is the suite's to report, case by case
        pass
    return None


def check(kernel: str, backend: str, seed: int = 0, adamw: dict | None = None, dtype: str = "float32") -> dict:
    """The conformance report (schema ckparity.check/1) of one backend of one
    slot, in this process (``run`` puts it in a child). ``adamw``: the
    optimizer slot's ``sizes`` and ``steps`` instead of the record's (the
    optimizer_parity gate's settings); its threads property is then not run.
    ``dtype``: "bfloat16" runs every case in bf16 against torch in bf16 (and
    float64 of the same values), max ULP in bf16 ULPs, assert_close's bf16
    tolerances; a backend that refuses bf16 (a TypeError) is "not supported"."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    record = record_of(kernel)
    kernels.resolve(record.name, backend)
    fn, torch_fn = record.backends[backend], record.backends["torch"]
    registration = record.registrations.get(backend, kernels.Registration())
    torch_dtype = DTYPES[dtype]
    kernel_slot = _in_dtype(record.conformance, torch_dtype)
    start, not_run, refused_options = time.perf_counter(), {}, {}
    refused = _refuses(record, fn, kernel_slot, torch_dtype) if torch_dtype != torch.float32 else None
    if refused is not None:
        row = {"property": f"dtype {dtype}", "cases": 0, "bit_identical": 0, "failing": 0, "max_ulp": 0,
               "verdict": "not supported", "groups": {}, "worst": [], "failures": [f"refuses {dtype}: {refused}"]}
        return {"schema": SCHEMA, "kernel": record.name, "backend": backend, "dtype": dtype,
                "capability": cpu.capability(), "properties": [row], "not_run": {}, "verdict": "not supported",
                "passed": True, "passes_gates": True, "seconds": round(time.perf_counter() - start, 1)}
    # a registered backend's contract (planted faults, put in the registry by kernels.register, have none)
    runs = [lambda: properties.contract(record, fn)] if backend in record.registrations else []
    if record.optimizer:
        if adamw:
            runs += [lambda: adamw_sizes(fn, torch_fn, adamw["sizes"], adamw["steps"], torch_dtype)]
        else:
            runs += [lambda: adamw_sizes(fn, torch_fn, kernel_slot.widths, dtype=torch_dtype),
                     lambda: properties.adamw_threads(fn, torch_dtype)]
    else:
        g = torch.Generator().manual_seed(seed)
        helper = getattr(fn, "ckparity_helper", None) is not None
        if helper:
            not_run.update(layouts=HELPER_NOT_APPLICABLE, threads=HELPER_NOT_APPLICABLE)
            if any(b.kind == "shape" for b in kernel_slot.bad):
                not_run["bad_input (shapes)"] = HELPER_NOT_APPLICABLE
        runs += [lambda: properties.widths(kernel_slot, fn, torch_fn, g, torch_dtype),
                 lambda: properties.options(kernel_slot, fn, torch_fn, g, registration.unsupported, torch_dtype,
                                            refused_options)]
        if not helper:  # the last properties that draw from g: skipping them changes no other case
            runs += [lambda: properties.layouts(kernel_slot, fn, torch_fn, g, torch_dtype),
                     lambda: properties.threads(kernel_slot, fn, torch_fn, g, torch_dtype)]
        # its own generator: the properties before it draw the same cases with or without it
        runs += [lambda: properties.batch_invariance(kernel_slot, fn, torch_fn, torch.Generator().manual_seed(seed),
                                                     torch_dtype),
                 lambda: properties.non_finite(kernel_slot, fn, torch_fn, torch.Generator().manual_seed(seed),
                                               torch_dtype)]
        runs += [lambda: properties.bad_input(kernel_slot, fn, {"value"} if helper else {"shape", "value"}),
                 lambda: properties.torch_inputs(kernel_slot, fn, torch_fn, not_run, torch_dtype)]
        if backend != "torch":  # torch's own backend is torch's op
            runs += [lambda: cheats.cheats(kernel_slot, record.torch_ops, fn, torch_fn,
                                           torch.Generator().manual_seed(seed), torch_dtype)]
    rows = []
    for run in runs:  # in order: the generator's draws follow it
        started = time.perf_counter()
        prop = run()
        if prop.cases:
            rows.append(dict(prop.report(), seconds=round(time.perf_counter() - started, 3)))
            if properties.TRACE is not None:
                properties.TRACE(json.dumps({"row": rows[-1]}))
    rows += [{"property": f"option {name}", "cases": 0, "bit_identical": 0, "failing": 0, "max_ulp": 0,
              "verdict": "not supported", "groups": {}, "worst": [],
              "failures": ["declared unsupported at registration"]} for name in sorted(registration.unsupported)]
    rows += [{"property": f"option {name} ({dtype})", "cases": 0, "bit_identical": 0, "failing": 0, "max_ulp": 0,
              "verdict": "not supported", "groups": {}, "worst": [], "failures": [f"refuses it in {dtype}: {why}"]}
             for name, why in sorted(refused_options.items())]
    overall = worst(r["verdict"] for r in rows)
    return {"schema": SCHEMA, "kernel": record.name, "backend": backend, "dtype": dtype,
            "capability": cpu.capability(),
            "properties": rows, "not_run": not_run, "verdict": overall, "passed": check_passes(overall),
            "passes_gates": gate_passes(overall), "seconds": round(time.perf_counter() - start, 1)}


def table(report: dict) -> str:
    dtype = f" --dtype {report['dtype']}" if report.get("dtype", "float32") != "float32" else ""
    lines = [f"ckparity check {report['kernel']} --backend {report['backend']}{dtype}: {report['verdict']} "
             f"({report['seconds']} s)", "| property | cases | failing | bit-identical | max ULP | verdict | "
             "worst failure |", "|---|---|---|---|---|---|---|"]
    for r in report["properties"]:
        failing = r.get("failing")
        by_group = ", ".join(f"{g} {v['failing']}/{v['cases']}" for g, v in (r.get("groups") or {}).items()
                             if v["failing"])
        lines.append(f"| {r['property']} | {r['cases']} | {failing}{f' ({by_group})' if by_group else ''} | "
                     f"{r['bit_identical']} | {r['max_ulp']} | {r['verdict']} | {(r['failures'] or ['-'])[0]} |")
    for name, why in (report.get("not_run") or {}).items():
        lines.append(f"not run: {name}: {why}")
    if report.get("crash"):
        crash = report["crash"]
        lines.append(f"the check's process was {crash['ending']} in {crash['property']}, case {crash['case']}; "
                     "the properties after it did not run")
    if report.get("isolated") is False:
        lines.append(f"checked in this process: {report['in_process_because']}")
    return "\n".join(lines)



def junit_cases(reports: list[dict]) -> list:
    """A JUnit test case per property of each report, failing where check fails it (wrong, crashes)."""
    cases = []
    for report in reports:
        for r in report["properties"]:
            failed = not check_passes(r["verdict"])
            cases.append(TestCase(f"ckparity.check.{report['kernel']}.{report['backend']}", r["property"],
                                  r.get("seconds", 0.0),  # an option the backend declared unsupported: not run
                                  failure=f"{r['verdict']}: {(r['failures'] or ['-'])[0]}" if failed else None,
                                  output=f"verdict {r['verdict']}; cases {r['cases']}, failing {r['failing']}, "
                                         f"bit-identical {r['bit_identical']}, max ULP {r['max_ulp']}"))
    return cases
