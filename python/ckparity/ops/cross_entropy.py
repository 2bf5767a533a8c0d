"""ckparity.cross_entropy: F.cross_entropy on the C kernel (csrc/cross_entropy.c).

The kernel computes the loss and the gradient in one pass over the logits.
Inputs that are not contiguous are copied first.
"""

from __future__ import annotations

import functools
import math

import torch

from .._native import check, ffi, lib
from .._tensors import pointer, require_cpu, require_float32

VARIANTS = {"default": lib.CKP_CE_DEFAULT, "ptref": lib.CKP_CE_PTREF}
REDUCTIONS = {"none": lib.CKP_REDUCTION_NONE, "mean": lib.CKP_REDUCTION_MEAN, "sum": lib.CKP_REDUCTION_SUM}


def _options(weight, ignore_index, reduction, label_smoothing, z_loss, variant, row_grad=None):
    if weight is None and row_grad is None:
        return _plain_options(ignore_index, reduction, label_smoothing, z_loss, variant)
    return _new_options(weight, ignore_index, reduction, label_smoothing, z_loss, variant, row_grad)


@functools.lru_cache(maxsize=64)
def _plain_options(ignore_index, reduction, label_smoothing, z_loss, variant):
    """Options without pointers, made once per setting (the C side only reads
    them): building a cffi struct costs more than a small kernel call."""
    return _new_options(None, ignore_index, reduction, label_smoothing, z_loss, variant, None)


def _new_options(weight, ignore_index, reduction, label_smoothing, z_loss, variant, row_grad):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {sorted(REDUCTIONS)}, got {reduction!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    opt = ffi.new("ckp_cross_entropy_options *")
    opt.weight = pointer(weight)
    opt.ignore_index = int(ignore_index)
    opt.reduction = REDUCTIONS[reduction]
    opt.label_smoothing = float(label_smoothing)
    opt.z_loss = float(z_loss)
    opt.variant = VARIANTS[variant]
    opt.row_grad = pointer(row_grad)
    return opt


def cross_entropy_forward_backward(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    variant: str = "default",
    dlogits: torch.Tensor | None = None,
    compute_grad: bool = True,
    row_grad: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call of the C kernel on 2-D tensors, no autograd.

    logits is (N, V) float32 contiguous; target is (N) int64 class indices or
    (N, V) float32 probabilities. Returns (loss, dlogits): loss is (N) for
    reduction "none", else 0-dim; dlogits is the gradient for an upstream
    gradient of 1, written into ``dlogits`` if given (it may be ``logits``
    itself: the in-place mode that saves an (N, V) buffer) or a new tensor,
    or None when ``compute_grad`` is False. With reduction "none", ``row_grad``
    (N, float32) is the upstream gradient of each row, folded in before rounding.
    """
    N, V = logits.shape
    probs = target.is_floating_point()
    loss = torch.empty((N,) if reduction == "none" else (), dtype=torch.float32)
    if compute_grad and dlogits is None:
        dlogits = torch.empty_like(logits)
    if not compute_grad:
        dlogits = None
    opt = _options(weight, ignore_index, reduction, label_smoothing, z_loss, variant, row_grad)
    status = lib.ckp_cross_entropy(
        pointer(logits),
        ffi.NULL if probs else pointer(target),
        pointer(target) if probs else ffi.NULL,
        N,
        V,
        opt,
        pointer(loss),
        pointer(dlogits),
    )
    check(status, "cross_entropy")
    return loss, dlogits


class _CrossEntropyFunction(torch.autograd.Function):
    """Reductions mean and sum: the gradient (for upstream 1) comes out of the
    forward's single pass and backward scales it. Reduction none: the upstream
    gradient differs per row, so backward runs the kernel with it (one pass,
    one rounding, as torch folds it in) instead of rescaling a stored gradient."""

    @staticmethod
    def forward(ctx, logits, target, weight, settings):
        ctx.settings = settings
        ctx.reduction_none = settings["reduction"] == "none"
        fused = ctx.needs_input_grad[0] and not ctx.reduction_none
        loss, dlogits = cross_entropy_forward_backward(logits, target, weight, **settings, compute_grad=fused)
        if ctx.reduction_none:
            ctx.save_for_backward(logits, target, weight)
        else:
            ctx.save_for_backward(dlogits)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if ctx.reduction_none:
            logits, target, weight = ctx.saved_tensors
            row_grad = grad_loss.contiguous().float()
            _, dlogits = cross_entropy_forward_backward(logits, target, weight, **ctx.settings, row_grad=row_grad)
            return dlogits, None, None, None
        (dlogits,) = ctx.saved_tensors
        if float(grad_loss) == 1.0:
            return dlogits, None, None, None  # x * 1 == x: skip a pass over (N, V)
        return dlogits * grad_loss, None, None, None


def _check_target(input: torch.Tensor, target: torch.Tensor, ignore_index: int) -> bool:
    """Validates target against input; True for probability targets."""
    require_cpu(target, "target")
    if target.shape == input.shape and target.is_floating_point():
        require_float32(target, "target (class probabilities)")
        if ignore_index >= 0:
            raise ValueError("ignore_index is not supported for floating point target (as in torch)")
        return True
    if target.is_floating_point():
        raise ValueError(
            f"a floating point target is read as class probabilities and must have the input's "
            f"shape {tuple(input.shape)}, got {tuple(target.shape)}"
        )
    if target.dtype != torch.int64:
        raise TypeError(f"class-index target must be int64 (torch.long), got {target.dtype}; use target.long()")
    expected = input.shape[:1] + input.shape[2:] if input.dim() >= 2 else torch.Size([])
    if target.shape != expected:
        raise ValueError(
            f"target shape {tuple(target.shape)} does not match input shape {tuple(input.shape)}: "
            f"expected {tuple(expected)} for class indices or {tuple(input.shape)} for probabilities"
        )
    return False


def _empty_result(input: torch.Tensor, loss_shape, reduction: str) -> torch.Tensor:
    """torch's results for zero rows: NaN mean, zero sum, empty none (graph kept)."""
    tied = input.sum() * 0.0
    if reduction == "none":
        return input.new_zeros(loss_shape) + tied
    return tied + (math.nan if reduction == "mean" else 0.0)


def _flatten(input: torch.Tensor, target: torch.Tensor, probs: bool):
    """Moves the class dimension last and flattens: (rows, C) logits, the
    matching target, and the shape of the unreduced loss."""
    if input.dim() == 2 and not probs:  # the common case, without the cost of the views
        return input.contiguous(), target.contiguous(), input.shape[:1]
    if input.dim() == 1:
        logits, loss_shape = input.unsqueeze(0), ()
    else:
        logits = input.movedim(1, -1)
        loss_shape = logits.shape[:-1]
    C = logits.shape[-1]
    flat_target = target.movedim(1, -1) if probs and target.dim() > 1 else target
    flat_target = flat_target.reshape(-1, C) if probs else flat_target.reshape(-1)
    return logits.reshape(-1, C).contiguous(), flat_target.contiguous(), loss_shape


def cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    z_loss: float = 0.0,
    variant: str = "default",
) -> torch.Tensor:
    """F.cross_entropy with the same arguments, plus ``z_loss`` and ``variant``.

    input is (C), (N, C) or (N, C, d1, ...) float32 on the CPU; target is class
    indices (int64, input's shape without C) or class probabilities (float32,
    input's shape). ``z_loss`` adds z_loss * logsumexp(row)**2 to each
    non-ignored row's loss before the reduction. ``variant`` is "default" (fused,
    threaded) or "ptref" (ATen's order of operations). Gradients flow to input
    only; asking for a gradient of target or weight raises NotImplementedError.
    """
    require_float32(input, "input")
    if input.dim() == 0:
        raise ValueError("input must have at least 1 dimension (C), got a 0-dim tensor")
    probs = _check_target(input, target, ignore_index)
    if weight is not None:
        require_float32(weight, "weight")
        C = input.shape[0] if input.dim() == 1 else input.shape[1]
        if weight.shape != (C,):
            raise ValueError(f"weight must have shape ({C},) (one per class), got {tuple(weight.shape)}")
        weight = weight.contiguous()
    if torch.is_grad_enabled() and (target.requires_grad or (weight is not None and weight.requires_grad)):
        raise NotImplementedError("ckparity.cross_entropy differentiates with respect to input only")

    logits, flat_target, loss_shape = _flatten(input, target, probs)
    C = logits.shape[1]
    if logits.shape[0] == 0 or C == 0:
        return _empty_result(input, loss_shape, reduction)
    settings = dict(
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
        z_loss=z_loss,
        variant=variant,
    )
    loss = _CrossEntropyFunction.apply(logits, flat_target, weight, settings)
    return loss.reshape(loss_shape) if reduction == "none" else loss
