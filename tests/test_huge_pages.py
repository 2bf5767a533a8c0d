"""Large outputs ask Linux for huge pages unless CKP_HUGE_PAGES=0 ([Note: huge pages for large
outputs] in ckparity/_tensors.py); a value other than 0 or 1 is refused by name when ckparity is
imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# a 64 MB output from the ops' allocator, written, and the huge pages (kB) of the mappings it lies in
# (the advice splits its mapping: the page before the first whole page has none)
_CODE = """
import torch
from ckparity import _tensors
t = _tensors.empty(((64 << 20) // 4,), torch.float32)
t.fill_(1.0)
start, kb, inside = t.data_ptr(), 0, False
end = start + t.numel() * t.element_size()
for line in open("/proc/self/smaps"):
    fields = line.split()
    if fields and "-" in fields[0] and all(c in "0123456789abcdef-" for c in fields[0]):
        lo, hi = (int(v, 16) for v in fields[0].split("-"))
        inside = lo < end and start < hi
    elif inside and fields[0] == "AnonHugePages:":
        kb += int(fields[1])
print(kb)
"""


def _huge_kb(value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("CKP_HUGE_PAGES", "THP_MEM_ALLOC_ENABLE")}
    if value is not None:
        env["CKP_HUGE_PAGES"] = value
    out = subprocess.run([sys.executable, "-c", _CODE], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _fallbacks() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_fallback "):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(not THP.exists() or "[madvise]" not in THP.read_text(),
                    reason="huge pages only where asked for (THP in madvise mode) tell the advice apart")
def test_large_outputs_get_huge_pages_unless_turned_off():
    assert _huge_kb("0") == 0  # no advice: in madvise mode, 4 KB pages only
    before = _fallbacks()
    on = _huge_kb(None)
    if on == 0 and _fallbacks() > before:
        pytest.skip("the kernel had no free huge page to give (thp_fault_fallback moved)")
    assert on >= 32 << 10  # at least half of the 64 MB
    assert _huge_kb("1") > 0


def test_a_bad_ckp_huge_pages_is_refused_by_name():
    env = {**os.environ, "CKP_HUGE_PAGES": "yes"}
    out = subprocess.run([sys.executable, "-c", "import ckparity"], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "CKP_HUGE_PAGES must be 0" in out.stderr and "'yes'" in out.stderr
