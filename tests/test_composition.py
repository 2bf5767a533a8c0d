"""Per-kernel bit-identity composes: with every kernel the CK twin uses
bitwise (rms_norm and swiglu in C, torch's loss and optimizer), a residual
model's CK twin equals the torch twin bit for bit — logits, grads, params and
moments, every step, at any depth.

Why it needs care: torch's composite rms_norm uses x twice (x * rstd, and
x**2 for rstd), and a residual block uses x once more; autograd adds the
three gradients into x's one by one, in its engine's order. ckparity's
rms_norm hands autograd its two terms separately
(ckp_rms_norm_backward_terms), so the engine adds them in the same places.
The planted variant below returns one pre-added dx instead (the natural
way to write a backward) and must be caught."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ckparity import _bindings
from ckparity import kernels
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.loop.run import train

BITWISE = RunConfig(model="stacked", max_steps=20, grad_accum=4, total_tokens=4096, no_progress=True,
                    ck_rmsnorm_backend="c", ck_swiglu_backend="c", ck_loss_backend="torch",
                    ck_optimizer_backend="torch")


class _PreAddedRMSNorm(torch.autograd.Function):
    """planted: the C kernel's dx returned as one pre-added gradient"""

    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = torch.empty_like(x), torch.empty(x.shape[0])
        _bindings.rms_norm_forward(x, weight, eps, y, rstd)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        dx, dweight = torch.empty_like(x), torch.empty_like(weight)
        _bindings.rms_norm_backward(dy.contiguous(), x, weight, rstd, dx, dweight)
        return dx, dweight, None


def _pre_added_rms_norm(x, shape, weight, eps):
    return _PreAddedRMSNorm.apply(x.reshape(-1, x.shape[-1]).contiguous(), weight, eps).reshape(x.shape)


kernels.register("rms_norm", "fault_pre_added_dx", _pre_added_rms_norm)


@pytest.mark.parametrize("num_layers", [1, 2, 4])
def test_stacked_twin_is_bit_identical_at_depth(tmp_path, num_layers):
    result = train(replace(BITWISE, num_layers=num_layers, json_out=str(tmp_path / "r.json")))
    assert result["divergence"]["first_step"] is None, result["divergence"]
    for key in ("max_loss_abs_diff", "max_param_abs_diff", "max_grad_abs_diff", "max_logit_abs_diff",
                "max_moment_abs_diff"):
        assert result[key] == 0.0, key


def test_pre_added_dx_breaks_bit_identity(tmp_path):
    result = train(replace(BITWISE, num_layers=2, ck_rmsnorm_backend="fault_pre_added_dx",
                           json_out=str(tmp_path / "r.json")))
    divergence = result["divergence"]
    assert divergence["first_step"] == 1 and divergence["per_quantity"]["grads"] == 1
    # the first gradient that differs is the residual stream's, below the last block
    assert divergence["stage"].startswith("d") and divergence["stage"] != "dlogits"
