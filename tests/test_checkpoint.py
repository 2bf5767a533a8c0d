"""--checkpoint-every / --resume: a run stopped at step k -- by --max-steps,
by a SIGTERM, by a SIGKILL between checkpoints -- and resumed gives the
report of the run that was never stopped, bit for bit but for timings and
the flags that may change; at every model kind, with a schedule, the
float64 shadow, the envelope and spike triage. A checkpoint is written
atomically; a resume with another flag is refused by name."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ckparity.harness import checkpoint
from ckparity.harness.config import RunConfig, UsageError
from ckparity.harness.run import train

SKIP = {"timing", "env", "config"}  # timings, and the flags a resume may change


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


@pytest.mark.parametrize("name", list(CASES))
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
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000000006"]  # older ones removed
    manifest = json.loads((root / "step-000000006" / "checkpoint.json").read_text())
    assert manifest["schema"] == checkpoint.SCHEMA and manifest["step"] == 6
    components = manifest["state"]["__dict__"][0][1]["__dict__"]
    assert {k for k, _ in components} >= {"ck", "torch", "series", "first_fail", "divergence", "envelope"}


def test_resume_refuses_another_flag_and_a_missing_checkpoint(tmp_path):
    train(RunConfig(max_steps=3, checkpoint_every=3, checkpoint_dir=str(tmp_path / "ck"), no_progress=True,
                    json_out=str(tmp_path / "r.json")))
    with pytest.raises(UsageError, match="--lr 0.01 differs from the checkpoint's 0.001"):
        train(RunConfig(resume=str(tmp_path / "ck"), lr=1e-2, no_progress=True))
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
