"""Measures where MKL's sgemm applies its alpha on this CPU's branch, and writes
reports/linear/mkl_avx2_alpha.json (run on a CPU without AVX-512: MKL's AVX2 branch; csrc/linear.c's
alpha_packed_with_b states the result).

For each transpose of A and B and each (M, K, N), torch.addmm(C, A, B, beta, alpha = 1/sqrt(24)) at one torch
thread against two readings, the product computed by ckparity's linear (MKL's order where it is followed):
alpha multiplied into B before the product ("in B": C + A.(alpha B)) and alpha on the rounded product ("on the
product": C + alpha (A.B)). The count of elements of each that differ from torch's.

    python scripts/mkl_avx2_alpha.py [--out reports/linear/mkl_avx2_alpha.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from ckparity.harness.loop.run import environment
from ckparity.ops.linear import linear

ALPHA = float(torch.tensor(24 ** -0.5))  # attention's scale at d = 24: not a power of two
# C of 12+ columns (4 rows up, K from 5), and C of under 12 columns (MKL's small path)
SHAPES = ((32, 37, 24), (32, 32, 24), (37, 5, 24), (24, 8, 24), (4, 12, 12), (32, 11, 24), (64, 64, 32),
          (100, 37, 24), (24, 37, 100), (200, 50, 200), (5, 1000, 5), (24, 24, 8), (32, 24, 11), (11, 11, 11))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/mkl_avx2_alpha.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g, alpha = torch.Generator().manual_seed(1), torch.tensor(ALPHA)
    rows = []
    for ta in (False, True):
        for tb in (False, True):
            for M, K, N in SHAPES:
                A = torch.randn(K, M, generator=g).t() if ta else torch.randn(M, K, generator=g)
                B = torch.randn(N, K, generator=g).t() if tb else torch.randn(K, N, generator=g)
                C = torch.randn(M, N, generator=g)
                for beta in (0.0, 1.0):
                    theirs = torch.addmm(C, A, B, beta=beta, alpha=ALPHA)
                    start = C if beta else torch.zeros_like(C)
                    in_b = start + linear(A, (alpha * B).t())
                    on_product = start + alpha * linear(A, B.t())
                    rows.append({"a_transposed": ta, "b_transposed": tb, "M": M, "K": K, "N": N, "beta": beta,
                                 "elements": M * N, "in_b_differing": int((in_b != theirs).sum()),
                                 "on_product_differing": int((on_product != theirs).sum())})
    report = {"env": environment(), "alpha": ALPHA, "shapes": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    wide = [r for r in rows if r["N"] >= 12 and r["M"] >= 4]
    print(f"C of 12+ columns: {sum(r['in_b_differing'] == 0 for r in wide)} of {len(wide)} GEMMs alpha in B exactly; "
          f"under 12: {sum(0 in (r['in_b_differing'], r['on_product_differing']) for r in rows if r['N'] < 12)} of "
          f"{sum(r['N'] < 12 for r in rows)} by either reading")


if __name__ == "__main__":
    main()
