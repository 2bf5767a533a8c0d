"""A user's kernel that segfaults, aborts or hangs inside `ckparity train` ends the run's child process,
not the command: exit 1 and a report naming the kernel, its backend, the step and the stage it crashed in
(basics/progress.py keeps the child's place where a dying process can leave it). `attribute`'s variants
and `gate --backend`'s gates the same."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent('''
    import ctypes, os
    import torch
    import torch.nn.functional as F
    import ckparity

    CALLS = [0]

    def segfaulting_linear(x, weight, bias=None):
        """a linear whose 8th call reads address 0 (the contract's call is the 1st)"""
        CALLS[0] += 1
        if CALLS[0] == 8:
            ctypes.string_at(0)
        return F.linear(x, weight, bias)

    def _swiglu(x):
        return F.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2:]

    class _AbortInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return _swiglu(x)

        @staticmethod
        def backward(ctx, g):
            CALLS[0] += 1
            if CALLS[0] == 5:
                os.abort()
            (x,) = ctx.saved_tensors
            with torch.enable_grad():
                x = x.detach().requires_grad_(True)
                return torch.autograd.grad(_swiglu(x), x, g)[0]

    def aborting_swiglu(x):
        """a swiglu whose backward aborts on its 5th call (registered unchecked: no contract call)"""
        return _AbortInBackward.apply(x)

    def hanging_linear(x, weight, bias=None):
        """a linear whose 8th call sleeps in C for 11 days"""
        CALLS[0] += 1
        if CALLS[0] == 8:
            ctypes.CDLL(None).sleep(10 ** 6)
        return F.linear(x, weight, bias)

    ckparity.register_backend("linear", "segfaulting", segfaulting_linear)
    ckparity.register_backend("linear", "hanging", hanging_linear)
    ckparity.register_backend("swiglu", "aborting", aborting_swiglu, check=False)
''')


@pytest.mark.parametrize("flag, backend, signal, kernel, stage", [
    ("--ck-linear-backend", "segfaulting", "SIGSEGV", "linear", "forward"),
    ("--ck-swiglu-backend", "aborting", "SIGABRT", "swiglu", "backward")])
def test_a_crashing_kernel_is_a_report(tmp_path, flag, backend, signal, kernel, stage):
    (tmp_path / "engine.py").write_text(PLUGIN)
    done = subprocess.run([sys.executable, "-m", "ckparity", "train", "--plugin", "engine.py", flag, backend,
                           "--max-steps", "6", "--no-progress", "--json-out", "r.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    crash = report["crash"]
    assert report["status"] == "error" and crash["ending"] == f"killed by {signal}"
    assert (crash["kernel"], crash["backend"], crash["stage"]) == (kernel, backend, stage)
    assert crash["step"] >= 2 and report["steps"] == crash["step"] - 1
    assert f"in the {stage} of {kernel} at step {crash['step']}" in done.stderr


# --jobs 2 (every variant a child, each its own place record) is nightly: CI's 15 minutes
@pytest.mark.parametrize("jobs", ["1", pytest.param("2", marks=pytest.mark.nightly)])
def test_attribute_survives_a_crashing_kernel_and_names_it(tmp_path, jobs):
    """attribute's variants that call the segfaulting linear end as error rows naming the kernel, the stage
    and the step; the variants on torch's linear still run and report."""
    (tmp_path / "engine.py").write_text(PLUGIN)
    done = subprocess.run([sys.executable, "-m", "ckparity", "attribute", "--plugin", "engine.py",
                           "--ck-linear-backend", "segfaulting", "--max-steps", "4", "--jobs", jobs,
                           "--json-out", "a.json"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-2000:]  # the configured run errored
    result = json.loads((tmp_path / "a.json").read_text())
    rows = {v["name"]: v for v in result["variants"]}
    crashed = [v for v in rows.values() if v["backends"]["linear"] == "segfaulting"]
    assert crashed and all(v["status"] == "error" for v in crashed)
    for v in crashed:
        assert v["crash"]["ending"] == "killed by SIGSEGV" and v["crash"]["kernel"] == "linear"
        assert "the forward of linear at step" in v["error"]
    assert rows["all torch"]["status"] == "pass"
    assert "killed by SIGSEGV" in done.stdout  # the table says it


def test_a_hanging_kernel_is_killed_and_reported(tmp_path):
    """A child whose place record stands still for --hang-timeout seconds is killed as hung; the report
    says where it stood. An 8 s timeout: the child's set-up (imports, then the twins) moves it twice."""
    (tmp_path / "engine.py").write_text(PLUGIN)
    done = subprocess.run([sys.executable, "-m", "ckparity", "train", "--plugin", "engine.py", "--ck-linear-backend",
                           "hanging", "--hang-timeout", "8", "--max-steps", "6", "--no-progress", "--json-out", "r.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    crash = json.loads((tmp_path / "r.json").read_text())["crash"]
    assert crash["ending"] == "hung (no slot called for 8 s) and killed"
    assert (crash["kernel"], crash["backend"], crash["stage"]) == ("linear", "hanging", "forward")
    assert f"hung (no slot called for 8 s) and killed and wrote no report, in the forward of linear at step {crash['step']}" in done.stderr


def test_a_hang_timeout_must_be_a_number_of_seconds(tmp_path):
    from ckparity.cli import main

    for bad in ("-1", "inf", "nan"):
        assert main(["train", "--hang-timeout", bad, "--json-out", str(tmp_path / "r.json")]) == 2
    assert not (tmp_path / "r.json").exists()


def test_a_gate_survives_a_crashing_backend_and_names_where(tmp_path):
    """gate --backend runs each gate in a process of its own: fd_gradients' twins run the segfaulting linear
    in that process, which dies; the gate fails naming the stage and the kernel, and the gates after it run."""
    (tmp_path / "engine.py").write_text(PLUGIN)
    done = subprocess.run([sys.executable, "-m", "ckparity", "gate", "--plugin", "engine.py", "--backend",
                           "linear=segfaulting", "--only", "fd_gradients", "optimizer_parity", "--out-dir", "gates"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    fd = json.loads((tmp_path / "gates" / "fd_gradients_latest.json").read_text())
    assert not fd["passed"] and fd["details"]["crash"]["ending"] == "killed by SIGSEGV"
    assert "killed by SIGSEGV in the forward of linear (with linear=segfaulting)" in fd["summary"]
    after = json.loads((tmp_path / "gates" / "optimizer_parity_latest.json").read_text())
    assert after["passed"], after["summary"]  # the next gate ran (it calls no linear)


def test_a_gate_whose_backend_hangs_is_killed_and_names_where(tmp_path):
    """gate --hang-timeout: fd_gradients' own twins call the hanging linear in the gate's process, whose place
    record then stands still; the process is killed, the gate fails saying so and where, the next gate runs."""
    (tmp_path / "engine.py").write_text(PLUGIN)
    done = subprocess.run([sys.executable, "-m", "ckparity", "gate", "--plugin", "engine.py", "--backend",
                           "linear=hanging", "--hang-timeout", "8", "--only", "fd_gradients", "optimizer_parity",
                           "--out-dir", "gates"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-2000:]
    fd = json.loads((tmp_path / "gates" / "fd_gradients_latest.json").read_text())
    assert not fd["passed"] and fd["details"]["crash"]["ending"] == "hung (no slot called for 8 s) and killed"
    assert "hung (no slot called for 8 s) and killed in the forward of linear (with linear=hanging)" in fd["summary"]
    assert json.loads((tmp_path / "gates" / "optimizer_parity_latest.json").read_text())["passed"]


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_a_gate_hang_timeout_must_be_a_number_of_seconds(tmp_path, bad):
    from ckparity.cli import main
    assert main(["gate", "--only", "drift_smoke", "--hang-timeout", bad, "--out-dir", str(tmp_path / "g")]) == 2
    assert not (tmp_path / "g" / "drift_smoke_latest.json").exists()  # refused before any gate ran


LOAD_CRASH = textwrap.dedent('''
    import ctypes
    import torch.nn.functional as F
    import ckparity

    def segfaulting_gelu(x, approximate="none"):
        """a gelu that reads address 0 on its first call: the contract check's, at registration"""
        ctypes.string_at(0)
        return F.gelu(x, approximate=approximate)

    ckparity.register_backend("gelu", "segfaulting", segfaulting_gelu)
''')


@pytest.mark.parametrize("command", [["train", "--model", "gpt2", "--ck-gelu-backend", "segfaulting"],
                                     ["gate", "--only", "kernel_parity", "--backend", "gelu=segfaulting"]])
def test_a_plugin_that_crashes_as_it_loads_is_refused_by_name(tmp_path, command):
    """A backend that segfaults in its contract check, at --plugin's load, ends a probe process, not the
    command: exit 2, the plugin named with the signal and the child's Python stack (the register_backend
    call), and no work started."""
    (tmp_path / "engine.py").write_text(LOAD_CRASH)
    done = subprocess.run([sys.executable, "-m", "ckparity", command[0], "--plugin", "engine.py", *command[1:],
                           "--json-out" if command[0] == "train" else "--out-dir", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--plugin engine.py: loading it killed the process (SIGSEGV)" in done.stderr
    assert "segfaulting_gelu" in done.stderr  # the child's last words: faulthandler's stack
    assert not (tmp_path / "out").exists()
