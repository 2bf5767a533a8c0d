"""Every path through ckparity.cross_entropy against torch's eager loss: each variant, dtype and option
(label smoothing, class weights, probability targets, reduction none, a loss scaled by 1/8 before
backward as gradient accumulation scales it) forward and backward at one
large shape, the two sides timed in turn (medians), so that no option is a slow path the bench's rows
never take:

    python scripts/ce_options.py [--shape 2048,32000] [--repeats 5] [--json-out reports/bench/ce_options.json]

A path ckparity refuses (say, z-loss in bf16 ptref) is listed with its refusal instead of a time.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import ckparity
from ckparity import cpu
from ckparity.bench import interleaved_median_ms
from ckparity.harness.basics.report import check_writable, write_json
from ckparity.kernels.benching import fwd_bwd

OPTIONS = {  # name -> (keyword arguments, probability targets: True in the logits' dtype, or this dtype)
    "plain": ({}, False),
    "label_smoothing": ({"label_smoothing": 0.1}, False),
    "weight": ({"weight": True}, False),
    "reduction none": ({"reduction": "none"}, False),
    "probabilities": ({}, True),
    "probabilities, label_smoothing": ({"label_smoothing": 0.1}, True),
    "float32 probabilities": ({}, torch.float32),  # with bf16 logits: torch's mixed call, the loss float32
    "loss / 8": ({"scale": 0.125}, False),  # backward receives 1/8: [Note: guessing the upstream gradient]
}


def rows(N: int, V: int, repeats: int):
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(N, V, generator=g).to(dtype).requires_grad_(True)
        classes = torch.randint(0, V, (N,), generator=g)
        classes[::7] = -100  # ignored rows, as padding makes them
        probs32 = torch.softmax(torch.randn(N, V, generator=g), -1)
        probs = probs32.to(dtype)
        weight = (torch.rand(V, generator=g) + 0.5).to(dtype)
        for variant in ("default", "ptref"):
            for name, (kwargs, soft) in OPTIONS.items():
                if soft is torch.float32 and dtype == torch.float32:
                    continue  # the "probabilities" row
                kw = {**kwargs, **({"weight": weight} if "weight" in kwargs else {})}
                scale = kw.pop("scale", 1.0)
                target = probs32 if soft is torch.float32 else probs if soft else classes
                row = {"dtype": str(dtype).removeprefix("torch."), "variant": variant, "option": name}
                ours = fwd_bwd(lambda a, **k: ckparity.cross_entropy(a, target, variant=variant, **k) * scale, x, **kw)
                try:
                    ours()
                except (TypeError, ValueError, NotImplementedError) as e:
                    yield {**row, "refused": str(e)}
                    continue
                theirs = fwd_bwd(lambda a, **k: F.cross_entropy(a, target, **k) * scale, x, **kw)
                ck, pt = interleaved_median_ms([ours, theirs], repeats)
                yield {**row, "ckparity_ms": ck, "torch_ms": pt, "speedup": pt / ck}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="2048,32000", help="N,V")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-out", default="-")
    args = parser.parse_args(argv)
    N, V = (int(v) for v in args.shape.split(","))
    check_writable(args.json_out, "--json-out")  # before minutes of timing
    results = []
    for row in rows(N, V, args.repeats):
        results.append(row)
        print(f"{row['dtype']:8} {row['variant']:7} {row['option']:31} " +
              (f"refused: {row['refused']}" if "refused" in row else
               f"ckparity {row['ckparity_ms']:8.1f} ms  torch {row['torch_ms']:8.1f} ms  {row['speedup']:5.2f}x"),
              file=sys.stderr, flush=True)
    write_json(args.json_out, {"schema": "ckparity.ce_options/1", "shape": [N, V], "capability": cpu.capability(),
                               "threads": torch.get_num_threads(), "torch": torch.__version__,
                               "repeats": args.repeats, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
