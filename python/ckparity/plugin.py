"""A C kernel as a ckparity backend in a few lines (docs/plugins.md, "A C
kernel in a few lines"). ``ckparity.kernels`` registers backends; this module
builds them.

Each helper takes the calls of your C functions, written as Python callables
that receive tensors -- contiguous, float32 (targets int64), outputs already
allocated -- and pass their pointers on (``pointer(t)`` for ctypes: it keeps
``t`` alive for the call, so ``pointer(x.contiguous())`` is safe;
``ffi.cast("float *", t.data_ptr())`` for cffi, where the tensor must be held
by a name). The helper returns the slot's backend: argument checks,
contiguity, output allocation, the autograd.Function and, for the optimizer,
a torch Optimizer keeping its state under torch's names. The forms
(docs/plugins.md has them with an example each):

- ``rms_norm(forward, backward, saves=False)``: forward(x, w, y, eps) with x, y (rows, D)
  and w (D); backward(dy, x, w, dx, dw, eps, *saved) writes dx (rows, D)
  and dw (D). A missing weight is passed as ones (and its gradient dropped).
- ``swiglu(forward, backward, saves=False)``: forward(x, out) with x (rows, 2H), the gate
  the first H columns, out (rows, H); backward(dout, x, dx, *saved).
- ``rope(forward, backward, saves=False)``: forward(x, cos, sin, out) with x, out
  (N, T, d) and cos, sin (T, d/2), rotate-half layout; backward(dout, cos,
  sin, dx, *saved).
- ``gelu(forward, backward, saves=False)``: GELU's tanh form; forward(x, y) with x, y flat (n,);
  backward(dy, x, dx, *saved). Another ``approximate`` is refused (the erf form is another kernel).
- ``layer_norm(forward, backward, saves=False)``: forward(x, w, b, y, eps) with x, y (rows, D) and
  w, b (D); backward(dy, x, w, dx, dw, db, eps, *saved). A missing weight is passed as ones, a
  missing bias as zeros (their gradients dropped); normalized dims past the last are flattened into D.
- ``attention(forward, backward, saves=False)``: forward(q, k, v, out, scale, is_causal) with q, out
  (B, Hq, Tq, d) and k, v (B, Hkv, Tk, d) (query head h reads kv head h / (Hq / Hkv)), the scale
  already resolved (1 / sqrt(d) by default); backward(dout, q, k, v, out, dq, dk, dv, scale, is_causal,
  *saved) -- with saves=True the forward returns what backward needs (its logsumexp, say). A mask
  and dropout are refused.
- ``cross_entropy(forward, label_smoothing=True)``: forward(logits, targets,
  dlogits, label_smoothing) -> the mean loss over the rows whose target is
  not -100 (a float), writing the gradient of that mean into dlogits (N, V);
  backward scales it by the upstream gradient. ``label_smoothing=False``
  for a kernel without it: forward(logits, targets, dlogits), a smoothing
  other than 0 refused, and the backend registers with the option
  ``unsupported`` (check says "not supported", a run that needs it is refused).
- ``adamw(c_step)``: c_step(param, grad, exp_avg, exp_avg_sq, step, lr,
  beta1, beta2, eps, weight_decay) updates one parameter tensor in place
  (torch's AdamW arithmetic is yours to match); returns the optimizer class.

``dtypes``: the dtypes your kernel takes, ``(torch.float32,)`` by default;
with ``(torch.float32, torch.bfloat16)`` a bf16 input reaches your calls as
bf16 tensors (their pointers are uint16 buffers: bf16 bit patterns), the
outputs allocated in bf16 too (the cross-entropy's returned float loss is
rounded to bf16; the optimizer's state takes the param's dtype). A dtype not
declared is refused with a TypeError (check --dtype: "not supported").

``*saved``: with ``saves=True`` (rms_norm, swiglu, rope), what forward
returns -- a tensor or a tuple of tensors you allocated (rms_norm's per-row
rstd, say) -- is kept for backward and passed after its other arguments, so
backward need not recompute it. Without it, forward's return is ignored (a
ctypes call returns an int).

A backend a helper builds is marked (``ckparity_helper``): ``ckparity
check`` does not run the properties the helper itself decides (strided
input, threads, bad shapes) on it, and says so; it is named after your
forward (``__qualname__``), so two of them are told apart in reports.
"""

from __future__ import annotations

import ctypes
import math
from typing import Callable

import torch

from .errors import InvalidArgument, InvalidType


class _Pointer(ctypes.c_void_p):
    """A c_void_p that holds its tensor: a temporary given to pointer() lives as long as the pointer does."""


def pointer(t: torch.Tensor) -> ctypes.c_void_p:
    """t's data for a ctypes call (declare the argument c_void_p or a pointer
    type); the pointer keeps ``t`` alive for as long as it is used. A
    non-contiguous tensor is refused: its data is not the rows C reads."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgument(f"pointer() takes a tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise InvalidArgument(f"pointer() of a non-contiguous tensor {tuple(t.shape)} (strides {t.stride()}): "
                              "C would read other elements; pass t.contiguous()")
    p = _Pointer(t.data_ptr())
    p.tensor = t
    return p


def _saved(result, form: str, saves: bool) -> tuple:
    """What a forward returned, as the tensors backward receives after its own arguments (with ``saves``)."""
    if not saves:
        return ()
    saved = (result,) if isinstance(result, torch.Tensor) else result
    if not isinstance(saved, tuple) or not all(isinstance(t, torch.Tensor) for t in saved):
        raise InvalidArgument(f"the {form} forward returned {type(result).__name__}; with saves=True it returns a "
                              "tensor or a tuple of tensors (kept for backward)")
    return saved


def _named(backend: Callable, forward: Callable, form: str, **marks) -> Callable:
    """The backend marked as helper-built and named after the user's forward."""
    name = getattr(forward, "__qualname__", None) or getattr(forward, "__name__", None) or form
    backend.__name__ = backend.__qualname__ = f"{form}({name})"
    backend.__module__ = getattr(forward, "__module__", None) or backend.__module__
    backend.ckparity_helper = form
    for key, value in marks.items():
        setattr(backend, key, value)
    return backend


FLOAT32 = (torch.float32,)


def _of_dtype(t: torch.Tensor, name: str, dtypes: tuple, like: torch.Tensor | None = None) -> torch.Tensor:
    """t, contiguous, if its dtype is one the kernel declares (and like's, if given)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in dtypes:  # a TypeError: check --dtype says "not supported"
        raise InvalidType(f"{name} must be a {' or '.join(str(d).removeprefix('torch.') for d in dtypes)} tensor "
                          f"(the dtypes this backend declares), got "
                          f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if like is not None and t.dtype != like.dtype:
        raise InvalidType(f"{name} is {t.dtype} and the input {like.dtype}: the kernel takes one dtype for both")
    return t.contiguous()


def _rows(x: torch.Tensor, last: int) -> torch.Tensor:
    """x as (rows, last), contiguous."""
    return x.contiguous().view(-1, last)


def rms_norm(forward: Callable, backward: Callable, saves: bool = False, dtypes: tuple = FLOAT32) -> Callable:
    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps):
            D = x.shape[-1]
            x2, y = _rows(x, D), torch.empty(x.shape, dtype=x.dtype).view(-1, D)
            ctx.save_for_backward(x2, weight, *_saved(forward(x2, weight, y, eps), "rms_norm", saves))
            ctx.eps, ctx.shape = eps, x.shape
            return y.view(x.shape)

        @staticmethod
        def backward(ctx, dy):
            x2, weight, *saved = ctx.saved_tensors
            dx, dw = torch.empty_like(x2), torch.empty_like(weight)
            backward(_rows(dy, x2.shape[1]), x2, weight, dx, dw, ctx.eps, *saved)
            return dx.view(ctx.shape), dw, None

    def rms_norm_backend(x, normalized_shape, weight=None, eps=None):
        x = _of_dtype(x, "x", dtypes)
        D = x.shape[-1]
        if tuple(normalized_shape) != (D,):
            raise InvalidArgument(f"normalized_shape must be ({D},), the last dim, got {tuple(normalized_shape)}")
        eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
        if weight is None:
            return RMSNorm.apply(x, torch.ones(D, dtype=x.dtype), eps)
        if not isinstance(weight, torch.Tensor) or weight.shape != (D,):
            raise InvalidArgument(f"weight must be ({D},), got "
                                  f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
        return RMSNorm.apply(x, _of_dtype(weight, "weight", dtypes, like=x), eps)
    return _named(rms_norm_backend, forward, "rms_norm")


def swiglu(forward: Callable, backward: Callable, saves: bool = False, dtypes: tuple = FLOAT32) -> Callable:
    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x2 = _rows(x, x.shape[-1])
            out = torch.empty(x2.shape[0], x2.shape[1] // 2, dtype=x.dtype)
            ctx.save_for_backward(x2, *_saved(forward(x2, out), "swiglu", saves))
            ctx.shape = x.shape
            return out.view(*x.shape[:-1], x.shape[-1] // 2)

        @staticmethod
        def backward(ctx, dout):
            x2, *saved = ctx.saved_tensors
            dx = torch.empty_like(x2)
            backward(_rows(dout, x2.shape[1] // 2), x2, dx, *saved)
            return dx.view(ctx.shape)

    def swiglu_backend(x):
        x = _of_dtype(x, "x", dtypes)
        if x.dim() == 0 or x.shape[-1] % 2:
            raise InvalidArgument(f"swiglu needs an even last dim (gate and up halves), got {tuple(x.shape)}")
        return SwiGLU.apply(x)
    return _named(swiglu_backend, forward, "swiglu")


def rope(forward: Callable, backward: Callable, saves: bool = False, dtypes: tuple = FLOAT32) -> Callable:
    class Rope(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin):
            T, d = x.shape[-2], x.shape[-1]
            x3, out = x.contiguous().view(-1, T, d), torch.empty(x.shape, dtype=x.dtype).view(-1, T, d)
            ctx.save_for_backward(cos, sin, *_saved(forward(x3, cos, sin, out), "rope", saves))
            ctx.shape = x.shape
            return out.view(x.shape)

        @staticmethod
        def backward(ctx, dout):
            cos, sin, *saved = ctx.saved_tensors
            T, d = ctx.shape[-2], ctx.shape[-1]
            d3 = dout.contiguous().view(-1, T, d)
            dx = torch.empty_like(d3)
            backward(d3, cos, sin, dx, *saved)
            return dx.view(ctx.shape), None, None

    def rope_backend(x, cos, sin):
        x = _of_dtype(x, "x", dtypes)
        cos, sin = _of_dtype(cos, "cos", dtypes, like=x), _of_dtype(sin, "sin", dtypes, like=x)
        if x.dim() < 2 or x.shape[-1] % 2 or cos.shape != (x.shape[-2], x.shape[-1] // 2) or sin.shape != cos.shape:
            raise InvalidArgument(f"rope needs x (..., T, d), d even, and cos, sin (T, d/2); got x "
                                  f"{tuple(x.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
        return Rope.apply(x, cos, sin)
    return _named(rope_backend, forward, "rope")


def gelu(forward: Callable, backward: Callable, saves: bool = False, dtypes: tuple = FLOAT32) -> Callable:
    class Gelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x1 = x.contiguous().view(-1)
            y = torch.empty_like(x1)
            ctx.save_for_backward(x1, *_saved(forward(x1, y), "gelu", saves))
            ctx.shape = x.shape
            return y.view(x.shape)

        @staticmethod
        def backward(ctx, dy):
            x1, *saved = ctx.saved_tensors
            dx = torch.empty_like(x1)
            backward(dy.contiguous().view(-1), x1, dx, *saved)
            return dx.view(ctx.shape)

    def gelu_backend(x, approximate="tanh"):
        if approximate != "tanh":  # the slot's form: a kernel of the erf form is another kernel
            raise InvalidArgument(f"this gelu computes the tanh form (approximate='tanh'), got {approximate!r}")
        return Gelu.apply(_of_dtype(x, "x", dtypes))
    # the erf form (check's "erf" option, --gelu erf) is declared unsupported: check skips it, a run refuses it
    return _named(gelu_backend, forward, "gelu", ckparity_unsupported=("erf",))


def layer_norm(forward: Callable, backward: Callable, saves: bool = False, dtypes: tuple = FLOAT32) -> Callable:
    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, eps, affine):
            D = weight.shape[0]
            x2, y = _rows(x, D), torch.empty(x.shape, dtype=x.dtype).view(-1, D)
            ctx.save_for_backward(x2, weight, *_saved(forward(x2, weight, bias, y, eps), "layer_norm", saves))
            ctx.eps, ctx.shape, ctx.affine = eps, x.shape, affine
            return y.view(x.shape)

        @staticmethod
        def backward(ctx, dy):
            x2, weight, *saved = ctx.saved_tensors
            dx, dw, db = torch.empty_like(x2), torch.empty_like(weight), torch.empty_like(weight)
            backward(_rows(dy, x2.shape[1]), x2, weight, dx, dw, db, ctx.eps, *saved)
            has_w, has_b = ctx.affine
            return dx.view(ctx.shape), dw if has_w else None, db if has_b else None, None, None

    def layer_norm_backend(x, normalized_shape, weight=None, bias=None, eps=1e-5):
        x = _of_dtype(x, "x", dtypes)
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape or tuple(x.shape[x.dim() - len(shape):]) != shape:
            raise InvalidArgument(f"normalized_shape must be x's trailing dims, got {shape} for x {tuple(x.shape)}")
        D = math.prod(shape)  # the rows your C sees are (rows, D): the normalized dims flattened
        params = []
        for name, t, fill in (("weight", weight, 1.0), ("bias", bias, 0.0)):
            if t is None:
                params.append(torch.full((D,), fill, dtype=x.dtype))
            elif not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
                raise InvalidArgument(f"{name} must be {shape}, got "
                                      f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
            else:
                params.append(_of_dtype(t, name, dtypes, like=x).reshape(D))
        return LayerNorm.apply(x, *params, float(eps), (weight is not None, bias is not None))
    return _named(layer_norm_backend, forward, "layer_norm")


def attention(forward: Callable, backward: Callable, saves: bool = False, dtypes: tuple = FLOAT32) -> Callable:
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, scale, is_causal):
            out = torch.empty(q.shape, dtype=q.dtype)
            ctx.save_for_backward(q, k, v, out, *_saved(forward(q, k, v, out, scale, is_causal), "attention", saves))
            ctx.scale, ctx.is_causal = scale, is_causal
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, *saved = ctx.saved_tensors
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            backward(dout.contiguous(), q, k, v, out, dq, dk, dv, ctx.scale, ctx.is_causal, *saved)
            return dq, dk, dv, None, None

    def attention_backend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p:
            raise InvalidArgument("this attention takes no attn_mask and no dropout (the slot's contract)")
        q, k, v = _of_dtype(q, "q", dtypes), _of_dtype(k, "k", dtypes, like=q), _of_dtype(v, "v", dtypes, like=q)
        if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
            raise InvalidArgument(f"q (B, Hq, Tq, d), k and v (B, Hkv, Tk, d) expected, got {tuple(q.shape)}, "
                                  f"{tuple(k.shape)}, {tuple(v.shape)}")
        if q.shape[1] != k.shape[1] and not (enable_gqa and q.shape[1] % k.shape[1] == 0):
            raise InvalidArgument(f"{q.shape[1]} query heads for {k.shape[1]} kv heads needs enable_gqa=True and a "
                                  "multiple")
        scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
        return Attention.apply(q, k, v, scale, bool(is_causal))
    return _named(attention_backend, forward, "attention")


def cross_entropy(forward: Callable, label_smoothing: bool = True, dtypes: tuple = FLOAT32) -> Callable:
    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets, smoothing):
            dlogits = torch.empty_like(logits)
            loss = float(forward(logits, targets, dlogits, smoothing) if label_smoothing
                         else forward(logits, targets, dlogits))
            ctx.save_for_backward(dlogits)
            return torch.tensor(loss, dtype=logits.dtype)

        @staticmethod
        def backward(ctx, grad):
            (dlogits,) = ctx.saved_tensors
            return dlogits * grad, None, None

    def cross_entropy_backend(logits, targets, label_smoothing=0.0):
        logits = _of_dtype(logits, "logits", dtypes)
        if logits.dim() != 2 or targets.shape != logits.shape[:1] or targets.dtype != torch.int64:
            raise InvalidArgument(f"cross_entropy needs logits (N, V) and targets (N) int64; got "
                                  f"{tuple(logits.shape)} and {tuple(targets.shape)} {targets.dtype}")
        if label_smoothing and not label_smoothing_supported:
            raise InvalidArgument(f"this cross_entropy backend takes no label smoothing, got {label_smoothing}")
        return CrossEntropy.apply(logits, targets.contiguous(), float(label_smoothing))
    label_smoothing_supported = label_smoothing
    return _named(cross_entropy_backend, forward, "cross_entropy",
                  ckparity_unsupported=() if label_smoothing else ("label_smoothing",))


def adamw(c_step: Callable, dtypes: tuple = FLOAT32) -> Callable:
    class AdamW(torch.optim.Optimizer):
        """Your C step per parameter tensor; the state under torch's names."""

        def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
            super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure=None):
            loss = closure() if closure is not None else None
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if p.dtype not in dtypes or p.grad.dtype != p.dtype:  # a TypeError: check --dtype says so
                        raise InvalidType(f"the C AdamW step takes params of {dtypes} with grads of their dtype, "
                                          f"got {p.dtype} with {p.grad.dtype} grads")
                    if not (p.is_contiguous() and p.grad.is_contiguous()):
                        raise InvalidArgument("the C AdamW step needs contiguous params and grads")
                    state = self.state[p]
                    if not state:
                        state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p),
                                     exp_avg_sq=torch.zeros_like(p))
                    state["step"] += 1
                    beta1, beta2 = group["betas"]
                    c_step(p, p.grad, state["exp_avg"], state["exp_avg_sq"], int(state["step"]), group["lr"],
                           beta1, beta2, group["eps"], group["weight_decay"])
            return loss
    return _named(AdamW, c_step, "adamw")
