"""ckparity.attention: F.scaled_dot_product_attention without mask or dropout, on the C kernel
(csrc/attention.c), which computes what ATen's CPU flash kernel computes: its blocks, its exps, its online
softmax and its saved logsumexp, its GEMMs in MKL's one-thread order (kernels/attention.py says where that
is torch's bits). Its bindings live beside the op (as ops/residual.py's)."""

from __future__ import annotations

import math

import torch

from .._native import check, ffi, lib
from .._tensors import empty, require_floating
from .. import cpu
from ..errors import InvalidArgument
from . import _aten_bf16, _onednn
from ._function import CFunction, first_order_only

_FLOAT, _U16 = ffi.typeof("float *"), ffi.typeof("uint16_t *")


def _at(t: torch.Tensor):
    """A pointer to t's first element: float32, or a bf16 tensor's bits."""
    return ffi.cast(_U16 if t.dtype == torch.bfloat16 else _FLOAT, t.data_ptr())


def _strides(t: torch.Tensor):
    """(batch, head, position) strides of a 4-D tensor whose last dim is contiguous."""
    return ffi.new("int64_t[3]", [t.stride(0), t.stride(1), t.stride(2)])


def attention_forward(q, k, v, scale: float, is_causal: bool, out, lse, *, library=lib) -> None:
    """out (B, Hq, Tq, d) and lse (B, Hq, Tq), contiguous, from q (B, Hq, Tq, d), k and v (B, Hkv, Tk, d) read
    by their strides (the last dim contiguous)."""
    (B, Hq, Tq, d), (Hkv, Tk) = q.shape, k.shape[1:3]
    entry = library.ckp_attention_forward_bf16 if q.dtype == torch.bfloat16 else library.ckp_attention_forward
    check(entry(_at(q), _strides(q), _at(k), _strides(k), _at(v), _strides(v), B, Hq, Hkv,
                                        Tq, Tk, d, scale, int(is_causal), _at(out), _at(lse), torch.get_num_threads()),
          "attention", library)


def attention_backward(dout, q, k, v, out, lse, scale: float, is_causal: bool, dq, dk, dv, *, library=lib) -> None:
    """dq, dk, dv (q's and k's shapes, written by their strides, each row its own) from dout (read by its strides,
    its last dim contiguous), out (contiguous) and the forward's lse."""
    (B, Hq, Tq, d), (Hkv, Tk) = q.shape, k.shape[1:3]
    bf16 = q.dtype == torch.bfloat16
    entry = library.ckp_attention_backward_bf16 if bf16 else library.ckp_attention_backward
    gemm = (bf16_gemm() or lib.CKP_BF16_GEMM_ATEN,) if bf16 else ()  # what adds into the bf16 gradients
    check(entry(_at(dout), _strides(dout), _at(q), _strides(q), _at(k), _strides(k), _at(v),
                                         _strides(v), _at(out), _at(lse), B, Hq, Hkv, Tq, Tk, d, scale, int(is_causal),
                                         _at(dq), _strides(dq), _at(dk), _strides(dk), _at(dv), _strides(dv),
                                         *gemm, torch.get_num_threads()),
          "attention backward", library)


def _as_aten_lays_it(like: torch.Tensor) -> torch.Tensor:
    """An empty tensor of like's (B, H, T, d) shape and dtype laid out as (B, T, H, d), as ATen's flash backward
    makes its gradients."""
    B, H, T, d = like.shape
    return empty((B, T, H, d), like.dtype).transpose(1, 2)


class _AttentionFunction(CFunction):
    """q (B, Hq, Tq, d), k, v (B, Hkv, Tk, d), scale, is_causal -> (B, Hq, Tq, d), float32 or bf16 (torch's bf16
    kernel: csrc/attention.c's [Note: ATen's bf16 flash attention]). First-order only: see ops/_function.py."""

    @staticmethod
    def compute(q, k, v, scale, is_causal):
        out = empty(q.shape, q.dtype)
        lse = empty(q.shape[:3], torch.float32)
        attention_forward(q, k, v, scale, is_causal, out, lse)
        return out, lse

    @classmethod
    def forward(cls, ctx, q, k, v, scale, is_causal):
        out, lse = cls.compute(q, k, v, scale, is_causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale, ctx.is_causal = scale, is_causal
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @first_order_only
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _as_aten_lays_it(q), _as_aten_lays_it(k), _as_aten_lays_it(v)
        # dout where ATen's flash backward reads it, and dq, dk, dv where it writes them: (B, T, H, d) buffers
        # (grad_out.transpose(1, 2) made contiguous: a copy unless dout already lies so). MKL's small paths on its
        # AVX2 branch start a row of A or C at its first 16-byte boundary ([Note: MKL's AVX2 small sgemm], [Note:
        # MKL's AVX2 small sgemm by columns]), so where the rows start moves bits
        dout = dout.to(q.dtype)
        attention_backward(dout.transpose(1, 2).contiguous().transpose(1, 2), q, k, v, out, lse, ctx.scale,
                           ctx.is_causal, dq, dk, dv)
        return dq, dk, dv, None, None


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """t (..., H, T, d) as (B, H, T, d), its last dim contiguous (ATen's flash kernel reads rows). A 4-D t as it
    is: a reshape to its own shape would still be an autograd node (a fifth of a twin's attention's overhead)."""
    if t.dim() == 4 and t.stride(-1) == 1:
        return t
    t = t.reshape(-1, *t.shape[-3:]) if t.dim() >= 3 else t.reshape(1, 1, *t.shape)
    return t if t.stride(-1) == 1 else t.contiguous()


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask=None, dropout_p: float = 0.0,
              is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention: query (..., Hq, Tq, d), key and value (..., Hkv, Tk, d) -> (..., Hq, Tq, d),
    float32 or bfloat16; is_causal (top-left: row r sees keys <= r), scale (default 1 / sqrt(d)), enable_gqa
    (query head h reads kv head h / (Hq / Hkv)). An attn_mask and dropout are refused by name.
    bfloat16: where torch's bf16 flash kernel runs MKL's bf16 GEMM on its AVX2 branch and ATen's own bf16 loops
    or oneDNN's AVX-512 bf16 brgemm (bf16_followed: an AMD CPU with AVX2 only, or a Zen 5), that kernel
    (csrc/attention.c's [Note: ATen's bf16 flash attention]: P and dS rounded to bf16, dQ, dK, dV accumulated in
    bf16); elsewhere (MKL's AVX-512 code, AMX GEMMs) the
    float32 kernel on the widened values, the result rounded once. Either way the same bits at any ckparity
    thread count."""
    if attn_mask is not None:
        raise InvalidArgument("attention: attn_mask is not built in ckparity's attention (use is_causal, or "
                              "F.scaled_dot_product_attention)")
    if dropout_p != 0.0:
        raise InvalidArgument(f"attention: dropout is not built in ckparity's attention, got dropout_p={dropout_p}")
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        query, key, value = (t.to(torch.bfloat16) for t in (query, key, value))
    require_floating(query, "query")
    require_floating(key, "key", like=query)
    require_floating(value, "value", like=query)
    if query.dtype == torch.bfloat16 and not bf16_followed():  # widened exactly; the gradients come back through the
        # casts, rounded once
        with torch.autocast("cpu", enabled=False):
            return attention(query.float(), key.float(), value.float(), is_causal=is_causal, scale=scale,
                             enable_gqa=enable_gqa).bfloat16()
    _check_shapes(query, key, value, enable_gqa)
    if query.numel() == 0 or key.shape[-2] == 0:  # no rows, d = 0 or no keys: torch's own special case (no
        # kernel takes them; no scale is needed, whose default at d = 0 is 1 / sqrt(0)): zeros plus the inputs'
        # sums times 0, so a NaN or inf anywhere in them makes every output NaN, and the gradients are zero
        return query.new_zeros(query.shape) + (query.sum() + key.sum() + value.sum()) * 0
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)  # sdp::calculate_scale, in double
    if not math.isfinite(scale):
        raise InvalidArgument(f"attention: scale must be finite, got {scale}")
    out, _ = _AttentionFunction.apply(_as_4d(query), _as_4d(key), _as_4d(value), scale, bool(is_causal))
    return out if query.dim() == 4 else out.reshape(query.shape)


def bf16_followed() -> bool:
    """Whether torch's bf16 flash kernel runs here on GEMMs ckparity follows in bf16: MKL's bf16 GEMM as its AVX2
    branch's own sgemm order (a CPU without AVX-512, or an AMD one past Zen 4), and for the bf16 gradients ATen's
    own bf16 loops or oneDNN's AVX-512 bf16 brgemm (bf16_gemm; not AMX)."""
    return cpu.mkl_avx2_own() and bf16_gemm() is not None


def bf16_gemm() -> int | None:
    """What torch's bf16 GEMMs that add into bf16 tensors run here: ATen's own loops (lib.CKP_BF16_GEMM_ATEN:
    no oneDNN for bf16), oneDNN's AVX-512 bf16 brgemm (lib.CKP_BF16_GEMM_ONEDNN: ops/_onednn.py reads its chain
    over pairs, at a block GEMM's shape and dV's layouts), or None (another order: AMX's tiles)."""
    if _aten_bf16.torch_runs_aten():
        return lib.CKP_BF16_GEMM_ATEN
    order = _onednn.order(32, 64, 32, True, False)
    return lib.CKP_BF16_GEMM_ONEDNN if order is not None and order == _onednn.Order(0, ()) else None


def _check_shapes(query, key, value, enable_gqa: bool) -> None:
    shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        raise InvalidArgument(f"attention: query, key and value must have the same number of dims (2 or more), "
                              f"got {shapes}")
    if key.shape != value.shape:
        raise InvalidArgument(f"attention: key and value must have one shape (ATen's flash kernel takes one head "
                              f"size), got {shapes}")
    if key.shape[-1] != query.shape[-1]:
        raise InvalidArgument(f"attention: key's head dim must be query's, got {shapes}")
    if query.dim() >= 3:
        if query.shape[:-3] != key.shape[:-3]:
            raise InvalidArgument(f"attention: query's and key's batch dims differ (no broadcasting), got {shapes}")
        hq, hkv = query.shape[-3], key.shape[-3]
        if hq != hkv and not (enable_gqa and hkv > 0 and hq % hkv == 0):
            raise InvalidArgument(f"attention: {hq} query heads for {hkv} kv heads needs enable_gqa=True and a "
                                  f"multiple, got {shapes}")
