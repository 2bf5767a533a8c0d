"""ckparity bench: each kernel against its torch counterpart, in one run, on
the same tensors.

Per kernel and shape:
- ``ckparity_ms`` / ``torch_ms``: median time of the user-facing call
  (forward+backward through autograd, outputs made by each call -- ckparity's
  large ones on reused buffers, CKP_OUTPUT_POOL_MB -- or the optimizer step),
  and ``speedup`` = torch_ms / ckparity_ms;
  ``ckparity_mean_ms`` / ``torch_mean_ms`` and ``speedup_of_means`` (and
  ``speedup_vs_compile_of_means``) the same of the samples' means: what a run
  of calls costs, slow calls included (a median leaves them out);
- ``kernel_ms``: median time of the C calls alone on preallocated outputs
  (no autograd, no allocation), ``c_calls`` of them, through the same
  bindings the ops use (ckparity._bindings: pointer casts and the status
  check, about a microsecond a call, are included);
- ``bandwidth_fraction``: the bytes the operation must move at minimum over
  ckparity_ms, as a fraction of a STREAM-style copy measured in the same run;
  ``kernel_bandwidth_fraction`` the same over kernel_ms;
- ``overhead_us_per_call``: (ckparity_ms - kernel_ms) / c_calls, the cost of
  the op above the binding (checks, output allocation, autograd) per call;
  ``autograd_floor_us`` (one per report) is the part of it no Python op
  avoids: fwd+bwd of an autograd.Function that computes nothing;
- ``torch_compile_ms`` / ``speedup_vs_compile``: torch's counterpart through
  ``torch.compile`` (inductor; compiled once, outside the timing; the
  optimizer rows compile the single-tensor step), the peer a user would pick
  instead of eager — or null and ``compile_error`` where inductor cannot run;
- the vocab_parallel_cross_entropy row (bench_ranks.py): two ranks on gloo
  against torch's loss_parallel, and whether their losses have the same bits;
- ``ckparity_peak_mb`` / ``torch_peak_mb`` / ``inputs_mb`` / ``peak_ratio``:
  peak resident memory of one call of each large row, each side in a fresh
  process (bench_memory.py); the fused linear + cross-entropy row (a 128k
  vocabulary) is timed by that one call per side only.

The three timings of a case are taken in turn, repeat by repeat, so a drift
in the machine's speed hits them alike; each is a median. The copy bandwidth
is the best of the repeats (STREAM's convention: the machine's capability,
not its noise).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Collection

import torch

from . import cpu, kernels
from .kernels.benching import Case, fwd_bwd
from .threads import get_num_threads


def _times_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm up (allocations, first-touch, lazy imports)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return times


# A sample lasts at least this long: a call of a few microseconds is timed as a run of calls, not
# alone, where the timer's own cost and the caches the previous side left weigh on it (the tiny
# cross_entropy row: 42 us against torch's 26 one call at a time, 31 against 20 as runs).
SAMPLE_MS = 1.0


def interleaved_samples_ms(fns: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Each callable's samples (time per call, ms), the callables measured in
    turn (a, b, c, a, b, c, ...): on a shared machine whose speed drifts, each
    sees the same drift, so their ratios are steadier than from back-to-back
    blocks. A callable faster than SAMPLE_MS is run that many times in a row
    per sample (the count fixed by its second call)."""
    runs = []
    for fn in fns:
        fn()  # warm up
        start = time.perf_counter()
        fn()  # how long one call takes
        runs.append(max(1, math.ceil(SAMPLE_MS / max(1e3 * (time.perf_counter() - start), 1e-3))))
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out, n in zip(fns, times, runs):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            out.append(1e3 * (time.perf_counter() - start) / n)
    return times


def interleaved_median_ms(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """The median of each callable's interleaved_samples_ms."""
    return [statistics.median(t) for t in interleaved_samples_ms(fns, repeats)]


class _Nothing(torch.autograd.Function):
    """An op that computes nothing, written as ckparity's ops are (a Python autograd.Function):
    forward makes the 0-dim output and the gradient's buffer, backward hands the buffer over."""

    @staticmethod
    def forward(ctx, x):
        ctx.grad = torch.empty_like(x)
        return x.new_empty(())

    @staticmethod
    def backward(ctx, _grad):
        return ctx.grad


def autograd_floor_us(repeats: int) -> float:
    """fwd+bwd of _Nothing on the tiny cross_entropy row's logits (8, 256), timed as the rows are:
    what any Python autograd.Function costs before its kernel and its checks."""
    return 1e3 * interleaved_median_ms([fwd_bwd(_Nothing.apply, torch.zeros(8, 256, requires_grad=True))],
                                       repeats)[0]


def copy_gbps(repeats: int, nbytes: int = 1 << 28) -> float:
    """STREAM copy (read nbytes, write nbytes) in GB/s, best of the repeats."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / (min(_times_ms(lambda: dst.copy_(src), repeats)) * 1e6)


def cases(select: Callable[[str, str], bool] = lambda kernel, shape: True, dtype: str = "float32"):
    """The bench's rows of ``dtype`` (a bfloat16 row's shape ends in " bf16"),
    every kernel record's (kernels/<kernel>.py); only those
    ``select(kernel, shape)`` accepts are built, each record's from its own
    generator."""
    def chosen(kernel: str, shape: str) -> bool:
        return shape.endswith(" bf16") == (dtype == "bfloat16") and select(kernel, shape)

    for record in kernels.KERNELS.values():
        if record.bench is not None:
            yield from record.bench(torch.Generator().manual_seed(0), chosen)


def inductor_cache_per_capability() -> str:
    """torch.compile's on-disk cache (inductor's) does not key its kernels by
    the ATen capability: a bf16 bench under ATEN_CPU_CAPABILITY=avx2 after one
    at avx512 loaded that run's kernels and died with SIGSEGV inside them
    (torch 2.13; a fresh cache ran). Unless the user chose a cache
    (TORCHINDUCTOR_CACHE_DIR), each capability gets its own directory; returns
    the one in use."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from torch._inductor.runtime.runtime_utils import default_cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
            default_cache_dir(), f"capability_{torch.backends.cpu.get_cpu_capability().lower()}")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def _compile(case: Case) -> tuple[Callable[[], object] | None, str | None]:
    """torch's counterpart compiled and run once (the compile happens here, not in the timing)."""
    if case.compiled is None:
        return None, "no compiled counterpart for this row"
    try:
        fn = case.compiled()
        fn()
        return fn, None
    except Exception as err:  # inductor needs a C++ compiler and more; say why it could not run
        return None, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


# rows that move at least this much get a peak-memory measurement (bench_memory.py)
LARGE_BYTES = 64 << 20


def peak_memory(kernel: str, shape: str, side: str) -> dict:
    """The row's call on ``side`` in a fresh process (bench_memory.py): peak_mb, inputs_mb, ms, peak_since."""
    proc = subprocess.run([sys.executable, "-m", "ckparity.bench_memory", kernel, shape, side],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"measuring {kernel} {shape} ({side}) failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _memory(case: Case) -> dict:
    """Both sides' peak RSS, each in a fresh process."""
    ours, theirs = (peak_memory(case.kernel, case.shape, side) for side in ("ckparity", "torch"))
    return {"ckparity_peak_mb": ours["peak_mb"], "torch_peak_mb": theirs["peak_mb"], "inputs_mb": ours["inputs_mb"],
            "peak_ratio": ours["peak_mb"] / theirs["peak_mb"], "peak_since": ours["peak_since"],
            "_ms": (ours["ms"], theirs["ms"])}


def _once_row(case: Case, copy: float) -> dict:
    """A row too large to repeat: one call per side, timed in its fresh process."""
    memory = _memory(case)
    ck_ms, torch_ms = memory.pop("_ms")
    return {"kernel": case.kernel, "shape": case.shape, "ckparity_ms": ck_ms, "torch_ms": torch_ms,
            "speedup": torch_ms / ck_ms, "torch_compile_ms": None, "speedup_vs_compile": None,
            "compile_error": "not compiled: one call per side at this size", "repeats": 1,
            "ckparity_gbps": case.nbytes / (ck_ms * 1e6), "bandwidth_fraction": case.nbytes / (ck_ms * 1e6) / copy,
            **memory}


def row_names(dtype: str) -> list[tuple[str, str]]:
    """(kernel, shape) of every row of ``dtype``, nothing built; the vocab-parallel row is float32's."""
    names = []

    def record(kernel: str, shape: str) -> bool:
        names.append((kernel, shape))
        return False

    list(cases(select=record, dtype=dtype))
    if dtype == "float32":
        from .bench_ranks import shape

        names.append(("vocab_parallel_cross_entropy", shape()))
    return names


def row_kernels() -> list[str]:
    """The kernels with rows in the bench, of any dtype (the names ``--kernel`` takes)."""
    return sorted({kernel for dtype in ("float32", "bfloat16") for kernel, _ in row_names(dtype)})


def _wanted(kernel: str, kernels: Collection[str] | None, memory: bool, distributed: bool) -> bool:
    """Whether bench() runs this kernel's rows: those of ``kernels`` (None: all); the fused row only
    with the memory columns (fresh processes are how it is measured), the vocab-parallel row only
    with ``distributed`` (two gloo ranks)."""
    return ((kernels is None or kernel in kernels) and (memory or kernel != "fused_linear_cross_entropy")
            and (distributed or kernel != "vocab_parallel_cross_entropy"))


def selected(dtype: str, kernels: Collection[str] | None = None, memory: bool = True,
             distributed: bool = True) -> list[tuple[str, str]]:
    """The rows bench() would run with these arguments, nothing built (the CLI refuses an empty choice)."""
    return [(k, s) for k, s in row_names(dtype) if _wanted(k, kernels, memory, distributed)]


def bench(repeats: int = 5, compile: bool = True, distributed: bool = True, memory: bool = True,
          dtype: str = "float32", kernels: Collection[str] | None = None) -> dict:
    """Every row of ``dtype``, or only those of ``kernels``' names (row_kernels())."""
    if compile:
        inductor_cache_per_capability()
    copy = copy_gbps(repeats)
    results = []
    for case in cases(select=lambda kernel, shape: _wanted(kernel, kernels, memory, distributed), dtype=dtype):
        if case.once:
            results.append(_once_row(case, copy))
            continue
        compiled, compile_error = _compile(case) if compile else (None, "--no-compile")
        fns = [case.ours, case.theirs] + ([compiled] if compiled is not None else []) + \
              ([case.c_kernel] if case.c_kernel is not None else [])
        samples = interleaved_samples_ms(fns, repeats)
        ck_ms, torch_ms, *rest = (statistics.median(t) for t in samples)
        # the means too: a call that is slow now and then (a fresh output's pages, [Note: huge pages for
        # large outputs]) costs a training run its mean, which the median does not show
        ck_mean, torch_mean, *rest_mean = (statistics.mean(t) for t in samples)
        compile_ms = rest.pop(0) if compiled is not None else None
        compile_mean = rest_mean[0] if compiled is not None else None
        kernel = rest
        row = {"kernel": case.kernel, "shape": case.shape, "ckparity_ms": ck_ms, "torch_ms": torch_ms,
               "speedup": torch_ms / ck_ms, "torch_compile_ms": compile_ms,
               "speedup_vs_compile": compile_ms / ck_ms if compile_ms is not None else None,
               "compile_error": compile_error, "ckparity_mean_ms": ck_mean, "torch_mean_ms": torch_mean,
               "speedup_of_means": torch_mean / ck_mean,
               "speedup_vs_compile_of_means": compile_mean / ck_mean if compile_mean is not None else None,
               "ckparity_gbps": case.nbytes / (ck_ms * 1e6)}
        row["bandwidth_fraction"] = row["ckparity_gbps"] / copy
        if kernel:
            kernel_ms = kernel[0]
            row.update(kernel_ms=kernel_ms, c_calls=case.c_calls,
                       kernel_bandwidth_fraction=case.nbytes / (kernel_ms * 1e6) / copy,
                       overhead_us_per_call=1e3 * (ck_ms - kernel_ms) / case.c_calls)
        if memory and case.nbytes >= LARGE_BYTES:
            row.update({k: v for k, v in _memory(case).items() if k != "_ms"})
        results.append(row)
    if dtype == "float32" and _wanted("vocab_parallel_cross_entropy", kernels, memory, distributed):
        from .bench_ranks import vocab_parallel_row

        row = vocab_parallel_row(repeats)
        results.append({**row, "bandwidth_fraction": row["ckparity_gbps"] / copy})
    return {"schema": "ckparity.bench/5", "dtype": dtype, "capability": cpu.capability(), "copy_gbps": copy,
            "autograd_floor_us": autograd_floor_us(repeats), "threads": get_num_threads(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats,
            "results": results}


def table(data: dict) -> str:
    floor = data.get("autograd_floor_us")  # not in reports older than it
    lines = [f"copy bandwidth {data['copy_gbps']:.1f} GB/s (best of {data['repeats']}), {data['threads']} threads, "
             f"torch at {data['capability']['torch']}" +
             (f"; a Python autograd.Function that computes nothing: {floor:.1f} us fwd+bwd" if floor else ""),
             "", "| kernel | shape | ckparity ms | torch eager ms | speedup | torch.compile ms | speedup vs compile "
             "| speedup of means: eager / compile | of copy | C kernel ms | kernel of copy | overhead us/call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        kernel = (f"{r['kernel_ms']:.3f} | {100 * r['kernel_bandwidth_fraction']:.0f}% | "
                  f"{r['overhead_us_per_call']:.0f}") if "kernel_ms" in r else "- | - | -"
        compiled = (f"{r['torch_compile_ms']:.3f} | {r['speedup_vs_compile']:.2f}x" if r["torch_compile_ms"] is not None
                    else "- | -")
        means = "-"  # not in reports older than it, nor in the rows timed once
        if r.get("speedup_of_means") is not None:
            of_compile = r.get("speedup_vs_compile_of_means")
            means = f"{r['speedup_of_means']:.2f}x / " + (f"{of_compile:.2f}x" if of_compile is not None else "-")
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['ckparity_ms']:.3f} | {r['torch_ms']:.3f} | "
                     f"{r['speedup']:.2f}x | {compiled} | {means} | {100 * r['bandwidth_fraction']:.0f}% | {kernel} |")
    return "\n".join(lines)
