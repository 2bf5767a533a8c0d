"""ckparity attribute: which of the CK twin's kernels makes a run fail?

An ablation over the backend flags. From the configured run it makes:
- "as configured";
- "without <kind>": that kind's backend swapped to torch, the others as configured;
- "only <kind>": that kind as configured, every other kind on torch;
- "alternative <kind>=<backend>": another C backend of that kind (c_ptref
  for c), the others as configured;
- "all torch": the control, every kind on torch.
Each variant is a full `ckparity train` run (in parallel processes, --jobs),
and the verdict reads them:
- the control fails: no ckparity kernel is the cause (a tolerance too tight
  for the config, or torch disagreeing with itself);
- the configured run passes: nothing is responsible;
- some kinds fail alone ("only <kind>" fails) and pass when swapped out:
  those kinds are responsible;
- no kind fails alone but the configured run fails: the combination is
  responsible, narrowed to the kinds whose removal makes it pass."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path

from .backends import BUILTIN, FLAGS
from .config import RunConfig
from .report import check_writable, check_writable_dir, write_json

SCHEMA = "ckparity.attribution/1"
# the seed's names of the kinds, as the flags say them (--ck-loss-backend: "loss")
KINDS = {flag: flag.removeprefix("ck_").removesuffix("_backend") for flag in FLAGS}


def variants(config: RunConfig) -> dict[str, dict[str, str]]:
    """name -> the backend of every kind (flag -> backend)."""
    configured = {flag: getattr(config, flag) for flag in FLAGS}
    in_c = [flag for flag, backend in configured.items() if backend != "torch"]
    out = {"as configured": configured}
    for flag in in_c:
        out[f"without {KINDS[flag]}"] = {**configured, flag: "torch"}
        out[f"only {KINDS[flag]}"] = {f: (b if f == flag else "torch") for f, b in configured.items()}
        for backend in BUILTIN[FLAGS[flag]]:
            if backend not in ("torch", configured[flag]):
                out[f"alternative {KINDS[flag]}={backend}"] = {**configured, flag: backend}
    out["all torch"] = {flag: "torch" for flag in configured}
    return out


def _run_variant(config: RunConfig) -> dict:
    from .run import train

    report = train(config)
    return {key: report[key] for key in ("status", "first_loss_fail_step", "first_param_fail_step",
                                         "max_param_abs_diff", "max_loss_abs_diff", "divergence")}


def verdict(rows: dict[str, dict]) -> dict:
    failed = {name: row["status"] != "pass" for name, row in rows.items()}
    kinds = [name.removeprefix("only ") for name in rows if name.startswith("only ")]
    alternatives = [name.removeprefix("alternative ") for name in rows
                    if name.startswith("alternative ") and not failed[name]]
    if failed["all torch"]:
        return {"responsible": [], "summary": "the all-torch control fails too: no ckparity kernel is the cause "
                                              "(a tolerance too tight for this config, or torch disagreeing with itself)"}
    if not failed["as configured"]:
        return {"responsible": [], "summary": "the configured run passes: nothing is responsible"}
    alone = [k for k in kinds if failed[f"only {k}"]]
    needed = [k for k in kinds if not failed[f"without {k}"]]
    passing = f"; passes with {', '.join(alternatives)}" if alternatives else ""
    if alone:
        responsible = [k for k in alone if k in needed] or alone
        return {"responsible": responsible,
                "summary": f"the {', '.join(responsible)} backend{'s' if len(responsible) > 1 else ''} "
                           f"{'fail' if len(responsible) > 1 else 'fails'} on {'their' if len(responsible) > 1 else 'its'} "
                           f"own (the run passes with {'them' if len(responsible) > 1 else 'it'} on torch){passing}"}
    responsible = needed or kinds
    return {"responsible": responsible,
            "summary": f"no backend fails on its own: only the combination of {', '.join(kinds)} fails"
                       + (f", and swapping {' or '.join(needed)} to torch makes it pass" if needed else "")
                       + passing}


def attribute(config: RunConfig, json_out: str, jobs: int, echo=print) -> dict:
    check_writable(json_out, "--json-out")
    runs_dir = Path(json_out).with_suffix("") if json_out != "-" else Path("reports/attribute")
    runs_dir = runs_dir.parent / f"{runs_dir.name}_runs"
    check_writable_dir(runs_dir, "the variants' reports")
    plan = variants(config)
    threads = config.threads or max(1, (os.cpu_count() or 1) // jobs)
    configs = {name: replace(config, **backends, threads=threads, no_progress=True,
                             json_out=str(runs_dir / f"{name.replace(' ', '_').replace('=', '-')}.json"))
               for name, backends in plan.items()}
    start = time.perf_counter()
    if jobs == 1:  # in this process: planted backends (tests) stay visible
        rows = {name: _run_variant(c) for name, c in configs.items()}
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            futures = {name: pool.submit(_run_variant, c) for name, c in configs.items()}
            rows = {name: f.result() for name, f in futures.items()}
    result = {
        "schema": SCHEMA, "config": config.to_dict(), "jobs": jobs, "wall_s": time.perf_counter() - start,
        "variants": [{"name": name, "backends": {KINDS[f]: b for f, b in plan[name].items()}, **rows[name],
                      "report": configs[name].json_out} for name in plan],
        "verdict": verdict(rows),
    }
    write_json(json_out, result)
    return result


def table(result: dict) -> str:
    lines = ["| variant | backends | status | first loss fail | first param fail | max param diff | first divergence |",
             "|---|---|---|---|---|---|---|"]
    for v in result["variants"]:
        backends = " ".join(f"{k}={b}" for k, b in v["backends"].items())
        lines.append(f"| {v['name']} | {backends} | {v['status']} | {v['first_loss_fail_step'] or '-'} | "
                     f"{v['first_param_fail_step'] or '-'} | {v['max_param_abs_diff']:.3g} | "
                     f"{v['divergence']['first_step'] or '-'} |")
    return "\n".join(lines) + f"\n\nverdict: {result['verdict']['summary']}"
