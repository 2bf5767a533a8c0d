"""One thin binding per C entry point: tensors in, pointers and sizes out to
the C call, its status turned into an exception. No checks of shapes or
dtypes beyond what the call needs (the ops do those), no allocation, no
autograd: the ops, ``ckparity bench`` and the clone tests all call the C
library through these, so a change to a C signature is made in one place.

The layering follows Liger-Kernel's kernel -> driver -> autograd Function:
csrc/*.c is the kernel, this module the driver, ``ckparity.ops`` the Functions.

Every binding takes ``library``: another build of the same C API (the
baseline-only build in tests/test_clones.py); the loaded one by default.
"""

from __future__ import annotations

import functools
import threading

import torch

from ._native import check, ffi, lib
from .errors import InvalidArgument, as_float, as_int

# resolved once: a cast with a ctype object skips parsing the type's name on every call
_C_TYPES = {torch.float32: ffi.typeof("float *"), torch.int64: ffi.typeof("int64_t *"),
            torch.float64: ffi.typeof("double *"), torch.bfloat16: ffi.typeof("uint16_t *"),
            torch.float16: ffi.typeof("uint16_t *")}

CE_VARIANTS = {"default": lib.CKP_CE_DEFAULT, "ptref": lib.CKP_CE_PTREF}
# the suffix of a C entry point for its tensors' dtype (bf16 and float16 as uint16)
_FORMATS = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_f16"}
REDUCTIONS = {"none": lib.CKP_REDUCTION_NONE, "mean": lib.CKP_REDUCTION_MEAN, "sum": lib.CKP_REDUCTION_SUM}


def pointer(tensor: torch.Tensor | None):
    """A cffi pointer to a contiguous CPU tensor's data (NULL for None)."""
    if tensor is None:
        return ffi.NULL
    assert tensor.is_contiguous(), "internal: pointer() needs a contiguous tensor"
    return ffi.cast(_C_TYPES[tensor.dtype], tensor.data_ptr())


# ---- cross_entropy ----------------------------------------------------------

def cross_entropy_options(weight=None, ignore_index: int = -100, reduction: str = "mean",
                          label_smoothing: float = 0.0, z_loss: float = 0.0, variant: str = "default",
                          row_grad=None, torch_threads: int = 1):
    """A ckp_cross_entropy_options struct; without pointers it is made once
    per setting (the C side only reads it, and building a cffi struct costs
    more than a small kernel call). ``torch_threads``: ptref's full sums split
    as torch's are on that many threads (torch.get_num_threads()).
    ``row_grad``: a float32 tensor, or for mean and sum without a weight the
    upstream gradient as a number (a float32 or bf16 value), written into a
    struct made once per setting and thread (a loss scaled by 1/K passes one
    every backward)."""
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise InvalidArgument(f"reduction must be one of {sorted(REDUCTIONS)}, got {reduction!r}")
    if not isinstance(variant, str) or variant not in CE_VARIANTS:
        raise InvalidArgument(f"variant must be one of {sorted(CE_VARIANTS)}, got {variant!r}")
    settings = (as_int(ignore_index, "ignore_index"), reduction, as_float(label_smoothing, "label_smoothing"),
                as_float(z_loss, "z_loss"), variant, int(torch_threads))
    if isinstance(row_grad, float):
        if weight is not None or reduction == "none":
            raise ValueError("internal: an upstream gradient as a number is for mean and sum without a weight")
        return _upstream_options(settings, row_grad)
    if weight is None and row_grad is None:
        return _plain_cross_entropy_options(*settings)
    return _new_cross_entropy_options(weight, *settings[:5], row_grad, settings[5])


_per_thread = threading.local()


def _upstream_options(settings: tuple, upstream: float):
    """The options of ``settings`` whose row_grad points at a float the entry owns, set to ``upstream``:
    one per setting and thread (another thread's backward may write its own at the same time)."""
    cache = _per_thread.__dict__.setdefault("upstream_options", {})
    entry = cache.get(settings)
    if entry is None:
        if len(cache) >= 64:  # settings are few in a run; a sweep of them must not grow this without end
            cache.clear()
        value = ffi.new("float[1]")
        options = _new_cross_entropy_options(None, *settings[:5], None, settings[5])
        options.row_grad = value
        entry = cache[settings] = (options, value)  # the tuple keeps the float alive
    entry[1][0] = upstream
    return entry[0]


@functools.lru_cache(maxsize=64)
def _plain_cross_entropy_options(ignore_index, reduction, label_smoothing, z_loss, variant, torch_threads):
    return _new_cross_entropy_options(None, ignore_index, reduction, label_smoothing, z_loss, variant, None,
                                      torch_threads)


def _new_cross_entropy_options(weight, ignore_index, reduction, label_smoothing, z_loss, variant, row_grad,
                               torch_threads):
    opt = ffi.new("ckp_cross_entropy_options *")
    opt.weight = pointer(weight)
    opt.ignore_index = ignore_index
    opt.reduction = REDUCTIONS[reduction]
    opt.label_smoothing = label_smoothing
    opt.z_loss = z_loss
    opt.variant = CE_VARIANTS[variant]
    opt.row_grad = pointer(row_grad)
    opt.torch_threads = torch_threads
    return opt


def cross_entropy(logits, target, options, loss, dlogits=None, *, library=lib) -> None:
    """logits (N, V); target (N) int64 class indices or (N, V) float32
    probabilities; loss (N) or (); dlogits (N, V), logits itself, or None."""
    N, V = logits.shape
    probs = target.is_floating_point()
    check(library.ckp_cross_entropy(pointer(logits), ffi.NULL if probs else pointer(target),
                                    pointer(target) if probs else ffi.NULL, N, V, options, pointer(loss),
                                    pointer(dlogits)), "cross_entropy", library)


def _cross_entropy_bf16_f32p(logits, target, options, loss, dlogits, library) -> None:
    """bf16 logits with float32 probabilities, either variant (options.variant); loss float32."""
    N, V = logits.shape
    check(library.ckp_cross_entropy_probs_bf16_f32p(pointer(logits), pointer(target), N, V, options, pointer(loss),
                                                    pointer(dlogits)), "cross_entropy", library)


def cross_entropy_bf16(logits, target, options, loss, dlogits=None, *, library=lib) -> None:
    """As cross_entropy on bfloat16 logits and dlogits: the ptref variant, class targets (int64) or
    probabilities (bf16 or float32, logits' shape); the loss bf16, float32 with float32 probabilities
    (torch's promotion); options without z_loss, weight and row_grad holding their values as floats."""
    if target.dtype == torch.float32:
        return _cross_entropy_bf16_f32p(logits, target, options, loss, dlogits, library)
    N, V = logits.shape
    entry = library.ckp_cross_entropy_probs_bf16 if target.is_floating_point() else library.ckp_cross_entropy_bf16
    check(entry(pointer(logits), pointer(target), N, V, options, pointer(loss), pointer(dlogits)), "cross_entropy",
          library)


def cross_entropy_default_bf16(logits, target, options, loss, dlogits=None, *, library=lib) -> None:
    """The default variant on bfloat16 logits: target (N) int64 or (N, V) bf16 or float32 probabilities;
    loss float32 (N) or (); dlogits bf16 (N, V), logits itself, or None; options' weight and row_grad float32."""
    if target.dtype == torch.float32:
        return _cross_entropy_bf16_f32p(logits, target, options, loss, dlogits, library)
    N, V = logits.shape
    probs = target.is_floating_point()
    check(library.ckp_cross_entropy_default_bf16(pointer(logits), ffi.NULL if probs else pointer(target),
                                                 pointer(target) if probs else ffi.NULL, N, V, options, pointer(loss),
                                                 pointer(dlogits)), "cross_entropy", library)


# ---- rms_norm ---------------------------------------------------------------

def rms_norm_forward(x, weight, eps: float, y, rstd, *, torch_threads: int = 1, library=lib) -> None:
    """x, y (N, D); weight (D) or None; rstd (N). ``torch_threads``: a sum torch
    reduces to one value (one row, N = 1) is split as on that many threads."""
    N, D = x.shape
    check(library.ckp_rms_norm_forward(pointer(x), pointer(weight), N, D, eps, pointer(y), pointer(rstd),
                                       torch_threads), "rms_norm", library)


def rms_norm_backward(dy, x, weight, rstd, dx, dweight, *, torch_threads: int = 1, library=lib) -> None:
    """dy, x, dx (N, D); weight, dweight (D) or None; rstd (N) from the forward."""
    N, D = x.shape
    check(library.ckp_rms_norm_backward(pointer(dy), pointer(x), pointer(weight), pointer(rstd), N, D,
                                        pointer(dx), pointer(dweight), torch_threads), "rms_norm backward", library)


def rms_norm_backward_terms(dy, x, weight, rstd, dx_normalized, dx_rstd, dweight, *, torch_threads: int = 1,
                            library=lib) -> None:
    """As rms_norm_backward, with dx as its two unadded terms."""
    N, D = x.shape
    check(library.ckp_rms_norm_backward_terms(pointer(dy), pointer(x), pointer(weight), pointer(rstd), N, D,
                                              pointer(dx_normalized), pointer(dx_rstd), pointer(dweight),
                                              torch_threads), "rms_norm backward", library)


def _entry_16(library, name: str, x, weight):
    """name's C entry point for 16-bit x (bf16 or float16) and a weight of x's dtype or float32 (_f32w)."""
    return getattr(library, name + _FORMATS[x.dtype] +
                   ("_f32w" if weight is not None and weight.dtype == torch.float32 else ""))


def rms_norm_forward_16(x, weight, eps: float, y, rstd, *, torch_threads: int = 1, library=lib) -> None:
    """As rms_norm_forward on bfloat16 or float16 x and y (rstd float32), the weight x's dtype or float32."""
    N, D = x.shape
    check(_entry_16(library, "ckp_rms_norm_forward", x, weight)(pointer(x), pointer(weight), N, D, eps, pointer(y),
                                                                pointer(rstd), torch_threads), "rms_norm", library)


def rms_norm_backward_16(dy, x, weight, rstd, dx, dweight, *, torch_threads: int = 1, library=lib) -> None:
    """As rms_norm_backward on bfloat16 or float16 dy, x, dx (rstd float32); weight and dweight x's dtype or
    float32."""
    N, D = x.shape
    check(_entry_16(library, "ckp_rms_norm_backward", x, weight)(pointer(dy), pointer(x), pointer(weight),
                                                                 pointer(rstd), N, D, pointer(dx), pointer(dweight),
                                                                 torch_threads), "rms_norm backward", library)


# ---- swiglu -----------------------------------------------------------------

def swiglu_forward(x, out, *, library=lib) -> None:
    """x (..., 2H), out (..., H), contiguous: float32, bfloat16 or float16 alike."""
    H = out.shape[-1]
    N = out.numel() // H
    check(getattr(library, "ckp_swiglu_forward" + _FORMATS[x.dtype])(pointer(x), N, H, pointer(out)), "swiglu",
          library)


def swiglu_backward(dout, x, dx, *, library=lib) -> None:
    """dout (..., H); x, dx (..., 2H), contiguous: float32, bfloat16 or float16 alike."""
    H = dout.shape[-1]
    N = dout.numel() // H
    check(getattr(library, "ckp_swiglu_backward" + _FORMATS[x.dtype])(pointer(dout), pointer(x), N, H, pointer(dx)),
          "swiglu backward", library)


# ---- vocab-parallel cross_entropy ------------------------------------------

def vocab_parallel_ce_max(logits, row_max, *, library=lib) -> None:
    """logits (N, V_local); row_max (N)."""
    N, V_local = logits.shape
    check(library.ckp_vocab_parallel_ce_max(pointer(logits), N, V_local, pointer(row_max)),
          "vocab_parallel_cross_entropy", library)


def vocab_parallel_ce_sums(logits, target, vocab_start: int, V: int, ignore_index: int, global_max, sums, *,
                           library=lib) -> None:
    """sums (N, 3) float64: sum of exp(x - max), the owned target logit, sum of x."""
    N, V_local = logits.shape
    check(library.ckp_vocab_parallel_ce_sums(pointer(logits), pointer(target), N, V_local, vocab_start, V,
                                             ignore_index, pointer(global_max), pointer(sums)),
          "vocab_parallel_cross_entropy", library)


def vocab_parallel_ce_loss(target, V: int, ignore_index: int, label_smoothing: float, z_loss: float, global_max,
                           global_sums, loss_rows, *, library=lib) -> None:
    check(library.ckp_vocab_parallel_ce_loss(pointer(target), target.shape[0], V, ignore_index,
                                             float(label_smoothing), float(z_loss), pointer(global_max),
                                             pointer(global_sums), pointer(loss_rows)),
          "vocab_parallel_cross_entropy", library)


def vocab_parallel_ce_backward(logits, target, vocab_start: int, V: int, ignore_index: int, label_smoothing: float,
                               z_loss: float, global_max, global_sums, row_grad, dlogits, *, library=lib) -> None:
    N, V_local = logits.shape
    check(library.ckp_vocab_parallel_ce_backward(pointer(logits), pointer(target), N, V_local, vocab_start, V,
                                                 ignore_index, float(label_smoothing), float(z_loss),
                                                 pointer(global_max), pointer(global_sums), pointer(row_grad),
                                                 pointer(dlogits)), "vocab_parallel_cross_entropy backward", library)


# ---- rope -------------------------------------------------------------------

ROPE_LAYOUTS = {"half": lib.CKP_ROPE_HALF, "interleaved": lib.CKP_ROPE_INTERLEAVED}


def rope_forward(x, cos, sin, layout: str, out, *, library=lib) -> None:
    """x, out (..., T, d), contiguous; cos, sin (T, d/2): float32, bfloat16 or float16 alike."""
    T, d = x.shape[-2:]
    N = x.numel() // (T * d)
    check(getattr(library, "ckp_rope_forward" + _FORMATS[x.dtype])(pointer(x), pointer(cos), pointer(sin), N, T, d,
                                                                  ROPE_LAYOUTS[layout], pointer(out)), "rope", library)


def rope_backward(dout, cos, sin, layout: str, dx, *, library=lib) -> None:
    """dout, dx (..., T, d), contiguous; cos, sin (T, d/2): float32, bfloat16 or float16 alike."""
    T, d = dout.shape[-2:]
    N = dout.numel() // (T * d)
    check(getattr(library, "ckp_rope_backward" + _FORMATS[dout.dtype])(pointer(dout), pointer(cos), pointer(sin), N,
                                                                      T, d, ROPE_LAYOUTS[layout], pointer(dx)),
          "rope backward", library)


# ---- adamw ------------------------------------------------------------------

def adamw_options(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
                  amsgrad: bool = False, maximize: bool = False, fused: bool = False):
    """fused: torch's fused=True kernel instead of its single-tensor path."""
    opt = ffi.new("ckp_adamw_options *")
    opt.lr, opt.beta1, opt.beta2, opt.eps = float(lr), float(beta1), float(beta2), float(eps)
    opt.weight_decay, opt.amsgrad, opt.maximize = float(weight_decay), bool(amsgrad), bool(maximize)
    opt.fused = bool(fused)
    return opt


def adamw_step(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step: float, options, *, library=lib) -> None:
    """One AdamW step in place on param and the moments, all (n); max_exp_avg_sq
    is None without amsgrad; ``step`` counts this step (1 on the first)."""
    check(library.ckp_adamw_step(pointer(param), pointer(grad), pointer(exp_avg), pointer(exp_avg_sq),
                                 pointer(max_exp_avg_sq), param.numel(), step, options), "adamw", library)


def adamw_step_bf16(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, step: float, options, *, library=lib) -> None:
    """As adamw_step on a bfloat16 param, grad and moments."""
    check(library.ckp_adamw_step_bf16(pointer(param), pointer(grad), pointer(exp_avg), pointer(exp_avg_sq),
                                      pointer(max_exp_avg_sq), param.numel(), step, options), "adamw", library)


# ---- compare ----------------------------------------------------------------

def compare(a, b, *, library=lib) -> tuple[float, float, int]:
    """(max |a - b|, max |b|, elements that differ) of two contiguous float32 tensors of one size."""
    out = ffi.new("double[2]")
    differing = ffi.new("int64_t *")
    check(library.ckp_compare(pointer(a), pointer(b), a.numel(), out, out + 1, differing), "compare", library)
    return out[0], out[1], differing[0]


# ---- grad_norm --------------------------------------------------------------

def grad_norm(tensors: list[torch.Tensor], norm_type: float, *, library=lib) -> float:
    """The norm_type-norm of all the (contiguous float32) tensors together, in double."""
    pointers = ffi.new("const float *[]", [pointer(t) for t in tensors])
    sizes = ffi.new("int64_t[]", [t.numel() for t in tensors])
    total = ffi.new("double *")
    check(library.ckp_grad_norm(pointers, sizes, len(tensors), float(norm_type), total), "grad_norm", library)
    return total[0]
