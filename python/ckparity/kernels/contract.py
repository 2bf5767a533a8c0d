"""The pieces every slot's contract check is made of (docs/plugins.md): a
backend that breaks its contract is refused with the reason, before any
run -- never compared as 0."""

from __future__ import annotations

import torch


class ContractError(ValueError):
    """A backend that does not keep its slot's contract (docs/plugins.md)."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise ContractError(what)


def tensor_like(out, shape, what: str) -> None:
    expect(isinstance(out, torch.Tensor), f"{what} must be a tensor, got {type(out).__name__}")
    expect(tuple(out.shape) == tuple(shape), f"{what} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    expect(out.dtype == torch.float32, f"{what} must be float32, got {out.dtype}")
    expect(bool(torch.isfinite(out).all()), f"{what} has non-finite values on finite input")


def grads_present(leaves: dict[str, torch.Tensor]) -> None:
    for name, leaf in leaves.items():
        expect(leaf.grad is not None, f"backward gives no gradient for {name}")
        tensor_like(leaf.grad, leaf.shape, f"the gradient of {name}")
        expect(bool(leaf.grad.abs().sum() > 0), f"the gradient of {name} is all zero")
