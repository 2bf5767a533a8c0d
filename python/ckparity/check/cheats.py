"""The cheats property of ``ckparity check``: a backend that passes by not doing the work.

Benchmark suites for generated kernels found these in the wild (KernelBench's adversarial tests,
BackendBench's watermarked ops), and a conformance check that only compares outputs passes them all:

- it writes an input (the bits of every input before and after the forward and the backward);
- its output aliases an input, or a previous call's output still alive (its storage);
- its result does not change when the inputs do (a cache): two calls on other values, the same bits,
  where torch's results differ;
- it calls torch's own op for the slot and hands back torch's bits (the call seen by a TorchFunctionMode:
  the record's ``torch_ops``, the names of the torch functions that are the slot's whole op).

Each cheat is a "wrong" case whose reason names it."""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from .properties import Property, at, floating


class _Calls(TorchFunctionMode):
    """The names of the torch functions called while it is active (the backward's too: autograd runs a
    CPU backward on the calling thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """t's bytes (a NaN equal to itself, -0 not +0)."""
    return t.contiguous().reshape(-1).view(torch.uint8) if t.is_floating_point() else t


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _storage(a), _storage(b)
    return a0 < b1 and b0 < a1


def _run(kernel_slot, fn, tensors: dict, dtype, calls: _Calls | None = None):
    """fn's output and the leaves it was given, after a forward and a backward (under ``calls``)."""
    leaves = {k: v.detach().clone().requires_grad_(k in kernel_slot.differentiated)
              for k, v in floating(tensors, dtype).items()}
    with calls if calls is not None else contextlib.nullcontext():
        out = kernel_slot.call(fn, leaves)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
        out.backward(upstream)
    return out, leaves


def cheats(kernel_slot, torch_ops: tuple[str, ...], fn, torch_fn, g: torch.Generator,
           dtype=torch.float32) -> Property:
    prop = Property("cheats")
    first, second = kernel_slot.make(64, 3, g), kernel_slot.make(64, 3, g)
    for label, check in (("writes an input", _writes_an_input), ("aliases", _aliases),
                         ("caches its result", _caches), ("calls torch's own op", _calls_torch)):
        at(prop, label)
        try:
            why = check(kernel_slot, torch_ops, fn, torch_fn, first, second, dtype)
        except Exception as err:  # noqa: BLE001 -- a backend raising on valid input is the finding
            prop.case(label, "crashes", f"{type(err).__name__}: {err}")
            continue
        prop.case(label, "bitwise" if why is None else "wrong", why)
    return prop


def _writes_an_input(kernel_slot, torch_ops, fn, torch_fn, first, second, dtype):
    before = {k: v.clone() for k, v in floating(first, dtype).items()}
    _, leaves = _run(kernel_slot, fn, first, dtype)
    written = [k for k, v in leaves.items() if not torch.equal(_bits(v.detach()), _bits(before[k]))]
    return f"writes its input{'s' if len(written) > 1 else ''} {', '.join(written)}" if written else None


def _aliases(kernel_slot, torch_ops, fn, torch_fn, first, second, dtype):
    out, leaves = _run(kernel_slot, fn, first, dtype)
    shared = [k for k, v in leaves.items() if _shares(out, v)]
    if shared:
        return f"its output shares memory with its input {', '.join(shared)}"
    again, _ = _run(kernel_slot, fn, second, dtype)
    if _shares(again, out):
        return "its output shares memory with a previous call's output, still alive"
    return None


def _caches(kernel_slot, torch_ops, fn, torch_fn, first, second, dtype):
    ours = [_run(kernel_slot, fn, t, dtype)[0].detach() for t in (first, second)]
    theirs = [_run(kernel_slot, torch_fn, t, dtype)[0].detach() for t in (first, second)]
    if torch.equal(ours[0], ours[1]) and not torch.equal(theirs[0], theirs[1]):
        return "the same result for other inputs (a cached result), where torch's differs"
    return None


def _calls_torch(kernel_slot, torch_ops, fn, torch_fn, first, second, dtype):
    """torch's op called, and its bits handed back: the backend did none of the work. (A backend built on
    torch's op that changes its result is a kernel like any other, judged by the other properties.)"""
    calls = _Calls()
    ours, _ = _run(kernel_slot, fn, first, dtype, calls)
    used = sorted(calls.names & set(torch_ops))
    theirs, _ = _run(kernel_slot, torch_fn, first, dtype)
    if used and torch.equal(_bits(ours.detach()), _bits(theirs.detach())):
        return f"calls torch's own {', '.join(used)} and hands back its bits (the op it stands in for)"
    return None
