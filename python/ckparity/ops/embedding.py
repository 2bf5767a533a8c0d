"""ckparity.embedding: F.embedding on the C kernel (csrc/embedding.c): the lookup and its weight
gradient (each row's gradients added in index order, as ATen's embedding_dense_backward_cpu adds them).
Its bindings live beside the op (as ops/residual.py's)."""

from __future__ import annotations

import torch

from .._bindings import pointer
from .._native import check, lib
from .._tensors import FLOATING, empty, require_cpu
from ..errors import InvalidArgument, InvalidType, as_int


def embedding_forward(idx, weight, out, *, library=lib) -> None:
    """out (n, D) = weight (V, D)[idx (n,)], all contiguous."""
    entry = library.ckp_embedding_forward if weight.dtype == torch.float32 else library.ckp_embedding_forward_bf16
    check(entry(pointer(idx), idx.numel(), pointer(weight), *weight.shape, pointer(out)), "embedding", library)


def embedding_backward(dout, idx, padding_idx: int, dweight, *, library=lib) -> None:
    """dweight (V, D) = dout (n, D)'s rows added per index, none for padding_idx (-1: none)."""
    entry = library.ckp_embedding_backward if dout.dtype == torch.float32 else library.ckp_embedding_backward_bf16
    check(entry(pointer(dout), pointer(idx), idx.numel(), *dweight.shape, padding_idx, pointer(dweight)),
          "embedding backward", library)


class _EmbeddingFunction(torch.autograd.Function):
    """idx (n,) int64, weight (V, D), padding_idx, shape (the lookup's (..., D)) -> shape. The backward is a sum per row in index
    order; the gradient of a gradient is not built (first order, as ckparity's other ops)."""

    @staticmethod
    def forward(ctx, idx, weight, padding_idx, shape):
        out = empty(shape, weight.dtype)  # (..., D) here: a reshape after the Function would be another node
        embedding_forward(idx, weight, out)
        ctx.save_for_backward(idx)
        ctx.shape, ctx.padding_idx = weight.shape, padding_idx
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        (idx,) = ctx.saved_tensors
        dweight = empty(ctx.shape, dout.dtype)
        embedding_backward(dout.contiguous(), idx, ctx.padding_idx, dweight)
        return None, dweight, None, None


def embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None, max_norm=None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> torch.Tensor:
    """F.embedding: input (...) int64 indices into weight (V, D), float32 or bfloat16 -> (..., D); padding_idx
    (negative: from the end) gets no gradient. max_norm (which renormalizes the weight in place),
    scale_grad_by_freq and sparse gradients are refused by name."""
    for flag, name in ((max_norm is not None, "max_norm"), (scale_grad_by_freq, "scale_grad_by_freq"),
                       (sparse, "sparse")):
        if flag:
            raise InvalidArgument(f"embedding: {name} is not built in ckparity's embedding (use F.embedding)")
    require_cpu(input, "input")
    require_cpu(weight, "weight")
    if input.dtype not in (torch.int64, torch.int32):
        raise InvalidType(f"embedding: the indices must be int64 or int32, got {input.dtype}")
    if weight.dtype not in FLOATING:
        raise InvalidType(f"embedding: the weight must be float32 or bfloat16, got {weight.dtype}")
    if weight.dim() != 2:
        raise InvalidArgument(f"embedding: the weight must be 2-D (V, D), got shape {tuple(weight.shape)}")
    V, D = weight.shape
    if padding_idx is not None:
        padding_idx = as_int(padding_idx, "padding_idx")
        if not -V <= padding_idx < V:
            raise InvalidArgument(f"embedding: padding_idx must be within the {V} rows, got {padding_idx}")
        padding_idx %= V
    idx = input.reshape(-1).to(torch.int64).contiguous()
    if idx.numel() == 0 or D == 0:
        return (weight.sum() * 0).expand(*input.shape, D) if D else weight.new_zeros(*input.shape, 0)
    return _EmbeddingFunction.apply(idx, weight.contiguous(), -1 if padding_idx is None else padding_idx,
                                    (*input.shape, D))
