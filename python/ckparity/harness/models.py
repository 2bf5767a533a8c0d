"""The twin models. Both twins are instances of the same class built with
different ops (twins.build_twins copies the weights).

Every forward returns the activations of each stage by name, so that
localization can compare the twins stage by stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class Ops:
    rms_norm: Callable  # (x, normalized_shape, weight, eps) like F.rms_norm
    swiglu: Callable    # (x [..., 2H]) -> [..., H]
    loss: Callable      # (logits (N, V), targets (N)) -> mean loss


class RMSNormLayer(nn.Module):
    def __init__(self, dim: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.ops = eps, ops

    def forward(self, x):
        return self.ops.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class TinyModel(nn.Module):
    """The seed's model: embedding, RMSNorm, Linear(D, 2H), SwiGLU, Linear(H, V)."""

    STAGES = ("embedding", "rmsnorm", "fc1", "swiglu", "logits")

    def __init__(self, vocab: int, d_model: int, hidden: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.embedding = nn.Embedding(vocab, d_model)
        self.norm = RMSNormLayer(d_model, eps, ops)
        self.fc1 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.fc2 = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        acts = {"embedding": self.embedding(tokens)}
        acts["rmsnorm"] = self.norm(acts["embedding"])
        acts["fc1"] = self.fc1(acts["rmsnorm"])
        acts["swiglu"] = self.ops.swiglu(acts["fc1"])
        acts["logits"] = self.fc2(acts["swiglu"])
        return acts


class Block(nn.Module):
    """x + fc2(swiglu(fc1(rmsnorm(x))))"""

    def __init__(self, d_model: int, hidden: int, eps: float, ops: Ops) -> None:
        super().__init__()
        self.ops = ops
        self.norm = RMSNormLayer(d_model, eps, ops)
        self.fc1 = nn.Linear(d_model, 2 * hidden, bias=False)
        self.fc2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x, acts: dict, prefix: str):
        acts[f"{prefix}.rmsnorm"] = h = self.norm(x)
        acts[f"{prefix}.fc1"] = h = self.fc1(h)
        acts[f"{prefix}.swiglu"] = h = self.ops.swiglu(h)
        acts[f"{prefix}.out"] = out = x + self.fc2(h)
        return out


class StackedModel(nn.Module):
    """Embedding, L residual RMSNorm+SwiGLU blocks, final RMSNorm, lm_head."""

    def __init__(self, vocab: int, d_model: int, hidden: int, eps: float, ops: Ops, num_layers: int) -> None:
        super().__init__()
        self.ops = ops
        self.embedding = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, hidden, eps, ops) for _ in range(num_layers))
        self.norm = RMSNormLayer(d_model, eps, ops)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        acts = {"embedding": self.embedding(tokens)}
        x = acts["embedding"]
        for i, block in enumerate(self.blocks):
            x = block(x, acts, f"block{i}")
        acts["rmsnorm"] = self.norm(x)
        acts["logits"] = self.lm_head(acts["rmsnorm"])
        return acts


def build_model(config, ops: Ops) -> nn.Module:
    if config.model == "tiny":
        return TinyModel(config.vocab, config.d_model, config.hidden, config.eps, ops)
    return StackedModel(config.vocab, config.d_model, config.hidden, config.eps, ops, config.num_layers)

