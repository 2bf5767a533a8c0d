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
Where oneDNN has no AMX but AVX-512's bf16 instructions (an AMD Zen 5, brg_matmul:avx512_core_bf16), W reads
as 2 and a chunk is one float32 chain over K's pairs, each pair's odd-placed term first (VDPBF16PS: [Note:
oneDNN's AVX-512 bf16 order]); the chunks are read by other probes (_onednn._Probe.pair_starts).
The script prints and writes, per shape: W (0 for the pairs' chain), the chunk starts (ckparity.ops._onednn's probes), and how many
of 3 random draws' outputs the model (csrc/linear_bf16.c) gets wrong, and how many the float32 GEMM rounded
once (ckparity's bf16 linear before, and where no order is measured) and the readings the probes tell the
model from (other_readings_differing) get wrong. ckparity.linear measures
each GEMM's order this way at run time (y, dX and dW on their own layouts), checks it, and follows it.
Writes reports/linear/onednn_bf16_order.json.

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

from ckparity.ops import _onednn
from ckparity.ops.linear import _bf16_product

SHAPES = ((8, 64, 256), (64, 256, 64), (64, 300, 1000), (256, 1000, 256), (64, 1000, 1000), (64, 512, 256),
          (64, 2048, 1000), (128, 4096, 128), (256, 4096, 256), (64, 4096, 64))


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
        order = _onednn._Probe(M, K, N, False, True).order()  # F.linear's y: x . Wᵀ, Wᵀ a transposed view
        # the readings the probes tell it from: for the pairs' chain, each pair summed first (AMX tiles of 2) and
        # the chunks not added apart; for AMX tiles, tiles of half the width
        others = {"pairs_summed_first": _onednn.Order(2, order.starts)} if order.width == 0 else \
            {"half_width": _onednn.Order(order.width // 2 + order.width // 2 % 2, order.starts)}
        if order.starts:
            others["one_chunk"] = _onednn.Order(order.width, ())
        wrong = rounded = total = 0
        other_wrong = dict.fromkeys(others, 0)
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            x, w = torch.randn(M, K, generator=g).bfloat16(), torch.randn(N, K, generator=g).bfloat16()
            y = F.linear(x, w)
            wrong += (_onednn.product(x, w.t(), order) != y).sum().item()
            for name, other in others.items():
                other_wrong[name] += (_onednn.product(x, w.t(), other) != y).sum().item()
            rounded += (_bf16_product(x, w.t(), None) != y).sum().item()
            total += y.numel()
        row = {"M": M, "K": K, "N": N, "tile_width": order.width, "pairs_chain": order.width == 0,
               "chunk_starts": list(order.starts), "outputs": total, "model_differing": wrong,
               "float32_rounded_once_differing": rounded, "other_readings_differing": other_wrong}
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
