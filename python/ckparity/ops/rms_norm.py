"""ckparity.rms_norm: F.rms_norm on the C kernel (csrc/rms_norm.c)."""

from __future__ import annotations

import math

import torch

from .. import _bindings
from .._tensors import WITH_FLOAT16, empty, require_floating
from ..errors import InvalidArgument, InvalidType, as_float
from ._function import CFunction, first_order_only

# torch's eps=None: the float32 machine epsilon (ATen: numeric_limits<float>::epsilon()).
DEFAULT_EPS = torch.finfo(torch.float32).eps


def _rows(t: torch.Tensor, D: int) -> torch.Tensor:
    return t.reshape(-1, D).contiguous()


def _forward(x, weight, eps):
    """(y, rstd) by the C forward of x's dtype; rstd float32. A sum torch reduces
    to one value is split across its threads: rms_norm splits it the same way."""
    D = x.shape[-1]
    rows = _rows(x, D)
    y = empty(x.shape, x.dtype)
    rstd = torch.empty(rows.shape[0], dtype=torch.float32)
    forward = _bindings.rms_norm_forward if x.dtype == torch.float32 else _bindings.rms_norm_forward_16
    forward(rows, weight, eps, y.view(-1, D), rstd, torch_threads=torch.get_num_threads())
    return y, rstd


def _dweight(ctx, weight, index):
    """dweight's output, or None where weight (input ``index`` of the Function) needs no gradient:
    the C backward then skips dweight's walk, as torch's backward skips what it is not asked for."""
    return torch.empty_like(weight) if weight is not None and ctx.needs_input_grad[index] else None


def _save(ctx, x, weight, rstd):
    ctx.mark_non_differentiable(rstd)
    ctx.save_for_backward(x, weight, rstd)


class _RMSNormFunction(CFunction):
    """x comes in twice — the x of torch's product x * rstd and the x of its
    rstd = rsqrt(mean(x**2) + eps) — and backward returns one gradient term for
    each (ckp_rms_norm_backward_terms). Autograd adds them into x's gradient
    one by one, in its engine's order, with the gradients of x's other uses (a
    residual stream): the same association of the sum as torch's composite
    rms_norm, whose engine adds the two terms separately too. One pre-added dx
    would make the residual sum (res + (a + b)) where torch has ((res + a) + b).

    First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, x_again, weight, eps):
        return _forward(x, weight, eps)

    @staticmethod
    def save(ctx, inputs, output):
        _save(ctx, inputs[0], inputs[2], output[1])

    @staticmethod
    @first_order_only
    def backward(ctx, dy, _drstd):
        x, weight, rstd = ctx.saved_tensors
        D = x.shape[-1]
        rows = _rows(x, D)
        dx_normalized, dx_rstd = empty(x.shape, torch.float32), empty(x.shape, torch.float32)
        dweight = _dweight(ctx, weight, 2)
        _bindings.rms_norm_backward_terms(_rows(dy, D), rows, weight, rstd, dx_normalized.view(-1, D),
                                          dx_rstd.view(-1, D), dweight, torch_threads=torch.get_num_threads())
        return dx_normalized, dx_rstd, dweight, None


class _RMSNorm16Function(CFunction):
    """bfloat16 and float16: torch computes in float and rounds each result once, dx's
    two terms added in float before the rounding -- one dx, not two terms (csrc/rms_norm.c).

    First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, weight, eps):
        return _forward(x, weight, eps)

    @staticmethod
    def save(ctx, inputs, output):
        _save(ctx, inputs[0], inputs[1], output[1])

    @staticmethod
    @first_order_only
    def backward(ctx, dy, _drstd):
        x, weight, rstd = ctx.saved_tensors
        D = x.shape[-1]
        dx = empty(x.shape, x.dtype)
        dweight = _dweight(ctx, weight, 1)
        _bindings.rms_norm_backward_16(_rows(dy.to(x.dtype), D), _rows(x, D), weight, rstd, dx.view(-1, D),
                                       dweight, torch_threads=torch.get_num_threads())
        return dx, dweight, None


def _shape(normalized_shape) -> tuple[int, ...]:
    """normalized_shape as F.rms_norm takes it: a tuple, list or torch.Size of ints. A bare int is a
    TypeError in torch's F.rms_norm (nn.RMSNorm turns one into a tuple; so does ckparity.nn.RMSNorm)."""
    if not isinstance(normalized_shape, (tuple, list, torch.Size)) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in normalized_shape):
        raise InvalidType(f"rms_norm(): normalized_shape must be a tuple of ints (as in F.rms_norm), got "
                          f"{normalized_shape!r}" + (f"; write ({normalized_shape},)"
                                                     if isinstance(normalized_shape, int) else ""))
    return tuple(normalized_shape)


def rms_norm(input: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
             eps: float | None = None) -> torch.Tensor:
    """F.rms_norm: normalizes over the trailing ``normalized_shape`` dimensions
    by 1/sqrt(mean(x^2) + eps), then scales by ``weight``. eps=None is float32's
    machine epsilon, as in torch (for bfloat16 too: torch computes it in float).
    float32, bfloat16 or float16 (the result in that dtype, rounded once as torch's);
    weight of the input's dtype, or float32 with a bfloat16 or float16 input (as torch:
    its float composite, dweight float32), or bfloat16 or float16 with a float32 input
    (as torch: the weight widened, the float32 result; dweight float32's rounded once to
    the weight's dtype). Non-contiguous inputs are copied."""
    require_floating(input, "input", dtypes=WITH_FLOAT16)
    shape = _shape(normalized_shape)
    if len(shape) == 0 or input.dim() < len(shape) or tuple(input.shape[-len(shape):]) != shape:
        raise InvalidArgument(f"normalized_shape {shape} must match the trailing dimensions of input "
                              f"{tuple(input.shape)}")
    if weight is not None:
        # one dtype float32 and the other 16-bit: torch takes them (its float composite), so does ckparity
        mixed = isinstance(weight, torch.Tensor) and torch.float32 in (input.dtype, weight.dtype)
        require_floating(weight, "weight", like=None if mixed else input, dtypes=WITH_FLOAT16)
        if tuple(weight.shape) != shape:
            raise InvalidArgument(f"weight must have shape {shape}, got {tuple(weight.shape)}")
        # a 16-bit weight with a float32 input: torch's composite promotes it to float32 and autograd casts
        # dweight back, rounded once; .float() is that same differentiable cast (ToCopyBackward). A float32
        # weight comes through .float() as it is: contiguous() after it, for every dtype (a strided or
        # expanded weight is a copy whose gradient autograd takes back through the view)
        weight = (weight.float() if input.dtype == torch.float32 else weight).contiguous()
    eps = DEFAULT_EPS if eps is None else as_float(eps, "eps")
    if not (eps >= 0 and math.isfinite(eps)):
        raise InvalidArgument(f"eps must be finite and >= 0, got {eps}")
    if input.numel() == 0:  # no rows, or rows of width 0: torch returns the empty shape, graph kept
        return input * (weight if weight is not None else 1.0)
    D = math.prod(shape)
    # the last len(shape) dimensions flattened to D (a view when it can be; the
    # function's gradients come back in this shape, then through the view)
    x = input if len(shape) == 1 else input.flatten(-len(shape))
    # (a 1-D weight as it is: a reshape to its own shape is still an autograd node, a backward step more)
    w = weight if weight is None or weight.dim() == 1 else weight.reshape(D)
    if x.dtype != torch.float32:
        y, _ = _RMSNorm16Function.apply(x, w, eps)
    else:
        y, _ = _RMSNormFunction.apply(x, x, w, eps)
    return y if len(shape) == 1 else y.unflatten(-1, shape)
