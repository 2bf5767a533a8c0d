"""Other people's kernels in ckparity: backends registered by name.

A backend is a named implementation of one slot of the CK twin (a kernel):
ckparity's own ("c", "c_ptref", "torch"), or one a user registers:

    # my_kernels.py, loaded with `ckparity train --plugin my_kernels.py ...`
    import ckparity
    ckparity.register_backend("swiglu", "mine", my_swiglu)

    ckparity train --plugin my_kernels.py --ck-swiglu-backend mine

Ways in, all ending in ``register_backend``: a ``--plugin MODULE_OR_FILE.py``
flag (any command, repeatable), the ``CKP_PLUGINS`` environment variable
(paths or modules separated by ``os.pathsep``; ``--plugin`` adds to it, so
every process ckparity starts -- attribute's jobs, --tp/--dp ranks, gate
and mutate children -- loads the same plugins), installed packages'
``ckparity.backends`` entry points (each names a function that registers),
and a backend flag given as ``module:attr`` (registered under that spec on
first use). A slot is named as ckparity names its kernel or as the flags
spell it (``rms_norm``/``rmsnorm``, ``cross_entropy``/``loss``,
``adamw``/``optimizer``, ``clip_grad_norm``/``clip``, ``swiglu``, ``rope``).

Every registration runs the slot's contract check (docs/plugins.md): a small
call with the shapes and dtypes the harness uses, its output's shape and
dtype, a gradient for each differentiable input, an optimizer's state under
torch's names. A backend that breaks its contract is refused with the
reason, before any run -- never compared as 0.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from pathlib import Path
from typing import Callable

import torch

from .harness import backends

ENV = "CKP_PLUGINS"
ENTRY_POINT_GROUP = "ckparity.backends"

# the slot's name as ckparity names its kernel, and as the backend flags spell it
ALIASES = {"rmsnorm": "rms_norm", "loss": "cross_entropy", "optimizer": "adamw", "clip": "clip_grad_norm"}


class ContractError(ValueError):
    """A backend that does not keep its slot's contract (docs/plugins.md)."""


def slot(kernel: str) -> str:
    """ckparity's name of the slot ``kernel`` names (either spelling)."""
    name = ALIASES.get(kernel, kernel)
    if name not in backends.BACKENDS:
        spellings = sorted(set(backends.BACKENDS) | set(ALIASES))
        raise ValueError(f"no kernel slot {kernel!r}; slots: {', '.join(spellings)}")
    return name


def register_backend(kernel: str, name: str, fn: Callable, *, check: bool = True) -> None:
    """Makes ``fn`` the backend ``name`` of the slot ``kernel``, after the
    slot's contract check (``check=False`` skips it: for planted faults that
    break the contract on purpose). ckparity's own backends cannot be
    replaced; registering the same name again replaces the user's."""
    kernel = slot(kernel)
    if not isinstance(name, str) or not name or name.strip() != name:
        raise ValueError(f"a backend name must be a non-empty string without surrounding spaces, got {name!r}")
    if name in backends.BUILTIN[kernel]:
        raise ValueError(f"{name!r} is ckparity's own {kernel} backend; give yours another name")
    if not callable(fn):
        raise TypeError(f"the {kernel} backend {name!r} must be callable, got {type(fn).__name__}")
    if check:
        try:
            CONTRACTS[kernel](fn)
        except ContractError as err:
            raise ContractError(f"the {kernel} backend {name!r} breaks its contract: {err} "
                                "(docs/plugins.md)") from None
        except Exception as err:  # noqa: BLE001 -- whatever the user's code raises, say where
            raise ContractError(f"the {kernel} backend {name!r} raised in its contract check: "
                                f"{type(err).__name__}: {err} (docs/plugins.md)") from err
    backends.register(kernel, name, fn)


def registered(kernel: str) -> list[str]:
    return sorted(backends.BACKENDS[slot(kernel)])


def unknown_backend_message(kernel: str, name: str) -> str:
    return (f"no {kernel} backend {name!r}; registered: {', '.join(registered(kernel))}. Register one with "
            f"ckparity.register_backend({kernel!r}, NAME, fn) in a module loaded by --plugin, or name it as "
            "module:attr")


def resolve(kernel: str, name: str) -> None:
    """Makes sure the backend ``name`` of ``kernel`` exists: a ``module:attr``
    name is imported and registered on first use; an unknown name raises
    ValueError with what is registered and how to register one."""
    kernel = slot(kernel)
    if name in backends.BACKENDS[kernel]:
        return
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"cannot load the {kernel} backend {name!r}: {type(err).__name__}: {err}") from None
        register_backend(kernel, name, fn)
        return
    raise ValueError(unknown_backend_message(kernel, name))


# ---- loading ----------------------------------------------------------------

_loaded: list[str] = []


def load_plugin(spec: str) -> None:
    """Imports a plugin: a path to a .py file, or a module name. Once per process."""
    key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
    if key in _loaded:
        return
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"--plugin {spec}: no such file")
        module_name = f"ckparity_plugin_{len(_loaded)}_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        loader_spec.loader.exec_module(module)
    else:
        try:
            importlib.import_module(spec)
        except ImportError as err:
            raise ValueError(f"--plugin {spec}: {err}") from None
    _loaded.append(key)


def use_plugins(specs: list[str]) -> None:
    """Loads ``specs`` here and puts them in CKP_PLUGINS for every process this one starts."""
    for spec in specs:
        load_plugin(spec)
    keys = [k for k in os.environ.get(ENV, "").split(os.pathsep) if k]
    for spec in specs:
        key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
        if key not in keys:
            keys.append(key)
    os.environ[ENV] = os.pathsep.join(keys)


def load_configured() -> None:
    """The plugins of CKP_PLUGINS and of installed packages' entry points."""
    for spec in [k for k in os.environ.get(ENV, "").split(os.pathsep) if k]:
        load_plugin(spec)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.value not in _loaded:
            entry.load()()
            _loaded.append(entry.value)


# ---- the contracts (docs/plugins.md) ------------------------------------------

def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise ContractError(what)


def _tensor_like(out, shape, what: str) -> None:
    _expect(isinstance(out, torch.Tensor), f"{what} must be a tensor, got {type(out).__name__}")
    _expect(tuple(out.shape) == tuple(shape), f"{what} must have shape {tuple(shape)}, got {tuple(out.shape)}")
    _expect(out.dtype == torch.float32, f"{what} must be float32, got {out.dtype}")
    _expect(bool(torch.isfinite(out).all()), f"{what} has non-finite values on finite input")


def _grads_present(leaves: dict[str, torch.Tensor]) -> None:
    for name, leaf in leaves.items():
        _expect(leaf.grad is not None, f"backward gives no gradient for {name}")
        _tensor_like(leaf.grad, leaf.shape, f"the gradient of {name}")
        _expect(bool(leaf.grad.abs().sum() > 0), f"the gradient of {name} is all zero")


def _check_rms_norm(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g).requires_grad_(True)
    w = torch.randn(10, generator=g).requires_grad_(True)
    y = fn(x, (10,), w, 1e-5)
    _tensor_like(y, (6, 10), "rms_norm(x (6, 10), (10,), weight, eps)")
    y.backward(torch.randn(6, 10, generator=g))
    _grads_present({"x": x, "weight": w})


def _check_swiglu(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 2, 12, generator=g).requires_grad_(True)
    y = fn(x)
    _tensor_like(y, (5, 2, 6), "swiglu(x (5, 2, 12))")
    y.backward(torch.randn(5, 2, 6, generator=g))
    _grads_present({"x": x})


def _check_cross_entropy(fn) -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 11, generator=g).requires_grad_(True)
    targets = torch.randint(0, 11, (7,), generator=g)
    loss = fn(logits, targets)
    _tensor_like(loss, (), "the loss of logits (7, 11), targets (7) (the mean over rows)")
    reference = torch.nn.functional.cross_entropy(logits.detach(), targets)
    value = float(loss.detach())
    _expect(abs(value - float(reference)) <= 1e-3 * max(1.0, abs(float(reference))),
            f"the loss {value:.6g} is not the mean cross-entropy {float(reference):.6g}")
    loss.backward()
    _grads_present({"logits": logits})


def _check_rope(fn) -> None:
    g = torch.Generator().manual_seed(0)
    leaf = torch.randn(2, 5, 3, 8, generator=g).requires_grad_(True)
    angles = torch.rand(5, 4, generator=g)
    # (B, heads, T, d) as a transposed view of (B, T, heads, d), not contiguous, as the harness passes it
    y = fn(leaf.transpose(1, 2), angles.cos(), angles.sin())
    _tensor_like(y, (2, 3, 5, 8), "rope(q (2, 3, 5, 8), cos (5, 4), sin (5, 4))")
    y.backward(torch.randn(y.shape, generator=g))
    _grads_present({"q": leaf})


def _check_adamw(factory) -> None:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(9, generator=g)), torch.nn.Parameter(torch.randn(2, 3, generator=g))]
    optimizer = factory(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    _expect(isinstance(optimizer, torch.optim.Optimizer),
            f"the factory must return a torch.optim.Optimizer, got {type(optimizer).__name__}")
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    optimizer.step()
    _expect(all(not torch.equal(a, p.detach()) for a, p in zip(before, params)), "step() left a parameter unchanged")
    for p in params:
        state = optimizer.state.get(p, {})
        for name in ("step", "exp_avg", "exp_avg_sq"):
            _expect(name in state, f"the optimizer keeps no state[{name!r}] (torch.optim.AdamW's names: step, "
                                   f"exp_avg, exp_avg_sq); the harness compares the moments under these names")
        for name in ("exp_avg", "exp_avg_sq"):
            _tensor_like(state[name], p.shape, f"state[{name!r}]")
    saved = optimizer.state_dict()
    _expect({"state", "param_groups"} <= set(saved), "state_dict() must hold 'state' and 'param_groups'")


def _check_clip_grad_norm(fn) -> None:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(9, generator=g))]
    params[0].grad = torch.randn(9, generator=g) * 10
    total = fn(params, 1.0)
    _expect(isinstance(total, torch.Tensor) and total.numel() == 1, "clip_grad_norm_ must return the total norm")
    _expect(bool(params[0].grad.norm() <= 1.0 + 1e-4), "the gradients were not clipped to max_norm")


CONTRACTS: dict[str, Callable] = {"rms_norm": _check_rms_norm, "swiglu": _check_swiglu,
                                  "cross_entropy": _check_cross_entropy, "rope": _check_rope, "adamw": _check_adamw,
                                  "clip_grad_norm": _check_clip_grad_norm}
