"""The noise envelope's calibration figures (README "Noise or bug"):
verdicts on the stress profile, the false-fail rate over seeds a correct
kernel trains with, and the power against planted biases.

    python scripts/envelope_sweep.py [--seeds 20] [--out reports/envelope]

Writes one JSON per case (the run's envelope and verdict, without its series)
and summary.json; prints a Markdown table. Each stress run is 1000 steps with
K=4 null twins: ~1-3 min on this machine's 2 cores. Each row also holds
the verdict of the per-step criterion (before the window) from the same run.
reports/envelope/summary_uniform_null.json holds the same cases under the
null model before (uniform +-m ULPs on the loss and dlogits)."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

import ckparity
from ckparity import kernels
from ckparity.harness.observers import envelope
from ckparity.harness.studies.repro import STRESS
from ckparity.harness.loop.run import train


class _OneUlpUp(torch.autograd.Function):
    """A planted bias: every dlogit one ULP further from 0 than torch's."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        bits = grad.contiguous().view(torch.int32)
        return torch.where(grad == 0, grad, (bits + 1).view(torch.float32))


def _smoothing_over_fewer_classes(logits, targets, label_smoothing=0.0):
    """A planted slip: label smoothing spread as if over 0.99 V classes."""
    eps = label_smoothing * logits.shape[-1] / (0.99 * logits.shape[-1])
    return F.cross_entropy(logits, targets, label_smoothing=min(eps, 1.0))


class _BiasedAdamW(ckparity.optim.AdamW):
    """A planted bias: ckparity's AdamW, then every param moved by -1e-7 x lr."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.sub_(1e-7 * group["lr"])
        return loss


PLANTED = {
    ("cross_entropy", "dlogits_one_ulp_up"): lambda x, t, **kw: F.cross_entropy(_OneUlpUp.apply(x), t, **kw),
    ("cross_entropy", "smoothing_099V"): _smoothing_over_fewer_classes,
    ("adamw", "update_bias_1e-7lr"): _BiasedAdamW,
}

# name -> (RunConfig changes, seeds); "seeds" cases are the false-fail rate
REORDER_ULPS = envelope.REORDER_ULPS

CASES = {
    "default_ce": ({"ck_loss_backend": "c"}, None),
    "ptref_ce": ({"ck_loss_backend": "c_ptref"}, None),
    "default_ce_smoothing_0.1": ({"ck_loss_backend": "c", "label_smoothing": 0.1}, None),
    "fault_dlogits_one_ulp_up": ({"ck_loss_backend": "dlogits_one_ulp_up", "ck_optimizer_backend": "torch"}, None),
    "fault_adamw_update_bias": ({"ck_loss_backend": "torch", "ck_optimizer_backend": "update_bias_1e-7lr"}, None),
    "fault_smoothing_099V": ({"ck_loss_backend": "smoothing_099V", "label_smoothing": 0.1}, None),
    "default_ce_uncut_null": ({"ck_loss_backend": "c"}, None),
    "false_fail_default_ce": ({"ck_loss_backend": "c"}, "seeds"),
    # a kernel set whose every difference from torch is measured unbiased and within reach
    # (ptref is bit-identical; C AdamW's differences have no direction): the false-fail rate proper
    "false_fail_ptref": ({"ck_loss_backend": "c_ptref"}, "seeds"),
}

# a diagnostic null model: the CK kernels' differences not cut to a correct kernel's reach
# (is a drift beyond noise owed to the errors beyond the reach, or to their direction?)
NULL_REACH = {"default_ce_uncut_null": 1 << 20}


def _per_step(series: dict, limit: float) -> dict:
    """The criterion before the window (envelope.WINDOW): each step's CK
    difference over that step's members' largest, from the run's own series."""
    first, ratios = {}, {}
    for q in envelope.QUANTITIES:
        r = [ck / max(env, floor) if floor > 0 or env > 0 else 0.0
             for ck, env, floor in zip(series[f"{q}_ck"], series[f"{q}_max"], series[f"{q}_floor"])]
        ratios[q] = max(r, default=0.0)
        first[q] = next((step for step, v in zip(series["step"], r) if not v <= limit), None)
    beyond = [v for v in first.values() if v is not None]
    return {"verdict": "beyond_noise" if beyond else "within_noise", "first_beyond_step": min(beyond, default=None),
            "first_beyond_step_per_quantity": first, "max_noise_ratio": ratios}


def rescore(runs_dir: str) -> dict:
    """Each stored run's windowed verdict under the loss floor it ran with (half
    an ULP) and under envelope.py's floor of REORDER_ULPS ULPs: the criterion is
    a function of the series the run keeps (CK's, the members', the floors)."""
    out = {"how": f"python scripts/envelope_sweep.py --rescore {runs_dir}", "window": envelope.WINDOW, "runs": {}}
    for path in sorted(Path(runs_dir).glob("*.json")):
        series = json.loads(path.read_text())["envelope"]["series"]
        row = {}
        for label, loss_factor in (("half_ulp_loss_floor", 1), ("reorder_loss_floor", 2 * envelope.REORDER_ULPS)):
            worst, first = {}, {}
            for q, factor in (("loss", loss_factor), ("param", 1)):
                ratios = [envelope.window_ratio(series[f"{q}_ck"][:i + 1], series[f"{q}_max"][:i + 1],
                                                series[f"{q}_floor"][i] * factor) for i in range(len(series["step"]))]
                worst[q] = max(ratios)
                first[q] = next((s for s, r in zip(series["step"], ratios) if not r <= 4.0), None)
            row[label] = {"max_noise_ratio": worst, "first_beyond_step_per_quantity": first}
        out["runs"][path.stem] = row
    return out


def _row(report: dict, seconds: float) -> dict:
    env = report["envelope"] or {}
    return {"status": report["status"], "steps": report["steps"], "verdict": report["noise_verdict"],
            "first_beyond_step": env.get("first_beyond_step"), "directed": env.get("directed"),
            "first_beyond_step_per_quantity": env.get("first_beyond_step_per_quantity"),
            "per_step_criterion": _per_step(env["series"], env["ratio_limit"]) if env else None,
            "max_noise_ratio": env.get("max_noise_ratio"), "first_param_fail_step": report["first_param_fail_step"],
            "null_model": env.get("null_model"), "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds for the false-fail rate")
    parser.add_argument("--first-seed", type=int, default=100, help="the false-fail rate's first seed")
    parser.add_argument("--seed", type=int, default=STRESS.seed, help="the seed of the cases that are one run")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--out", default="reports/envelope")
    parser.add_argument("--runs-dir", default="/tmp/ckparity_envelope_runs", help="each run's full report")
    parser.add_argument("--only", nargs="*", default=None, help="only these cases")
    parser.add_argument("--rescore", metavar="RUNS_DIR", help="only rescore the runs stored there (runs made before "
                        "the loss floor of REORDER_ULPS ULPs) into OUT/rescored_loss_floor.json")
    args = parser.parse_args()
    if args.rescore:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "rescored_loss_floor.json").write_text(json.dumps(rescore(args.rescore), indent=1))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    for (kernel, name), fn in PLANTED.items():
        kernels.register(kernel, name, fn)
    # cases run before (another --only) stay in the summary
    previous = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {"cases": {}}
    summary = {"capability": ckparity.cpu.capability(), "members": args.members, "profile": "stress, 1000 steps",
               "cases": previous["cases"]}
    for case, (changes, seeds) in CASES.items():
        if args.only is not None and case not in args.only:
            continue
        rows = []
        envelope.REORDER_ULPS = NULL_REACH.get(case, REORDER_ULPS)
        for seed in (range(args.first_seed, args.first_seed + args.seeds) if seeds else [args.seed]):
            config = replace(STRESS, envelope=args.members, no_progress=True, seed=seed, **changes,
                             json_out=str(Path(args.runs_dir) / f"{case}_seed{seed}.json"))
            start = time.perf_counter()
            report = train(config)
            if report["status"] == "interrupted":  # a partial run says nothing about the verdict: the sweep stops
                raise SystemExit(f"{case} seed {seed}: interrupted at step {report['steps']}; not recorded")
            rows.append({"seed": seed, **_row(report, time.perf_counter() - start)})
            print(case, rows[-1]["seed"], rows[-1]["verdict"], rows[-1]["first_beyond_step"], rows[-1]["directed"],
                  rows[-1]["max_noise_ratio"], "per step:", rows[-1]["per_step_criterion"]["verdict"], flush=True)
            # after every run: a sweep cut off by its timeout keeps the seeds it finished
            summary["cases"][case] = {"changes": changes, "runs": rows}
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("| case | runs | beyond noise (per-step criterion) | by size | directed | first beyond | max ratio loss / param "
          "| first param fail | dlogits beyond reach | dlogits outward share | loss up share |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for case, entry in summary["cases"].items():
        runs = entry["runs"]
        beyond = [r for r in runs if r["verdict"] == "beyond_noise"]
        per_step = sum((r.get("per_step_criterion") or {}).get("verdict") == "beyond_noise" for r in runs)
        firsts = sorted(r["first_beyond_step"] for r in beyond if r["first_beyond_step"] is not None)
        ratio = lambda q: max(r["max_noise_ratio"][q] for r in runs)  # noqa: E731
        dlogits = [r["null_model"]["measured"]["loss.grad0"] for r in runs]
        beyond_reach = max(d["beyond_reach"] / d["elements"] for d in dlogits)
        by_size = sum(r["first_beyond_step"] is not None for r in runs)
        directed = sorted({slot for r in runs for slot in r.get("directed") or []})
        n_directed = sum(bool(r.get("directed")) for r in runs)

        def span(values):  # None where nothing differed (a bit-identical slot)
            values = [v for v in values if v is not None]
            return f"{min(values):.3f}-{max(values):.3f}" if values else "-"
        print(f"| {case} | {len(runs)} | {len(beyond)} ({per_step}) | {by_size} | {n_directed} {directed or ''} "
              f"| {firsts[:3] or '-'} | {ratio('loss'):.3g} / {ratio('param'):.3g} "
              f"| {[r['first_param_fail_step'] for r in runs][:3]} | {beyond_reach:.4f} "
              f"| {span(d['outward_share'] for d in dlogits)} "
              f"| {span(r['null_model']['measured']['loss']['up_share'] for r in runs)} |")


if __name__ == "__main__":
    main()
