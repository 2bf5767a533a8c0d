"""clip_grad_norm: torch.nn.utils.clip_grad_norm_ (the total norm, clipped
to max_norm); the optimizer_parity gate holds it against float64."""

from __future__ import annotations

import torch

from ..ops.clip_grad_norm import clip_grad_norm_
from .. import _bindings as C
from .contract import expect
from .layouts import LayoutCase
from .record import Kernel


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(9, generator=g))]
    params[0].grad = torch.randn(9, generator=g) * 10
    total = fn(params, 1.0)
    expect(isinstance(total, torch.Tensor) and total.numel() == 1, "clip_grad_norm_ must return the total norm")
    expect(bool(params[0].grad.norm() <= 1.0 + 1e-4), "the gradients were not clipped to max_norm")


def _probe(g: torch.Generator):
    grads = [torch.randn(100003, generator=g), torch.randn(7, generator=g)]
    for p in (1.0, 2.0, 3.0, float("inf")):
        yield f"grad_norm p={p}", lambda L, f, p=p: torch.tensor(C.grad_norm(grads, p, library=L), dtype=torch.float64)


def _clip(fn, t: dict, **kwargs) -> dict:
    params = [torch.nn.Parameter(torch.zeros(t[name].shape)) for name in ("grad", "grad2")]
    for p, name in zip(params, ("grad", "grad2")):
        p.grad = t[name]
    total = fn(params, 0.5, **kwargs)
    return {"total_norm": total.reshape(()), "grad": params[0].grad, "grad2": params[1].grad}


def _layout_cases(g):
    """Two gradients, each in every layout; clipped (max_norm 0.5), at norms 2 and inf. Not claimed:
    the norm is reduced in double, held to its contiguous bits."""
    for norm_type in (2.0, float("inf")):
        yield LayoutCase(f"grads (4, 6) and (7,), norm {norm_type}", clip_grad_norm_, torch.nn.utils.clip_grad_norm_,
                         lambda f, t, n=norm_type: _clip(f, t, norm_type=n), (),
                         {"grad": torch.randn(4, 6, generator=g), "grad2": torch.randn(7, generator=g)})


KERNEL = Kernel(
    name="clip_grad_norm",
    used_by=lambda config: config.max_grad_norm > 0,
    exercise=("clipped", {"max_grad_norm": 1.0}),
    flag="ck_clip_backend",
    spellings=("clip",),
    backends={"c": clip_grad_norm_, "torch": torch.nn.utils.clip_grad_norm_},
    contract=_contract,
    not_claimed={"clip_grad_norm_": "the norm is reduced in double"},
    probe=_probe,
    layouts=_layout_cases,
)
