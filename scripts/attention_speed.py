"""The C attention's speed against torch's SDPA (ATen's flash kernel): causal forward+backward at the llama
preset's shape and at (4, 16, 1024, 64), 1 and 2 threads, the sides timed in turn (best of 5 after a
warm-up: the first calls pay for fresh pages), as a ratio (timings on a shared machine move 2-3x within an
hour; the ratio of the same run is what is compared). `ckparity bench` times a shape this large once; this
script repeats it. Writes reports/bench/attention_speed.json. --dtype bfloat16: the same in bf16 (torch's bf16
flash kernel, the inputs rounded to bf16 once).

    .venv/bin/python scripts/attention_speed.py [--dtype bfloat16] [--out PATH]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import ckparity
from ckparity import cpu
from ckparity.ops.attention import attention
from gemm_speed import best  # scripts/ is this script's first import path: the same timing as the GEMM's

SHAPES = ((8, 4, 2, 64, 64), (4, 16, 16, 1024, 64))  # (batch, query heads, kv heads, T, head dim)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/bench/attention_speed.json")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        ckparity.set_num_threads(threads)
        for B, H, Hkv, T, d in SHAPES:
            g = torch.Generator().manual_seed(0)
            q = torch.randn(B, H, T, d, generator=g).to(dtype).requires_grad_(True)
            k, v = (torch.randn(B, Hkv, T, d, generator=g).to(dtype).requires_grad_(True) for _ in range(2))

            def fwd_bwd(fn):
                return lambda: fn(q, k, v, is_causal=True, enable_gqa=H != Hkv).sum().backward()
            ours, theirs = best(fwd_bwd(attention)), best(fwd_bwd(F.scaled_dot_product_attention))
            rows.append({"threads": threads, "B": B, "Hq": H, "Hkv": Hkv, "T": T, "d": d,
                         "ckparity_ms": round(ours * 1e3, 3), "torch_ms": round(theirs * 1e3, 3),
                         "ratio": round(theirs / ours, 3)})
            print(rows[-1], flush=True)
    report = {"schema": "ckparity.attention_speed/1", "dtype": args.dtype, "mkl_branch": cpu.mkl_branch(),
              "onednn_isa": cpu.onednn_isa(),
              "torch_capability": torch.backends.cpu.get_cpu_capability(), "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
