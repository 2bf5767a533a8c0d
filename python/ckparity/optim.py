"""ckparity.optim.AdamW: a torch.optim.Optimizer whose step is the C kernel
(csrc/adamw.c). Its state ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
has torch.optim.AdamW's names, dtypes and shapes, so a state_dict saved by
either loads into the other."""

from __future__ import annotations

import torch

from ._native import check, ffi, lib
from ._tensors import pointer, require_float32


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False,
                 *, maximize: bool = False) -> None:
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        # torch's own group keys ride along (unused here) so that a state_dict
        # loaded into torch.optim.AdamW keeps decoupled_weight_decay=True:
        # torch fills a missing key with Adam's default (False, i.e. L2 decay).
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=None, capturable=False, differentiable=False,
                        fused=None, decoupled_weight_decay=True)
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
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        if amsgrad and "max_exp_avg_sq" not in state:
            state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            opt = ffi.new("ckp_adamw_options *")
            opt.lr = float(group["lr"])
            opt.beta1, opt.beta2 = (float(b) for b in group["betas"])
            opt.eps = float(group["eps"])
            opt.weight_decay = float(group["weight_decay"])
            opt.amsgrad = bool(group["amsgrad"])
            opt.maximize = bool(group["maximize"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                require_float32(p, "parameter")
                require_float32(p.grad, "gradient")
                if p.grad.is_sparse:
                    raise TypeError("AdamW does not support sparse gradients")
                if not p.is_contiguous():
                    raise ValueError("ckparity AdamW updates parameters in place and needs them contiguous")
                state = self._state_for(p, opt.amsgrad)
                for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                    if name in state and (state[name].dtype != torch.float32 or not state[name].is_contiguous()):
                        state[name] = state[name].float().contiguous()
                grad = p.grad.contiguous()
                state["step"] += 1
                check(lib.ckp_adamw_step(
                    pointer(p), pointer(grad), pointer(state["exp_avg"]), pointer(state["exp_avg_sq"]),
                    pointer(state.get("max_exp_avg_sq")) if opt.amsgrad else ffi.NULL,
                    p.numel(), float(state["step"]), opt), "adamw")
        return loss
