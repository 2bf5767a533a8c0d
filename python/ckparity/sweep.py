"""The bit-identity sweep: every claim a kernel's record makes (its
``claims``: quantities bit-identical to torch), checked against torch over
every width 1..300 and some large ones, at the CPU capability this process
runs at.

    python -m ckparity.sweep [--dtype float32|bfloat16] [--kernels swiglu,rms_norm] [--json-out F|-]

Under ``ATEN_CPU_CAPABILITY=default|avx2|avx512`` (torch reads it at start-up)
the same sweep runs at a lower capability: tests/test_capability.py runs it
in one subprocess per capability the CPU can execute. Vector tails and
blockings hide in the widths, so the widths are all of 1..300 plus large
ones (kernels.WIDTHS); the row counts take ATen's row paths (one row, fewer
rows than its four accumulators, leftovers, multi-block). Each claim's sweep
is written in its record (kernels/<kernel>.py), with its reference. torch
runs single-threaded where its thread split could cut a row, except in the
cases that are about that split: a sum torch reduces to one value of >=
32768 elements is split across its threads, and ptref and rms_norm follow
it for torch's thread count at the call (those cases run torch, and so the
kernel, on 2..4 threads).

The result, per claim and quantity: how many cases were swept and which
were not bit-identical. It claims exactly what it swept.
"""

from __future__ import annotations

import argparse
import sys

import torch

from . import cpu, kernels
from .harness.basics.report import check_writable, write_json
from .kernels.layouts import applicable, contiguous_copy, run as run_case
from .kernels.sweeping import Tally, same_bits


DTYPES = ("float32", "bfloat16", "float16")  # float16: rms_norm, swiglu and rope


def claims(dtype: str = "float32") -> dict[str, kernels.Claim]:
    """The claims of ``dtype``, by key (``rms_norm``, ``cross_entropy.ptref``)."""
    return {c.key: c for c in kernels.claims(dtype)}


def run(keys=None, seed: int = 0, dtype: str = "float32", held_only: bool = False) -> dict:
    """The sweep of the ``dtype`` claims ``keys`` (default: all, and the layouts sweep) at this
    process's capability. A claim whose condition fails here is swept and reported all the same (the
    figures say how far off it is), unless ``held_only``: then only its reason is (a gate that asserts
    the held claims need not pay for the others)."""
    known = claims(dtype)
    results, not_here = {}, {}
    for key in keys or known:
        reason = known[key].reason_not_here()
        if reason:
            not_here[key] = reason
            if held_only:
                continue
        tally = Tally()
        known[key].sweep(tally, torch.Generator().manual_seed(seed))
        results[key] = tally.result()
    report = {"schema": "ckparity.sweep/1", "capability": cpu.capability(), "torch": torch.__version__,
              "mkl_branch": cpu.mkl_branch(), "mkl_strict": cpu.mkl_strict(), "onednn_isa": cpu.onednn_isa(), "dtype": dtype, "kernels": results, "not_claimed_here": not_here}
    if keys is None:
        report["layouts"] = layouts(dtype, seed)
    return report


def _attempt(fn):
    try:
        return fn(), None
    except Exception as err:  # noqa: BLE001 -- both sides' errors are compared by the caller
        return None, err


def layouts(dtype: str = "float32", seed: int = 0, records=None) -> dict:
    """Every tensor argument of every record's layout cases (Kernel.layouts) in every layout torch accepts
    (kernels/layouts.py): the bits of the same call on a contiguous copy ("as a contiguous copy"), torch's
    bits where a claim covers the call ("torch's bits"; where torch's own bits on the layout are not its
    bits on the copy, listed instead: ckparity's result does not depend on a layout), and an error exactly
    where torch raises one ("refused as torch refuses": in-place updates of an expanded tensor). A case whose contiguous call
    raises a TypeError is an op that does not take ``dtype`` (float16 cross-entropy): counted, not run.
    ``records``: the kernel records to sweep (default: every one)."""
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    claimed, tally, not_taken, torch_varies = kernels.bit_identical(dtype), Tally(), [], []
    for record in records or kernels.KERNELS.values():
        for case in record.layouts(torch.Generator().manual_seed(seed)) if record.layouts else ():
            def call(fn, layout=None):
                return _attempt(lambda: run_case(case.call, case.differentiated, fn, case.tensors, torch_dtype, layout))
            _, err = call(case.ours)
            if isinstance(err, TypeError):
                not_taken.append(f"{record.name} {case.label}")
                continue
            for name, t in case.tensors.items():
                for layout_name, layout in applicable(t):
                    label = f"{record.name} {case.label}: {name} {layout_name}"
                    (ours, ours_err), (theirs, theirs_err) = call(case.ours, (name, layout)), call(case.theirs, (name, layout))
                    if ours_err is not None or theirs_err is not None:
                        as_torch = theirs_err is not None or f"{name} {layout_name}" in case.refuses
                        tally.outcome("refused as torch refuses", f"{label}: ours {ours_err!r}, torch's {theirs_err!r}",
                                      ours_err is not None and as_torch)
                        continue
                    (copy, _), (theirs_copy, _) = (call(fn, (name, contiguous_copy(layout)))
                                                   for fn in (case.ours, case.theirs))
                    covered = case.claim in claimed
                    for k in ours:
                        tally.add("as a contiguous copy", f"{label} {k}", ours[k], copy[k])
                        if not (covered and (case.claimed_outputs is None or k in case.claimed_outputs)):
                            continue
                        if same_bits(theirs[k], theirs_copy[k]):
                            tally.add("torch's bits", f"{label} {k}", ours[k], theirs[k])
                        else:  # ckparity keeps its contiguous bits (torch's on the copy: the claim's sweep)
                            torch_varies.append(f"{label} {k}")
    return {**tally.result(), "not taken in this dtype": not_taken,
            "where torch's own bits depend on the layout": torch_varies}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckparity.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--kernels", default=None, help="comma-separated claim keys (default: all of the dtype's)")
    parser.add_argument("--json-out", default="-", help="file, or - for standard output")
    args = parser.parse_args(argv)
    known = claims(args.dtype)
    keys = [k for k in (args.kernels or ",".join(known)).split(",") if k]
    unknown = sorted(set(keys) - set(known))
    if unknown:
        parser.error(f"unknown kernels {unknown}; known: {', '.join(known)}")
    check_writable(args.json_out, "--json-out")  # before the sweep, not after
    write_json(args.json_out, run(keys, dtype=args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
