"""ckparity.fused_linear_cross_entropy: F.cross_entropy(F.linear(hidden,
weight, bias), target) without the (N, V) logits.

Rows go in chunks. Per chunk: the logits by torch's matmul, the C
cross-entropy writing each row's loss and dlogits over those logits (in
place), then grad_hidden for the chunk and grad_weight / grad_bias
accumulated by torch's matmul. Only one chunk's logits exist at a time.

Reductions mean and sum compute the gradients in the forward, for an
upstream gradient of 1, and backward scales them (exact when the upstream
gradient is a power of two, as ``loss / K`` of gradient accumulation with K
a power of two is); a gradient only has to exist once. Reduction none cannot
know each row's upstream gradient in the forward, so backward runs the
chunks again with it (one more matmul per chunk) and folds it into dlogits
before any rounding, as torch does — ignored rows get zero gradient (NaN
where their logits are not finite, as torch's: cross_entropy.c's ignored_row_grad).

The arithmetic differs from the unfused composition in two places: the mean
scale is 1/n rounded to float32 and applied per row, and grad_weight is a sum
over chunks (torch's is one matmul over all rows). tests/test_fused_linear.py
measures both against torch's own error relative to float64.

bfloat16 hidden and weight (and bias) are the default cross-entropy's bf16
rule (ops/cross_entropy.py): float math on the values widened exactly,
rounded where a result is stored -- the loss and the gradients, once each
(the casts' autograd). The logits are never stored, so they are never
rounded: torch's bf16 composition rounds them, and its error is the larger
(tests/test_fused_linear.py). The cost is a float32 copy of the weight and
a float32 grad_weight for the call's duration."""

from __future__ import annotations

import math

import torch

from .._tensors import require_cpu, require_float32
from ..errors import InvalidArgument, InvalidType, TargetOutOfRange, as_float, as_int
from ._function import first_order_only
from .cross_entropy import cross_entropy_forward_backward

REDUCTIONS = ("none", "mean", "sum")

# default rows per chunk: about 2**24 floats (64 MB) of logits. Smaller chunks
# cost more passes over grad_weight (one addmm_ per chunk); larger ones more memory.
CHUNK_FLOATS = 1 << 24


def _chunks(N: int, chunk_size: int):
    """Rows in ceil(N / chunk_size) chunks of near-equal size (none larger
    than chunk_size), not full chunks and a remainder: a remainder of 2 or 3
    rows goes through MKL's small-M sgemm, whose bits changed between 1 and 2
    threads (AMD EPYC, even with MKL_CBWR=AUTO,STRICT; M = 2, 3 of 1..39
    measured, tests/test_fused_linear.py), where balanced chunks keep every
    product at a deterministic size unless N itself is that small."""
    count = -(-N // chunk_size)
    base, extra = divmod(N, count)
    start = 0
    for k in range(count):
        end = start + base + (1 if k < extra else 0)
        yield start, end
        start = end


def _run(hidden, weight, bias, target, settings, row_grad, grads):
    """The chunked pass: returns the per-row losses; with ``grads`` (a
    (grad_hidden, grad_weight, grad_bias) triple of zeroed buffers or Nones),
    accumulates the gradients for the per-row upstream ``row_grad``."""
    N = hidden.shape[0]
    rows = torch.empty(N, dtype=torch.float32)
    grad_hidden, grad_weight, grad_bias = grads if grads is not None else (None, None, None)
    options = {k: settings[k] for k in ("ignore_index", "label_smoothing", "z_loss")}
    for start, end in _chunks(N, settings["chunk_size"]):
        h = hidden[start:end]
        logits = torch.addmm(bias, h, weight.t()) if bias is not None else torch.mm(h, weight.t())
        loss, dlogits = cross_entropy_forward_backward(
            logits, target[start:end], None, reduction="none", variant="default", **options,
            compute_grad=grads is not None, dlogits=logits if grads is not None else None,
            row_grad=row_grad[start:end] if grads is not None else None)
        rows[start:end] = loss
        if grad_hidden is not None:
            torch.mm(dlogits, weight, out=grad_hidden[start:end])
        if grad_weight is not None:
            grad_weight.addmm_(dlogits.t(), h)
        if grad_bias is not None:
            grad_bias.add_(dlogits.sum(0))
        del logits, dlogits  # before the next chunk's matmul, not after: one chunk alive at a time
    return rows


def _gradient_buffers(hidden, weight, bias, needs):
    need_hidden, need_weight, need_bias = needs
    return (torch.empty_like(hidden) if need_hidden else None,
            torch.zeros_like(weight) if need_weight else None,
            torch.zeros_like(bias) if bias is not None and need_bias else None)


def _reduce(rows: torch.Tensor, target: torch.Tensor, settings) -> torch.Tensor:
    if settings["reduction"] == "none":
        return rows
    total = rows.double().sum()  # float32-rounded rows summed in double: no rounding of its own
    if settings["reduction"] == "mean":  # torch's mean: over the non-ignored rows; all ignored gives NaN
        total = total / (target != settings["ignore_index"]).sum()
    return total.float()


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """The gradients of mean and sum go from the forward to ctx directly, not
    out as outputs: autograd would give every output a zero gradient in
    backward (a V x D one for grad_weight). First-order only (_function.py)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, settings, needs):
        ctx.settings, ctx.needs, ctx.grads = settings, needs, None
        if settings["reduction"] == "none" or not any(needs):
            ctx.save_for_backward(hidden, weight, bias, target)
            return _reduce(_run(hidden, weight, bias, target, settings, None, None), target, settings)
        count = int((target != settings["ignore_index"]).sum())
        scale = 1.0 / count if settings["reduction"] == "mean" and count else 1.0
        ctx.grads = _gradient_buffers(hidden, weight, bias, needs)
        rows = _run(hidden, weight, bias, target, settings, torch.full((hidden.shape[0],), scale), ctx.grads)
        return _reduce(rows, target, settings)

    @staticmethod
    @first_order_only
    def backward(ctx, grad_loss):
        if ctx.settings["reduction"] == "none":
            hidden, weight, bias, target = ctx.saved_tensors
            grads = _gradient_buffers(hidden, weight, bias, ctx.needs)
            _run(hidden, weight, bias, target, ctx.settings, grad_loss.contiguous().float(), grads)
        else:
            if ctx.grads is None:
                raise RuntimeError("fused_linear_cross_entropy's backward runs once (its gradients were computed "
                                   "in the forward and handed over): retain_graph is not supported")
            # handed over, not kept: autograd then takes grad_weight as weight.grad instead of copying
            # it (a V x D copy, the size of the weight itself)
            stored, ctx.grads = ctx.grads, None
            scale = float(grad_loss)
            grads = [g if g is None or scale == 1.0 else g.mul_(scale) for g in stored]
        return (*grads, None, None, None)


def _require_bf16(hidden, weight, bias) -> None:
    """bf16 hidden takes a bf16 weight and bias: a float32 weight would make
    torch's F.linear refuse the call (it does not promote), so no reference
    exists to follow."""
    for name, t in (("hidden", hidden), ("weight", weight), ("bias", bias)):
        if t is None:
            continue
        require_cpu(t, name)
        if t.dtype != torch.bfloat16:
            raise InvalidType(f"{name} must be bfloat16 like hidden, got {t.dtype} (F.linear takes one dtype)")


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: torch.Tensor | None = None, *, ignore_index: int = -100,
                               reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                               chunk_size: int | None = None) -> torch.Tensor:
    """F.cross_entropy(F.linear(hidden, weight, bias), target, ...) without
    materializing the logits.

    hidden is (..., D) float32 or bfloat16, weight (V, D) and bias (V) or
    None of hidden's dtype, target the
    class indices (int64) of hidden's leading shape. ``z_loss`` as in
    ckparity.cross_entropy. ``chunk_size``: rows per chunk (default: about
    64 MB of logits, 2**24 // V rows). Gradients flow to hidden, weight and
    bias; first-order only."""
    if isinstance(hidden, torch.Tensor) and hidden.dtype == torch.bfloat16:
        _require_bf16(hidden, weight, bias)
        widened = fused_linear_cross_entropy(
            hidden.float(), weight.float(), target, None if bias is None else bias.float(),
            ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss,
            chunk_size=chunk_size)
        return widened.to(torch.bfloat16)
    for name, t in (("hidden", hidden), ("weight", weight)):
        require_float32(t, name)
    require_cpu(target, "target")
    if target.dtype != torch.int64:
        raise InvalidType(f"target must be int64 class indices, got {target.dtype}")
    if hidden.dim() < 1 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise InvalidArgument(f"hidden must be (..., D) and weight (V, D), got {tuple(hidden.shape)} and "
                              f"{tuple(weight.shape)}")
    if target.shape != hidden.shape[:-1]:
        raise InvalidArgument(f"target must have hidden's leading shape {tuple(hidden.shape[:-1])}, got "
                              f"{tuple(target.shape)}")
    V = weight.shape[0]
    if bias is not None:
        require_float32(bias, "bias")
        if bias.shape != (V,):
            raise InvalidArgument(f"bias must have shape ({V},), got {tuple(bias.shape)}")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise InvalidArgument(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")
    ignore_index = as_int(ignore_index, "ignore_index")
    label_smoothing, z_loss = as_float(label_smoothing, "label_smoothing"), as_float(z_loss, "z_loss")
    if not (0.0 <= label_smoothing <= 1.0):
        raise InvalidArgument(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if not (z_loss >= 0.0 and math.isfinite(z_loss)):
        raise InvalidArgument(f"z_loss must be finite and >= 0, got {z_loss}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise InvalidArgument(f"chunk_size must be a positive int, got {chunk_size!r}")
    if V == 0:
        raise InvalidArgument("weight has 0 rows: there are no classes")
    leading = target.shape
    h, t = hidden.reshape(-1, hidden.shape[-1]).contiguous(), target.reshape(-1).contiguous()
    if h.shape[0] == 0:
        raise InvalidArgument("hidden has no rows")
    # refused before any chunk runs (the kernel would find it only in its chunk)
    counted = t[t != ignore_index]
    bad = counted[(counted < 0) | (counted >= V)]
    if bad.numel():
        raise TargetOutOfRange(f"Target {int(bad[0])} is out of bounds: weight has {V} classes")
    settings = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss,
                    chunk_size=chunk_size or max(1, CHUNK_FLOATS // V))
    grad_on = torch.is_grad_enabled()
    needs = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
             grad_on and bias is not None and bias.requires_grad)
    loss = _FusedLinearCrossEntropy.apply(h, weight.contiguous(), bias.contiguous() if bias is not None else None,
                                          t, settings, needs)
    return loss.reshape(leading) if reduction == "none" else loss
