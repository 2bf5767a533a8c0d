"""The C GEMM's speed against torch's MKL sgemm: GFLOP/s of y = x.Wᵀ at 1 and 2 threads, the sides
timed in turn (best of 5 after a warm-up), as a ratio (timings on a shared machine move 2-3x within
an hour; the ratio of the same run is what is compared). Writes reports/bench/gemm_speed.json.

    .venv/bin/python scripts/gemm_speed.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import ckparity
from ckparity import cpu
from ckparity.ops.linear import gemm

SHAPES = ((512, 64, 256), (1024, 1024, 1024), (512, 256, 1024), (2048, 4096, 4096))


def best(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/bench/gemm_speed.json")
    args = parser.parse_args()
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ckparity.set_num_threads(threads)
        for M, K, N in SHAPES:
            x, w, y = torch.randn(M, K), torch.randn(N, K), torch.empty(M, N)
            ours, theirs = best(lambda: gemm(x, w.t(), y)), best(lambda: torch.mm(x, w.t()))
            flops = 2 * M * N * K / 1e9
            rows.append({"threads": threads, "M": M, "K": K, "N": N, "ckparity_gflops": round(flops / ours, 1),
                         "mkl_gflops": round(flops / theirs, 1), "ratio": round(theirs / ours, 3)})
            print(rows[-1], flush=True)
    report = {"schema": "ckparity.gemm_speed/1", "mkl_branch": cpu.mkl_branch(), "mkl": cpu.mkl_version(),
              "torch_capability": torch.backends.cpu.get_cpu_capability(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
