"""Checks shared by every op: one place decides what a tensor handed to the
C library must be."""

from __future__ import annotations

import ctypes
import math
import os
import sys

import torch

from . import _pool
from .errors import InvalidArgument, InvalidType


def require_cpu(tensor: torch.Tensor, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise InvalidType(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        raise InvalidType(
            f"{name} is a torch.func transform's tensor (grad, vmap, jacrev, ...); ckparity's C kernels read "
            f"a tensor's memory, which those wrappers do not have: use torch.autograd.grad, and call the op "
            f"on the whole batch instead of under vmap")
    if tensor.device.type != "cpu":
        raise InvalidType(
            f"{name} is on device {tensor.device}; ckparity's kernels run on the CPU only "
            f"(move it with .cpu())"
        )


def require_float32(tensor: torch.Tensor, name: str) -> None:
    require_cpu(tensor, name)
    if tensor.dtype != torch.float32:
        raise InvalidType(
            f"{name} must be float32, got {tensor.dtype}; ckparity's kernels are float32 "
            f"(convert with .float() if that is what you mean)"
        )


# the dtypes a kernel with bfloat16 entry points takes (rms_norm, swiglu, rope); the others take float32
# alone; rms_norm, swiglu and rope take float16 too (WITH_FLOAT16)
FLOATING = (torch.float32, torch.bfloat16)
WITH_FLOAT16 = FLOATING + (torch.float16,)
# the dtypes by the names the commands take (--dtype)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def require_floating(tensor: torch.Tensor, name: str, like: torch.Tensor | None = None,
                     dtypes: tuple[torch.dtype, ...] = FLOATING) -> None:
    """One of ``dtypes`` (float32 or bfloat16 unless the op takes more), and ``like``'s dtype, if given:
    mixed dtypes are not taken."""
    require_cpu(tensor, name)
    if tensor.dtype not in dtypes:
        names = [str(d).removeprefix("torch.") for d in dtypes]
        raise InvalidType(f"{name} must be {', '.join(names[:-1])} or {names[-1]}, got {tensor.dtype} (convert with "
                          f".float() or .bfloat16() if that is what you mean)")
    if like is not None and tensor.dtype != like.dtype:
        raise InvalidType(f"{name} is {tensor.dtype} and the input {like.dtype}: ckparity takes one dtype for both "
                          "(convert one of them)")


def plain(tensor, dim: int, dtypes: tuple[torch.dtype, ...] = FLOATING) -> bool:
    """The common case in a few attribute reads: a contiguous CPU tensor of one
    of ``dtypes`` and ``dim`` dimensions that no torch.func transform wraps. An
    op takes its fast path on it and its full checks (with their errors) on
    anything else; tests/test_fast_paths.py holds both to the same bits."""
    return (isinstance(tensor, torch.Tensor) and tensor.dtype in dtypes and tensor.is_cpu
            and tensor.dim() == dim and tensor.is_contiguous()
            and not torch._C._functorch.is_functorch_wrapped_tensor(tensor))


# [Note: huge pages for large outputs]
# A fresh output of 128 MB costs more to fault in, 4 KB page by page, than the
# kernel that fills it: rms_norm's C forward over (8192, 4096) takes 6 ms into a
# reused buffer and 32 ms into a fresh torch.empty (ckparity bench). Linux's
# transparent huge pages in "madvise" mode (Debian's default) fault a buffer in
# 2 MB pages where it asks for them, and then it takes 9 ms. So the ops allocate
# their outputs through empty(), which asks for huge pages from HUGE_PAGES_FROM
# bytes on (one madvise; where THP is "always" or "never", or off Linux, it
# changes nothing). Only advice: the bits and the memory held are the same.
# torch's own allocator does the same for every tensor under THP_MEM_ALLOC_ENABLE=1.
# The first huge-page buffers a process faults in cost more, not less: a 262 MB
# output took 100-300 ms for the first three to five times in a fresh process on
# this machine (4 KB pages: 45-70 ms every time), then 11 ms -- the kernel
# assembling 2 MB pages from memory the process has not held before, once. A
# training run pays it in its first steps; a timing's first calls show it.
# Not only then, on a VM whose balloon reports free memory to the host
# (virtio-balloon's free page reporting, which this machine's has): the guest
# reports free blocks of 2 MB and more, the host discards them, and a huge page
# made from one faults on the host when it is first written. The default
# cross_entropy's fwd+bwd at (2048, 32000), torch's eager loss run between
# calls, 75 calls: median 25 ms on huge pages, 68 on 4 KB ones, but the mean
# 51-67 against 69, the 90th percentile 141-257 against 71 (two runs each,
# /tmp script; no reclaim or compaction in /proc/vmstat). The bench reports
# means beside medians for that reason; CKP_HUGE_PAGES=0 turns the advice off
# (read when ckparity is imported).
HUGE_PAGES_FROM = 4 << 20
_PAGE = 4096
_MADV_HUGEPAGE = 14


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return fn


def _huge_pages_wanted() -> bool:
    value = os.environ.get("CKP_HUGE_PAGES", "1")
    if value not in ("0", "1"):
        raise InvalidArgument(f"CKP_HUGE_PAGES must be 0 (4 KB pages for large outputs) or 1 (huge pages where "
                              f"Linux gives them, the default), got {value!r}")
    return value == "1"


_MADVISE = _madvise() if _huge_pages_wanted() else None


def _advise_huge_pages(address: int, nbytes: int) -> None:
    if _MADVISE is not None:
        start = (address + _PAGE - 1) // _PAGE * _PAGE
        _MADVISE(start, (address + nbytes - start) // _PAGE * _PAGE, _MADV_HUGEPAGE)


_BUDGET = _pool.budget_from_env()
POOL = _pool.Pool(_BUDGET, _advise_huge_pages) if _BUDGET else None


def empty(shape, dtype: torch.dtype) -> torch.Tensor:
    """torch.empty(shape, dtype=dtype); when it is large, on a reused buffer
    ([Note: reused buffers for large outputs]) faulted in by huge pages
    ([Note: huge pages for large outputs])."""
    shape = tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE_PAGES_FROM:
        return torch.empty(shape, dtype=dtype)
    if POOL is not None:
        return POOL.tensor(nbytes, dtype, shape)
    t = torch.empty(shape, dtype=dtype)
    _advise_huge_pages(t.data_ptr(), nbytes)
    return t


def empty_cache() -> None:
    """Drops the large-output buffers no tensor holds any more (CKP_OUTPUT_POOL_MB
    keeps up to 1 GB of them for the next calls; [Note: reused buffers for large outputs])."""
    if POOL is not None:
        POOL.empty_cache()


def empty_like(t: torch.Tensor) -> torch.Tensor:
    """empty() of t's shape and dtype, contiguous."""
    return empty(t.shape, t.dtype)
