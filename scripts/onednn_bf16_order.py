"""The order of torch's bfloat16 F.linear (oneDNN's brgemm matmul) on this CPU, measured: issue 54's
"bitwise where you can model this machine's oneDNN order", as far as it goes.

How it is read: a row of x holding +2^30, -2^30 and a single 1 (the weight all ones), y = the row's sum in
oneDNN's order. The 1 survives only where it meets the big pair after they cancel, or in another partial
sum; it is absorbed (2^30 + 1 is 2^30 in float32) where it shares a partial with one of them. Where it
survives, for every placement, says how the terms are grouped.

What it found (Intel Xeon with AMX, oneDNN 3.12's brg_matmul:avx10_1_512_amx, one thread):
  - K is cut into tiles of W terms (32, the AMX tile's depth, at the K tested here but 300, where W = 30);
    in a tile the even-placed terms are one float32 chain and the odd-placed ones another, each from 0
    (every product of two bf16 values is exact in float32, so a chain step is one rounding); the tile adds
    (even + odd) to its chunk's running sum;
  - K is also cut into chunks (by M, N and K: one chunk at most shapes, 3 x 352 at (64, 1000, N >= 256),
    7 x 608 at (256, 4096, 256)) whose sums start from 0 and are added in order; the result is rounded to
    bf16 once.
The script prints and writes, per shape: W, the chunk starts, and how many of 3 random draws' outputs the
model gets wrong, and how many ckparity's bf16 linear (the float32 GEMM rounded once) gets wrong.
Not built into ckparity: W and the chunks are oneDNN's heuristics (not read here), and dX and dW would need
the same probes on their layouts. Writes reports/linear/onednn_bf16_order.json.

    .venv/bin/python scripts/onednn_bf16_order.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from ckparity.ops.linear import linear

BIG = 2.0 ** 30
SHAPES = ((8, 64, 256), (64, 256, 64), (64, 300, 1000), (256, 1000, 256), (64, 1000, 1000), (64, 512, 256),
          (64, 2048, 1000), (128, 4096, 128), (256, 4096, 256), (64, 4096, 64))


def survivors(M: int, K: int, N: int, plus: int, minus: int, ones: list[int]) -> list[int]:
    """Of the placements ``ones``, those whose 1 survives in y = x.ones with +2^30 at ``plus`` and -2^30 at
    ``minus`` (one row per placement, M rows a call: oneDNN's blocking follows the shape)."""
    alive = []
    for s in range(0, len(ones), M):
        part = ones[s:s + M]
        x = torch.zeros(M, K)
        x[:, plus], x[:, minus] = BIG, -BIG
        for r, j in enumerate(part):
            x[r, j] = 1.0
        y = F.linear(x.bfloat16(), torch.ones(N, K).bfloat16()).float()
        alive += [j for r, j in enumerate(part) if y[r, 0] == 1.0]
    return alive


def tile_width(M: int, K: int, N: int) -> int:
    """The first tile's depth: with the pair at 0 and 1 (an even and an odd chain of that tile), the 1s
    absorbed are the tile's; the first that survives is the next tile's first term."""
    alive = survivors(M, K, N, 0, 1, list(range(2, min(K, 70))))
    return min(alive) if alive else K


def chunk_starts(M: int, K: int, N: int, width: int) -> list[int]:
    """Where K's chunks start (besides 0): with +2^30 in the first tile and -2^30 in tile t, a 1 in the
    tile after t survives while t is in the first chunk (the running sum is 0 again there); past the first
    chunk it does not (t's chunk sum holds -2^30 until the chunks are added), and the first survivor is
    the start of the chunk after t's."""
    tiles = list(range(width, K, width))

    def first_alive(t: int) -> int | None:
        alive = survivors(M, K, N, 0, t, [u + 2 for u in range(0, K, width) if u + 2 < K and u != t])
        return min(alive) - 2 if alive else None

    def same_chunk(t: int) -> bool:
        return t == tiles[-1] or first_alive(t) == t + width  # the last tile has no tile after it to ask

    lo, hi = 0, len(tiles)
    while lo < hi:  # the first tile that is not in the first chunk
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if same_chunk(tiles[mid]) else (lo, mid)
    if lo == len(tiles):
        return []
    starts = [tiles[lo]]
    while (nxt := first_alive(starts[-1])) is not None:
        starts.append(nxt)
    return starts


def model(x: torch.Tensor, w: torch.Tensor, width: int, starts: list[int]) -> torch.Tensor:
    """y = x.wᵀ in the measured order, float32 (rounded to bf16 by the caller)."""
    a, b = x.float(), w.float().t()
    K = a.shape[1]
    total = None
    for c0, c1 in zip([0] + starts, starts + [K]):
        chunk = torch.zeros(a.shape[0], b.shape[1])
        for t0 in range(c0, c1, width):
            chains = [torch.zeros_like(chunk), torch.zeros_like(chunk)]
            for k in range(t0, min(t0 + width, c1)):
                chains[(k - t0) % 2] = chains[(k - t0) % 2] + a[:, k:k + 1] * b[k:k + 1, :]  # exact products
            chunk = chunk + (chains[0] + chains[1])
        total = chunk if total is None else total + chunk
    return total


def implementation() -> str:
    """oneDNN's own name for the matmul it runs here (ONEDNN_VERBOSE, read in a fresh process)."""
    code = ("import torch, torch.nn.functional as F; torch.set_num_threads(1); "
            "F.linear(torch.ones(64, 256).bfloat16(), torch.ones(64, 256).bfloat16())")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ONEDNN_VERBOSE": "1"},
                         capture_output=True, text=True).stdout
    lines = [line.split(",")[6] for line in out.splitlines() if ",exec,cpu,matmul," in line]
    return lines[0] if lines else "not oneDNN (no matmul in ONEDNN_VERBOSE)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/onednn_bf16_order.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for M, K, N in SHAPES:
        width = tile_width(M, K, N)
        starts = chunk_starts(M, K, N, width)
        wrong = ours = total = 0
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x, w = torch.randn(M, K, generator=g).bfloat16(), torch.randn(N, K, generator=g).bfloat16()
            y = F.linear(x, w)
            wrong += (model(x, w, width, starts).bfloat16() != y).sum().item()
            ours += (linear(x, w) != y).sum().item()
            total += y.numel()
        row = {"M": M, "K": K, "N": N, "tile_width": width, "chunk_starts": starts, "outputs": total,
               "model_differing": wrong, "ckparity_differing": ours}
        print(row, flush=True)
        rows.append(row)
    report = {"schema": "ckparity.onednn_bf16_order/1", "torch": torch.__version__, "threads": 1,
              "implementation": implementation(), "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
