"""ckparity.clip_grad_norm_: torch.nn.utils.clip_grad_norm_ with the norm
reduced in C (csrc/clip_grad_norm.c). bfloat16 gradients (all of them) are
widened exactly for the reduction, and the total norm, the coefficient and
the scaling are then torch's bf16 tensor operations, as torch computes them
for bf16 gradients: the norm is more accurate than torch's, not its bits."""

from __future__ import annotations

import math

import torch

from .. import _bindings
from .._tensors import require_float32, require_floating
from ..errors import InvalidArgument, InvalidType, as_float


def grad_norm(tensors: list[torch.Tensor], norm_type: float = 2.0) -> float:
    """The norm_type-norm of all the tensors together, in double; NaN/inf propagate."""
    for k, t in enumerate(tensors):
        require_float32(t, f"gradient {k}")
    return _bindings.grad_norm([t.contiguous() for t in tensors], norm_type)


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> torch.Tensor:
    """Scales the gradients in place so that their total norm is at most
    max_norm, as torch.nn.utils.clip_grad_norm_ does (coefficient
    max_norm / (total_norm + 1e-6), clamped at 1). Returns the total norm as a
    tensor of the gradients' dtype (float32, or bfloat16: rounded from the
    double via float32). A NaN or inf gradient gives a NaN or inf norm (and a
    RuntimeError with error_if_nonfinite=True), never a finite one.

    norm_type 0 (the count of nonzeros) and -inf (the smallest magnitude) are
    exact in any order and are left to torch's own vector_norm; every p > 0
    and inf is reduced in C. ``foreach`` picks among torch's implementations:
    None/False are accepted, True is refused (ckparity has one: the C call)."""
    if foreach:
        raise InvalidArgument("ckparity.clip_grad_norm_ reduces the norm in C; foreach=True asks for torch's "
                              "foreach implementation (use torch.nn.utils.clip_grad_norm_ for that)")
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type, max_norm = as_float(norm_type, "norm_type"), as_float(max_norm, "max_norm")
    if math.isnan(norm_type) or (norm_type < 0 and norm_type != -math.inf):
        raise InvalidArgument(f"norm_type must be >= 0, inf or -inf, got {norm_type}")
    if not grads:
        return torch.tensor(0.0)
    for k, g in enumerate(grads):  # float16 and the rest refused by name, before anything is scaled
        require_floating(g, f"gradient {k}")
    dtypes = {g.dtype for g in grads}
    if dtypes == {torch.bfloat16}:  # the norm of the exact float values; torch's dtype for what follows
        widened, dtype = [g.float() for g in grads], torch.bfloat16
    elif len(dtypes) > 1 and torch.bfloat16 in dtypes:
        raise InvalidType(f"ckparity.clip_grad_norm_ takes float32 or bfloat16 gradients, one dtype for all; got "
                          f"{sorted(str(d) for d in dtypes)}")
    else:
        widened, dtype = grads, torch.float32
    if norm_type in (0.0, -math.inf):
        for k, g in enumerate(widened):
            require_float32(g, f"gradient {k}")
        total_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, norm_type) for g in widened]), norm_type).to(dtype)
    else:
        total_norm = torch.tensor(grad_norm(widened, norm_type), dtype=torch.float32).to(dtype)
    if error_if_nonfinite and not math.isfinite(float(total_norm)):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
            "anyway, set `error_if_nonfinite=False`")
    # torch's arithmetic for the coefficient, in the gradients' dtype, so the scaling matches it.
    clip_coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(clip_coef)
    return total_norm
