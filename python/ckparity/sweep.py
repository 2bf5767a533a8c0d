"""The bit-identity sweep: every claim a kernel's record makes (its
``claims``: quantities bit-identical to torch), checked against torch over
every width 1..300 and some large ones, at the CPU capability this process
runs at.

    python -m ckparity.sweep [--kernels swiglu,rms_norm] [--json-out F|-]

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
import json
import sys

import torch

from . import cpu, kernels
from .kernels.sweeping import Tally


def claims() -> dict[str, kernels.Claim]:
    """The float32 claims, by key (``rms_norm``, ``cross_entropy.ptref``)."""
    return {c.key: c for c in kernels.claims("float32")}


def run(keys=None, seed: int = 0) -> dict:
    """The sweep of the claims ``keys`` (default: all) at this process's capability."""
    known = claims()
    results = {}
    for key in keys or known:
        tally = Tally()
        known[key].sweep(tally, torch.Generator().manual_seed(seed))
        results[key] = tally.result()
    return {"schema": "ckparity.sweep/1", "capability": cpu.capability(), "torch": torch.__version__,
            "kernels": results}


def main(argv=None) -> int:
    known = claims()
    parser = argparse.ArgumentParser(prog="python -m ckparity.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default=",".join(known), help=f"comma-separated, of {', '.join(known)}")
    parser.add_argument("--json-out", default="-", help="file, or - for standard output")
    args = parser.parse_args(argv)
    keys = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(keys) - set(known))
    if unknown:
        parser.error(f"unknown kernels {unknown}; known: {', '.join(known)}")
    text = json.dumps(run(keys), indent=1)
    if args.json_out == "-":
        print(text)
    else:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
