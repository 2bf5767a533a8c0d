"""Building the twins: the CK twin's ops and optimizer from the backend
flags, the torch twin's from torch, with bit-identical initial weights."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from .. import kernels
from . import init_from, ranks
from .models import Ops, build_model
from .twin import Twin


def ops_for(config, side: str) -> Ops:
    """The CK twin's ops come from the backend flags; the torch twin's are torch's."""
    if side == "torch":
        ops = Ops(rms_norm=kernels.backends("rms_norm")["torch"], swiglu=kernels.backends("swiglu")["torch"],
                  loss=kernels.backends("cross_entropy")["torch"], rope=kernels.backends("rope")["torch"])
    else:
        ops = Ops(rms_norm=kernels.backends("rms_norm")[config.ck_rmsnorm_backend],
                  swiglu=kernels.backends("swiglu")[config.ck_swiglu_backend], loss=kernels.backends("cross_entropy")[config.ck_loss_backend],
                  rope=kernels.backends("rope")[config.ck_rope_backend], head_loss=kernels.HEAD_LOSS.get(config.ck_loss_backend))
    if config.label_smoothing:  # only then: a planted loss in a test need not take the keyword
        ops = replace(ops, loss=partial(ops.loss, label_smoothing=config.label_smoothing),
                      head_loss=partial(ops.head_loss, label_smoothing=config.label_smoothing) if ops.head_loss else None)
    return ops


def make_optimizer(config, side: str, params):
    if config.optimizer == "sgd":  # no C kernel: both twins use torch's SGD
        return torch.optim.SGD(params, lr=config.lr)
    make = kernels.backends("adamw")[config.ck_optimizer_backend if side == "ck" else "torch"]
    return make(params, lr=config.lr, betas=(config.adamw_beta1, config.adamw_beta2), eps=config.adamw_eps,
                weight_decay=config.adamw_weight_decay)


def build_twin(config, side: str, model=None) -> Twin:
    model = model if model is not None else build_model(config, ops_for(config, side))
    if side == "ck":
        model = ranks.shard_model(model, config)
    clip = kernels.backends("clip_grad_norm")[config.ck_clip_backend if side == "ck" else "torch"]
    twin = Twin(side, model, make_optimizer(config, side, model.parameters()), clip)
    # --tp / --dp: the CK twin is this rank's part of the distributed twin
    return ranks.parallel_twin(twin, config) if side == "ck" else twin


def build_twins(config) -> tuple[Twin, Twin]:
    """(ck, torch) twins with bit-identical initial weights."""
    torch.manual_seed(config.seed)
    torch_model = build_model(config, ops_for(config, "torch"))
    if config.init_from and not config.resume:  # a resumed run's weights come from its checkpoint
        init_from.load_into(torch_model, config)
    ck_model = build_model(config, ops_for(config, "ck"))
    ck_model.load_state_dict(torch_model.state_dict())
    return build_twin(config, "ck", ck_model), build_twin(config, "torch", torch_model)
