"""Building the twins, every kind through ``build_twin(config, kind)``: the
CK twin's ops and optimizer from the backend flags, the torch twin's from
torch, with bit-identical initial weights, and the float64 twin the shadow
and the replays recompute with. (The envelope's null members are torch
twins with perturbed ops: observers/envelope.py builds them.)"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from ... import kernels, reference
from ..basics import progress
from . import init_from
from . import ranked as ranks
from . import precision
from .models import KERNEL_TAG, Ops, build_model
from .stepper import Twin


def ops_for(config, side: str) -> Ops:
    """The CK twin's ops come from the backend flags (each kernel record's
    ``flag``); the torch twin's (and the float64 one's) are torch's."""
    chosen = {name: "torch" if side != "ck" else getattr(config, record.flag)
              for name, record in kernels.KERNELS.items()}
    ops = Ops(**{slot: kernels.backends(name)[chosen[name]] for slot, name in kernels.SLOTS.items()},
              head_loss=kernels.HEAD_LOSS.get(chosen["cross_entropy"]))
    if config.label_smoothing:  # only then: a planted loss in a test need not take the keyword
        ops = replace(ops, loss=partial(ops.loss, label_smoothing=config.label_smoothing),
                      head_loss=partial(ops.head_loss, label_smoothing=config.label_smoothing) if ops.head_loss else None)
    if config.amp != "none" and side != "f64":  # the float64 twin runs without autocast
        ops = replace(ops, loss=precision.float_loss(ops.loss))
    track = side == "ck" and progress.enabled()
    return replace(ops, **{slot: _tagging(name, getattr(ops, slot), track) for slot, name in kernels.SLOTS.items()},
                   head_loss=ops.head_loss and _tagging(kernels.SLOTS["loss"], ops.head_loss, track))


def _tagging(kernel: str, fn, track: bool = False):
    """fn whose output names the kernel record it came out of (models.KERNEL_TAG): localization reads each
    stage's kernel from its tensor, so no table of the models' stages exists beside the records. With
    ``track`` (a run in a child that keeps its place: basics/progress.py), entering the slot's forward,
    and its backward (a hook on its output runs just before), is noted."""
    def call(*args, **kwargs):
        if track:
            progress.note(stage="forward", kernel=kernel)
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            setattr(out, KERNEL_TAG, kernel)
            if track and out.requires_grad:
                out.register_hook(lambda grad: progress.note(stage="backward", kernel=kernel))
        return out
    return call


def make_optimizer(config, side: str, params):
    if config.optimizer == "sgd":  # no C kernel: every twin uses torch's SGD
        return torch.optim.SGD(params, lr=config.lr)
    kw = dict(lr=config.lr, betas=(config.adamw_beta1, config.adamw_beta2), eps=config.adamw_eps,
              weight_decay=config.adamw_weight_decay)
    if side == "f64":  # reference.adamw, not the record's "torch" entry: a test may plant a fault in the torch twin
        return reference.adamw(params, **kw)
    if side == "torch" and config.torch_adamw == "fused":  # torch's other AdamW reference (FusedAdamKernel.cpp)
        return torch.optim.AdamW(params, fused=True, **kw)
    return kernels.backends("adamw")[config.ck_optimizer_backend if side == "ck" else "torch"](params, **kw)


KINDS = ("ck", "torch", "f64")


def build_twin(config, kind: str, model=None, snapshot: dict | None = None) -> Twin:
    """A twin of ``kind``: "ck" (the backend flags' kernels; this rank's part
    under --tp/--dp), "torch" (torch's ops and AdamW) or "f64" (torch's model,
    loss and optimizer in float64, from ``snapshot``: the shadow, the dump's
    and the spikes' replays). ``model`` reuses built weights; else a new init
    from the seed in effect."""
    if kind not in KINDS:
        raise ValueError(f"no twin kind {kind!r}; kinds: {', '.join(KINDS)}")
    model = model if model is not None else build_model(config, ops_for(config, kind))
    if kind == "f64":
        twin = Twin("f64", model.double(), make_optimizer(config, kind, model.parameters()),
                    torch.nn.utils.clip_grad_norm_)
        twin.restore(snapshot)  # load_state_dict casts the float32 weights and moments to float64
        return twin
    model = precision.cast_model(model, config)
    if kind == "ck":
        model = ranks.shard_model(model, config)
    clip = kernels.backends("clip_grad_norm")[config.ck_clip_backend if kind == "ck" else "torch"]
    twin = Twin(kind, model, make_optimizer(config, kind, model.parameters()), clip,
                autocast=lambda: precision.autocast(config))
    # --tp / --dp: the CK twin is this rank's part of the distributed twin
    return ranks.parallel_twin(twin, config) if kind == "ck" else twin


def build_twins(config) -> tuple[Twin, Twin]:
    """(ck, torch) twins with bit-identical initial weights (initialized in
    float32 whatever the dtype, then cast by build_twin: a bf16 run starts
    from its float32 run's weights rounded once)."""
    torch.manual_seed(config.seed)
    torch_model = build_model(config, ops_for(config, "torch"))
    if config.init_from and not config.resume:  # a resumed run's weights come from its checkpoint
        init_from.load_into(torch_model, config)
    ck_model = build_model(config, ops_for(config, "ck"))
    ck_model.load_state_dict(torch_model.state_dict())
    return build_twin(config, "ck", ck_model), build_twin(config, "torch", torch_model)
