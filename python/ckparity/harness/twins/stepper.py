"""A twin: one model, its optimizer, its loss and its clip function, and the
micro-steps / step they run. Both twins go through the same code; the
distributed CK twins (ranks.py) are Twins too."""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .models import model_loss


@dataclass
class Twin:
    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    clip: Callable
    seconds: float = 0.0  # time spent in this twin's forward, backward and step
    scheduler: object = None  # its lr schedule (harness/longrun/schedule.py), stepped after each update
    autocast: Callable = contextlib.nullcontext  # the context of the forward and loss (precision.autocast)

    def micro_step(self, tokens, targets, scale: float, keep_activations: bool = False):
        """Forward and backward of one micro-batch with the loss scaled by
        ``scale`` (1/K); returns (unscaled loss, activations)."""
        start = time.perf_counter()
        with self.autocast():
            acts = self.model(tokens)
            if keep_activations:
                for t in acts.values():
                    if t.requires_grad:  # a fused head loss's logits are for the comparison only
                        t.retain_grad()
            loss = model_loss(self.model, acts, targets)
        if keep_activations:
            loss.retain_grad()
            acts["loss"] = loss
        (loss * scale).backward()
        self.seconds += time.perf_counter() - start
        return loss.detach(), acts

    def micro_steps(self, windows, keep_activations: bool = False) -> list:
        """micro_step over a step's (tokens, targets) windows, each loss
        scaled by 1/K; the (loss, activations) of each."""
        scale = 1.0 / len(windows)
        return [self.micro_step(tokens, targets, scale, keep_activations) for tokens, targets in windows]

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def update(self, max_grad_norm: float) -> None:
        start = time.perf_counter()
        if max_grad_norm > 0:
            self.clip(self.model.parameters(), max_grad_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.seconds += time.perf_counter() - start

    def grads(self) -> dict[str, torch.Tensor]:
        return {n: p.grad for n, p in self.model.named_parameters() if p.grad is not None}

    def params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def moments(self) -> dict[str, torch.Tensor]:
        """AdamW's exp_avg / exp_avg_sq per parameter (empty for SGD)."""
        out = {}
        for n, p in self.model.named_parameters():
            state = self.optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    out[f"{n}.{key}"] = state[key]
        return out

    def snapshot(self, reuse: dict | None = None) -> dict:
        """A copy of the weights and the optimizer state. With ``reuse`` (an
        earlier snapshot of this twin), its tensors are overwritten in place
        where the structure is unchanged: the harness snapshots every step,
        and fresh buffers each time cost more (allocation, first touch) than
        the copy."""
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        return refresh(reuse, state)

    def restore(self, snapshot: dict) -> None:
        self.model.load_state_dict(snapshot["model"])
        # a deep copy: optimizers must never share state tensors (torch keeps
        # the CPU "step" tensor as is when loading)
        self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))


def refresh(old, new):
    """new, copied into old's tensors where shapes and dtypes match, else freshly copied."""
    if isinstance(new, torch.Tensor):
        if isinstance(old, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype:
            return old.copy_(new)
        return new.detach().clone()
    if isinstance(new, dict):
        old = old if isinstance(old, dict) else {}
        return {k: refresh(old.get(k), v) for k, v in new.items()}
    if isinstance(new, (list, tuple)):
        old = old if isinstance(old, (list, tuple)) and len(old) == len(new) else [None] * len(new)
        return type(new)(refresh(o, v) for o, v in zip(old, new))
    return copy.deepcopy(new)
