"""ATen's own bfloat16 GEMM: what torch's bf16 matmul runs where it runs no oneDNN (a CPU without AVX-512's bf16
checks, as an AMD CPU with AVX2 only), and everywhere for products of at most 16^3 multiply-adds, [Note: ATen's
bf16 GEMM] (csrc/linear_bf16_aten.c).

ATen casts torch.mm(A, B) as the column-major C^T = B^T . A^T and picks its transposes by the operands' strides
(addmm_impl_cpu_); the pair of transposes picks the loop, and the loop is the order. ``form`` is that choice,
measured on every layout and on products of one row, one column and one term (scripts/aten_bf16_order.py)."""

from __future__ import annotations

import functools

import torch

from .._native import check, ffi, lib

DOT, PAIRS, CHAIN = lib.CKP_ATEN_BF16_DOT, lib.CKP_ATEN_BF16_PAIRS, lib.CKP_ATEN_BF16_CHAIN
_U16 = ffi.typeof("uint16_t *")


# ATen's mkldnn_gemm_min_size: torch.mm of bf16 goes to oneDNN only past this many multiply-adds (M·K·N), its own
# loops below (measured on an AMD Zen 5: every layout at 16^3 ATen's bits, at 16^3 + 1 and up oneDNN's)
ONEDNN_FLOOR = 16 * 16 * 16


def torch_runs_aten(multiply_adds: int | None = None) -> bool:
    """Whether torch's bf16 matmul is ATen's own loops here -- for every product, or for one of ``multiply_adds``
    (M·K·N): oneDNN takes a product past ONEDNN_FLOOR wherever torch finds the CPU's AVX-512 bf16 support
    (mkldnn_bf16_device_check) unless torch.backends.mkldnn is switched off, and no BLAS of torch's wheel has a
    bf16 GEMM."""
    if multiply_adds is not None and multiply_adds <= ONEDNN_FLOOR:
        return True
    return not (torch.backends.mkldnn.enabled and _onednn_bf16_device())


@functools.cache
def _onednn_bf16_device() -> bool:
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _lies_along(t: torch.Tensor, dim: int, other_extent: int) -> bool:
    """ATen's test that dim is t's unit stride with the other's stride a valid leading dimension."""
    return t.stride(dim) == 1 and t.stride(1 - dim) >= max(1, other_extent)


def form(a: torch.Tensor, b: torch.Tensor) -> int:
    """The loop ATen's bf16 GEMM runs torch.mm(a, b) with: its addmm's transposes for C^T = B^T . A^T -- B^T
    transposed (B column-major) alone takes the dot, A^T transposed alone the chain, both or neither the pairs.
    An operand neither way is copied contiguous first, as ATen copies it. (ATen casts a C of one column the other
    way round, C = A . B; its transposes then mirror these and pick the same loop: measured.)"""
    (M, K), N = a.shape, b.shape[1]
    trans_a = not _lies_along(b, 1, N) and _lies_along(b, 0, K)
    trans_b = not _lies_along(a, 1, K) and _lies_along(a, 0, M)
    if trans_a and not trans_b:
        return DOT
    if trans_b and not trans_a:
        return CHAIN
    return PAIRS


def product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, bias_after: bool = False, *,
            library=lib) -> torch.Tensor:
    """a (M, K) . b (K, N) (+ bias (N)), bf16 of any strides, in the loop ATen's bf16 GEMM takes for torch.mm(a, b)
    (torch.addmm(bias, a, b); with ``bias_after``, torch.mm(a, b).add_(bias)): (M, N) bf16."""
    (M, K), N = a.shape, b.shape[1]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    bias = None if bias is None else bias.contiguous()  # held until the call returns
    bias_ptr = ffi.NULL if bias is None else ffi.cast(_U16, bias.data_ptr())
    check(library.ckp_gemm_bf16_aten(ffi.cast(_U16, a.data_ptr()), *a.stride(), ffi.cast(_U16, b.data_ptr()),
                                     *b.stride(), M, K, N, bias_ptr, int(bias_after), form(a, b), ffi.cast(_U16, out.data_ptr())),
          "linear (bf16)", library)
    return out
