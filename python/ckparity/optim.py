"""ckparity.optim.AdamW: a torch.optim.Optimizer whose step is the C kernel
(csrc/adamw.c). Its state ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
has torch.optim.AdamW's names, dtypes and shapes, so a state_dict saved by
either loads into the other. A bfloat16 parameter (with a bfloat16 gradient)
is stepped as torch's default single-tensor path steps it: bf16 moments,
every op rounded to bf16. ``fused=True`` follows torch's other reference
instead, ``torch.optim.AdamW(fused=True)`` (ATen's FusedAdamKernel.cpp): the
math in float from the unrounded moments, only the stores rounded (in
float32 too: there its sqrt is correctly rounded where the single-tensor
path's is MKL's)."""

from __future__ import annotations

import torch

from . import _bindings
from ._tensors import require_floating
from .errors import InvalidArgument, InvalidType


# torch's keywords that choose among its own implementations of the same step.
# ckparity follows two (the C kernel's two forms): the single-tensor path
# (False/None) and fused=True; True for the others asks for what it has not.
_TORCH_PATHS = ("foreach", "capturable", "differentiable")


def _check_betas(betas) -> tuple[float, float]:
    """torch's checks and messages, in its order; 1-element tensors become
    floats as torch.optim.Adam's _to_scalar makes them."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise InvalidArgument(f"betas must be a pair (beta1, beta2), got {betas!r}")
    for k, beta in enumerate(betas):
        if isinstance(beta, torch.Tensor) and beta.numel() != 1:
            raise InvalidArgument(f"Tensor betas[{k}] must be 1-element")
        if not isinstance(beta, (float, int, torch.Tensor)) or isinstance(beta, bool):
            raise InvalidArgument(f"betas[{k}] must be a number, got {type(beta).__name__}")
        if not 0.0 <= beta < 1.0:
            raise InvalidArgument(f"Invalid beta parameter at index {k}: {beta}")
    if isinstance(betas[0], torch.Tensor) != isinstance(betas[1], torch.Tensor):
        raise InvalidArgument("betas must be either both floats or both Tensors")
    return tuple(float(b) for b in betas)


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 *, maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        if isinstance(lr, torch.Tensor):
            if lr.numel() != 1:
                raise InvalidArgument("Tensor lr must be 1-element")
            # torch keeps a Tensor lr in float32 tensor arithmetic (lr * wd,
            # lr / bias_correction1); the C step takes lr in double, so it
            # would round differently: refused rather than silently off.
            raise InvalidArgument("ckparity.optim.AdamW takes lr as a Python float; a Tensor lr makes torch do "
                                  "its lr arithmetic in float32 tensors, which the C step does not repeat "
                                  "(pass float(lr))")
        if not 0.0 <= lr:
            raise InvalidArgument(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise InvalidArgument(f"Invalid epsilon value: {eps}")
        betas = _check_betas(betas)
        if not 0.0 <= weight_decay:
            raise InvalidArgument(f"Invalid weight_decay value: {weight_decay}")
        chosen = {"foreach": foreach, "capturable": capturable, "differentiable": differentiable}
        asked = [name for name in _TORCH_PATHS if chosen[name]]
        if asked:
            raise InvalidArgument(f"ckparity.optim.AdamW runs its own C step; {asked[0]}=True asks for one of "
                                  f"torch's implementations (use torch.optim.AdamW for that, or leave it "
                                  f"False/None)")
        # torch's own group keys ride along (unused here) so that a state_dict
        # loaded into torch.optim.AdamW keeps decoupled_weight_decay=True:
        # torch fills a missing key with Adam's default (False, i.e. L2 decay).
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=None, capturable=False, differentiable=False,
                        fused=True if fused else None, decoupled_weight_decay=True)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)

    def _state_for(self, p: torch.Tensor, amsgrad: bool) -> dict:
        state = self.state[p]
        if len(state) == 0:
            # torch keeps step as a float32 scalar tensor on the CPU
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):  # e.g. loaded from another layout
            if name in state and (state[name].dtype != p.dtype or not state[name].is_contiguous()):
                state[name] = state[name].to(p.dtype).contiguous()
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            options = _bindings.adamw_options(group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
                                              group["amsgrad"], group["maximize"], bool(group.get("fused")))
            for p in group["params"]:
                if p.grad is None:
                    continue
                require_floating(p, "parameter")
                require_floating(p.grad, "gradient", like=p)
                if p.grad.is_sparse:
                    raise InvalidType("AdamW does not support sparse gradients")
                state = self._state_for(p, options.amsgrad)
                # the step is elementwise: a non-contiguous parameter is
                # updated on a contiguous copy in its logical order, then copied back
                work = p.contiguous()
                state["step"] += 1
                step = _bindings.adamw_step_bf16 if p.dtype == torch.bfloat16 else _bindings.adamw_step
                step(work, p.grad.contiguous(), state["exp_avg"], state["exp_avg_sq"],
                     state.get("max_exp_avg_sq") if options.amsgrad else None, float(state["step"]), options)
                if work is not p:
                    p.copy_(work)
        return loss
