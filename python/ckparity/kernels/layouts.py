"""The layouts torch accepts for a tensor argument, as differentiable maps of a
contiguous tensor: the same shape, another memory layout (an expanded layout
repeats one row or one column, so its values change with it). A kernel given a
tensor in any of them must give the bits it gives on a contiguous copy, and
torch's (check's ``layouts`` property, the layouts sweep, tests/test_layouts.py).

Each map is differentiable in its input, so a gradient through the layout
reaches the contiguous leaf the way autograd takes it through a user's view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch


def strided(t: torch.Tensor) -> torch.Tensor:
    """Every other element of a last dimension twice as long: stride 2 inside a row."""
    return torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]


def transposed(t: torch.Tensor) -> torch.Tensor:
    """Column-major: the dimensions laid out in reverse order (a .t() of a contiguous tensor)."""
    order = tuple(reversed(range(t.dim())))
    return t.permute(order).contiguous().permute(order)


def offset(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, 3 elements into its storage (a slice's view)."""
    return torch.cat([torch.zeros(3, dtype=t.dtype), t.reshape(-1)])[3:].view(t.shape)


def expanded_rows(t: torch.Tensor) -> torch.Tensor:
    """Stride 0 in the first dimension: its first entry repeated (torch.expand, a broadcast weight)."""
    return t[:1].expand(t.shape)


def expanded_last(t: torch.Tensor) -> torch.Tensor:
    """Stride 0 in the last dimension: each row's first element repeated (a scalar expanded to a row)."""
    return t[..., :1].expand(t.shape)


LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "strided": strided, "transposed": transposed, "storage offset": offset,
    "expanded rows": expanded_rows, "expanded last dim": expanded_last,
}


def applicable(t: torch.Tensor) -> Iterator[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    """The layouts that give ``t`` another memory layout than a contiguous one: a 0-dim tensor
    only an offset, a 1-D one no transpose and one expansion, none of a dimension of size 1."""
    for name, layout in LAYOUTS.items():
        if t.dim() == 0 and name != "storage offset":
            continue
        if name == "transposed" and sum(size > 1 for size in t.shape) < 2:
            continue
        if name == "expanded last dim" and (t.dim() < 2 or t.shape[-1] < 2):
            continue
        if name == "expanded rows" and t.shape[0] < 2:
            continue
        if name == "strided" and t.shape[-1] < 1:
            continue
        yield name, layout


@dataclass(frozen=True)
class LayoutCase:
    """One call of a kernel's public op whose every tensor argument the layouts sweep lays out anew:
    ``call(fn, tensors)`` calls ``fn`` (``ours``, ckparity's op, or ``theirs``, torch's) and returns the
    output, differentiated with respect to ``differentiated`` (an optimizer's call returns its state: a
    dict); ``claim`` is the claim key whose bit-identity with torch covers the call (None: not claimed, the
    call held to its own contiguous bits alone)."""
    label: str
    ours: Callable
    theirs: Callable
    call: Callable[[Callable, dict], object]
    differentiated: tuple[str, ...]
    tensors: dict
    claim: str | None = None
    claimed_outputs: tuple[str, ...] | None = None  # the outputs the claim covers (None: all of them)
    refuses: tuple[str, ...] = ()  # "<tensor> <layout>" ckparity refuses where torch computes (the case says why)


def _in_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype) if t.is_floating_point() else t


def run(call: Callable, differentiated: tuple[str, ...], fn: Callable, tensors: dict, dtype: torch.dtype,
        layout: tuple[str, Callable] | None = None) -> dict:
    """fn's output and the gradients of a fixed random weighting of it, on ``tensors`` in ``dtype``; with
    ``layout`` (name, map) that tensor reaches fn as the map of its contiguous leaf, and its gradient is
    the one fn gives the laid-out tensor (what autograd then adds back into the leaf through an expanded
    view is torch's sum, not the kernel's: a row's softmax gradients summed cancel to 0, where a
    ratio of errors measures nothing). A call that returns a dict (an optimizer's state) is its result."""
    leaves = {k: _in_dtype(v.detach(), dtype).clone().requires_grad_(k in differentiated)
              for k, v in tensors.items()}
    given = dict(leaves)
    if layout is not None:
        name, laid_out = layout
        given[name] = laid_out(leaves[name])
        if given[name].requires_grad:
            given[name].retain_grad()
    out = call(fn, given)
    if isinstance(out, dict):
        return {k: v.detach() for k, v in out.items()}
    if differentiated:
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
        out.backward(upstream)
    return {"out": out.detach(), **{f"d{k}": given[k].grad for k in differentiated}}


def contiguous_copy(layout: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The same values as ``layout`` gives, in a contiguous tensor of their own."""
    return lambda t: layout(t).contiguous()
