"""--checkpoint-every / --resume: a run stopped at step k -- by --max-steps,
by a SIGTERM, by a SIGKILL between checkpoints -- and resumed gives the
report of the run that was never stopped, bit for bit but for timings and
the flags that may change; at every model kind, with a schedule, the
float64 shadow, the envelope and spike triage. A checkpoint is written
atomically; a resume with another flag is refused by name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ckparity.harness.longrun import checkpoint
from ckparity.harness.basics.config import RunConfig, UsageError
from ckparity.harness.loop.run import train

SKIP = {"timing", "env", "config", "resume"}  # timings, the flags a resume may change, and what it changed


def _comparable(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in SKIP}
    out["series"] = {k: v for k, v in report["series"].items() if not k.endswith("_ms")}
    if out.get("shadow"):
        out["shadow"] = {k: v for k, v in out["shadow"].items() if k != "seconds"}
        out["shadow"]["summary"] = {k: v for k, v in out["shadow"]["summary"].items() if "seconds" not in k}
    return json.loads(json.dumps(out, default=str))


def _stop_and_resume(tmp_path, base: RunConfig, k: int) -> tuple[dict, dict]:
    whole = train(replace(base, json_out=str(tmp_path / "whole.json")))
    cut = train(replace(base, max_steps=k, checkpoint_every=k, checkpoint_dir=str(tmp_path / "ck"),
                        json_out=str(tmp_path / "cut.json")))
    assert cut["steps"] == k
    resumed = train(RunConfig(resume=str(tmp_path / "ck"), max_steps=base.max_steps, no_progress=True,
                              json_out=str(tmp_path / "resumed.json")))
    return whole, resumed


CASES = {
    "tiny, default CE and C AdamW (drift), linear schedule": RunConfig(
        max_steps=12, lr_schedule="linear", warmup_steps=3, no_progress=True),
    "stacked, f64 shadow, spike triage": RunConfig(
        model="stacked", num_layers=2, max_steps=12, f64_shadow=True, shadow_every=2, spike_triage=True,
        no_progress=True),
    "llama, envelope K=2, cosine": RunConfig(
        model="llama", num_layers=2, max_steps=10, envelope=2, lr_schedule="cosine", no_progress=True),
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.nightly) if name.startswith("llama") else name
                                  for name in CASES])
def test_a_resumed_run_is_the_uninterrupted_run(tmp_path, name):
    base = CASES[name]
    whole, resumed = _stop_and_resume(tmp_path, base, k=base.max_steps // 2 + 1)
    assert resumed["steps"] == whole["steps"] == base.max_steps
    assert _comparable(resumed) == _comparable(whole)
    assert whole["max_param_abs_diff"] > 0 or "llama" in name  # the drift itself is compared, not only zeros


def test_a_checkpoint_holds_every_component_and_only_the_latest_stays(tmp_path):
    report = train(RunConfig(max_steps=6, checkpoint_every=2, checkpoint_dir=str(tmp_path / "ck"), envelope=1,
                             no_progress=True, json_out=str(tmp_path / "r.json")))
    root = tmp_path / "ck"
    timing = report["timing"]  # what they cost, in the report
    assert timing["checkpoints"] == 3 and timing["checkpoint_s"] > 0
    assert timing["checkpoint_bytes"] == sum(f.stat().st_size for f in (root / "step-000000006").iterdir())
    assert (root / "latest").read_text() == "step-000000006"
    assert sorted(p.name for p in root.iterdir()) == ["ckparity-run.json", "latest", "step-000000006"]  # older ones removed
    manifest = json.loads((root / "step-000000006" / "checkpoint.json").read_text())
    assert manifest["schema"] == checkpoint.SCHEMA and manifest["step"] == 6
    components = manifest["state"]["__dict__"][0][1]["__dict__"]
    assert {k for k, _ in components} >= {"ck", "torch", "series", "first_fail", "divergence", "envelope"}


def test_resume_refuses_another_flag_and_a_missing_checkpoint(tmp_path):
    train(RunConfig(max_steps=3, checkpoint_every=3, checkpoint_dir=str(tmp_path / "ck"), no_progress=True,
                    json_out=str(tmp_path / "r.json")))
    with pytest.raises(UsageError, match="--lr 0.01 differs from the checkpoint's 0.001"):
        train(RunConfig(resume=str(tmp_path / "ck"), lr=1e-2, no_progress=True))
    # another world size: refused by name (its shards and reductions split otherwise: not the run's bits)
    with pytest.raises(UsageError, match="--tp 2 differs from the checkpoint's 1"):
        train(RunConfig(resume=str(tmp_path / "ck"), no_progress=True, tp=2))
    with pytest.raises(UsageError, match="no checkpoint there"):
        train(RunConfig(resume=str(tmp_path / "none"), no_progress=True))
    with pytest.raises(UsageError, match="before the checkpoint's step 3"):
        train(RunConfig(resume=str(tmp_path / "ck"), max_steps=2, no_progress=True))


CKPARITY = [sys.executable, "-m", "ckparity"]


def _wait_for(path: Path, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_run_resumes_to_the_uninterrupted_report(tmp_path, sig):
    """SIGTERM: the step it arrives in ends, a checkpoint is written, the report says
    interrupted (exit 143). SIGKILL: nothing more is written; the last periodic
    checkpoint is whole. Either way --resume gives the uninterrupted run's report."""
    flags = ["--model", "stacked", "--num-layers", "2", "--max-steps", "60", "--no-progress"]
    whole = train(RunConfig(model="stacked", num_layers=2, max_steps=60, no_progress=True,
                            json_out=str(tmp_path / "whole.json")))
    ck = tmp_path / "ck"
    run = subprocess.Popen([*CKPARITY, "train", *flags, "--checkpoint-every", "5", "--checkpoint-dir", str(ck),
                            "--json-out", str(tmp_path / "cut.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(ck / "latest")  # past the first checkpoint, mid-run
    run.send_signal(sig)
    run.communicate(timeout=120)
    step = int((ck / "latest").read_text().split("-")[1])
    assert 5 <= step < 60
    if sig == signal.SIGTERM:
        assert run.returncode == 143
        cut = json.loads((tmp_path / "cut.json").read_text())
        assert cut["status"] == "interrupted" and cut["steps"] == step  # the checkpoint is of the last step run
    else:
        assert run.returncode == -signal.SIGKILL and step % 5 == 0
    assert not list(ck.glob(".writing-*")) or sig == signal.SIGKILL
    resumed = subprocess.run([*CKPARITY, "train", "--resume", str(ck), "--max-steps", "60", "--no-progress",
                              "--json-out", str(tmp_path / "resumed.json")], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode in (0, 1), resumed.stderr[-2000:]
    assert _comparable(json.loads((tmp_path / "resumed.json").read_text())) == _comparable(whole)


def _cli_report(tmp_path, name: str, *flags: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run([*CKPARITY, "train", *flags, "--no-progress", "--json-out", str(out)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    return json.loads(out.read_text())


RANKED = {"dp 2, 2 micro-batches per rank, envelope": ["--dp", "2", "--grad-accum", "4", "--envelope", "1"],
          "tp 2, uneven vocab shards, f64 shadow": ["--tp", "2", "--model", "stacked", "--vocab", "37",
                                                    "--f64-shadow"]}


# the dp case is nightly: test_a_resume_takes_the_newest_step_every_rank_holds resumes a dp run in CI
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.nightly) if n.startswith("dp") else n
                                  for n in RANKED])
def test_a_ranked_run_resumes_to_the_uninterrupted_report(tmp_path, name):
    """Each rank checkpoints its own shards and RNGs (D/rank-<r>/); `train
    --resume D` alone knows from the checkpoint that the run has ranks."""
    flags = [*RANKED[name], "--max-steps", "8"]
    whole = _cli_report(tmp_path, "whole", *flags)
    ck = tmp_path / "ck"
    cut = _cli_report(tmp_path, "cut", *RANKED[name], "--max-steps", "5", "--checkpoint-every", "5",
                      "--checkpoint-dir", str(ck))
    assert cut["steps"] == 5 and sorted(p.name for p in ck.iterdir()) == ["ckparity-run.json", "rank-0", "rank-1"]
    resumed = _cli_report(tmp_path, "resumed", "--resume", str(ck), "--max-steps", "8")
    assert resumed["env"]["world_size"] == 2 and resumed["steps"] == 8
    assert _comparable(resumed) == _comparable(whole)
    assert whole["max_grad_abs_diff"] > 0  # the ranks' drift itself is compared, not only zeros


# nightly: a signal's resume is test_a_killed_run_resumes_to_the_uninterrupted_report's in CI (one process),
# a ranked resume test_a_resume_takes_the_newest_step_every_rank_holds's
@pytest.mark.nightly
@pytest.mark.parametrize("whom", ["the launcher", "rank 1 alone"])
def test_a_signalled_ranked_run_stops_every_rank_after_one_step_and_resumes(tmp_path, whom):
    """A SIGTERM to the launcher (which passes it on) or to one rank (a
    scheduler's, under torchrun): the ranks agree on the step to stop after,
    each checkpoints it, and the resume gives the uninterrupted report. A rank
    that stopped alone would leave the other in its next collective."""
    from test_ranks import _ranks_of

    # 300 steps (~12 s of steps here): the signal lands mid-run however long it takes to reach the ranks
    flags = ["--dp", "2", "--grad-accum", "2", "--model", "stacked", "--num-layers", "2", "--max-steps", "300"]
    whole = _cli_report(tmp_path, "whole", *flags)
    ck = tmp_path / "ck"
    run = subprocess.Popen([*CKPARITY, "train", *flags, "--no-progress", "--checkpoint-every", "5",
                            "--checkpoint-dir", str(ck), "--json-out", str(tmp_path / "cut.json")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids = _ranks_of(run, 2)
    _wait_for(ck / "rank-1" / "latest")
    os.kill(run.pid if whom == "the launcher" else pids[1], signal.SIGTERM)
    run.communicate(timeout=120)
    assert run.returncode == 143
    steps = {(ck / f"rank-{r}" / "latest").read_text() for r in (0, 1)}
    assert len(steps) == 1, steps  # the same step on both ranks
    cut = json.loads((tmp_path / "cut.json").read_text())
    assert cut["status"] == "interrupted" and f"step-{cut['steps']:09d}" in steps and cut["steps"] < 300
    resumed = _cli_report(tmp_path, "resumed", "--resume", str(ck), "--max-steps", "300")
    assert _comparable(resumed) == _comparable(whole)


def test_a_resume_takes_the_newest_step_every_rank_holds(tmp_path):
    """A kill between one rank naming step N latest and another doing so: the
    resume goes on from step N-k, which both still hold."""
    ck = tmp_path / "ck"
    _cli_report(tmp_path, "cut", "--dp", "2", "--grad-accum", "2", "--max-steps", "4", "--checkpoint-every", "2",
                "--checkpoint-dir", str(ck))
    whole = _cli_report(tmp_path, "whole", "--dp", "2", "--grad-accum", "2", "--max-steps", "6")
    # as if killed after rank 0 wrote and named step 4, before rank 1 did: rank 1 still at step 2
    for r in (0, 1):
        assert (ck / f"rank-{r}" / "latest").read_text() == "step-000000004"
    shutil.rmtree(ck / "rank-1" / "step-000000004")
    _cli_report(tmp_path, "two", "--dp", "2", "--grad-accum", "2", "--max-steps", "2", "--checkpoint-every", "2",
                "--checkpoint-dir", str(tmp_path / "ck2"))
    shutil.copytree(tmp_path / "ck2" / "rank-1" / "step-000000002", ck / "rank-1" / "step-000000002")
    shutil.copytree(tmp_path / "ck2" / "rank-0" / "step-000000002", ck / "rank-0" / "step-000000002")
    (ck / "rank-1" / "latest").write_text("step-000000002")
    resumed = _cli_report(tmp_path, "resumed", "--resume", str(ck), "--max-steps", "6")
    assert _comparable(resumed) == _comparable(whole)
