"""ckparity train --tp N / --dp N: the CK twin spread over the ranks of a
torch.distributed group (gloo), next to the ordinary single-process torch
twin. Every rank runs the same loop on the same data, including its own copy
of the torch twin, so that every rank takes the same decisions (when to
replay, when to stop) without asking the others; only rank 0 writes the report.

- tensor parallel (--tp N): the CK twin's lm_head is split by vocabulary
  (``ckparity.distributed.shard_range``) and its loss is the C vocab-parallel
  cross-entropy. The lm_head's input is replicated, so its gradient is each
  rank's partial dhidden, summed over the ranks by an all-reduce in backward
  (Megatron's "copy to the tensor-parallel region").
- data parallel (--dp N): micro-batch i of a step runs on rank i % N; after the
  step's micro-batches each rank's gradient (the sum of its micro-batches'
  1/K-scaled gradients) is summed over the ranks by an explicit all-reduce, and
  each rank steps its own C AdamW. Explicit rather than DDP: DDP divides by N
  and all-reduces in buckets of its own choosing (an extra rounding and an
  order we could not state); with the loss already scaled by 1/K, a sum over
  the ranks is the whole difference from one process, and the report
  measures it.

For the comparison the twin reads as one full model: the lm_head shards
(weights, grads, moments) and the logits are gathered on every rank, and a
snapshot is the full state (restoring one slices it), so localization, the
divergence replay and the float64 shadow run unchanged."""

from __future__ import annotations

import copy
import hashlib
import os
import time
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...distributed import shard_range, vocab_parallel_cross_entropy
from ...ops._function import CFunction
from ..basics.config import UsageError
from .models import head_name
from .stepper import Twin, refresh

# the environment torchrun (and ckparity's own launcher) gives each rank
RANK_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Ranks:
    rank: int
    world_size: int

    @property
    def is_writer(self) -> bool:
        """Rank 0 writes the report."""
        return self.rank == 0


SINGLE = Ranks(0, 1)


def join(config) -> Ranks:
    """Joins the process group torchrun or the launcher set up (gloo; a
    collective that waits longer than --rank-timeout raises), or SINGLE for a
    one-process run. The world must be exactly --tp x --dp ranks."""
    wanted = config.tp * config.dp
    if "WORLD_SIZE" not in os.environ:
        if wanted > 1:
            raise UsageError(f"--tp {config.tp} --dp {config.dp} needs {wanted} ranks; run it as `ckparity train` "
                             f"(which starts them) or under torchrun")
        return SINGLE
    missing = [name for name in RANK_ENV if name not in os.environ]
    if missing:
        raise UsageError(f"a torch.distributed launch sets {', '.join(RANK_ENV)}; {', '.join(missing)} missing")
    world = int(os.environ["WORLD_SIZE"])
    if world != wanted:
        raise UsageError(f"{world} ranks were started but --tp {config.tp} --dp {config.dp} needs {wanted}")
    if world == 1:
        return SINGLE
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=config.rank_timeout))
    return Ranks(dist.get_rank(), world)


def barrier(ranks: Ranks) -> None:
    if ranks.world_size > 1:
        dist.barrier()


def agreed_signal(ranks: Ranks, signum: int | None) -> int | None:
    """The signal any rank has received (the highest number), so that all
    ranks stop after the same step: a rank that stopped alone would leave the
    others waiting in the next step's collectives."""
    if ranks.world_size == 1:
        return signum
    flag = torch.tensor([signum or 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) or None


def agreed_min(ranks: Ranks, value: int) -> int:
    if ranks.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def leave(ranks: Ranks) -> None:
    if ranks.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def gather_shards(local: torch.Tensor, dim: int, sizes: list[int]) -> torch.Tensor:
    """The tensor whose shards along ``dim`` (of these sizes, rank by rank)
    the ranks hold. gloo's all_gather wants equal sizes: shards are padded to
    the widest and cut back."""
    shape = list(local.shape)
    shape[dim] = max(sizes)
    padded = local.new_zeros(shape)
    padded.narrow(dim, 0, local.shape[dim]).copy_(local)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([p.narrow(dim, 0, s) for p, s in zip(parts, sizes)], dim=dim)


def fingerprints(tensors) -> list[int]:
    """Every rank's 63-bit digest of the bytes of ``tensors`` (in order)."""
    digest = hashlib.blake2b(digest_size=8)
    for t in tensors:
        t = t.detach().contiguous()
        # the bytes as they are: numpy has no bfloat16, so a bf16 tensor is read as its int16 bits
        digest.update(memoryview((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()).cast("B"))
    mine = torch.tensor([int.from_bytes(digest.digest(), "little") >> 1], dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [int(t) for t in every]


class _ReplicatedInput(CFunction):
    """Identity forward; backward sums the ranks' partial gradients."""

    @staticmethod
    def compute(x):
        return x.view_as(x)

    @staticmethod
    def save(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad


class VocabParallelHead(nn.Module):
    """Rows [start, end) of the lm_head weight; its output is this rank's
    columns of the logits."""

    def __init__(self, full_weight: torch.Tensor, start: int, end: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(full_weight.detach()[start:end].clone())
        self.start, self.end = start, end

    def forward(self, x):
        return F.linear(_ReplicatedInput.apply(x), self.weight)


class TensorParallelTwin(Twin):
    """This rank's CK twin under --tp: the lm_head rows of its vocabulary
    shard, the vocab-parallel loss; read and snapshotted as the full model."""

    def __init__(self, twin: Twin, config, ranks: Ranks) -> None:
        super().__init__(twin.name, twin.model, twin.optimizer, twin.clip)
        name = head_name(twin.model)
        head_module = getattr(twin.model, name)  # shard_model's VocabParallelHead
        self.start, self.end = head_module.start, head_module.end
        self.sizes = [b - a for a, b in (shard_range(config.vocab, r, ranks.world_size)
                                         for r in range(ranks.world_size))]
        self.weight = f"{name}.weight"
        self.index = next(i for i, p in enumerate(twin.model.parameters()) if p is head_module.weight)

    def _gather(self, local: torch.Tensor, dim: int = 0) -> torch.Tensor:
        return gather_shards(local, dim, self.sizes)

    def micro_step(self, tokens, targets, scale: float, keep_activations: bool = False):
        loss, acts = super().micro_step(tokens, targets, scale, keep_activations)
        local = acts["logits"]
        acts["logits"] = full = self._gather(local.detach(), -1)
        if keep_activations and local.grad is not None:
            full.grad = self._gather(local.grad, -1)
        return loss, acts

    def _full(self, named: dict, suffixes=("",)) -> dict:
        for suffix in suffixes:
            if self.weight + suffix in named:
                named[self.weight + suffix] = self._gather(named[self.weight + suffix])
        return named

    def grads(self) -> dict[str, torch.Tensor]:
        return self._full(super().grads())

    def params(self) -> dict[str, torch.Tensor]:
        return self._full(super().params())

    def moments(self) -> dict[str, torch.Tensor]:
        return self._full(super().moments(), (".exp_avg", ".exp_avg_sq"))

    def replicated_params(self) -> list[torch.Tensor]:
        """The parameters every rank holds whole (all but the shard)."""
        return [p for n, p in self.model.named_parameters() if n != self.weight]

    def snapshot(self, reuse: dict | None = None) -> dict:
        model_state = self._full(dict(self.model.state_dict()))
        optimizer_state = self.optimizer.state_dict()
        state = optimizer_state["state"]
        if self.index in state:
            state = {**state, self.index: {k: self._gather(v) if v.dim() else v
                                           for k, v in state[self.index].items()}}
        return refresh(reuse, {"model": model_state, "optimizer": {**optimizer_state, "state": state}})

    def restore(self, snapshot: dict) -> None:
        model_state = dict(snapshot["model"])
        model_state[self.weight] = model_state[self.weight][self.start:self.end]
        self.model.load_state_dict(model_state)
        optimizer_state = copy.deepcopy(snapshot["optimizer"])
        for k, v in optimizer_state["state"].get(self.index, {}).items():
            if v.dim():
                optimizer_state["state"][self.index][k] = v[self.start:self.end].clone()
        self.optimizer.load_state_dict(optimizer_state)


class DataParallelTwin(Twin):
    """This rank's CK twin under --dp: it runs micro-batches i with
    i % N == rank, sums the gradients over the ranks, and steps its own
    optimizer. Every rank returns every micro-batch's loss and logits, sent
    by the rank that ran it."""

    def __init__(self, twin: Twin, config, ranks: Ranks) -> None:
        super().__init__(twin.name, twin.model, twin.optimizer, twin.clip)
        self.rank, self.world_size, self.vocab = ranks.rank, ranks.world_size, config.vocab
        # the dtype of the loss and logits another rank sends (pure bf16: the model's dtype)
        self.dtype = next(twin.model.parameters()).dtype

    def micro_steps(self, windows, keep_activations: bool = False) -> list:
        scale = 1.0 / len(windows)
        outputs = []
        for i, (tokens, targets) in enumerate(windows):
            if i % self.world_size == self.rank:
                outputs.append(self.micro_step(tokens, targets, scale, keep_activations))
            elif keep_activations:  # a replay compares every micro-batch's stages
                outputs.append(self._discarding_grads(tokens, targets, scale))
            else:
                outputs.append(None)
        start = time.perf_counter()
        self._sum_grads()
        self.seconds += time.perf_counter() - start
        if keep_activations:
            return outputs
        return [self._share(i % self.world_size, out, tokens.shape) for i, (out, (tokens, _)) in
                enumerate(zip(outputs, windows))]

    def _discarding_grads(self, tokens, targets, scale: float):
        """Another rank's micro-batch run here for its activations only:
        its parameter gradients are dropped (the owner's count)."""
        params = list(self.model.parameters())
        kept = [p.grad for p in params]
        for p in params:
            p.grad = None
        output = self.micro_step(tokens, targets, scale, keep_activations=True)
        for p, grad in zip(params, kept):
            p.grad = grad
        return output

    def _sum_grads(self) -> None:
        """One all-reduce (SUM) per parameter; a rank that ran none of the
        step's micro-batches adds zeros where another rank has a gradient."""
        params = list(self.model.parameters())
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        for p, anyone in zip(params, has.tolist()):
            if anyone:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)

    def _share(self, owner: int, output, shape) -> tuple:
        if output is None:
            loss, logits = torch.empty((), dtype=self.dtype), torch.empty(*shape, self.vocab, dtype=self.dtype)
        else:
            loss, logits = output[0].detach().contiguous(), output[1]["logits"].detach().contiguous()
        dist.broadcast(loss, src=owner)
        dist.broadcast(logits, src=owner)
        return loss, {"logits": logits}

    def replicated_params(self) -> list[torch.Tensor]:
        return list(self.model.parameters())


def shard_model(model: nn.Module, config) -> nn.Module:
    """Under --tp, the CK model with this rank's lm_head shard and the
    vocab-parallel loss (before its optimizer is made); else as is."""
    if config.tp == 1:
        return model
    name = head_name(model)
    start, end = shard_range(config.vocab, dist.get_rank(), dist.get_world_size())
    setattr(model, name, VocabParallelHead(getattr(model, name).weight, start, end))
    model.ops = replace(model.ops, loss=lambda logits, targets: vocab_parallel_cross_entropy(
        logits, targets, vocab_start=start, vocab_size=config.vocab))
    return model


def parallel_twin(twin: Twin, config) -> Twin:
    """The CK twin as this rank's part of the --tp / --dp twin (as is for one process)."""
    if config.tp * config.dp == 1:
        return twin
    ranks = Ranks(dist.get_rank(), dist.get_world_size())
    return TensorParallelTwin(twin, config, ranks) if config.tp > 1 else DataParallelTwin(twin, config, ranks)


class RanksDisagree(Exception):
    """The ranks' replicated parameters differ: the run ends at this step."""
