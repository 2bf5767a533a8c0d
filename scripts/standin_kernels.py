"""Stand-in kernels for every slot, as a user's plugin: what
scripts/your_kernels.py judges through every command.

For cross_entropy, rms_norm, swiglu and rope (each wrapping torch's own op):
``exact`` (torch's bits), ``off`` (its output 1e-3 too large: wrong),
``crashes`` (a segfault on a row wider than 100: past the contract's small
call, inside the check's width sweep); for cross_entropy also ``no_smoothing``
(refuses label smoothing, and says so at registration where the ckparity
running it lets it). For adamw: ``exact`` (torch's AdamW), ``off`` (each
step's params 1e-3 too large), ``crashes`` (a segfault on a tensor of more
than 1000 elements). One stand-in per process: ``register(kernel, name)``
(a stand-in the contract refuses at registration must not take the others
with it)."""

from __future__ import annotations

import ctypes

import torch

import ckparity
from ckparity import kernels


def _segfault() -> None:
    ctypes.string_at(0)


def _register(kernel: str, name: str, fn, **options) -> None:
    try:
        ckparity.register_backend(kernel, name, fn, **options)
    except TypeError:  # a ckparity without unsupported=: registered as it can be
        ckparity.register_backend(kernel, name, fn)


def _ops(kernel: str) -> dict:
    torch_fn = kernels.backends(kernel)["torch"]

    def exact(*args, **kw):
        return torch_fn(*args, **kw)

    def off(*args, **kw):
        return torch_fn(*args, **kw) * (1 + 1e-3)

    def crashes(*args, **kw):
        if args[0].shape[-1] > 100:
            _segfault()
        return torch_fn(*args, **kw)

    return {"exact": exact, "off": off, "crashes": crashes}


def no_smoothing(logits, targets, label_smoothing=0.0):
    if label_smoothing:
        raise ValueError("this kernel has no label smoothing")
    return torch.nn.functional.cross_entropy(logits, targets)




class _Off(torch.optim.AdamW):
    @torch.no_grad()
    def step(self, closure=None):
        super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                p.mul_(1 + 1e-3)


class _Crashes(torch.optim.AdamW):
    def step(self, closure=None):
        if any(p.numel() > 1000 for group in self.param_groups for p in group["params"]):
            _segfault()
        return super().step(closure)


ADAMW = {"exact": lambda params, **kw: torch.optim.AdamW(params, foreach=False, **kw),
         "off": lambda params, **kw: _Off(params, foreach=False, **kw),
         "crashes": lambda params, **kw: _Crashes(params, foreach=False, **kw)}


def register(kernel: str, name: str) -> None:
    if name == "no_smoothing":
        _register("cross_entropy", "no_smoothing", no_smoothing, unsupported=["label_smoothing"])
    else:
        _register(kernel, name, (ADAMW if kernel == "adamw" else _ops(kernel))[name])
