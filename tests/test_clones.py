"""Every build of the hot loops gives the same bits, at every capability.

The installed library picks AVX-512, AVX2+FMA or baseline code at load time
(target_clones), so on one CPU only one clone ever runs. CKP_ISA_LIBS names
builds with one ISA's code each (meson -Dclones=false [-Dmarch=...];
./scripts/test.sh builds baseline, x86-64-v3 and x86-64-v4): each runs here
if this CPU can execute it, and is skipped by name if not. Each kernel runs
through the installed library and the single-ISA build on the same inputs,
at each torch capability the kernels follow (ckp_set_capability: it selects
arithmetic, not instructions, so all three run on any CPU), and every output
must be equal bit for bit: the claim that the vector code does each
element's IEEE operations as written, whatever the vector width.
"""

from __future__ import annotations

import os

import pytest
import torch

from ckparity._native import ffi, lib
from ckparity.builds import cases, differing
from ckparity.cpu import CAPABILITIES

ISA_LIBS = dict(item.split("=", 1) for item in os.environ.get("CKP_ISA_LIBS", "").split(",") if item)
pytestmark = pytest.mark.skipif(not ISA_LIBS, reason="CKP_ISA_LIBS is not set (./scripts/test.sh sets it)")

# What the CPU needs to run each build (torch's cpuinfo names).
ISA_NEEDS = {"baseline": [], "x86-64-v3": ["avx2", "fma"], "x86-64-v4": ["avx512f", "avx512bw", "avx512vl", "avx512dq"]}


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.fixture(scope="module", params=sorted(ISA_LIBS))
def isa_build(request):
    isa = request.param
    missing = [f for f in ISA_NEEDS.get(isa, []) if f not in cpu_flags()]
    if missing:
        pytest.skip(f"{isa} build: this CPU lacks {', '.join(missing)}")
    return ffi.dlopen(ISA_LIBS[isa])


@pytest.fixture(params=CAPABILITIES)
def capability(request, isa_build):
    before = lib.ckp_get_capability()
    index = CAPABILITIES.index(request.param)
    assert lib.ckp_set_capability(index) == 0 and isa_build.ckp_set_capability(index) == 0
    yield request.param
    lib.ckp_set_capability(before)


@pytest.mark.parametrize("name,run", list(cases()), ids=[name for name, _ in cases()])
def test_same_bits_as_single_isa_build(isa_build, capability, name, run):
    torch.manual_seed(0)
    for k, (elements, count) in enumerate(differing(run, lib, isa_build)):
        assert count == 0, f"{name} at {capability} output {k}: {count} of {elements} elements differ"


def test_each_build_names_the_isa_it_runs():
    """ckp_isa: a single-ISA build names its own; the installed one names the
    clone GCC's resolver picks here, which is the highest level this CPU runs
    (ckparity mutate builds that one alone)."""
    from ckparity._native import isa

    runnable = [name for name in ("x86-64-v4", "x86-64-v3")
                if all(f in cpu_flags() for f in ISA_NEEDS[name])] + ["baseline"]
    assert isa() == runnable[0]
    for name, path in ISA_LIBS.items():
        assert isa(ffi.dlopen(path)) == name
