"""ckparity.residual: x + y, the residual stream's add, on the C kernel (csrc/residual.c).

Its binding lives here beside the op (a kernel family added since the
bindings module keeps its one binding with its one op: a change to the C
signature is still made in one place)."""

from __future__ import annotations

import torch

from .._bindings import pointer
from .._native import check, lib
from .._tensors import FLOATING, empty, require_cpu
from ..errors import InvalidArgument, InvalidType
from ._function import CFunction


def residual_add(x, y, out, *, library=lib) -> None:
    """out = x + y over three contiguous tensors of one dtype (float32 or bfloat16) and size."""
    entry = library.ckp_residual_add if x.dtype == torch.float32 else library.ckp_residual_add_bf16
    check(entry(pointer(x), pointer(y), x.numel(), pointer(out)), "residual", library)


class _ResidualFunction(CFunction):
    @staticmethod
    def compute(x, y):
        if x.shape == y.shape and x.dtype == y.dtype:  # the residual stream's add: no broadcast, no promotion
            dtype, shape, a, b = x.dtype, x.shape, x.contiguous(), y.contiguous()
        else:  # torch.broadcast_shapes costs more than a small add: only where the shapes differ
            dtype, shape = torch.result_type(x, y), torch.broadcast_shapes(x.shape, y.shape)
            a, b = (t.to(dtype).expand(shape).contiguous() for t in (x, y))  # float32 + bf16: the bf16 side widened, exact
        out = empty(shape, dtype)
        if out.numel():
            residual_add(a, b, out)
        return out

    @staticmethod
    def save(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, dout):
        # torch's AddBackward0 hands both inputs the upstream gradient; the engine then sums it to each
        # input's shape and casts it to its dtype, for this Function's outputs as for torch's add. No
        # arithmetic here, so the gradient stays differentiable (create_graph works as for torch's add).
        return dout, dout


def residual(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x + y as torch adds them (broadcasting, float32 with bfloat16 promoted to float32), in float32 or
    bfloat16: bit-identical to torch's add (float32: one IEEE add; bfloat16: the sum in float rounded once)."""
    for t, name in ((x, "x"), (y, "y")):
        require_cpu(t, name)
        if t.dtype not in FLOATING:
            raise InvalidType(f"residual takes float32 or bfloat16 tensors, got {name} of {t.dtype}")
    try:
        if x.shape != y.shape:
            torch.broadcast_shapes(x.shape, y.shape)
    except RuntimeError:
        raise InvalidArgument(f"residual: x {tuple(x.shape)} and y {tuple(y.shape)} do not broadcast to one shape") from None
    return _ResidualFunction.apply(x, y)
