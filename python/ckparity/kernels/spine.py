"""The records, in the order the suites run them, and the views of them
that the layers above index (the registry of backends is registry.py)."""

from __future__ import annotations

from typing import Callable

from .. import cpu
from . import (adamw, attention, clip_grad_norm, cross_entropy, embedding, gelu, layer_norm, linear, residual, rms_norm,
               rope, swiglu)
from .record import Claim, Kernel

KERNELS: dict[str, Kernel] = {k.name: k for k in (cross_entropy.KERNEL, rms_norm.KERNEL, swiglu.KERNEL, rope.KERNEL,
                                                  adamw.KERNEL, clip_grad_norm.KERNEL, embedding.KERNEL, linear.KERNEL,
                                                  attention.KERNEL, residual.KERNEL, gelu.KERNEL,
                                                  layer_norm.KERNEL)}
SLOTS: dict[str, str] = {k.slot: name for name, k in KERNELS.items() if k.slot}  # the twins' op -> its kernel

FLAGS: dict[str, str] = {k.flag: name for name, k in KERNELS.items()}  # RunConfig field -> kernel
HEAD_LOSS = cross_entropy.HEAD_LOSS  # the lm_head + loss backends (--ck-loss-backend c_fused_linear)


def backends(kernel: str) -> dict[str, Callable]:
    """The live registry of ``kernel``'s backends (name -> callable)."""
    return KERNELS[kernel].backends


def claims(dtype: str | None = None) -> list[Claim]:
    """Every record's bit-identity claims (of ``dtype``, if given), in KERNELS' order."""
    return [c for k in KERNELS.values() for c in k.claims if dtype is None or c.dtype == dtype]


def claim_key(kernel: str, backend: str) -> str:
    """The claim key a backend of ckparity's runs under: ``c`` the kernel's (``rms_norm``), ``c_<variant>``
    the variant's (``cross_entropy.ptref``, ``adamw.fused``)."""
    return kernel if backend == "c" else f"{kernel}.{backend.removeprefix('c_')}"


def bit_identical(dtype: str = "float32") -> dict[str, list[str]]:
    """What is bit-identical to torch in this process, in ``dtype``: each
    claim key's quantities, where the library follows torch's capability and
    the claim covers it; nothing where it does not (ckparity.cpu)."""
    if not cpu.matched():
        return {}
    capability = cpu.torch_capability()
    return {c.key: list(c.quantities) for c in claims(dtype)
            if capability in c.capabilities and c.reason_not_here() is None}


def not_bit_identical() -> dict[str, str]:
    """What is not bit-identical at any capability, and why."""
    return {what: why for k in KERNELS.values() for what, why in k.not_claimed.items()}


def table() -> str:
    """The records as a Markdown table: one row a kernel (docs/kernels.md)."""
    rows = ["| kernel | flag | ckparity's backends | bit-identical to torch (dtype: capabilities) "
            "| not bit-identical |",
            "|---|---|---|---|---|"]
    for k in KERNELS.values():
        flag = "--" + k.flag.replace("_", "-")
        claims = "; ".join(f"`{c.key}`: {', '.join(c.quantities)} ({c.dtype}: {', '.join(c.capabilities)}"
                           f"{'; ' + c.condition if c.condition else ''})" for c in k.claims) or "-"
        not_claimed = "; ".join(f"{what}: {why}" for what, why in k.not_claimed.items()) or "-"
        rows.append(f"| `{k.name}` | `{flag}` | {', '.join(k.builtin)} | {claims} | {not_claimed} |")
    return "\n".join(rows)
