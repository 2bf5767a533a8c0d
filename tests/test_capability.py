"""Bit-identity at every CPU capability torch can run at on this machine.

torch runs its CPU kernels at one capability per process (DEFAULT, AVX2,
AVX512), fixed at start-up and lowered by ATEN_CPU_CAPABILITY. Each test
here runs in a subprocess per capability; a capability this CPU cannot run
(torch reports a lower one) is skipped with its name, never failed. At each:
- the bit-identity sweep (ckparity.sweep: every width 1..300 and large odd
  ones) finds no differing case in any quantity a kernel's record claims, in
  float32 and in bfloat16;
- the sweep can fail: with the library set to another capability's
  arithmetic, it finds the differences;
- the CK twin with ptref, C rms_norm, swiglu, rope and torch's AdamW is
  bit-identical to the torch twin (stacked and llama models).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

import pytest
import torch

import ckparity
from ckparity import cpu, kernels

CAPABILITIES = ("default", "avx2", "avx512")


def run_at(capability: str, code: str, timeout: float = 600) -> str:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"at {capability}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc.stdout


@functools.lru_cache(maxsize=None)
def highest_capability() -> str:
    """What torch picks on this CPU by itself. (torch 2.13 takes
    ATEN_CPU_CAPABILITY=avx512 on an AVX2 CPU, reports AVX512 and dies of an
    illegal instruction: what the CPU can run is asked without the variable.)"""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip().lower()


@pytest.fixture(params=CAPABILITIES)
def capability(request):
    highest = highest_capability()
    if highest not in CAPABILITIES or CAPABILITIES.index(request.param) > CAPABILITIES.index(highest):
        pytest.skip(f"{request.param.upper()}: this CPU runs torch at {highest.upper()} at most")
    return request.param


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_sweep_is_bit_identical_at(capability, dtype):
    """Every claim's sweep at each capability torch can run here: in CI at the CPU's highest (test_clones
    runs the library's code of every capability against the single-ISA builds there), nightly at each."""
    if capability != highest_capability() and os.environ.get("CKP_NIGHTLY") != "1":
        pytest.skip("nightly tier at a capability below the CPU's highest (CI runs the highest)")
    # held_only: a claim whose condition fails here (MKL's branch, oneDNN's) is not swept, only named
    code = f"import ckparity.sweep as s, json; print(json.dumps(s.run(dtype={dtype!r}, held_only=True)))"
    result = json.loads(run_at(capability, code))
    assert result["capability"] == {"torch": capability.upper(), "library": capability.upper(), "matched": True}
    assert result["dtype"] == dtype and kernels.claims(dtype)
    for claim in kernels.claims(dtype):
        kernel, quantities = claim.key, claim.quantities
        if kernel in result["not_claimed_here"]:  # a condition beyond the capability fails here (MKL's branch)
            assert claim.holds is not None and result["not_claimed_here"][kernel] and kernel not in result["kernels"]
            continue
        swept = result["kernels"][kernel]
        assert sorted(swept) == sorted(quantities), f"{kernel}: the sweep and the record's claim name other quantities"
        for quantity in quantities:
            figures = swept[quantity]
            assert figures["swept"] >= 300, f"{kernel}.{quantity}: only {figures['swept']} cases swept"
            assert figures["differing"] == 0, (
                f"{kernel}.{quantity} at {capability}: {figures['differing']} of {figures['swept']} cases differ, "
                f"e.g. {figures['examples']}")
    # every tensor argument of every kernel in every layout: its contiguous bits, torch's where claimed
    for quantity in ("as a contiguous copy", "torch's bits", "refused as torch refuses"):
        figures = result["layouts"][quantity]
        assert figures["swept"] and figures["differing"] == 0, (
            f"layouts, {quantity} at {capability}: {figures['differing']} of {figures['swept']}: {figures['examples']}")


# Another capability whose arithmetic differs from this one's in swiglu and ptref.
OTHER = {"default": "AVX2", "avx2": "AVX512", "avx512": "AVX2"}


def test_sweep_finds_another_capabilitys_arithmetic(capability):
    """The library set to another capability than torch runs at: the sweep
    must see swiglu's and ptref's differences (a sweep that cannot fail
    proves nothing). In CI at the CPU's highest capability; nightly at each."""
    if capability != highest_capability() and os.environ.get("CKP_NIGHTLY") != "1":
        pytest.skip("nightly tier at a capability below the CPU's highest (CI runs the highest)")
    other = OTHER[capability]
    code = ("import ckparity.sweep as s, json; from ckparity._native import lib; from ckparity import cpu;"
            f"lib.ckp_set_capability(cpu.CAPABILITIES.index({other!r}));"
            "print(json.dumps(s.run(['swiglu', 'cross_entropy.ptref'])))")
    result = json.loads(run_at(capability, code))
    assert result["capability"]["matched"] is False
    assert result["kernels"]["swiglu"]["out"]["differing"] > 0
    assert result["kernels"]["swiglu"]["dx"]["differing"] > 0
    assert result["kernels"]["cross_entropy.ptref"]["dlogits"]["differing"] > 0


TWINS = """
import json, tempfile
from dataclasses import replace
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.loop.run import train
runs = {
    "stacked": RunConfig(model="stacked", num_layers=3, vocab=300, d_model=40, hidden=70, seq_len=8, grad_accum=2,
                         max_steps=60, ck_loss_backend="c_ptref", ck_optimizer_backend="torch", no_progress=True,
                         total_tokens=100000),
    "llama": RunConfig(model="llama", num_layers=2, heads=4, kv_heads=2, d_model=32, hidden=48, vocab=64, seq_len=8,
                       batch_size=2, grad_accum=2, total_tokens=4096, max_steps=30, no_progress=True,
                       ck_loss_backend="c_ptref", ck_optimizer_backend="torch"),
}
out = {}
for name, config in runs.items():
    r = train(replace(config, json_out=tempfile.mkdtemp() + "/report.json"))  # not the cwd's reports/
    out[name] = {"status": r["status"], "divergence": r["divergence"]["first_step"],
                 "param": r["max_param_abs_diff"], "loss": r["max_loss_abs_diff"], "steps": r["steps"]}
print(json.dumps(out))
"""


def test_twins_with_ptref_are_bit_identical_at(capability):
    for name, r in json.loads(run_at(capability, TWINS)).items():
        assert r["status"] == "pass" and r["steps"] > 0, (name, r)
        assert r["divergence"] is None and r["param"] == 0.0 and r["loss"] == 0.0, (capability, name, r)


def test_reports_and_info_carry_the_capability():
    env = ckparity.capability()
    assert env == {"torch": torch.backends.cpu.get_cpu_capability(), "library": cpu.library_capability(),
                   "matched": cpu.matched()}
    from ckparity.harness.loop.run import environment

    recorded = environment()
    assert recorded["torch_cpu_capability"] == env["torch"]
    assert recorded["library_cpu_capability"] == env["library"] and recorded["capability_matched"] == env["matched"]


def test_library_capability_is_checked():
    from ckparity._native import lib

    before = lib.ckp_get_capability()
    assert lib.ckp_set_capability(3) == lib.CKP_ERR_BAD_OPTION and lib.ckp_set_capability(-1) == lib.CKP_ERR_BAD_OPTION
    assert lib.ckp_get_capability() == before


def test_unmatched_capability_claims_nothing(monkeypatch):
    """Where the library cannot follow torch, nothing is claimed bitwise (the
    envelope's null members then carry the C kernels' measured differences:
    tests/test_envelope.py)."""
    monkeypatch.setattr(cpu, "matched", lambda: False)
    assert kernels.bit_identical() == {}
