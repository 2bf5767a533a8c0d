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
from .harness.loop.report import check_writable, write_json
from .kernels.sweeping import Tally


DTYPES = ("float32", "bfloat16", "float16")  # float16: rms_norm, swiglu and rope


def claims(dtype: str = "float32") -> dict[str, kernels.Claim]:
    """The claims of ``dtype``, by key (``rms_norm``, ``cross_entropy.ptref``)."""
    return {c.key: c for c in kernels.claims(dtype)}


def run(keys=None, seed: int = 0, dtype: str = "float32") -> dict:
    """The sweep of the ``dtype`` claims ``keys`` (default: all) at this process's capability."""
    known = claims(dtype)
    results = {}
    for key in keys or known:
        tally = Tally()
        known[key].sweep(tally, torch.Generator().manual_seed(seed))
        results[key] = tally.result()
    return {"schema": "ckparity.sweep/1", "capability": cpu.capability(), "torch": torch.__version__,
            "dtype": dtype, "kernels": results}


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
