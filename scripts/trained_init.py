"""First-fail steps from trained weights against a random init (README "Long
runs"): real weights have outliers a random init lacks.

    python scripts/trained_init.py [--seeds 42 1 2] [--out reports/trained_init]

1. Pretrains the llama twin (2 blocks, D=64, H=128, V=256, 4 heads) for
   --pretrain-steps on the bytes of --text (README.md by default; its sha256
   goes in the summary) with torch's loss and AdamW on both twins, and keeps
   its checkpoint (outside the repository: --scratch).
2. Runs the stress profile (the "Hello!" text, lr 1e-3, seq 8, K=8, the C
   default cross-entropy and C AdamW) on the llama twin from a random init
   and, with --init-from, from the pretrained weights, once per seed.
Writes summary.json (each run's first-fail steps, drift and losses, without
its series, and the two inits' weight statistics) and prints a table.
Each stress run is ~80 s on this machine's cores; the pretraining ~3 min."""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from ckparity.harness.twins import init_from
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.studies.repro import STRESS
from ckparity.harness.loop.run import train
from ckparity.harness.twins.factory import build_twins

MODEL = dict(model="llama", num_layers=2, heads=4)
FIELDS = ["status", "steps", "first_loss_fail_step", "first_param_fail_step", "first_grad_fail_step",
          "first_logit_fail_step", "first_moment_fail_step", "max_loss_abs_diff", "max_param_abs_diff",
          "final_ck_loss", "final_torch_loss"]


def _weight_stats(config: RunConfig) -> dict:
    """How far the weights' tails reach: max |w| and the excess kurtosis, pooled over the matrices."""
    _, ref = build_twins(config)
    mats = torch.cat([p.detach().flatten() for n, p in ref.model.named_parameters() if p.dim() == 2]).double()
    z = (mats - mats.mean()) / mats.std()
    return {"max_abs": mats.abs().max().item(), "std": mats.std().item(),
            "excess_kurtosis": (z ** 4).mean().item() - 3.0}


def _pretrain(args) -> Path:
    ck = Path(args.scratch) / "pretrain"
    if (ck / "latest").exists():
        return ck
    tokens = args.pretrain_steps * 32 * 4 + 1
    cmd = [sys.executable, "-m", "ckparity", "train", "--model", "llama", "--num-layers", "2", "--heads", "4",
           "--train-text", args.text_copy, "--total-tokens", str(tokens), "--seq-len", "32", "--grad-accum", "4",
           "--max-steps", str(args.pretrain_steps), "--ck-loss-backend", "torch", "--ck-optimizer-backend", "torch",
           "--checkpoint-every", str(args.pretrain_steps), "--checkpoint-dir", str(ck), "--no-progress",
           "--json-out", str(Path(args.scratch) / "pretrain.json")]
    subprocess.run(cmd, check=False, timeout=3600)
    return ck


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--text", default="README.md")
    parser.add_argument("--pretrain-steps", type=int, default=2000)
    parser.add_argument("--scratch", default="/tmp/ckparity-trained-init")
    parser.add_argument("--out", default="reports/trained_init")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    text = Path(args.scratch) / "text"  # the bytes pretrained on, as they were
    if not text.exists():
        text.write_bytes(Path(args.text).read_bytes())
    args.text_copy = str(text)
    start = time.perf_counter()
    pretrained = _pretrain(args)
    pre = json.loads((Path(args.scratch) / "pretrain.json").read_text())
    summary = {"text": args.text, "text_sha256": hashlib.sha256(text.read_bytes()).hexdigest(),
               "pretrain": {"steps": pre["steps"], "status": pre["status"], "final_torch_loss": pre["final_torch_loss"],
                            "first_loss": pre["series"]["torch_loss"][0], "seconds": round(time.perf_counter() - start)},
               "stress": {k: v for k, v in STRESS.to_dict().items() if k in ("lr", "seq_len", "grad_accum", "epochs",
                                                                             "total_tokens", "max_steps")},
               "weights": {}, "runs": []}
    inits = {"random": None, "trained": str(pretrained)}
    for name, path in inits.items():
        config = init_from.configure(replace(STRESS, **MODEL, init_from=path))
        summary["weights"][name] = _weight_stats(config)
    for seed in args.seeds:
        for name, path in inits.items():
            config = replace(STRESS, **MODEL, init_from=path, seed=seed, no_progress=True, threads=1,
                             json_out=str(Path(args.scratch) / f"{name}-seed{seed}.json"))
            t0 = time.perf_counter()
            report = train(config)
            row = {"init": name, "seed": seed, **{k: report[k] for k in FIELDS},
                   "first_divergence_step": (report.get("divergence") or {}).get("first_step"),
                   "first_torch_loss": report["series"]["torch_loss"][0], "seconds": round(time.perf_counter() - t0)}
            summary["runs"].append(row)
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
