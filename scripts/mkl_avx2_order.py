"""Measures the K blocks of MKL's sgemm in this process, as [Note: MKL's AVX2 order] (csrc/linear.c) states
them, and writes reports/linear/mkl_avx2_order.json (run on a CPU without AVX-512: MKL's AVX2 branch).

The probe: A all ones; B's column n has zeros before a start i, +2^30 at i, -2^30 at j_n and ones elsewhere.
Where j shares i's chain, the ones between them vanish into 2^30 and C[m, n] is the count of ones after j,
K - 1 - j; where j is in another chain C is something else. So the run of j from i + 1 with C = K - 1 - j is the
rest of i's block, and the next block starts where it ends. A block's last term alone cannot be told from the
end of a chain this way (both give 0), so the report also runs on random inputs, as chained FMAs, the blocks
probed and the Note's blocks (a remainder of 1 alone), and counts the outputs of each that differ from torch.

    python scripts/mkl_avx2_order.py [--out reports/linear/mkl_avx2_order.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F

from ckparity.harness.loop.run import environment

BIG = 2.0 ** 30
# (M, K, N) of F.linear's y: one chain, the halves, K over 384 with remainders 0, 1 and more; rows and columns
# from the smallest the order covers (4 and 12) to large
SHAPES = ((32, 100, 32), (32, 192, 32), (32, 193, 32), (32, 300, 32), (32, 383, 32), (32, 384, 32), (32, 385, 32),
          (32, 577, 32), (32, 1000, 32), (4, 1000, 12), (1024, 1000, 64), (64, 2000, 1024))


def _blocks(M: int, K: int, N: int) -> list[int]:
    sizes, i = [], 0
    while i < K:
        same = {}
        js = list(range(i + 1, K))
        for s in range(0, len(js), N):
            chunk = js[s:s + N]
            w = torch.ones(N, K)  # F.linear's weight: B = w^T, column n of B is row n of w
            w[:, :i] = 0
            w[:, i] = BIG
            for c, j in enumerate(chunk):
                w[c, j] = -BIG
            y = F.linear(torch.ones(M, K), w)
            same.update({j: bool((y[:, c] == K - 1 - j).all()) for c, j in enumerate(chunk)})
        end = i + 1
        while end < K and same[end]:
            end += 1
        sizes.append(end - i)
        i = end
    return sizes


def _chains(x: np.ndarray, w: np.ndarray, blocks: list[range]) -> np.ndarray:
    """y = x.w^T as chained float32 FMAs per block from 0, the blocks added in order (a float64 product is exact,
    the float64 sum rounded to float32 is the FMA but where double rounding lands on a tie: ~2^-29 a step)."""
    out = None
    for ks in blocks:
        acc = np.zeros((x.shape[0], w.shape[0]), np.float32)
        for k in ks:
            acc = (np.outer(x[:, k].astype(np.float64), w[:, k]) + acc).astype(np.float32)
        out = acc if out is None else (out + acc).astype(np.float32)
    return out


def _model(K: int) -> list[int]:
    """The Note's blocks: a depth of K up to 192, K // 2 up to 384, else 192; the remainder alone, last."""
    depth = K if K <= 192 else K // 2 if K <= 384 else 192
    return [depth] * (K // depth) + ([K % depth] if K % depth else [])


def _differing(M: int, K: int, N: int, sizes: list[int], g: torch.Generator) -> int:
    starts = np.cumsum([0] + sizes)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    blocks = [range(s, e) for s, e in zip(starts[:-1], starts[1:])]
    return int((_chains(x.numpy(), w.numpy(), blocks) != F.linear(x, w).numpy()).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/mkl_avx2_order.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rows = []
    for M, K, N in SHAPES:
        sizes = _blocks(M, K, N)
        row = {"M": M, "K": K, "N": N, "blocks_probed": sizes, "blocks_model": _model(K), "outputs": M * N,
               "differing_probed": _differing(M, K, N, sizes, g), "differing_model": _differing(M, K, N, _model(K), g)}
        rows.append(row)
        print(row, flush=True)
    report = {"env": environment(), "shapes": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
