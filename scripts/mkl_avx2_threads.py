"""Measures how MKL's AVX2 branch shares an sgemm between 2 threads in this process, as [Note: MKL's AVX2 sgemm on
two threads] (csrc/linear.c) states it, and writes reports/linear/mkl_avx2_threads.json (run on a CPU without
AVX-512: MKL's AVX2 branch; 2+ cores).

For every transpose of A and B ('NT': F.linear's y, 'NN': dX, 'TN': dW, 'TT': a column-major x's), C of 2..13 rows
x 2..513 columns x K 1..1000, torch.mm at 2 threads against:
  - the whole product at 1 thread (where they differ, MKL shared it);
  - the Note's rule, written here: C's rows in groups of 4, the first thread ceil(groups / 2) of them, where C has
    12+ columns and K > 16, or K > 4 with 16+ columns, or K > 1 with 100+ -- each share torch.mm at 1 thread,
    written where the share lies. A one-row share of NT or TT is not that (torch.mm of one row is MKL's gemv; MKL's
    share of one row takes its small paths): those are counted apart and measured through ckparity's C only;
  - ckparity's C (ckp_gemm with torch_threads 2), as mm and as addmm with a bias.
Then torch at 4 threads against ckparity's C at 4 (not followed: the count says how far off).

    python scripts/mkl_avx2_threads.py [--out reports/linear/mkl_avx2_threads.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from ckparity.harness.loop.run import environment
from ckparity.kernels.sweeping import same_bits
from ckparity.ops.linear import gemm

KINDS = ("NT", "NN", "TN", "TT")
ROWS = range(2, 14)
COLUMNS = (*range(2, 40, 3), 99, 100, 101, 102, 150, 513)
DEPTHS = (1, 2, 3, 4, 5, 6, 8, 15, 16, 17, 40, 200, 385, 1000)


def first_share(M: int, K: int, N: int) -> int:
    """The Note's rule: the first thread's rows, or 0 where MKL does not share (or sharing moves no bit)."""
    if M < 4 or N < 12 or not (K > 16 or (K > 4 and N > 16) or (K > 1 and N > 100)):
        return 0
    first = 4 * (((M + 3) // 4 + 1) // 2)
    return first if first < M else 0


def operands(kind: str, M: int, K: int, N: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(K, M, generator=g).t() if kind[0] == "T" else torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g).t() if kind[1] == "T" else torch.randn(K, N, generator=g)
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/mkl_avx2_threads.json")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(0)
    counts = {"products": 0, "moved_at_2": 0, "rule_differing": 0, "one_row_shares": 0,
              "ckparity_mm_differing": 0, "ckparity_addmm_differing": 0, "at_4_ckparity_differing": 0}
    examples: dict[str, list] = {"rule_differing": [], "ckparity_differing": [], "at_4": []}
    for kind in KINDS:
        for M in ROWS:
            for N in COLUMNS:
                for K in DEPTHS:
                    a, b = operands(kind, M, K, N, g)
                    bias = torch.randn(N, generator=g)
                    case = f"{kind} M={M} N={N} K={K}"
                    counts["products"] += 1
                    torch.set_num_threads(2)
                    two, two_addmm = a @ b, torch.addmm(bias, a, b)
                    ours, ours_addmm = torch.empty(M, N), torch.empty(M, N)
                    gemm(a, b, ours)
                    gemm(a, b, ours_addmm, bias)
                    torch.set_num_threads(1)
                    one = a @ b
                    counts["moved_at_2"] += not same_bits(one, two)
                    s = first_share(M, K, N)
                    # torch.mm of one row is gemv: such a share is measured through ckparity's C only
                    one_row = bool(s) and M - s == 1 and kind in ("NT", "TT")
                    counts["one_row_shares"] += one_row
                    if not one_row:
                        model = one
                        if s:
                            model = torch.empty(M, N)
                            torch.mm(a[:s], b, out=model[:s])
                            torch.mm(a[s:], b, out=model[s:])
                        if not same_bits(model, two):
                            counts["rule_differing"] += 1
                            examples["rule_differing"].append(case)
                    for q, mine, theirs in (("mm", ours, two), ("addmm", ours_addmm, two_addmm)):
                        if not same_bits(mine, theirs):
                            counts[f"ckparity_{q}_differing"] += 1
                            examples["ckparity_differing"].append(f"{case} {q}")
                    torch.set_num_threads(4)
                    four, ours4 = a @ b, torch.empty(M, N)
                    gemm(a, b, ours4)
                    if not same_bits(four, ours4):
                        counts["at_4_ckparity_differing"] += 1
                        examples["at_4"].append(case)
        print(kind, counts, flush=True)
    torch.set_num_threads(2)
    report = {"env": environment(), "rows": list(ROWS), "columns": list(COLUMNS), "depths": list(DEPTHS),
              "counts": counts, "examples": {k: v[:40] for k, v in examples.items()}}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
