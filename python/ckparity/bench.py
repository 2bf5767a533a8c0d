"""ckparity bench: each kernel against its torch counterpart, in one run, on
the same tensors.

Per kernel and shape:
- ``ckparity_ms`` / ``torch_ms``: median time of the user-facing call
  (forward+backward through autograd with fresh output tensors, or the
  optimizer step), and ``speedup`` = torch_ms / ckparity_ms;
- ``kernel_ms``: median time of the C calls alone on preallocated outputs
  (no autograd, no allocation), ``c_calls`` of them, through the same
  bindings the ops use (ckparity._bindings: pointer casts and the status
  check, about a microsecond a call, are included);
- ``bandwidth_fraction``: the bytes the operation must move at minimum over
  ckparity_ms, as a fraction of a STREAM-style copy measured in the same run;
  ``kernel_bandwidth_fraction`` the same over kernel_ms;
- ``overhead_us_per_call``: (ckparity_ms - kernel_ms) / c_calls, the cost of
  the op above the binding (checks, output allocation, autograd) per call;
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
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import ckparity

from . import _bindings, reference


def _times_ms(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm up (allocations, first-touch, lazy imports)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def interleaved_median_ms(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median times of several callables measured in turn (a, b, c, a, b, c,
    ...): on a shared machine whose speed drifts, each sees the same drift,
    so their ratios are steadier than from back-to-back blocks."""
    for fn in fns:
        fn()  # warm up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - start))
    return [statistics.median(t) for t in times]


def copy_gbps(repeats: int, nbytes: int = 1 << 28) -> float:
    """STREAM copy (read nbytes, write nbytes) in GB/s, best of the repeats."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / (min(_times_ms(lambda: dst.copy_(src), repeats)) * 1e6)


@dataclass
class Case:
    kernel: str
    shape: str
    ours: Callable[[], object]    # the user-facing ckparity call
    theirs: Callable[[], object]  # torch's counterpart
    nbytes: int                   # bytes the operation must move at minimum
    c_kernel: Callable[[], None] | None = None  # the C calls alone (through _bindings), preallocated outputs
    c_calls: int = 1
    compiled: Callable[[], Callable[[], object]] | None = None  # makes torch's counterpart under torch.compile
    once: bool = False  # too large to repeat: one call per side, timed in its own process with its memory


# the fused linear + cross-entropy row: N, D, V (a Llama-3 vocabulary)
FUSED = (4096, 2048, 128256)


def _fwd_bwd(fn, x, *args, **kwargs):
    def run():
        x.grad = None
        out = fn(x, *args, **kwargs)
        out.backward(torch.ones_like(out) if out.dim() else None)
    return run


def _fresh_fwd_bwd(fn, src, *args, **kwargs):
    """fwd+bwd on src's values copied into one buffer each call, as a model's
    lm_head hands the loss new logits every step (the copy costs every side
    the same; the in-place loss overwrites the buffer, so it is refilled).
    The gradient is taken by autograd.grad, as the lm_head's matmul backward
    takes it: a leaf's .grad would have to copy dlogits away from the leaf's
    own storage (where the in-place loss wrote it), a cost no model pays."""
    x = src.clone().requires_grad_(True)

    def run():
        with torch.no_grad():
            x.copy_(src)
        torch.autograd.grad(fn(x, *args, **kwargs), x)
    return run


def _compiled_fwd_bwd(fn, x, *args, **kwargs):
    """A maker of the fwd+bwd closure of torch.compile(fn), for Case.compiled."""
    return lambda: _fwd_bwd(torch.compile(fn), x, *args, **kwargs)


def _compiled_step(optimizer):
    return lambda: torch.compile(optimizer.step)


def _ce_kernel(x, t, in_place: bool = False):
    loss, d = torch.empty(()), torch.empty_like(x)
    options = _bindings.cross_entropy_options()
    if in_place:  # on a scratch copy made once: the kernel's time alone, dlogits over the logits
        scratch = x.clone()
        return lambda: _bindings.cross_entropy(scratch, t, options, loss, scratch)
    return lambda: _bindings.cross_entropy(x, t, options, loss, d)


def _rms_kernel(x, w):
    y, rstd, dx, dw = torch.empty_like(x), torch.empty(x.shape[0]), torch.empty_like(x), torch.empty_like(w)
    dy = torch.ones_like(x)

    def run():
        _bindings.rms_norm_forward(x, w, 1e-6, y, rstd)
        _bindings.rms_norm_backward(dy, x, w, rstd, dx, dw)
    return run


def _swiglu_kernel(x):
    N, H = x.shape[0], x.shape[1] // 2
    out, dout, dx = torch.empty(N, H), torch.ones(N, H), torch.empty_like(x)

    def run():
        _bindings.swiglu_forward(x, out)
        _bindings.swiglu_backward(dout, x, dx)
    return run


def _rope_kernel(x, cos, sin):
    out, dx = torch.empty_like(x), torch.empty_like(x)

    def run():
        _bindings.rope_forward(x, cos, sin, "half", out)
        _bindings.rope_backward(out, cos, sin, "half", dx)
    return run


def _adamw_kernel(n, g):
    p, grad, m, v = (torch.randn(n, generator=g) for _ in range(4))
    v.abs_()
    options = _bindings.adamw_options(1e-3, 0.9, 0.999, 1e-8, 1e-2)
    return lambda: _bindings.adamw_step(p, grad, m, v, None, 10.0, options)


def _fused_linear_case(N: int, D: int, V: int, g) -> Case:
    hidden = torch.randn(N, D, generator=g).requires_grad_(True)
    weight = (torch.randn(V, D, generator=g) * D**-0.5).requires_grad_(True)
    t = torch.randint(0, V, (N,), generator=g)

    def run(fn):
        def call():
            hidden.grad = weight.grad = None
            fn(hidden, weight, t).backward()
        return call

    # at least: read hidden and weight, write grad_hidden and grad_weight (the logits never leave the chunk)
    return Case("fused_linear_cross_entropy", f"N={N},D={D},V={V}",
                run(ckparity.fused_linear_cross_entropy), run(lambda h, w, t: F.cross_entropy(F.linear(h, w), t)),
                8 * (N * D + V * D), once=True)


def cases(select: Callable[[str, str], bool] = lambda kernel, shape: True):
    """The bench's rows; only those ``select(kernel, shape)`` accepts are built."""
    g = torch.Generator().manual_seed(0)
    for N, V in ((2048, 32000), (8192, 256), (8, 256)):
        if select("cross_entropy", f"N={N},V={V}"):
            x = torch.randn(N, V, generator=g).requires_grad_(True)
            t = torch.randint(0, V, (N,), generator=g)
            yield Case("cross_entropy", f"N={N},V={V}", _fwd_bwd(ckparity.cross_entropy, x, t),
                       _fwd_bwd(F.cross_entropy, x, t), 8 * N * V, _ce_kernel(x.detach(), t),
                       compiled=_compiled_fwd_bwd(F.cross_entropy, x, t))
    N, V = 2048, 32000
    if select("cross_entropy", f"N={N},V={V},inplace_backward"):
        src, t = torch.randn(N, V, generator=g), torch.randint(0, V, (N,), generator=g)
        # in place: fresh logits each call (on every side), dlogits written over them
        yield Case("cross_entropy", f"N={N},V={V},inplace_backward",
                   _fresh_fwd_bwd(ckparity.cross_entropy, src, t, inplace_backward=True),
                   _fresh_fwd_bwd(F.cross_entropy, src, t), 8 * N * V, _ce_kernel(src, t, in_place=True),
                   compiled=lambda: _fresh_fwd_bwd(torch.compile(F.cross_entropy), src, t))
    for N, D in ((8192, 4096), (8, 64)):
        if select("rms_norm", f"N={N},D={D}"):
            x = torch.randn(N, D, generator=g).requires_grad_(True)
            w = torch.randn(D, generator=g)
            # forward reads x, writes y; backward reads dy and x, writes dx
            yield Case("rms_norm", f"N={N},D={D}", _fwd_bwd(ckparity.rms_norm, x, (D,), w),
                       _fwd_bwd(F.rms_norm, x, (D,), w), 20 * N * D, _rms_kernel(x.detach(), w), 2,
                       compiled=_compiled_fwd_bwd(F.rms_norm, x, (D,), w))
    for N, H in ((2048, 8192), (8, 128)):
        if select("swiglu", f"N={N},H={H}"):
            x = torch.randn(N, 2 * H, generator=g).requires_grad_(True)
            # forward reads x (2H) and writes out (H); backward reads dout (H) and x (2H), writes dx (2H)
            yield Case("swiglu", f"N={N},H={H}", _fwd_bwd(ckparity.swiglu, x), _fwd_bwd(reference.swiglu, x),
                       32 * N * H, _swiglu_kernel(x.detach()), 2, compiled=_compiled_fwd_bwd(reference.swiglu, x))
    for N, T, d in ((64, 512, 128), (4, 8, 16)):
        if select("rope", f"N={N},T={T},d={d}"):
            x = torch.randn(N, T, d, generator=g).requires_grad_(True)
            angles = torch.rand(T, d // 2, generator=g) * 6
            cos, sin = angles.cos(), angles.sin()
            # forward reads x, writes out; backward reads dout, writes dx (the tables stay in cache)
            yield Case("rope", f"N={N},T={T},d={d}", _fwd_bwd(ckparity.rope, x, cos, sin),
                       _fwd_bwd(reference.rope, x, cos, sin), 16 * N * T * d, _rope_kernel(x.detach(), cos, sin), 2,
                       compiled=_compiled_fwd_bwd(reference.rope, x, cos, sin))
    for n, label in ((16 * 2**20, "16M"), (64 * 64, "tiny 4096")):
        if not (select("adamw", f"n={label} vs default") or select("adamw", f"n={label} vs fused")):
            continue
        params = {name: torch.nn.Parameter(torch.randn(n, generator=g)) for name in ("ck", "torch", "fused", "compiled")}
        grad = torch.randn(n, generator=g)
        for p in params.values():
            p.grad = grad.clone()
        ck = ckparity.optim.AdamW([params["ck"]])
        ref = reference.adamw([params["torch"]])
        fused = torch.optim.AdamW([params["fused"]], fused=True)
        compiled = _compiled_step(reference.adamw([params["compiled"]]))
        kernel = _adamw_kernel(n, g)
        # reads param, grad, exp_avg, exp_avg_sq; writes param, exp_avg, exp_avg_sq
        yield Case("adamw", f"n={label} vs default", ck.step, ref.step, 28 * n, kernel, compiled=compiled)
        yield Case("adamw", f"n={label} vs fused", ck.step, fused.step, 28 * n, kernel)
    # lm_head + loss at a 128k vocabulary: timed once per side, in its fresh process (bench_memory.py)
    if select("fused_linear_cross_entropy", f"N={FUSED[0]},D={FUSED[1]},V={FUSED[2]}"):
        yield _fused_linear_case(*FUSED, g)


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


def bench(repeats: int = 5, compile: bool = True, distributed: bool = True, memory: bool = True) -> dict:
    copy = copy_gbps(repeats)
    results = []
    # without --no-memory the fused row is left out: fresh processes are how it is measured
    for case in cases(select=lambda kernel, shape: memory or kernel != "fused_linear_cross_entropy"):
        if case.once:
            results.append(_once_row(case, copy))
            continue
        compiled, compile_error = _compile(case) if compile else (None, "--no-compile")
        fns = [case.ours, case.theirs] + ([compiled] if compiled is not None else []) + \
              ([case.c_kernel] if case.c_kernel is not None else [])
        ck_ms, torch_ms, *rest = interleaved_median_ms(fns, repeats)
        compile_ms = rest.pop(0) if compiled is not None else None
        kernel = rest
        row = {"kernel": case.kernel, "shape": case.shape, "ckparity_ms": ck_ms, "torch_ms": torch_ms,
               "speedup": torch_ms / ck_ms, "torch_compile_ms": compile_ms,
               "speedup_vs_compile": compile_ms / ck_ms if compile_ms is not None else None,
               "compile_error": compile_error, "ckparity_gbps": case.nbytes / (ck_ms * 1e6)}
        row["bandwidth_fraction"] = row["ckparity_gbps"] / copy
        if kernel:
            kernel_ms = kernel[0]
            row.update(kernel_ms=kernel_ms, c_calls=case.c_calls,
                       kernel_bandwidth_fraction=case.nbytes / (kernel_ms * 1e6) / copy,
                       overhead_us_per_call=1e3 * (ck_ms - kernel_ms) / case.c_calls)
        if memory and case.nbytes >= LARGE_BYTES:
            row.update({k: v for k, v in _memory(case).items() if k != "_ms"})
        results.append(row)
    if distributed:
        from .bench_ranks import vocab_parallel_row

        row = vocab_parallel_row(repeats)
        results.append({**row, "bandwidth_fraction": row["ckparity_gbps"] / copy})
    return {"schema": "ckparity.bench/4", "copy_gbps": copy, "threads": ckparity.get_num_threads(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats,
            "results": results}


def table(data: dict) -> str:
    lines = [f"copy bandwidth {data['copy_gbps']:.1f} GB/s (best of {data['repeats']}), {data['threads']} threads",
             "", "| kernel | shape | ckparity ms | torch eager ms | speedup | torch.compile ms | speedup vs compile "
             "| of copy | C kernel ms | kernel of copy | overhead us/call |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        kernel = (f"{r['kernel_ms']:.3f} | {100 * r['kernel_bandwidth_fraction']:.0f}% | "
                  f"{r['overhead_us_per_call']:.0f}") if "kernel_ms" in r else "- | - | -"
        compiled = (f"{r['torch_compile_ms']:.3f} | {r['speedup_vs_compile']:.2f}x" if r["torch_compile_ms"] is not None
                    else "- | -")
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['ckparity_ms']:.3f} | {r['torch_ms']:.3f} | "
                     f"{r['speedup']:.2f}x | {compiled} | {100 * r['bandwidth_fraction']:.0f}% | {kernel} |")
    return "\n".join(lines)
