"""No lost work, no replaced files, bad input refused before the work starts:
the command line against unwritable paths, special files, a full disk,
impossible configs and signals, and AdamW against torch's own keywords."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import ckparity
from ckparity.cli import main
from ckparity.harness.basics import report

QUICK = ["--max-steps", "2", "--total-tokens", "4096", "--no-progress"]


def cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckparity", *args], capture_output=True, text=True, timeout=timeout)


def one_line(err: str) -> str:
    err = err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args, message", [
    (["train", "--json-out", "/proc/nope/x.json", "--max-steps", "2"], "cannot write --json-out in /proc/nope"),
    (["gate", "--only", "kernel_parity", "--out-dir", "/proc/nope"], "cannot write --out-dir in /proc/nope"),
    (["repro", "--out-dir", "/proc/nope", "--max-steps", "2"], "cannot write --out-dir in /proc/nope"),
    (["bench", "--json-out", "/proc/nope/b.json"], "cannot write --json-out in /proc/nope"),
    (["compare", "a.json", "--plot", "/proc/nope/p.png"], "cannot write --plot in /proc/nope"),
    (["train", "--vocab", "1000000000", "--max-steps", "1"], "GiB of memory"),
    (["train", "--max-steps", "2", "--localize-step", "5"], "--localize-step 5 is beyond the run's 2 steps"),
    (["train", "--optimizer", "sgd", "--ck-optimizer-backend", "torch"], "--ck-optimizer-backend takes no effect"),
])
def test_refused_before_any_work(args, message, capsys):
    start = time.perf_counter()
    assert main(args) == 2
    assert message in one_line(capsys.readouterr().err)
    assert time.perf_counter() - start < 5, "refused only after doing work"


def test_directory_as_json_out(tmp_path, capsys):
    assert main(["train", *QUICK, "--json-out", str(tmp_path)]) == 2
    assert "is a directory" in one_line(capsys.readouterr().err)


def test_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received = {}
    reader = threading.Thread(target=lambda: received.setdefault("text", fifo.read_text()))
    reader.start()
    assert main(["train", *QUICK, "--json-out", str(fifo)]) == 0
    reader.join(timeout=30)
    assert json.loads(received["text"])["status"] == "pass"
    assert fifo.is_fifo() and list(tmp_path.iterdir()) == [fifo]  # no temp file, nothing replaced


def test_symlink_is_written_through(tmp_path):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    report.write_json(link, {"schema": report.SCHEMA, "x": 1})
    assert link.is_symlink() and json.loads(target.read_text())["x"] == 1


def test_dash_writes_the_report_to_stdout():
    done = cli("train", *QUICK, "--json-out", "-")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # stdout holds the report alone
    assert data["status"] == "pass" and data["steps"] == 2
    assert "ckparity train: pass" in done.stderr


def test_full_disk_falls_back_and_says_where(tmp_path, monkeypatch, capsys):
    out = tmp_path / "r.json"
    real_fsync = os.fsync

    def fsync_fails_in_tmp_path(fd):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path)):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(report.os, "fsync", fsync_fails_in_tmp_path)
    assert main(["train", *QUICK, "--json-out", str(out)]) == 3
    err = one_line(capsys.readouterr().err)
    assert "No space left on device" in err and "written to" in err
    fallback = Path(err.split("written to ")[1].split(" instead")[0])
    assert json.loads(fallback.read_text())["status"] == "pass"
    fallback.unlink()
    assert list(tmp_path.iterdir()) == []  # no half report, no stray temp file


def test_train_text_shorter_than_a_step_is_repeated(tmp_path):
    text = tmp_path / "hello.txt"
    text.write_bytes(b"Hello!")
    result = ckparity.harness.loop.run.train(
        ckparity.harness.basics.config.RunConfig(train_text=str(text), total_tokens=4097, seq_len=8, grad_accum=8,
                                          max_steps=3, no_progress=True, json_out=str(tmp_path / "r.json")))
    assert result["status"] == "pass" and result["steps"] == 3


def test_adamw_accepts_torch_keywords_for_its_own_path():
    """False/None everywhere are the single-tensor path; fused=True is followed (the C fused form,
    tests/test_adamw.py); True for the others asks for a torch implementation ckparity has not."""
    p = torch.nn.Parameter(torch.randn(3))
    for keyword in ("foreach", "fused", "capturable", "differentiable"):
        for value in (False, None):
            ckparity.optim.AdamW([p], **{keyword: value})
        if keyword == "fused":
            assert ckparity.optim.AdamW([p], fused=True).defaults["fused"] is True
            continue
        with pytest.raises(ValueError, match=f"{keyword}=True"):
            ckparity.optim.AdamW([p], **{keyword: True})


@pytest.mark.parametrize("betas, message", [(None, "betas must be a pair"), ((0.9,), "betas must be a pair"),
                                            ((0.9, "x"), r"betas\[1\] must be a number")])
def test_adamw_malformed_betas(betas, message):
    with pytest.raises(ValueError, match=message):
        ckparity.optim.AdamW([torch.nn.Parameter(torch.randn(3))], betas=betas)


@pytest.mark.parametrize("args, message", [
    (["--kv-heads", "2"], "--kv-heads takes no effect with --model tiny"),
    (["--model", "stacked", "--tie-embeddings"], "--tie-embeddings takes no effect with --model stacked"),
    (["--num-layers", "4"], "--num-layers takes no effect with --model tiny"),
    (["--shadow-every", "5"], "--shadow-every takes no effect without --f64-shadow"),
])
def test_flags_that_cannot_take_effect_are_refused(args, message, capsys):
    assert main(["train", *QUICK, *args]) == 2
    assert message in one_line(capsys.readouterr().err)
