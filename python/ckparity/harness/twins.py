"""A twin: one model, its optimizer, its loss and its clip function, and the
micro-step / step they run. Both twins go through the same code."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import backends
from .models import Ops, build_model


@dataclass
class Twin:
    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    clip: Callable
    seconds: float = 0.0  # time spent in this twin's forward, backward and step

    def micro_step(self, tokens, targets, scale: float, keep_activations: bool = False):
        """Forward and backward of one micro-batch with the loss scaled by
        ``scale`` (1/K); returns (unscaled loss, activations)."""
        start = time.perf_counter()
        acts = self.model(tokens)
        if keep_activations:
            for t in acts.values():
                t.retain_grad()
        logits = acts["logits"]
        loss = self.model.ops.loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        if keep_activations:
            loss.retain_grad()
            acts["loss"] = loss
        (loss * scale).backward()
        self.seconds += time.perf_counter() - start
        return loss.detach(), acts

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def update(self, max_grad_norm: float) -> None:
        start = time.perf_counter()
        if max_grad_norm > 0:
            self.clip(self.model.parameters(), max_grad_norm)
        self.optimizer.step()
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
        return _refresh(reuse, state)

    def restore(self, snapshot: dict) -> None:
        self.model.load_state_dict(snapshot["model"])
        # a deep copy: optimizers must never share state tensors (torch keeps
        # the CPU "step" tensor as is when loading)
        self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))


def _refresh(old, new):
    """new, copied into old's tensors where shapes and dtypes match, else freshly copied."""
    if isinstance(new, torch.Tensor):
        if isinstance(old, torch.Tensor) and old.shape == new.shape and old.dtype == new.dtype:
            return old.copy_(new)
        return new.detach().clone()
    if isinstance(new, dict):
        old = old if isinstance(old, dict) else {}
        return {k: _refresh(old.get(k), v) for k, v in new.items()}
    if isinstance(new, (list, tuple)):
        old = old if isinstance(old, (list, tuple)) and len(old) == len(new) else [None] * len(new)
        return type(new)(_refresh(o, v) for o, v in zip(old, new))
    return copy.deepcopy(new)


def ops_for(config, side: str) -> Ops:
    """The CK twin's ops come from the backend flags; the torch twin's are torch's."""
    if side == "torch":
        return Ops(rms_norm=backends.RMS_NORM["torch"], swiglu=backends.SWIGLU["torch"],
                   loss=backends.CROSS_ENTROPY["torch"], rope=backends.ROPE["torch"])
    return Ops(rms_norm=backends.RMS_NORM[config.ck_rmsnorm_backend], swiglu=backends.SWIGLU[config.ck_swiglu_backend],
               loss=backends.CROSS_ENTROPY[config.ck_loss_backend], rope=backends.ROPE[config.ck_rope_backend])


def make_optimizer(config, side: str, params):
    if config.optimizer == "sgd":  # no C kernel: both twins use torch's SGD
        return torch.optim.SGD(params, lr=config.lr)
    make = backends.ADAMW[config.ck_optimizer_backend if side == "ck" else "torch"]
    return make(params, lr=config.lr, betas=(config.adamw_beta1, config.adamw_beta2), eps=config.adamw_eps,
                weight_decay=config.adamw_weight_decay)


def build_twin(config, side: str, model=None) -> Twin:
    model = model if model is not None else build_model(config, ops_for(config, side))
    clip = backends.CLIP_GRAD_NORM[config.ck_clip_backend if side == "ck" else "torch"]
    return Twin(side, model, make_optimizer(config, side, model.parameters()), clip)


def build_twins(config) -> tuple[Twin, Twin]:
    """(ck, torch) twins with bit-identical initial weights."""
    torch.manual_seed(config.seed)
    torch_model = build_model(config, ops_for(config, "torch"))
    ck_model = build_model(config, ops_for(config, "ck"))
    ck_model.load_state_dict(torch_model.state_dict())
    return build_twin(config, "ck", ck_model), build_twin(config, "torch", torch_model)
