"""ckparity bench: each kernel against its torch counterpart, in one run, on
the same tensors: median times, their ratio, and the effective bandwidth (the
bytes the operation must move at minimum, over ckparity's time) as a fraction
of a STREAM-style copy measured in the same run."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

import ckparity


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up (allocations, first-touch, lazy imports)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def copy_gbps(repeats: int, nbytes: int = 1 << 28) -> float:
    """STREAM copy: read and write nbytes, in GB/s."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    return 2 * nbytes / (median_ms(lambda: dst.copy_(src), repeats) * 1e6)


def _fwd_bwd(fn, x, *args, **kwargs):
    def run():
        x.grad = None
        out = fn(x, *args, **kwargs)
        out.backward(torch.ones_like(out) if out.dim() else None)
    return run


def _swiglu_torch(x):
    H = x.shape[-1] // 2
    return F.silu(x[..., :H]) * x[..., H:]


def cases():
    """(kernel, shape, ckparity fn, torch fn, minimum bytes moved)."""
    g = torch.Generator().manual_seed(0)
    for N, V in ((2048, 32000), (8192, 256), (8, 256)):
        x = torch.randn(N, V, generator=g).requires_grad_(True)
        t = torch.randint(0, V, (N,), generator=g)
        yield ("cross_entropy", f"N={N},V={V}", _fwd_bwd(ckparity.cross_entropy, x, t),
               _fwd_bwd(F.cross_entropy, x, t), 8 * N * V)
    for N, D in ((8192, 4096), (8, 64)):
        x = torch.randn(N, D, generator=g).requires_grad_(True)
        w = torch.randn(D, generator=g)
        yield ("rms_norm", f"N={N},D={D}", _fwd_bwd(ckparity.rms_norm, x, (D,), w),
               _fwd_bwd(F.rms_norm, x, (D,), w), 20 * N * D)
    for N, H in ((2048, 8192), (8, 128)):
        x = torch.randn(N, 2 * H, generator=g).requires_grad_(True)
        yield ("swiglu", f"N={N},H={H}", _fwd_bwd(ckparity.swiglu, x), _fwd_bwd(_swiglu_torch, x), 32 * N * H)
    for n, label in ((16 * 2**20, "16M"), (64 * 64, "tiny 4096")):
        params = {name: torch.nn.Parameter(torch.randn(n, generator=g)) for name in ("ck", "torch", "fused")}
        grad = torch.randn(n, generator=g)
        for p in params.values():
            p.grad = grad.clone()
        ck = ckparity.optim.AdamW([params["ck"]])
        ref = torch.optim.AdamW([params["torch"]], foreach=False)
        fused = torch.optim.AdamW([params["fused"]], fused=True)
        yield "adamw", f"n={label} vs default", ck.step, ref.step, 28 * n
        yield "adamw", f"n={label} vs fused", ck.step, fused.step, 28 * n


def bench(repeats: int = 5) -> dict:
    copy = copy_gbps(repeats)
    results = []
    for kernel, shape, ours, theirs, nbytes in cases():
        ck_ms, torch_ms = median_ms(ours, repeats), median_ms(theirs, repeats)
        gbps = nbytes / (ck_ms * 1e6)
        results.append({"kernel": kernel, "shape": shape, "ckparity_ms": ck_ms, "torch_ms": torch_ms,
                        "speedup": torch_ms / ck_ms, "ckparity_gbps": gbps, "bandwidth_fraction": gbps / copy})
    return {"schema": "ckparity.bench/1", "copy_gbps": copy, "threads": ckparity.get_num_threads(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "repeats": repeats,
            "results": results}


def table(data: dict) -> str:
    lines = [f"copy bandwidth {data['copy_gbps']:.1f} GB/s, {data['threads']} threads",
             "", "| kernel | shape | ckparity ms | torch ms | speedup | GB/s | of copy |", "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        lines.append(f"| {r['kernel']} | {r['shape']} | {r['ckparity_ms']:.3f} | {r['torch_ms']:.3f} | "
                     f"{r['speedup']:.2f}x | {r['ckparity_gbps']:.1f} | {100 * r['bandwidth_fraction']:.0f}% |")
    return "\n".join(lines)
