"""ckparity.distributed: the cross-entropy of logits split by vocabulary over
the ranks of a torch.distributed group (Megatron's vocab-parallel
cross-entropy; torch's loss_parallel), on the C shard kernels
(csrc/vocab_parallel_cross_entropy.c). The only communication is two
all-reduces of torch.distributed on ``group`` (MAX of the row maxima, SUM of
three per-row sums in float64); ckparity writes no communication of its own."""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import _bindings
from ._tensors import require_cpu, require_float32
from .errors import InvalidArgument, InvalidType
from .ops._function import CFunction, first_order_only

REDUCTIONS = ("none", "mean", "sum")


class _VocabParallelCrossEntropy(CFunction):
    """Forward: the three passes and both all-reduces; backward: the shard's
    dlogits from the saved global max and sums (no communication)."""

    @staticmethod
    def compute(logits, target, settings):
        N = logits.shape[0]
        s = settings
        row_max = torch.empty(N, dtype=torch.float32)
        _bindings.vocab_parallel_ce_max(logits, row_max)
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=s["group"])
        sums = torch.empty(N, 3, dtype=torch.float64)
        _bindings.vocab_parallel_ce_sums(logits, target, s["vocab_start"], s["vocab_size"], s["ignore_index"],
                                         row_max, sums)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=s["group"])
        rows = torch.empty(N, dtype=torch.float32)
        _bindings.vocab_parallel_ce_loss(target, s["vocab_size"], s["ignore_index"], s["label_smoothing"],
                                         s["z_loss"], row_max, sums, rows)
        return rows, row_max, sums

    @staticmethod
    def save(ctx, inputs, output):
        logits, target, settings = inputs
        _, row_max, sums = output
        ctx.mark_non_differentiable(row_max, sums)
        ctx.settings = settings
        ctx.save_for_backward(logits, target, row_max, sums)

    @staticmethod
    @first_order_only
    def backward(ctx, grad_rows, _grad_max, _grad_sums):
        logits, target, row_max, sums = ctx.saved_tensors
        s = ctx.settings
        dlogits = torch.empty_like(logits)
        _bindings.vocab_parallel_ce_backward(logits, target, s["vocab_start"], s["vocab_size"], s["ignore_index"],
                                             s["label_smoothing"], s["z_loss"], row_max, sums,
                                             grad_rows.contiguous().float(), dlogits)
        return dlogits, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, target: torch.Tensor, *, vocab_start: int,
                                 vocab_size: int, group=None, ignore_index: int = -100, reduction: str = "mean",
                                 label_smoothing: float = 0.0, z_loss: float = 0.0) -> torch.Tensor:
    """F.cross_entropy(full_logits, target, ...) where this rank holds
    ``local_logits`` = full_logits[:, vocab_start:vocab_start + V_local]
    (shards need not be equal). local_logits is (N, V_local) float32 or
    bfloat16 (the default cross-entropy's bf16 rule: float math on the
    values widened exactly, the loss and dlogits rounded once where
    stored), target
    (N) int64 class indices (the same on every rank). Every rank of ``group``
    must call it with the same N, target and options; each gets the whole
    loss, and its backward gives the gradient of its own shard. ``z_loss``
    adds z_loss * logsumexp(row)**2 per non-ignored row, as in
    ckparity.cross_entropy. Class weights are not supported."""
    if isinstance(local_logits, torch.Tensor) and local_logits.dtype == torch.bfloat16:
        return vocab_parallel_cross_entropy(local_logits.float(), target, vocab_start=vocab_start,
                                            vocab_size=vocab_size, group=group, ignore_index=ignore_index,
                                            reduction=reduction, label_smoothing=label_smoothing,
                                            z_loss=z_loss).to(torch.bfloat16)
    require_float32(local_logits, "local_logits")
    require_cpu(target, "target")
    if target.dtype != torch.int64:
        raise InvalidType(f"target must be int64 class indices, got {target.dtype}")
    if local_logits.dim() != 2 or target.shape != local_logits.shape[:1]:
        raise InvalidArgument(f"local_logits must be (N, V_local) and target (N), got {tuple(local_logits.shape)} "
                              f"and {tuple(target.shape)}")
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise InvalidArgument(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgument("vocab_parallel_cross_entropy needs an initialized torch.distributed process group")
    settings = dict(vocab_start=int(vocab_start), vocab_size=int(vocab_size), group=group,
                    ignore_index=int(ignore_index), label_smoothing=float(label_smoothing), z_loss=float(z_loss))
    rows, _, _ = _VocabParallelCrossEntropy.apply(local_logits.contiguous(), target.contiguous(), settings)
    if reduction == "none":
        return rows
    # summed in double: the rows are already float32-rounded, the reduction adds no rounding of its own
    total = rows.double().sum()
    if reduction == "mean":  # torch's mean: over the non-ignored rows; all rows ignored gives NaN
        total = total / (target != ignore_index).sum()
    return total.float()


def shard_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of rank's shard when V is split as evenly as it goes (the
    first V % world_size ranks take one column more)."""
    base, extra = divmod(vocab_size, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)
