"""Peak resident memory of one bench row's call, each side in a fresh process.

A process's peak RSS only ever grows, so it is measured where nothing else
ran before: `python -m ckparity.bench_memory KERNEL SHAPE SIDE` builds only
that row's inputs, resets the kernel's high-water mark (writing 5 to
/proc/self/clear_refs), makes the one call (forward+backward, or the
optimizer step) and reads VmHWM. ``peak_mb`` is the whole process's peak
during the call (inputs included, as a user's process holds them too);
``inputs_mb`` the resident size just before it. bench.peak_memory starts it. Where the mark cannot be
reset, the peak counts from process start and ``peak_since`` says so."""

from __future__ import annotations

import gc
import json
import sys
import time

from .bench import cases

SIDES = ("ckparity", "torch")


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))


def _main(kernel: str, shape: str, side: str) -> None:
    dtype = "bfloat16" if shape.endswith(" bf16") else "float32"  # a bf16 row's shape says so (bench.cases)
    case = next(cases(select=lambda k, s: (k, s) == (kernel, shape), dtype=dtype), None)
    if case is None or side not in SIDES:
        raise SystemExit(f"no bench row {kernel} {shape} or side {side} (sides: {SIDES})")
    fn = case.ours if side == "ckparity" else case.theirs
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        since = "call"
    except OSError:
        since = "process start"
    inputs = _status_kb("VmRSS")
    start = time.perf_counter()
    fn()
    ms = 1e3 * (time.perf_counter() - start)
    print(json.dumps({"peak_mb": _status_kb("VmHWM") / 1024, "inputs_mb": inputs / 1024, "ms": ms,
                      "peak_since": since}))


if __name__ == "__main__":
    _main(*sys.argv[1:4])
