"""ckparity.layer_norm: F.layer_norm on the C kernel (csrc/layer_norm.c), float32 and bfloat16.

Its bindings live here beside the op (as residual's do). dweight and dbias follow torch's thread count
(torch.get_num_threads()): torch sums them as one partial sum per thread, added in thread order."""

from __future__ import annotations

import math

import torch

from .._bindings import pointer
from .._native import check, ffi, lib
from .._tensors import empty, empty_like, require_cpu
from ..errors import InvalidArgument, InvalidType
from ._function import CFunction, first_order_only


def _suffix(x: torch.Tensor, stats: torch.Tensor) -> str:
    """The C entry's suffix: "" (float32), "_bf16" (all bf16), "_bf16_mixed" (a bf16 x, float32 mean and params)."""
    return "" if x.dtype == torch.float32 else "_bf16" if stats.dtype == torch.bfloat16 else "_bf16_mixed"


def layer_norm_forward(x, weight, bias, eps, y, mean, rstd, *, library=lib) -> None:
    """x, y (M, N); weight, bias (N) or None; mean, rstd (M): contiguous, all float32 or all bfloat16, or (torch's
    mixed types) x and y bfloat16 with float32 weight, bias, mean and rstd."""
    M, N = x.shape
    entry = getattr(library, "ckp_layer_norm_forward" + _suffix(x, mean))
    check(entry(pointer(x), pointer(weight), pointer(bias), M, N, eps, pointer(y),
                                         pointer(mean), pointer(rstd)), "layer_norm", library)


def layer_norm_backward(dy, x, mean, rstd, weight, dx, dweight, dbias, *, library=lib) -> None:
    """dy, x, dx (M, N); mean, rstd (M); weight, dweight, dbias (N); dx, dweight, dbias None: not computed. The
    dtypes as layer_norm_forward's (mixed: dweight and dbias float32, as the params)."""
    M, N = x.shape
    entry = getattr(library, "ckp_layer_norm_backward" + _suffix(x, mean))
    check(entry(pointer(dy), pointer(x), pointer(mean), pointer(rstd), pointer(weight),
                                          M, N, torch.get_num_threads(), pointer(dx) if dx is not None else ffi.NULL,
                                          pointer(dweight), pointer(dbias)), "layer_norm backward", library)


def _params_dtype(x, weight, bias) -> torch.dtype:
    """The dtype of the params (and of mean and rstd): float32 for a bf16 x with float32 params (mixed)."""
    return next((t.dtype for t in (weight, bias) if t is not None), x.dtype)


class _LayerNormFunction(CFunction):
    """x (M, N), weight and bias (N) or None. First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, weight, bias, eps):
        M, N = x.shape
        stats = _params_dtype(x, weight, bias)  # mean and rstd in the params' dtype, as torch keeps them
        y, mean, rstd = empty_like(x), empty((M,), stats), empty((M,), stats)
        if x.numel():
            layer_norm_forward(x, weight, bias, eps, y, mean, rstd)
        return y, mean, rstd

    @staticmethod
    def save(ctx, inputs, output):
        x, weight = inputs[0], inputs[1]
        ctx.save_for_backward(x, weight, output[1], output[2])
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.has_bias = inputs[2] is not None

    @staticmethod
    @first_order_only
    def backward(ctx, dy, _dmean, _drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        N = x.shape[1]
        dx = empty_like(x) if need_x else None
        dweight = empty((N,), mean.dtype) if need_w and weight is not None else None
        dbias = empty((N,), mean.dtype) if need_b and ctx.has_bias else None
        if x.numel():
            layer_norm_backward(dy.contiguous(), x, mean, rstd, weight, dx, dweight, dbias)
        else:  # no rows: the parameters' gradients are sums over nothing
            dweight = None if dweight is None else dweight.zero_()
            dbias = None if dbias is None else dbias.zero_()
        return dx, dweight, dbias, None


def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5) -> torch.Tensor:
    """F.layer_norm(x, normalized_shape, weight, bias, eps) of float32 tensors, of bfloat16 ones (x, weight and
    bias all bf16: torch's LayerNorm with bf16 params, its mean and rstd kept in bf16), or of a bfloat16 x with
    float32 weight and bias (torch's mixed types: float mean and rstd, float dweight and dbias): bit-identical to
    torch's forward and backward at every CPU capability and at torch's thread count (dweight, dbias)."""
    require_cpu(x, "x")
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not all(isinstance(d, int) for d in shape):
        raise InvalidArgument(f"normalized_shape must be ints, got {normalized_shape!r}")
    k = len(shape)
    if k == 0 or x.dim() < k or tuple(x.shape[-k:]) != shape:
        raise InvalidArgument(f"layer_norm: normalized_shape {shape} must be the last dimensions of x {tuple(x.shape)}")
    for t, name in ((x, "x"), (weight, "weight"), (bias, "bias")):
        if t is None:
            continue
        require_cpu(t, name)
        if t.dtype not in (torch.float32, torch.bfloat16):
            raise InvalidType(f"layer_norm takes float32 or bfloat16 tensors, got {name} of {t.dtype}")
        if t.dtype != x.dtype and not (x.dtype == torch.bfloat16 and t.dtype == torch.float32):
            raise InvalidType(f"layer_norm: {name} is {t.dtype} and x {x.dtype}: x, weight and bias of one dtype, "
                              "or a bfloat16 x with float32 weight and bias")
        if t is not x and tuple(t.shape) != shape:
            raise InvalidArgument(f"layer_norm: {name} of shape {tuple(t.shape)} for normalized_shape {shape}")
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise InvalidType(f"layer_norm: weight is {weight.dtype} and bias {bias.dtype}: the params of one dtype, "
                          "as torch's mixed-type LayerNorm takes them")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):  # any number, a negative one too, as torch takes it
        raise InvalidArgument(f"eps must be a number, got {eps!r}")
    N = math.prod(shape)
    if N == 0:  # nothing to normalize: torch's empty y, and empty gradients (of weight and bias too)
        y = x.clone()
        for t in (weight, bias):
            y = y if t is None else y + t.to(x.dtype)
        return y
    flat = x.reshape(-1, N).contiguous()
    w = None if weight is None else weight.reshape(N).contiguous()
    b = None if bias is None else bias.reshape(N).contiguous()
    y, _, _ = _LayerNormFunction.apply(flat, w, b, float(eps))
    return y.reshape(x.shape)
