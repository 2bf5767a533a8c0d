"""ckparity.gelu: F.gelu(x, approximate="tanh") -- GPT-2's GELU -- on the C kernel (csrc/gelu.c).

Its bindings live here beside the op (as residual's do). The bits follow torch's at the thread count
torch runs on (torch.get_num_threads()): past a grain torch splits the tensor between its threads and
computes each piece's last elements with libm's tanhf, the rest with SLEEF's; the C kernel takes that
count and splits as torch does, whatever threads it runs on itself."""

from __future__ import annotations

import torch

from .._bindings import pointer
from .._native import check, lib
from .._tensors import empty_like, require_cpu
from ..errors import InvalidArgument, InvalidType
from ._function import CFunction, first_order_only

# why approximate="none" is refused rather than computed with other bits
ERF_NOT_BUILT = ("approximate='none' (erf) is not built in C: torch hands a float32 tensor of more than one "
                 "element to oneDNN's eltwise gelu_erf, whose JIT erf ckparity does not follow; use "
                 "approximate='tanh' (GPT-2's GELU) or torch's F.gelu")


_SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16"}


def gelu_forward(x, y, *, library=lib) -> None:
    """y = gelu_tanh(x) over two contiguous tensors of one size and dtype (float32 or bfloat16)."""
    entry = getattr(library, "ckp_gelu_forward" + _SUFFIX[x.dtype])
    check(entry(pointer(x), x.numel(), torch.get_num_threads(), pointer(y)), "gelu", library)


def gelu_backward(dy, x, dx, *, library=lib) -> None:
    """dx = dy * gelu_tanh'(x) over three contiguous tensors of one size and dtype (float32 or bfloat16)."""
    entry = getattr(library, "ckp_gelu_backward" + _SUFFIX[x.dtype])
    check(entry(pointer(dy), pointer(x), x.numel(), torch.get_num_threads(), pointer(dx)), "gelu backward", library)


class _GeluFunction(CFunction):
    """First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x):
        y = empty_like(x)
        if x.numel():
            gelu_forward(x, y)
        return y

    @staticmethod
    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    @first_order_only
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = empty_like(x)
        if x.numel():
            gelu_backward(dy.contiguous().to(x.dtype), x, dx)
        return dx


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu(x, approximate="tanh") of a float32 or bfloat16 tensor of any shape, bit-identical to torch's
    forward and backward at every CPU capability and at torch's thread count (bfloat16: torch's float formula
    rounded once). F.gelu's default form, approximate="none", is refused by name (ERF_NOT_BUILT)."""
    if approximate not in ("none", "tanh"):
        raise InvalidArgument(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if approximate == "none":
        raise InvalidArgument(ERF_NOT_BUILT)
    require_cpu(x, "x")
    if x.dtype not in _SUFFIX:
        raise InvalidType(f"gelu takes a float32 or bfloat16 tensor, got {x.dtype}")
    return _GeluFunction.apply(x.contiguous())
