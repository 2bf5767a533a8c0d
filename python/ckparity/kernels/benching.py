"""What a record's bench rows (Kernel.bench) are made of: the row, and the
closures its sides are timed through. ckparity.bench times them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


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


def fwd_bwd(fn, x, *args, **kwargs):
    """fwd+bwd through autograd, fresh outputs and gradients each call. The
    upstream gradient (ones) is made by the first call and handed to every
    later one, as a model's next layer hands its gradient over: making it in
    the timing would add a fill of the output's size to every side alike."""
    upstream = {}

    def run():
        x.grad = None
        out = fn(x, *args, **kwargs)
        if not out.dim():
            out.backward()
            return
        g = upstream.get(out.dtype)
        if g is None or g.shape != out.shape:
            g = upstream[out.dtype] = torch.ones_like(out)
        out.backward(g)
    return run


def fresh_fwd_bwd(fn, src, *args, **kwargs):
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


def compiled_fwd_bwd(fn, x, *args, **kwargs):
    """A maker of the fwd+bwd closure of torch.compile(fn), for Case.compiled."""
    return lambda: fwd_bwd(torch.compile(fn), x, *args, **kwargs)


def compiled_step(optimizer):
    return lambda: torch.compile(optimizer.step)
