"""--checkpoint-every N [--checkpoint-dir D] and --resume D: a run that goes
on where it stopped, bit for bit.

A checkpoint, written after step N, 2N, ... and after the step a SIGTERM,
SIGINT or SIGHUP arrived in (with checkpoints on, a signal is acted on at the
end of the step, so that the state written is a whole step's), holds all the
run needs to go on: both twins (weights, optimizer state, lr scheduler),
the float64 shadow's twin and the envelope's members with their noise
generators, every observer's state (the series, first-fail steps, the
divergence tracer, the localization, spike history, rank agreement), the RNG
states of torch, numpy and python, the step reached and the config. The data
cursor is the step: the batches are a function of the config and the step.

Format: a directory ``D/step-<N>/`` with ``checkpoint.json`` (schema
ckparity.checkpoint/1: the step, the config, the state with each tensor named
by its key) and ``tensors.safetensors``; ``D/latest`` names the newest. A
checkpoint is written into a temporary directory, renamed into place, and
only then is ``latest`` replaced (os.replace): a kill during a write leaves
the previous checkpoint whole. Older checkpoints are removed after.

With --tp/--dp each rank writes its own state (its shards, its twins, its
RNGs) under ``D/rank-<r>/``, the same way, with a barrier between writing
and naming ``latest`` and another before removing the older ones: a kill at
any point leaves a step every rank still holds, and a resume takes the
newest such step (the ranks agree on it before loading). All ranks stop
after the same step when any of them is signalled (ranks.agreed_signal).

Resume: ``ckparity train --resume D`` takes the checkpoint's config; only the
flags in RESUME_MAY_CHANGE may differ (a longer --max-steps, another report
path), any other flag given with another value is refused by name. The
resumed run's report equals the uninterrupted run's except timings and those
flags (tests/test_checkpoint.py).

What each observer carries is its class's STATE tuple of attribute names;
a Twin, a torch.Generator and a list of them are restored in place.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import re
import shutil
import tempfile
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import torch

from ..basics.config import RunConfig, UsageError
from ..twins.ranked import SINGLE, Ranks, agreed_min, barrier
from ..twins.stepper import Twin
from ..basics.report import TEMP_PREFIX, fsync, write_new
from .directory import fsync_tree, sha256

SCHEMA = "ckparity.checkpoint/1"
# [Note: a manifest's config version]
# A manifest's config holds every RunConfig field. A key it lacks is refused by name (a hand-edited or
# truncated manifest would otherwise resume with a default the run never had), unless the manifest's
# config_version says the field did not exist yet when it was written: then its absence means the default,
# which is what that ckparity did. CONFIG_ADDED: each field added since version 1, with its version.
CONFIG_VERSION = 2
CONFIG_ADDED = {"torch_threads": 2}
RESUME_MAY_CHANGE = ("max_steps", "json_out", "no_progress", "checkpoint_every", "checkpoint_dir", "resume")
DEFAULT_DIR = "reports/checkpoint"


# ---- what is saved: state_of / load_state ------------------------------------

def state_of(obj):
    """The saveable state of a run's component (plain data and tensors)."""
    if isinstance(obj, Twin):
        return {"model": obj.model.state_dict(), "optimizer": obj.optimizer.state_dict(),
                "scheduler": obj.scheduler.state_dict() if obj.scheduler is not None else None}
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    if isinstance(obj, (list, tuple)) and any(isinstance(x, (Twin, torch.Generator, list, tuple)) or
                                              hasattr(type(x), "STATE") for x in obj):
        return [state_of(x) for x in obj]
    if hasattr(type(obj), "STATE"):
        return {name: state_of(getattr(obj, name)) for name in type(obj).STATE}
    return obj


def load_state(obj, state):
    """Restores ``state`` into ``obj`` (in place where it is a Twin, a
    Generator, a list of those or an observer); returns the value to keep."""
    if isinstance(obj, Twin):
        obj.model.load_state_dict(state["model"])
        obj.optimizer.load_state_dict(state["optimizer"])
        if obj.scheduler is not None:
            obj.scheduler.load_state_dict(state["scheduler"])
        return obj
    if isinstance(obj, torch.Generator):
        obj.set_state(state)
        return obj
    if isinstance(obj, (list, tuple)) and isinstance(state, list) and len(obj) == len(state) and \
            any(isinstance(x, (Twin, torch.Generator, list, tuple)) or hasattr(type(x), "STATE") for x in obj):
        return type(obj)(load_state(x, s) for x, s in zip(obj, state))
    if hasattr(type(obj), "STATE"):
        for name in type(obj).STATE:
            setattr(obj, name, load_state(getattr(obj, name), state[name]))
        return obj
    return state


# ---- how it is written: JSON with tensors by key --------------------------------

def pack(value, key: str, tensors: dict):
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach()  # as it is: unshare() copies what safetensors cannot write so
        return {"__tensor__": key}
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [pack(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
        return items if isinstance(value, list) else {"__tuple__": items}
    if isinstance(value, dict):
        return {"__dict__": [[pack(k, f"{key}.k{i}", tensors), pack(v, f"{key}.{k}", tensors)]
                             for i, (k, v) in enumerate(value.items())]}
    raise TypeError(f"cannot checkpoint {key}: a {type(value).__name__}")


def unshare(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors as safetensors writes them: a copy of each that shares its
    storage with one before it (tied weights) or is not contiguous; the others
    as they are (a copy of every tensor cost a checkpoint as much as its write)."""
    seen: set[int] = set()
    out = {}
    for key, t in tensors.items():
        storage = t.untyped_storage()
        whole = t.is_contiguous() and not t.storage_offset() and t.numel() * t.element_size() == storage.nbytes()
        if storage.data_ptr() in seen or not whole:
            out[key] = t.clone().contiguous()
        else:
            out[key] = t
            seen.add(storage.data_ptr())
    return out


def unpack(value, tensors: dict):
    if isinstance(value, list):
        return [unpack(v, tensors) for v in value]
    if isinstance(value, dict):
        if "__tensor__" in value:
            return tensors[value["__tensor__"]]
        if "__float__" in value:
            return float(value["__float__"])
        if "__tuple__" in value:
            return tuple(unpack(v, tensors) for v in value["__tuple__"])
        return {unpack(k, tensors): unpack(v, tensors) for k, v in value["__dict__"]}
    return value


def _rng_state() -> dict:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                      gauss],
            "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def _root(directory: str, ranks: Ranks) -> Path:
    return Path(directory) / f"rank-{ranks.rank}" if ranks.world_size > 1 else Path(directory)


def inputs(config: RunConfig) -> dict:
    """The files a run draws from, by their SHA-256: a resume on changed data is refused."""
    return {"train_text": _file_digest(config.train_text, os.stat(config.train_text).st_mtime_ns)} \
        if config.train_text else {}


@functools.lru_cache(maxsize=4)
def _file_digest(path: str, mtime_ns: int) -> str:
    return sha256(Path(path))


def environment(config: RunConfig) -> dict:
    """What a bit-for-bit resume needs unchanged: the versions, the CPU
    capability, and torch's thread count (its sums of 32768 elements or more
    are split by it, and ptref and rms_norm follow the split)."""
    import ckparity

    return {"ckparity": ckparity.__version__, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": config.torch_threads or config.threads or torch.get_num_threads()}


def _is_step(name: str) -> bool:
    return bool(re.fullmatch(r"step-\d{9}", name))


def save(directory: str, step: int, config: RunConfig, components: dict, ranks: Ranks = SINGLE) -> Path:
    """Writes the checkpoint of the end of ``step`` (atomically, fsynced) and returns its directory."""
    from safetensors.torch import save_file

    root = _root(directory, ranks)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(TEMP_PREFIX + "*"):  # a killed write's: only this rank writes here
        shutil.rmtree(leftover) if leftover.is_dir() and not leftover.is_symlink() else leftover.unlink()
    tensors: dict[str, torch.Tensor] = {}
    state = pack({"components": {name: state_of(c) for name, c in components.items()}, "rng": _rng_state()},
                  "state", tensors)
    staging = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=root))
    try:
        save_file(unshare(tensors), str(staging / "tensors.safetensors"))
        manifest = {"schema": SCHEMA, "step": step, "config_version": CONFIG_VERSION, "config": config.to_dict(),
                    "environment": environment(config),
                    "inputs": inputs(config), "tensors_sha256": sha256(staging / "tensors.safetensors"), "state": state}
        (staging / "checkpoint.json").write_text(json.dumps(manifest))
        fsync_tree(staging)  # the data on disk before any name points at it
        final = root / f"step-{step:09d}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        fsync(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    barrier(ranks)  # every rank holds step N before any names it latest
    write_new(root / "latest", final.name)
    barrier(ranks)  # every rank names step N before any removes the step before
    for old in root.iterdir():
        if _is_step(old.name) and old != final and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    return final


def _latest(directory: str, ranks: Ranks | None = None) -> Path:
    """The latest checkpoint of ``directory`` (of rank 0's, by default, in a --tp/--dp one)."""
    root = Path(directory)
    if ranks is not None:
        root = _root(directory, ranks)
    elif not (root / "latest").is_file() and (root / "rank-0" / "latest").is_file():
        root = root / "rank-0"
    if not (root / "latest").is_file():
        raise UsageError(f"--resume {directory}: no checkpoint there (no 'latest' file)")
    name = (root / "latest").read_text(errors="replace").strip()
    if not _is_step(name):  # never a path out of the directory
        raise UsageError(f"--resume {directory}: 'latest' names {name[:80]!r}, not a step of this directory")
    path = root / name
    if not (path / "checkpoint.json").is_file():
        raise UsageError(f"--resume {directory}: 'latest' names {path.name}, which is not a checkpoint")
    return path


def _manifest(path: Path, what: str) -> dict:
    """The checkpoint's manifest, checked: JSON, schema, its step that of its directory, a known config."""
    file = path / "checkpoint.json"
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{what}: {file} is not a readable checkpoint manifest ({type(err).__name__}: "
                         f"{str(err)[:120]})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        schema = manifest.get("schema") if isinstance(manifest, dict) else None
        raise UsageError(f"{what}: {file}: schema {schema!r}, expected {SCHEMA}")
    missing = [k for k in ("step", "config", "state") if k not in manifest]
    if missing:
        raise UsageError(f"{what}: {file} lacks {', '.join(missing)}")
    step = manifest["step"]
    if not isinstance(step, int) or f"step-{step:09d}" != path.name:
        raise UsageError(f"{what}: {file} says step {manifest['step']!r}, its directory is {path.name}")
    unknown = sorted(set(manifest["config"]) - {f.name for f in fields(RunConfig)}) \
        if isinstance(manifest["config"], dict) else ["(not a mapping)"]
    if unknown:
        raise UsageError(f"{what}: {file}: config keys this ckparity does not know: {', '.join(unknown)}")
    version = manifest.get("config_version", 1)  # the manifests before config_version: 1
    if not isinstance(version, int) or not 1 <= version <= CONFIG_VERSION:
        raise UsageError(f"{what}: {file}: config_version {version!r}, this ckparity writes 1..{CONFIG_VERSION}")
    absent = [f.name for f in fields(RunConfig) if f.name not in manifest["config"]]
    lacking = [name for name in absent if CONFIG_ADDED.get(name, 1) <= version]
    if lacking:
        raise UsageError(f"{what}: {file}: its config lacks {', '.join(lacking)} (a config of version {version} "
                         "holds every field; a resume will not guess a value the run may not have had)")
    manifest["config"].update({name: RunConfig.__dataclass_fields__[name].default for name in absent})
    kinds = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,), "str | None": (str, type(None))}
    for f in fields(RunConfig):
        value = manifest["config"][f.name]
        if not isinstance(value, kinds[f.type]) or (isinstance(value, bool) and f.type != "bool"):
            raise UsageError(f"{what}: {file}: config {f.name} = {value!r} is not a {f.type}")
    return manifest


def _state(path: Path, manifest: dict) -> dict:
    """The checkpoint's state, its tensors checked against the manifest's checksum first: a flipped
    byte is an input error naming the file, never a parity failure blamed on a kernel."""
    from safetensors.torch import load_file

    file = path / "tensors.safetensors"
    if not file.is_file():
        raise UsageError(f"{path}: no tensors.safetensors")
    expected = manifest.get("tensors_sha256")
    if expected is not None and sha256(file) != expected:
        raise UsageError(f"{file}: its SHA-256 is not the one its checkpoint.json recorded (the file changed "
                         "after it was written: bit rot, a partial copy, an edit)")
    try:
        tensors = load_file(str(file))
        return unpack(manifest["state"], tensors)
    except Exception as err:  # noqa: BLE001 -- safetensors' errors, a missing key: the file, not the run
        raise UsageError(f"{file}: not the tensors of {path / 'checkpoint.json'} ({type(err).__name__}: "
                         f"{str(err)[:120]})") from None


def resume_config(given: RunConfig, flags: frozenset[str] | None = None) -> RunConfig:
    """The checkpoint's config, with the flags that may change taken from ``given``
    where they were given; another flag given with a value other than the
    checkpoint's is refused by name. ``flags``: the RunConfig fields given on
    the command line (whatever their values; basics.config.given_fields); None
    where only the values are known (a rank re-reading its launcher's config):
    a value other than the default counts as given. A checkpoint written by
    another ckparity or torch, or at another CPU capability, is refused: a
    resume could not repeat the uninterrupted run's bits."""
    path = _latest(given.resume)
    manifest = _manifest(path, f"--resume {given.resume}")
    saved = manifest["config"]

    def was_given(f) -> bool:
        return f.name in flags if flags is not None else getattr(given, f.name) != f.default

    may_change = ", ".join("--" + n.replace("_", "-") for n in RESUME_MAY_CHANGE)
    for f in fields(RunConfig):
        value = getattr(given, f.name)
        if f.name not in RESUME_MAY_CHANGE and was_given(f) and value != saved[f.name]:
            raise UsageError(f"--resume: --{f.name.replace('_', '-')} {value!r} differs from the checkpoint's "
                             f"{saved[f.name]!r}; only {may_change} may change")
    try:
        checkpointed = RunConfig(**{**saved, "overwrite_checkpoints": False})
    except UsageError as err:
        raise UsageError(f"--resume {given.resume}: {path / 'checkpoint.json'}: its config: {err}") from None
    now, then = environment(checkpointed), manifest.get("environment")
    if then is not None and now != then:
        changed = ", ".join(f"{k} {then.get(k)!r} then, {now[k]!r} now" for k in now if then.get(k) != now[k])
        raise UsageError(f"--resume {given.resume}: {path} was written by another environment ({changed}); a resume "
                         "there would not repeat the uninterrupted run's bits")
    try:
        now_inputs = inputs(checkpointed)
    except OSError as err:
        raise UsageError(f"--resume {given.resume}: cannot read the run's --train-text: {err}") from None
    if "inputs" in manifest and now_inputs != manifest["inputs"]:
        raise UsageError(f"--resume {given.resume}: --train-text {saved['train_text']} is not the file the run "
                         "trained on (its SHA-256 changed since the checkpoint)")
    # what may change changes only where given: checkpointing goes on with the checkpoint's own settings
    kept = {name: getattr(given, name) for name in RESUME_MAY_CHANGE
            if name == "resume" or was_given(RunConfig.__dataclass_fields__[name])}
    config = replace(checkpointed, **kept)
    if config.max_steps and config.max_steps < manifest["step"]:
        raise UsageError(f"--resume: --max-steps {config.max_steps} is before the checkpoint's step {manifest['step']}")
    return config


def resumed_from(config: RunConfig) -> dict:
    """What the report says of a resume: the checkpoint it went on from, and
    the flags that may change that did (the checkpoint's value, this run's)."""
    path = _latest(config.resume)
    manifest = _manifest(path, f"--resume {config.resume}")
    saved = manifest["config"]
    return {"directory": config.resume, "step": manifest["step"],
            "changed": {name: [saved.get(name), getattr(config, name)] for name in RESUME_MAY_CHANGE
                        if name != "resume" and saved.get(name) != getattr(config, name)}}


def twin_weights(directory: str, twin: str = "torch") -> dict[str, torch.Tensor]:
    """A twin's model weights at the latest checkpoint of ``directory`` (rank
    0's in a --tp/--dp one, whose torch twin is whole): what --init-from takes
    from a checkpoint directory."""
    path = _latest(directory)
    state = _state(path, _manifest(path, directory))
    return dict(state["components"][twin]["model"])


def restore(directory: str, components: dict, ranks: Ranks = SINGLE) -> int:
    """Loads the latest checkpoint of ``directory`` into ``components`` (built
    as for a fresh run) and the RNGs; returns the step it was written after.
    The ranks of a --tp/--dp run take the newest step all of them hold."""
    path = _latest(directory, ranks)
    step = agreed_min(ranks, int(path.name.split("-")[1]))
    path = path.parent / f"step-{step:09d}"
    if not (path / "checkpoint.json").is_file():
        raise UsageError(f"--resume {directory}: rank {ranks.rank} does not hold step {step}, the newest step "
                         "every rank's latest reaches")
    manifest = _manifest(path, f"--resume {directory}")
    state = _state(path, manifest)
    try:
        for name, component in components.items():
            if component is not None:
                load_state(component, state["components"][name])
        _set_rng_state(state["rng"])
    except (KeyError, RuntimeError, TypeError, ValueError) as err:  # a manifest whose tensors do not fit this run
        raise UsageError(f"--resume {directory}: {path} does not fit the run its config describes "
                         f"({type(err).__name__}: {str(err)[:160]})") from None
    return manifest["step"]
