"""replay_determinism: the same run twice and at another of ckparity's thread counts, bit for bit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

import ckparity

from ..harness.basics.config import kernels_used
from .common import SHORT_RUN, result, series_without_timing, train_in_gate
from .record import Gate



# replay_determinism's run: wide enough that every C kernel of the step crosses
# its OpenMP threshold (cross_entropy N*V >= 16384, rms_norm and swiglu N*D >= 32768,
# AdamW more than one 65536-float chunk, compare n >= 65536), so a second thread
# count really runs threaded C -- at SHORT_RUN's sizes it would not.
REPLAY_RUN = replace(SHORT_RUN, model="stacked", vocab=2048, d_model=256, hidden=512, seq_len=128,
                     total_tokens=65536)


def run(settings: dict, out_dir: Path | None = None) -> dict:
    """The same run twice, and at each of ckparity's thread counts: identical
    series, bit for bit; a run that errors fails the gate (three runs that fail
    alike are not "identical"). torch's threads stay at the first count in every
    run: what varies is what ckparity owns. torch's own GEMMs (the twins'
    linears) are not thread-count invariant on every CPU -- MKL's AVX-512 sgemm
    splits K between 2 threads on an Intel Xeon, not on an AMD Zen 4
    (MKL_CBWR=AUTO,STRICT makes them agree) -- and ckparity's rms_norm and ptref
    follow torch's thread count by design (its split of long sums)."""
    runs, threads_used, failures, exercised = {}, {}, [], set()
    saved = (ckparity.get_num_threads(), torch.get_num_threads())
    try:
        for label, threads in [("first", settings["threads"][0]), ("again", settings["threads"][0])] + \
                [(f"threads={t}", t) for t in settings["threads"][1:]]:
            config = replace(REPLAY_RUN, max_steps=settings["steps"], threads=threads,
                             torch_threads=settings["threads"][0], ck_loss_backend=settings["ck_loss_backend"],
                             json_out=str(out_dir / f"replay_determinism_{label.replace('=', '')}.json"))
            exercised |= kernels_used(config)
            report = train_in_gate(config, settings)
            if report["status"] not in ("pass", "fail"):
                failures.append(f"{label}: {report['status']}: {report.get('error')}")
            elif report["first_nonfinite_step"] is not None:  # NaN series repeat as "identical" strings
                failures.append(f"{label}: non-finite from step {report['first_nonfinite_step']}")
            threads_used[label] = report["env"].get("ckparity_threads")
            runs[label] = series_without_timing(report)
    finally:
        ckparity.set_num_threads(saved[0])
        torch.set_num_threads(saved[1])
    base = runs["first"]
    differing = {label: sorted(k for k in base if base[k] != s[k]) for label, s in runs.items() if s != base}
    failures += [f"{label} differs in {', '.join(keys[:3])}" for label, keys in differing.items()]
    summary = (f"{len(runs)} runs of {settings['steps']} steps (C threads {sorted(set(threads_used.values()))}, "
               f"torch threads {settings['threads'][0]}): "
               + ("identical" if not failures else "; ".join(failures)))
    return result(not failures, summary, runs=list(runs), differing=differing, threads_used=threads_used,
                   failures=failures, exercised=sorted(exercised & set(settings.get("ck_backends", {}))))


GATE = Gate(
    name="replay_determinism", run=run,
    settings={"steps": 10, "threads": [1, 2], "ck_loss_backend": "c"},
    checks="the same 10-step stacked run twice at 1 thread and once with ckparity's C at 2 threads (torch's at 1 in "
           "every run: MKL's GEMMs in the twins' linears split K between 2 threads on an Intel Xeon, so torch's own "
           "bits move with its thread count there; `--torch-threads` sets torch's apart from `--threads`)",
    passes="identical series, bit for bit")
