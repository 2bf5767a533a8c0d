"""ckparity.gelu: F.gelu(x, approximate="none" | "tanh") on the C kernels (csrc/gelu_erf.c, csrc/gelu.c).

Its bindings live here beside the op (as residual's do). The tanh form's bits follow torch's at the thread
count torch runs on (torch.get_num_threads()): past a grain torch splits the tensor between its threads and
computes each piece's last elements with libm's tanhf, the rest with SLEEF's; the C kernel takes that count
and splits as torch does, whatever threads it runs on itself. The erf form's follow the code torch hands it
to: oneDNN's JIT gelu_erf, whose formula is chosen by oneDNN's ISA (cpu.onednn_isa), or ATen's scalar code
for a tensor of one element (erf_form)."""

from __future__ import annotations

import torch

from .. import cpu
from .._bindings import pointer
from .._native import check, lib
from .._tensors import empty_like, require_cpu
from ..errors import InvalidArgument, InvalidType
from ._function import CFunction, first_order_only

_SUFFIX = {torch.float32: "", torch.bfloat16: "_bf16"}


def gelu_forward(x, y, *, library=lib) -> None:
    """y = gelu_tanh(x) over two contiguous tensors of one size and dtype (float32 or bfloat16)."""
    entry = getattr(library, "ckp_gelu_forward" + _SUFFIX[x.dtype])
    check(entry(pointer(x), x.numel(), torch.get_num_threads(), pointer(y)), "gelu", library)


def gelu_backward(dy, x, dx, *, library=lib) -> None:
    """dx = dy * gelu_tanh'(x) over three contiguous tensors of one size and dtype (float32 or bfloat16)."""
    entry = getattr(library, "ckp_gelu_backward" + _SUFFIX[x.dtype])
    check(entry(pointer(dy), pointer(x), x.numel(), torch.get_num_threads(), pointer(dx)), "gelu backward", library)


def torch_runs_onednn(dtype: torch.dtype) -> bool:
    """Whether torch hands F.gelu(x)'s erf form of a contiguous ``dtype`` tensor of 2+ elements to oneDNN
    (ATen's use_mkldnn: oneDNN enabled, float32, or bfloat16 where oneDNN runs an avx512 ISA)."""
    return torch.backends.mkldnn.enabled and cpu.onednn_isa() != "none" and (
        dtype == torch.float32 or cpu.onednn_isa().startswith("AVX512"))


def erf_form(x: torch.Tensor) -> int:
    """The code torch's F.gelu(x) runs for a contiguous x ([Note: torch's erf GELU is oneDNN's]): oneDNN's
    gelu_erf at this process's oneDNN ISA (its minimax erf at an avx512 one, Abramowitz and Stegun's below),
    or ATen's own (its vectorized erf at torch's capability, split as torch splits it at its thread count) --
    for one element, and wherever torch_runs_onednn is false."""
    if x.numel() == 1 or not torch_runs_onednn(x.dtype):
        return lib.CKP_GELU_ERF_ATEN
    isa = cpu.onednn_isa()
    if not isa.startswith("AVX512"):
        return lib.CKP_GELU_ERF_ABRAMOWITZ_STEGUN
    # oneDNN stores bf16 with vcvtneps2bf16 where the CPU has it, which flushes denormals to zero
    flush = x.dtype == torch.bfloat16 and isa == "AVX512_CORE_BF16"
    return lib.CKP_GELU_ERF_MINIMAX | (lib.CKP_GELU_ERF_BF16_FLUSH if flush else 0)


def gelu_erf_forward(x, y, *, library=lib) -> None:
    """y = gelu_erf(x) over two contiguous tensors of one size and dtype (float32 or bfloat16)."""
    entry = getattr(library, "ckp_gelu_erf_forward" + _SUFFIX[x.dtype])
    check(entry(pointer(x), x.numel(), erf_form(x), torch.get_num_threads(), pointer(y)), "gelu", library)


def gelu_erf_backward(dy, x, dx, *, library=lib) -> None:
    """dx = dy * gelu_erf'(x) over three contiguous tensors of one size and dtype (float32 or bfloat16)."""
    entry = getattr(library, "ckp_gelu_erf_backward" + _SUFFIX[x.dtype])
    check(entry(pointer(dy), pointer(x), x.numel(), erf_form(x), torch.get_num_threads(), pointer(dx)), "gelu backward",
          library)


_KERNELS = {"tanh": (gelu_forward, gelu_backward), "none": (gelu_erf_forward, gelu_erf_backward)}


class _GeluFunction(CFunction):
    """First-order only: see ops/_function.py."""

    @staticmethod
    def compute(x, approximate):
        y = empty_like(x)
        if x.numel():
            _KERNELS[approximate][0](x, y)
        return y

    @staticmethod
    def save(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.approximate = inputs[1]

    @staticmethod
    @first_order_only
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dx = empty_like(x)
        if x.numel():
            _KERNELS[ctx.approximate][1](dy.contiguous().to(x.dtype), x, dx)
        return dx, None


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """F.gelu(x, approximate) of a float32 or bfloat16 tensor of any shape, forward and backward. The tanh form
    bit-identical to torch at every CPU capability and at torch's thread count (bfloat16: torch's float formula
    rounded once); the erf form (the default) to the code torch runs for a contiguous x (erf_form) -- a strided
    x is computed as its contiguous copy, where torch runs ATen's own erf (not followed)."""
    if approximate not in _KERNELS:
        raise InvalidArgument(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    require_cpu(x, "x")
    if x.dtype not in _SUFFIX:
        raise InvalidType(f"gelu takes a float32 or bfloat16 tensor, got {x.dtype}")
    return _GeluFunction.apply(x.contiguous(), approximate)
