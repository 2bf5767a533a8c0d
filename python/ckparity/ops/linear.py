"""ckparity.linear: F.linear(x, weight, bias) on the C GEMM (csrc/linear.c), forward and backward,
in the order of MKL's one-thread sgemm (kernels/linear.py says where that is torch's bits).

The bindings live here beside the op (as ops/residual.py's): operands go to C by their strides, so a
transposed or strided x or weight is read where it lies, as a BLAS takes transA/transB."""

from __future__ import annotations

import os

import torch

from .._native import check, ffi, lib
from .._tensors import empty, require_floating
from ..errors import InvalidArgument
from ._function import CFunction, first_order_only

_FLOAT = ffi.typeof("float *")
_cast = ffi.cast


def _at(t: torch.Tensor | None):
    """A pointer to t's first element (its strides say where the others are); NULL for None."""
    return ffi.NULL if t is None else ffi.cast(_FLOAT, t.data_ptr())


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
         bias_after: bool = False, *, library=lib) -> None:
    """out (M, N), contiguous = a (M, K) . b (K, N) + bias (N, contiguous; C's start, as addmm's, or added to
    the product with ``bias_after``, as matmul's then add_), a and b of any strides."""
    (M, K), (a_rs, a_cs), a = _blas_operand(a)
    (_, N), (b_rs, b_cs), b = _blas_operand(b)
    # called for every GEMM of a step (75 in the llama preset's): each stride and pointer read once
    check(library.ckp_gemm(_cast(_FLOAT, a.data_ptr()), a_rs, a_cs, _cast(_FLOAT, b.data_ptr()), b_rs, b_cs, M, K, N,
                           _at(bias), int(bias_after), _cast(_FLOAT, out.data_ptr())), "linear", library)


def _blas_operand(t: torch.Tensor) -> tuple[tuple[int, int], tuple[int, int], torch.Tensor]:
    """(shape, strides, t) of t as ATen's addmm hands it to MKL: read where it lies if one stride is 1 and the
    other spans a row or column (a BLAS leading dimension), else a contiguous copy (Blas.cpp's
    addmm_impl_cpu_). The copy changes no value, but MKL's path, and so the order, follows the strides it is
    given."""
    shape, strides = t.shape, t.stride()
    (rows, cols), (s0, s1) = shape, strides
    if (s1 == 1 and s0 >= max(1, cols)) or (s0 == 1 and s1 >= max(1, rows)):
        return shape, strides, t
    t = t.contiguous()
    return shape, t.stride(), t


def dbias(dy: torch.Tensor, out: torch.Tensor, *, library=lib) -> None:
    """out (N) = dy (M, N), contiguous, summed over its rows as torch.sum(0) orders it."""
    M, N = dy.shape
    check(library.ckp_linear_dbias(_at(dy), M, N, _at(out), torch.get_num_threads()), "linear backward", library)


class _LinearFunction(CFunction):
    """x (M, K), weight (N, K), bias (N) or None, bias_after -> (M, N). First-order only: see
    ops/_function.py."""

    @staticmethod
    def compute(x, weight, bias, bias_after):
        y = empty((x.shape[0], weight.shape[0]), torch.float32)
        gemm(x, weight.t(), y, bias, bias_after)
        return y

    @staticmethod
    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.has_bias = inputs[2] is not None

    @staticmethod
    @first_order_only
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = empty(x.shape, torch.float32)
            gemm(dy, weight, dx)           # dX = dY . W
        if ctx.needs_input_grad[1]:
            dw = empty(weight.shape, torch.float32)
            gemm(dy.t(), x, dw)            # dW = dYᵀ . X
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = empty((weight.shape[0],), torch.float32)
            dbias(dy, db)
        return dx, dw, db, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias): x (..., K), weight (N, K), bias (N) or None -> (..., N), in float32 or
    bfloat16 (all three of one dtype; under CPU autocast to bfloat16 they are cast to it first, as autocast
    casts F.linear's). Transposed and strided x and weight are read by their strides (no copy where ATen's
    addmm makes none).
    bfloat16: the float32 GEMM on the widened values, the result rounded once -- torch's bf16 matmul is
    oneDNN's, whose order is not followed: float32 accumulation, the same bits at any thread count."""
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        x, weight, bias = (t.to(torch.bfloat16) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                           for t in (x, weight, bias))
    for t, name in ((x, "x"), (weight, "weight"), (bias, "bias")):
        if t is not None:
            require_floating(t, name, like=x)
    if x.dtype == torch.bfloat16:  # widened exactly; the gradients come back through the casts, rounded once
        with torch.autocast("cpu", enabled=False):
            return linear(x.float(), weight.float(), None if bias is None else bias.float()).bfloat16()
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise InvalidArgument(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not multiply "
                              "(x (..., K) and weight (N, K))")
    N, K = weight.shape
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != N):
        raise InvalidArgument(f"linear: bias {tuple(bias.shape)} for a weight of {N} outputs (bias ({N},))")
    if x.numel() == 0:  # no rows, or K = 0: nothing to multiply
        return _empty_product(x, weight, bias)
    rows = x.reshape(-1, K)  # a view where x's leading dims collapse; else a copy
    bias_in = bias.contiguous() if bias is not None else None
    return _LinearFunction.apply(rows, weight, bias_in, not _addmm(x)).reshape(*x.shape[:-1], N)


def _addmm(x: torch.Tensor) -> bool:
    """Whether F.linear with a bias takes addmm for this x (the bias as the product's start) rather than
    matmul and then the bias added (ATen's linear: a 2-D x, or a 3-D one that is contiguous or that
    TORCH_LINEAR_FLATTEN_3D=1 makes so)."""
    return x.dim() == 2 or (x.dim() == 3 and (x.is_contiguous() or os.environ.get("TORCH_LINEAR_FLATTEN_3D") == "1"))


def _empty_product(x, weight, bias):
    """No rows, or K = 0: every output (if any) is the empty sum, 0, plus the bias; x and weight get zero
    gradients, as torch's."""
    zeros = (x.sum(-1, keepdim=True) * 0).expand(*x.shape[:-1], weight.shape[0]) + weight.sum(-1) * 0
    return zeros + bias if bias is not None else zeros
