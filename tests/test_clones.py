"""Every build of the hot loops gives the same bits.

The installed library picks AVX-512, AVX2+FMA or baseline code at load time
(target_clones); CKP_BASELINE_LIB names a build with only the baseline code
(meson -Dclones=false; ./scripts/test.sh builds it in build/baseline). Each
kernel runs through both on the same inputs, and every output must be equal
bit for bit: the claim that the vector code does each element's IEEE
operations as written, whatever the vector width.
"""

from __future__ import annotations

import os

import pytest

from ckparity._native import ffi, lib
from ckparity.builds import cases, differing

BASELINE = os.environ.get("CKP_BASELINE_LIB")
pytestmark = pytest.mark.skipif(not BASELINE, reason="CKP_BASELINE_LIB is not set (./scripts/test.sh sets it)")


@pytest.fixture(scope="module")
def baseline():
    return ffi.dlopen(BASELINE)


@pytest.mark.parametrize("name,run", list(cases()), ids=[name for name, _ in cases()])
def test_same_bits_as_baseline_build(baseline, name, run):
    for k, (elements, count) in enumerate(differing(run, lib, baseline)):
        assert count == 0, f"{name} output {k}: {count} of {elements} elements differ"
