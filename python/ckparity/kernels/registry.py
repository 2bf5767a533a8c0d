"""Other people's kernels: backends registered by name into a kernel's record.

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
spell it (a record's ``spellings``: ``rmsnorm``, ``loss``, ``optimizer``,
``clip``).

Every registration runs the slot's contract check (the record's
``contract``; docs/plugins.md): a backend that breaks its contract is
refused with the reason, before any run -- never compared as 0. In
``ckparity check``'s child the check is deferred (``deferred_contracts``):
there it is the suite's first property, so a backend that crashes in it is
a verdict with a report, not a dead command.

A registration remembers where it came from (``Registration.origin``): the
plugin being loaded, the module whose import registered it, or a module
attribute that holds the callable -- what a fresh process needs to register
it again (check's child does; kernels.carried).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from .spine import KERNELS
from .contract import ContractError
from .record import Registration

ENV = "CKP_PLUGINS"
ENTRY_POINT_GROUP = "ckparity.backends"


def slot(kernel: str) -> str:
    """ckparity's name of the slot ``kernel`` names (either spelling)."""
    for record in KERNELS.values():
        if kernel == record.name or kernel in record.spellings:
            return record.name
    spellings = sorted({s for r in KERNELS.values() for s in (r.name, *r.spellings)})
    raise ValueError(f"no kernel slot {kernel!r}; slots: {', '.join(spellings)}")


def register(kernel: str, name: str, fn: Callable) -> None:
    """Adds (or replaces) a backend of ``kernel`` without a contract check:
    for planted faults in tests and gates (``register("cross_entropy",
    "fault", f)``: ``--ck-loss-backend fault``)."""
    KERNELS[slot(kernel)].backends[name] = fn


_deferred = False  # True in check's child: contracts run as the suite's first property


def deferred_contracts() -> None:
    """From now on in this process, registrations skip the contract check
    (``ckparity check``'s child: the check runs it as a property)."""
    global _deferred
    _deferred = True


def register_backend(kernel: str, name: str, fn: Callable, *, check: bool = True,
                     unsupported: tuple[str, ...] | list[str] | None = None) -> None:
    """Makes ``fn`` the backend ``name`` of the slot ``kernel``, after the
    slot's contract check (``check=False`` skips it: for planted faults that
    break the contract on purpose). ``unsupported`` names the slot's options
    (its record's ``options()``, e.g. ``label_smoothing``) the backend
    refuses by design: ``ckparity check`` reports them ``not supported``
    instead of running them, and a run that needs one is refused before it
    starts (default: what ``fn`` declares as ``ckparity_unsupported``, as
    ``ckparity.plugin.cross_entropy(..., label_smoothing=False)`` does).
    ckparity's own backends cannot be replaced; registering the same name
    again replaces the user's."""
    record = KERNELS[slot(kernel)]
    kernel = record.name
    if not isinstance(name, str) or not name or name.strip() != name:
        raise ValueError(f"a backend name must be a non-empty string without surrounding spaces, got {name!r}")
    if name in record.builtin:
        raise ValueError(f"{name!r} is ckparity's own {kernel} backend; give yours another name")
    if not callable(fn):
        raise TypeError(f"the {kernel} backend {name!r} must be callable, got {type(fn).__name__}")
    if unsupported is None:
        unsupported = tuple(getattr(fn, "ckparity_unsupported", ()))
    if isinstance(unsupported, str) or not set(unsupported) <= set(record.options()):
        raise ValueError(f"unsupported={unsupported!r}: the {kernel} slot's options are "
                         f"{list(record.options()) or 'none'}")
    checked = check and not _deferred
    if checked:
        try:
            record.contract(fn)
        except ContractError as err:
            raise ContractError(f"the {kernel} backend {name!r} breaks its contract: {err} "
                                "(docs/plugins.md)") from None
        except Exception as err:  # noqa: BLE001 -- whatever the user's code raises, say where
            raise ContractError(f"the {kernel} backend {name!r} raised in its contract check: "
                                f"{type(err).__name__}: {err} (docs/plugins.md)") from err
    record.backends[name] = fn
    record.registrations[name] = Registration(frozenset(unsupported), _origin(fn), checked or not check)


def _origin(fn: Callable) -> str | None:
    """What registers ``fn`` again in a fresh process: the plugin being
    loaded; else the module whose import is registering it; else a module
    attribute holding ``fn`` (in its own module or a caller's). None for a
    callable only this process can reach (made in a function, or in
    __main__)."""
    if _loading:
        return _loading[-1]
    callers, frame = [], sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("ckparity.") and module != "ckparity":
            if frame.f_code.co_name == "<module>" and module in sys.modules and module != "__main__":
                return module  # its import registers fn
            callers.append(module)
        frame = frame.f_back
    for module in dict.fromkeys([getattr(fn, "__module__", None), *callers]):
        if module and module != "__main__" and module in sys.modules:
            attr = next((a for a, v in vars(sys.modules[module]).items() if v is fn), None)
            if attr is not None:
                return f"{module}:{attr}"
    return None


def carried(kernel: str, name: str) -> dict | None:
    """What a fresh process loads to have the backend ``name`` of ``kernel``
    as this one has it ({"plugins": [...], "attrs": [...]}, for
    ``load_carried``; empty where every process has it: ckparity's own, a
    CKP_PLUGINS or entry-point plugin's), or None where nothing can: a
    callable made in a function or in __main__, or one put in the registry
    without a registration (``register``: the tests' planted faults)."""
    record = KERNELS[slot(kernel)]
    if name in record.builtin:
        return {"plugins": [], "attrs": []}
    registration = record.registrations.get(name)
    if registration is None:
        return None if name in record.backends else {"plugins": [], "attrs": []}  # unknown: the child says so
    origin = registration.origin
    if origin is None:
        return None
    if origin.startswith("entry point ") or origin in os.environ.get(ENV, "").split(os.pathsep):
        return {"plugins": [], "attrs": []}
    if ":" in origin and not origin.endswith(".py"):
        return {"plugins": [], "attrs": [[record.name, name, origin, sorted(registration.unsupported)]]}
    return {"plugins": [origin], "attrs": []}


def carried_together(pairs) -> dict | None:
    """``carried`` of every (kernel, backend name) pair, merged; None where one of them no fresh process
    can have."""
    merged = {"plugins": [], "attrs": []}
    for kernel, name in pairs:
        carry = carried(kernel, name)
        if carry is None:
            return None
        for key in merged:
            merged[key] += [item for item in carry[key] if item not in merged[key]]
    return merged


def load_carried(carry: dict) -> None:
    """In a fresh process: the plugins and module attributes ``carried`` named."""
    for spec in carry["plugins"]:
        load_plugin(spec)
    for kernel, name, origin, unsupported in carry["attrs"]:
        if name not in KERNELS[kernel].backends:
            module, _, attr = origin.partition(":")
            fn = None

            def get(module=module, attr=attr):
                nonlocal fn
                fn = getattr(importlib.import_module(module), attr)
            _importing(f"{origin} (where the {kernel} backend {name!r} was registered)", get)
            register_backend(kernel, name, fn, unsupported=unsupported)


def child_env(carry: dict) -> dict:
    """The environment of a child that loads ``carry``: this process's
    sys.path first, so the modules that registered the backends are found
    where they were found here."""
    env = dict(os.environ)
    if carry["plugins"] or carry["attrs"]:
        path = [p for p in sys.path if p and os.path.isdir(p)]
        env["PYTHONPATH"] = os.pathsep.join(path + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def registered(kernel: str) -> list[str]:
    return sorted(KERNELS[slot(kernel)].backends)


def unknown_backend_message(kernel: str, name: str) -> str:
    return (f"no {kernel} backend {name!r}; registered: {', '.join(registered(kernel))}. Register one with "
            f"ckparity.register_backend({kernel!r}, NAME, fn) in a module loaded by --plugin, or name it as "
            "module:attr")


def resolve(kernel: str, name: str) -> None:
    """Makes sure the backend ``name`` of ``kernel`` exists: a ``module:attr``
    name is imported and registered on first use; an unknown name raises
    ValueError with what is registered and how to register one."""
    kernel = slot(kernel)
    if name in KERNELS[kernel].backends:
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


# ---- loading plugins ------------------------------------------------------------

_loaded: list[str] = []
_loading: list[str] = []  # the plugins being imported, innermost last: the origin of what they register


def load_plugin(spec: str) -> None:
    """Imports a plugin: a path to a .py file, or a module name. Once per process."""
    key = str(Path(spec).resolve()) if spec.endswith(".py") else spec
    if key in _loaded:
        return
    if spec.endswith(".py") and not Path(spec).is_file():
        raise ValueError(f"--plugin {spec}: no such file")
    _loading.append(key)
    try:
        _importing(f"--plugin {spec}", lambda: _import(spec))
    finally:
        _loading.pop()
    _loaded.append(key)


def _import(spec: str) -> None:
    if spec.endswith(".py"):
        path = Path(spec)
        module_name = f"ckparity_plugin_{len(_loaded)}_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        loader_spec.loader.exec_module(module)
    else:
        importlib.import_module(spec)


def _importing(what: str, load) -> None:
    """load() -- a user's code at import -- with whatever it raises, sys.exit
    included, said as a ValueError naming ``what`` (the command's exit 2)."""
    try:
        load()
    except KeyboardInterrupt:
        raise
    except ValueError as err:
        raise ValueError(f"{what}: {err}") from None
    except (Exception, SystemExit) as err:  # noqa: BLE001 -- a plugin's failure is an input error, named
        detail = f"sys.exit({err.code!r})" if isinstance(err, SystemExit) else f"{type(err).__name__}: {err}"
        raise ValueError(f"{what} failed to load: {detail}") from None


def probe_plugins(specs: list[str]) -> None:
    """Loads ``specs`` in a child process first: a plugin whose import, or a backend's contract check at its
    registration, kills its process (a segfault or an abort in a user's C) is refused by name with the
    child's last words (its Python stack, by faulthandler), instead of killing the command before it can
    say or write anything. Any other failure is left to the load here, which says it as usual."""
    if not specs:
        return
    code = "import ckparity.kernels.registry as r; [r.load_plugin(s) for s in __import__('sys').argv[1:]]"
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code, *specs], capture_output=True, text=True)
    if done.returncode < 0:
        # faulthandler's stack, most recent call first: the frames name the plugin's crashing function
        frames = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("File ")]
        words = " | ".join(frames[:4]) or done.stderr.strip()[-500:]
        raise ValueError(f"--plugin {' '.join(specs)}: loading it killed the process "
                         f"({signal.Signals(-done.returncode).name}): a crash in its import or in a backend's "
                         f"contract check, which would have killed this command; nothing was run. Where: "
                         f"{words}")


def use_plugins(specs: list[str], load: bool = True) -> None:
    """Loads ``specs`` here (unless not ``load``: ckparity check loads them
    in its child only) and puts them in CKP_PLUGINS for every process this
    one starts."""
    for spec in specs if load else ():
        load_plugin(spec)
    for spec in specs:
        if spec.endswith(".py") and not Path(spec).is_file():
            raise ValueError(f"--plugin {spec}: no such file")
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
            _loading.append(f"entry point {entry.value}")  # a fresh process loads entry points itself
            try:
                _importing(f"the {ENTRY_POINT_GROUP} entry point {entry.name} ({entry.value})",
                           lambda e=entry: e.load()())
            finally:
                _loading.pop()
            _loaded.append(entry.value)
