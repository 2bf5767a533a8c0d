"""ckparity.cross_entropy: F.cross_entropy on the C kernel (csrc/cross_entropy.c).

The kernel computes the loss and the gradient in one pass over the logits.
Inputs that are not contiguous are copied first.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import _bindings
from .._tensors import empty_like, plain, require_cpu, require_float32, require_floating
from ..errors import InvalidArgument, InvalidType, as_float, as_int
from ._function import CFunction, first_order_only


def _float32_products(logits: torch.Tensor, target: torch.Tensor) -> bool:
    """bf16 logits with float32 probabilities: torch's products are float32, and a float32 weight
    joins them as a bf16 one does (both variants take either)."""
    return logits.dtype == torch.bfloat16 and target.dtype == torch.float32


def _loss_dtype(logits: torch.Tensor, target: torch.Tensor) -> torch.dtype:
    """torch's: the logits', or float32 where float32 probabilities promote a bf16 loss."""
    return torch.float32 if target.dtype == torch.float32 else logits.dtype


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
    row_grad: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One call of the C kernel on 2-D tensors, no autograd.

    logits is (N, V) float32 contiguous, or bfloat16 with the default variant
    (its arithmetic on the widened values, dlogits rounded once; the loss
    stays float32); target is (N) int64 class indices or (N, V)
    probabilities of the logits' dtype. Returns (loss, dlogits): loss is (N) for
    reduction "none", else 0-dim; dlogits is the gradient for an upstream
    gradient of 1, written into ``dlogits`` if given (it may be ``logits``
    itself: the in-place mode that saves an (N, V) buffer) or a new tensor,
    or None when ``compute_grad`` is False. ``row_grad`` is the upstream
    gradient, folded in before rounding: (N) float32 with reduction "none", one
    per row; (1) or a number with mean and sum (ptref folds it where torch's chain does, the
    default variant into its row scale, one rounding).
    """
    N, V = logits.shape
    row_grad = _as_row_grad(row_grad, weight, reduction)
    if isinstance(row_grad, torch.Tensor) and row_grad.numel() != (N if reduction == "none" else 1):
        raise InvalidArgument(f"row_grad must have {N if reduction == 'none' else 1} elements with reduction "
                              f"{reduction!r}, got {row_grad.numel()}")
    loss = torch.empty((N,) if reduction == "none" else (), dtype=torch.float32)
    if weight is not None and weight.dtype == torch.bfloat16:
        weight = weight.float()  # bf16 values, held as floats (the C API's weight)
    if compute_grad and dlogits is None:
        dlogits = empty_like(logits)
    if not compute_grad:
        dlogits = None
    # ptref splits a sum over every element as torch does on its threads (probability targets' mean and sum)
    threads = torch.get_num_threads() if variant == "ptref" else 1
    options = _bindings.cross_entropy_options(weight, ignore_index, reduction, label_smoothing, z_loss, variant,
                                              row_grad, threads)
    call = _bindings.cross_entropy_default_bf16 if logits.dtype == torch.bfloat16 else _bindings.cross_entropy
    call(logits, target, options, loss, dlogits)
    return loss, dlogits


def _as_row_grad(upstream, weight, reduction: str):
    """The C options' row_grad for an upstream gradient: None (1); a number, for mean and sum without
    a weight (the bindings write it into a struct of their own); else float32 values, one per row with
    reduction none (bf16 upstream values held as floats)."""
    if upstream is None or (isinstance(upstream, float) and weight is None and reduction != "none"):
        return upstream
    if isinstance(upstream, float):
        return torch.tensor([upstream])
    return upstream.float().reshape(-1).contiguous()


def _target_grad(logits, target, weight, settings, grad_loss, widened=False):
    """The gradient of probability targets, by torch's own composite (the
    kernel computes dlogits only; distillation losses that differentiate the
    soft target are rare enough that torch's arithmetic serves). ``widened``
    (the default variant's bf16): the composite in float32 on the widened
    values, the gradient rounded once where autograd casts it back -- the
    variant's rule, and no farther from float64 than torch's bf16 composite,
    which the flattened (N, C) layout would not repeat for (N, C, d1, ...)."""
    with torch.enable_grad():
        leaf = target.detach().requires_grad_(True)
        as_float = (lambda t: None if t is None else t.float()) if widened else (lambda t: t)
        loss = F.cross_entropy(as_float(logits.detach()), as_float(leaf), as_float(weight),
                               reduction=settings["reduction"], label_smoothing=settings["label_smoothing"])
        (dtarget,) = torch.autograd.grad(loss, leaf, as_float(grad_loss))
    return dtarget


# [Note: guessing the upstream gradient]
# The kernel folds an upstream gradient other than 1 in (ptref where torch's chain folds it, the
# default variant into its row scale), so when the loss is scaled before backward -- gradient
# accumulation's loss / K, a loss scale -- the gradient a forward computed for an upstream of 1 was
# thrown away and the kernel ran again in backward: a ptref micro-step of the 850-step preset
# (loss / 8) took 68 us against torch's 30 at N=64, V=256, and at (2048, 32000) the wasted pass and
# buffer cost ptref 76 ms against torch's 205. The forward cannot see the upstream gradient to come,
# so it guesses the last backward's, per (variant, dtype, reduction), and folds that in; backward
# takes the forward's gradient when the guess was right (the same bits: the same kernel on the same
# inputs with the same upstream gradient) and runs the kernel with the real one otherwise. A wrong
# guess costs a pass, never a bit. Reduction none (an upstream gradient per row) is not guessed.
_LAST_UPSTREAM: dict[tuple, float] = {}


def _guess(key: tuple) -> float:
    """The upstream gradient the forward folds in: the last backward's for ``key``, else 1."""
    return _LAST_UPSTREAM.get(key, 1.0)


def _same_bits(a: float, b: float) -> bool:
    """a and b the same number, zeros' signs included (a NaN guess is never right: a rerun)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _folded(upstream: float) -> float | None:
    """The row_grad argument for an upstream gradient (None for 1: the kernel's own)."""
    return None if _same_bits(upstream, 1.0) else upstream


class _CrossEntropyFunction(torch.autograd.Function):
    """Reductions mean and sum: the gradient comes out of the forward's single
    pass, for the upstream gradient guessed from the last backward (1 at
    first; [Note: guessing the upstream gradient]). Any other upstream gradient
    (and reduction none's, one per row) is folded in by the kernel in
    backward: ptref where torch's chain folds it (its bits), the default
    variant into its float64 row scale (one rounding), never a finished
    gradient rescaled.

    A classic forward(ctx, ...) rather than CFunction's compute/save: the
    forward's dlogits are saved on ctx, not sent out as a second output (an
    output costs autograd its bookkeeping on every call, the tiny shapes'
    largest cost after the kernel). First-order only (ops/_function.py): a
    gradient computed under create_graph=True raises when differentiated
    again, never a silent first-order answer."""

    @staticmethod
    def forward(ctx, logits, target, weight, settings, compute_grad):
        reduction_none = settings["reduction"] == "none"
        # bf16 logits: the loss rounded as the float32 one cast to bf16 (float32 with float32 probabilities:
        # torch's promotion)
        ctx.rounded = logits.dtype == torch.bfloat16
        ctx.key = (settings["variant"], logits.dtype, settings["reduction"])
        ctx.guess = _guess(ctx.key)  # [Note: guessing the upstream gradient]
        compute_grad = compute_grad and not reduction_none
        loss, dlogits = cross_entropy_forward_backward(logits, target, weight, **settings, compute_grad=compute_grad,
                                                       row_grad=_folded(ctx.guess) if compute_grad else None)
        ctx.settings, ctx.reduction_none = settings, reduction_none
        if ctx.rounded:
            loss = loss.to(_loss_dtype(logits, target))
        # dlogits saved, not kept on ctx: autograd releases saved tensors as
        # soon as this backward has run (unless retain_graph), so a leaf's
        # AccumulateGrad finds the gradient unshared and takes it instead of
        # copying (N, V) floats, and the buffer does not outlive the step.
        # The inputs are kept (references, no copies): an upstream gradient
        # other than 1 is folded in by the kernel, which reads them again; and
        # first_order_only ties a create_graph gradient to the logits, so
        # differentiating it again raises instead of giving None.
        ctx.save_for_backward(dlogits, logits, target, weight)
        return loss

    @staticmethod
    @first_order_only
    def backward(ctx, grad_loss):
        dlogits, logits, target, weight = ctx.saved_tensors
        dtarget = None
        if ctx.needs_input_grad[1]:
            dtarget = _target_grad(logits, target, weight, ctx.settings, grad_loss, widened=ctx.rounded)
        if not ctx.needs_input_grad[0]:
            return None, dtarget, None, None, None
        if ctx.reduction_none:  # one upstream gradient per row
            row_grad = grad_loss
        else:
            upstream = _LAST_UPSTREAM[ctx.key] = float(grad_loss)
            if _same_bits(upstream, ctx.guess):
                return dlogits, dtarget, None, None, None
            row_grad = _folded(upstream)
        _, dlogits = cross_entropy_forward_backward(logits, target, weight, **ctx.settings, row_grad=row_grad)
        return dlogits, dtarget, None, None, None


class _InplaceCrossEntropyFunction(CFunction):
    """inplace_backward=True: the forward's single pass writes dlogits over
    the logits, so neither pass allocates an (N, V) buffer. The logits'
    version counter is bumped: any op that saved them for its own backward
    raises in that backward instead of reading dlogits as logits. First-order
    only: see ops/_function.py."""

    @staticmethod
    def compute(logits, target, weight, settings):
        loss, _ = cross_entropy_forward_backward(logits, target, weight, **settings, dlogits=logits)
        return loss.to(_loss_dtype(logits, target))

    @staticmethod
    def save(ctx, inputs, output):
        logits = inputs[0]
        torch.autograd.graph.increment_version(logits)
        ctx.dlogits = logits  # not save_for_backward: its version moved on purpose

    @staticmethod
    @first_order_only
    def backward(ctx, grad_loss):
        # another upstream gradient scales the finished gradient: exact for a power of two (1/2, 1/4 of a
        # gradient accumulation) in float32 and bf16; any other value rounds dlogits a second time (the
        # logits that a rerun of the kernel would need are gone)
        dlogits = ctx.dlogits
        return (dlogits if float(grad_loss) == 1.0 else dlogits * grad_loss), None, None, None


def _check_inplace(input: torch.Tensor, target: torch.Tensor, reduction: str) -> None:
    if input.dim() != 2 or not input.is_contiguous():
        raise InvalidArgument(f"inplace_backward needs contiguous (N, C) logits (their storage takes dlogits), got "
                              f"shape {tuple(input.shape)}{'' if input.is_contiguous() else ', not contiguous'}")
    if reduction == "none":
        raise InvalidArgument("inplace_backward needs reduction 'mean' or 'sum': with 'none' each row's upstream "
                              "gradient is only known in backward, after the logits would be gone")
    if target.requires_grad:
        raise InvalidArgument("inplace_backward cannot differentiate probability targets (their gradient needs the "
                              "logits, which it overwrites)")


def _check_target(input: torch.Tensor, target: torch.Tensor, ignore_index: int) -> bool:
    """Validates target against input; True for probability targets."""
    if input.dim() == 0:
        raise InvalidArgument("input must have at least 1 dimension (C), got a 0-dim tensor")
    require_cpu(target, "target")
    if target.shape == input.shape and target.is_floating_point():
        if input.dtype != torch.bfloat16:
            require_float32(target, "target (class probabilities)")
        elif target.dtype not in (torch.bfloat16, torch.float32):
            raise InvalidType(f"bfloat16 cross_entropy takes bf16 or float32 class probabilities, got {target.dtype}")
        if ignore_index >= 0:
            raise InvalidArgument("ignore_index is not supported for floating point target (as in torch)")
        return True
    if target.is_floating_point():
        raise InvalidArgument(
            f"a floating point target is read as class probabilities and must have the input's "
            f"shape {tuple(input.shape)}, got {tuple(target.shape)}"
        )
    if target.dtype not in (torch.int64, torch.uint8):
        raise InvalidType(f"class-index target must be int64 (torch.long), got {target.dtype}; use target.long()")
    if target.dtype == torch.uint8 and input.dim() > 2:
        # torch's nll_loss takes Byte targets; its spatial form (nll_loss2d, input of 3 or more dimensions) Long only
        raise InvalidType(f"class-index target of a {input.dim()}-D input must be int64 (torch.long), got uint8 "
                          f"(torch's nll_loss2d takes Long only); use target.long()")
    expected = input.shape[:1] + input.shape[2:] if input.dim() >= 2 else torch.Size([])
    if target.shape != expected and not (input.dim() == 1 and target.shape == (1,)):
        raise InvalidArgument(
            f"target shape {tuple(target.shape)} does not match input shape {tuple(input.shape)}: "
            f"expected {tuple(expected)} for class indices or {tuple(input.shape)} for probabilities"
        )
    return False


def _plain_target(target, input) -> bool:
    """(N) int64 class indices for (N, C) logits, contiguous, on the CPU, unwrapped."""
    return (isinstance(target, torch.Tensor) and target.dtype is torch.int64 and target.is_cpu and target.dim() == 1
            and target.shape[0] == input.shape[0] and target.is_contiguous() and not target.requires_grad
            and not torch._C._functorch.is_functorch_wrapped_tensor(target))


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
        return input.contiguous(), target.long().contiguous(), input.shape[:1]
    if input.dim() == 1:
        logits, loss_shape = input.unsqueeze(0), ()
    else:
        logits = input.movedim(1, -1)
        loss_shape = logits.shape[:-1]
    C = logits.shape[-1]
    flat_target = target.movedim(1, -1) if probs and target.dim() > 1 else target
    flat_target = flat_target.reshape(-1, C) if probs else flat_target.reshape(-1).long()
    return logits.reshape(-1, C).contiguous(), flat_target.contiguous(), loss_shape


def _rows(input: torch.Tensor, target: torch.Tensor, probs: bool, reduction: str):
    """_flatten, and torch's answer where there is nothing to compute: (logits, target, loss shape,
    the result for zero rows or classes, else None); a class index with zero classes raises."""
    logits, flat_target, loss_shape = _flatten(input, target, probs)
    C = logits.shape[-1]
    if C == 0 and not probs and flat_target.numel():
        raise IndexError(f"Target {int(flat_target[0])} is out of bounds: input has 0 classes")
    empty = _empty_result(input, loss_shape, reduction) if logits.shape[0] == 0 or C == 0 else None
    return logits, flat_target, loss_shape, empty


def _refuse_weight_grad(weight: torch.Tensor) -> None:
    if torch.is_grad_enabled() and weight.requires_grad:
        raise NotImplementedError("ckparity.cross_entropy differentiates with respect to input and "
                                  "probability targets, not weight")


def _bf16_call(logits, target, weight, reduction, ignore_index, label_smoothing, upstream=None, compute_grad=True):
    N, V = logits.shape
    loss = torch.empty((N,) if reduction == "none" else (), dtype=_loss_dtype(logits, target))
    dlogits = empty_like(logits) if compute_grad else None
    row_grad = _as_row_grad(upstream, weight, reduction)  # held here: the options point into it
    options = _bindings.cross_entropy_options(weight, ignore_index, reduction, label_smoothing, 0.0, "ptref",
                                              row_grad, torch.get_num_threads())
    _bindings.cross_entropy_bf16(logits, target, options, loss, dlogits)
    return loss, dlogits


class _CrossEntropyBF16Function(CFunction):
    """bfloat16 logits, the ptref variant (csrc/cross_entropy.c): the loss and
    the gradient for the guessed upstream gradient in one call ([Note: guessing
    the upstream gradient]); another upstream gradient runs the kernel again
    with it (torch's bf16 chain folds it in before its roundings: a rescaled
    gradient would not repeat them).

    First-order only: see ops/_function.py."""

    @staticmethod
    def compute(logits, target, weight, reduction, ignore_index, label_smoothing, compute_grad, upstream=None):
        return _bf16_call(logits, target, weight, reduction, ignore_index, label_smoothing, upstream,
                          compute_grad=compute_grad)

    @classmethod
    def forward(cls, ctx, logits, target, weight, reduction, ignore_index, label_smoothing, compute_grad,
                bf16_weight):
        ctx.key = ("ptref", logits.dtype, reduction)
        # [Note: guessing the upstream gradient]; reduction none's gradient is the one for ones
        ctx.guess = 1.0 if reduction == "none" else _guess(ctx.key)
        loss, dlogits = cls.compute(logits, target, weight, reduction, ignore_index, label_smoothing,
                                    compute_grad, _folded(ctx.guess))
        ctx.save_for_backward(logits, target, dlogits)
        ctx.weight, ctx.bf16_weight = weight, bf16_weight
        ctx.settings = (reduction, ignore_index, label_smoothing)
        return loss

    @staticmethod
    @first_order_only
    def backward(ctx, grad):
        logits, target, dlogits = ctx.saved_tensors
        dtarget = None
        if ctx.needs_input_grad[1]:  # bf16 probabilities: torch's own bf16 chain gives their gradient
            reduction, _, label_smoothing = ctx.settings
            dtarget = _target_grad(logits, target, ctx.bf16_weight,
                                   {"reduction": reduction, "label_smoothing": label_smoothing}, grad)
        if not ctx.needs_input_grad[0]:
            return None, dtarget, None, None, None, None, None, None
        if grad.dim():  # reduction none: one upstream gradient per row, the forward's for ones
            if not bool((grad == 1).all()):
                dlogits = _bf16_call(logits, target, ctx.weight, *ctx.settings, upstream=grad)[1]
            return dlogits, dtarget, None, None, None, None, None, None
        upstream = _LAST_UPSTREAM[ctx.key] = float(grad)  # float(): one op, where (grad == 1).all() is two
        if not _same_bits(upstream, ctx.guess):  # folded in where torch's chain folds it
            dlogits = _bf16_call(logits, target, ctx.weight, *ctx.settings, upstream=_folded(upstream))[1]
        return dlogits, dtarget, None, None, None, None, None, None


def _cross_entropy_bf16(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, variant,
                        inplace_backward):
    """The bf16 ptref path (the default variant takes cross_entropy's own path): what it takes,
    refused by name otherwise."""
    soft = isinstance(target, torch.Tensor) and target.is_floating_point()
    missing = [name for name, given in (("z_loss (torch has none to follow in bf16)", z_loss),
                                        ("inplace_backward (ptref folds the upstream gradient in where torch's "
                                         "chain does, which needs the logits)", inplace_backward),
                                        ("probability targets other than bf16 or float32", soft
                                         and target.dtype not in (torch.bfloat16, torch.float32)))
               if given]
    if missing:  # a TypeError: the dtype is what the call cannot take (check --dtype: "not supported")
        raise InvalidType(f"bfloat16 cross_entropy: the default variant, or ptref; "
                          f"{', '.join(missing)} is not in bf16 yet (or pass float32 logits)")
    if input.dim() > 2:  # an InvalidType like the refusals above: check --dtype reads it as "not supported"
        raise InvalidType(f"bfloat16 cross_entropy with ptref takes (C) or (N, C) logits, got "
                          f"{tuple(input.shape)}: with the class dimension not last torch's bf16 log_softmax "
                          f"runs other loops, whose bits ptref does not repeat; the default variant takes it")
    probs = _check_target(input, target, ignore_index)
    if reduction not in ("mean", "sum", "none"):
        raise InvalidArgument(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise InvalidArgument(f"label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    C = input.shape[0] if input.dim() == 1 else input.shape[1]
    bf16_weight = weight
    if weight is not None:
        dtypes = (torch.bfloat16, torch.float32) if _float32_products(input, target) else (torch.bfloat16,)
        if not isinstance(weight, torch.Tensor) or weight.dtype not in dtypes or weight.shape != (C,):
            names = " or ".join("bf16" if d == torch.bfloat16 else "float32" for d in dtypes)
            raise InvalidType(f"bfloat16 cross_entropy takes a {names} weight of "
                              f"shape ({C},), as torch does, got "
                              f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
        _refuse_weight_grad(weight)
        weight = weight.float().contiguous()  # bf16 values, held as floats (the C API's weight)
    logits, flat_target, loss_shape, empty = _rows(input, target, probs, reduction)  # (C): one row
    if empty is not None:
        return empty
    compute_grad = torch.is_grad_enabled() and input.requires_grad
    loss = _CrossEntropyBF16Function.apply(logits, flat_target, weight, reduction, ignore_index, label_smoothing,
                                           compute_grad, bf16_weight)
    return loss.reshape(loss_shape) if reduction == "none" else loss


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
    inplace_backward: bool = False,
) -> torch.Tensor:
    """F.cross_entropy with the same arguments, plus ``z_loss``, ``variant`` and ``inplace_backward``.

    input is (C), (N, C) or (N, C, d1, ...) float32 or bfloat16 on the CPU; target
    is class indices (int64, or uint8 for a (C) or (N, C) input as torch takes them; input's shape without C) or class
    probabilities (input's dtype and shape; float32 ones with bf16 input too, the loss then float32 as
    torch promotes it). bf16 with the default variant: its
    float32 arithmetic on the widened values in C, the loss and dlogits rounded
    once where stored; with ptref: torch's bf16 bits. ``z_loss`` adds z_loss * logsumexp(row)**2 to each
    non-ignored row's loss before the reduction. ``variant`` is "default" (fused,
    threaded) or "ptref" (ATen's order of operations). Gradients flow to input
    and to probability targets; asking for a gradient of weight raises
    NotImplementedError.

    ``inplace_backward=True`` (flash-attn's name): when input requires grad,
    the forward overwrites input — contiguous (N, C) logits — with dlogits and
    backward allocates nothing. The caller gives up the logits' values after
    the call, reduction "none", probability-target gradients and a second
    backward; an op that saved the logits for its backward raises there
    (autograd's version counter), never reads dlogits as logits.
    """
    # the scalars' types first: the settings key the upstream-gradient guess and the options' cache
    ignore_index, label_smoothing = as_int(ignore_index, "ignore_index"), as_float(label_smoothing, "label_smoothing")
    z_loss = as_float(z_loss, "z_loss")
    for name, value in (("reduction", reduction), ("variant", variant)):
        if not isinstance(value, str):
            raise InvalidType(f"{name} must be a string, got {type(value).__name__} {value!r}")
    if isinstance(input, torch.Tensor) and input.dtype == torch.bfloat16 and variant != "default":
        require_cpu(input, "input")
        return _cross_entropy_bf16(input, target, weight, ignore_index, reduction, label_smoothing, z_loss, variant,
                                   inplace_backward)
    settings = dict(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing, z_loss=z_loss,
                    variant=variant)
    if (weight is None and not inplace_backward and plain(input, 2) and _plain_target(target, input)
            and input.shape[0] and input.shape[1]):
        # the common case (the harness's 6800 calls per run; bf16 here is the default variant): the
        # kernel checks the targets' range and the options, the Function the rest
        compute_grad = torch.is_grad_enabled() and input.requires_grad
        return _CrossEntropyFunction.apply(input, target, None, settings, compute_grad)
    require_floating(input, "input")  # bf16 here is the default variant: its kernel on the widened values
    probs = _check_target(input, target, ignore_index)
    C = input.shape[0] if input.dim() == 1 else input.shape[1]
    if weight is not None:
        require_floating(weight, "weight", like=None if probs and _float32_products(input, target) else input)
        if weight.shape != (C,):
            raise InvalidArgument(f"weight must have shape ({C},) (one per class), got {tuple(weight.shape)}")
        weight = weight.contiguous()
        _refuse_weight_grad(weight)

    logits, flat_target, loss_shape, empty = _rows(input, target, probs, reduction)
    if empty is not None:
        return empty
    compute_grad = torch.is_grad_enabled() and input.requires_grad
    if inplace_backward:
        _check_inplace(input, target, reduction)
        if compute_grad:
            return _InplaceCrossEntropyFunction.apply(logits, flat_target, weight, settings)
    loss = _CrossEntropyFunction.apply(logits, flat_target, weight, settings, compute_grad)
    return loss.reshape(loss_shape) if reduction == "none" else loss
