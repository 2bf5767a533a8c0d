"""The C GEMM's speed against torch's MKL sgemm: GFLOP/s of y = x.Wᵀ at 1 and 2 threads, the sides
timed in turn (best of 5 after a warm-up), as a ratio (timings on a shared machine move 2-3x within
an hour; the ratio of the same run is what is compared). Writes reports/bench/gemm_speed.json.
With --bf16-aten (where torch runs ATen's own bf16 loops): F.linear's forward and backward in bf16 (its three
GEMMs, each loop once) against torch's, at 2 threads; writes reports/bench/gemm_speed_bf16_aten.json. With
--bf16-onednn (where torch runs oneDNN's bf16 brgemm): the same at 1 and 2 threads, on the twins' shapes and
(2048 x 4096) x (4096 x 4096); writes reports/bench/gemm_speed_bf16_onednn.json.

    .venv/bin/python scripts/gemm_speed.py [--bf16-aten | --bf16-onednn] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import ckparity
from ckparity import cpu
from ckparity.ops import _aten_bf16
from ckparity.ops.linear import gemm, linear

SHAPES = ((512, 64, 256), (1024, 1024, 1024), (512, 256, 1024), (2048, 4096, 4096))


def best(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def best_in_turn(ours, theirs, repeats: int = 5) -> tuple[float, float]:
    """The best time of each side over ``repeats`` rounds, the sides alternating (a machine's speed drifts within a
    run: alternating puts both sides under the same drift)."""
    ours(), theirs()
    times = ([], [])
    for _ in range(repeats):
        for side, fn in zip(times, (ours, theirs)):
            start = time.perf_counter()
            fn()
            side.append(time.perf_counter() - start)
    return min(times[0]), min(times[1])


def bf16_rows(onednn: bool) -> list[dict]:
    """F.linear in bf16, forward and backward, ckparity's against torch's: where torch runs ATen's own loops (at 2
    threads), or where it runs oneDNN (``onednn``: at 1 and 2 threads, the twins' shapes and the large one)."""
    import torch.nn.functional as F

    if _aten_bf16.torch_runs_aten() == onednn:
        raise SystemExit(f"torch runs {'ATen' if onednn else 'oneDNN'}'s loops for bf16 matmul here")
    shapes = ((512, 64, 256), (1024, 256, 1024), (512, 1024, 1024), (2048, 4096, 4096)) if onednn else \
        ((512, 64, 256), (1024, 256, 1024), (256, 1024, 256))
    rows = []
    for threads in (1, 2) if onednn else (2,):
        torch.set_num_threads(threads)
        ckparity.set_num_threads(threads)
        for M, K, N in shapes:
            x = torch.randn(M, K).bfloat16().requires_grad_(True)
            w, up = torch.randn(N, K).bfloat16().requires_grad_(True), torch.randn(M, N).bfloat16()
            ours, theirs = best_in_turn(*(lambda f=f: f(x, w).backward(up) for f in (linear, F.linear)),
                                        repeats=3 if M * K * N > 1 << 30 else 10)
            rows.append({"threads": threads, "M": M, "K": K, "N": N, "ckparity_ms": round(ours * 1e3, 2),
                         "torch_ms": round(theirs * 1e3, 2), "ratio": round(theirs / ours, 3)})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bf16-aten", action="store_true")
    parser.add_argument("--bf16-onednn", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.bf16_aten or args.bf16_onednn:
        kind = "onednn" if args.bf16_onednn else "aten"
        report = {"schema": f"ckparity.gemm_speed_bf16_{kind}/1", "torch_capability":
                  torch.backends.cpu.get_cpu_capability(), "onednn_isa": cpu.onednn_isa(),
                  "what": "F.linear bf16 forward + backward, best of each side, the sides in turn",
                  "rows": bf16_rows(args.bf16_onednn)}
        with open(args.out or f"reports/bench/gemm_speed_bf16_{kind}.json", "w") as f:
            json.dump(report, f, indent=1)
        return
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
    with open(args.out or "reports/bench/gemm_speed.json", "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
