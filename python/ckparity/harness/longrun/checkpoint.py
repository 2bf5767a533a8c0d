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
import os
import random
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
from ..basics.checkpoint_format import (CONFIG_VERSION, SCHEMA, is_step, latest, pack, read_manifest, read_state,
                                        sha256, unshare)
from .directory import fsync_tree

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
        if is_step(old.name) and old != final and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
    return final


def resume_config(given: RunConfig, flags: frozenset[str] | None = None) -> RunConfig:
    """The checkpoint's config, with the flags that may change taken from ``given``
    where they were given; another flag given with a value other than the
    checkpoint's is refused by name. ``flags``: the RunConfig fields given on
    the command line (whatever their values; basics.config.given_fields); None
    where only the values are known (a rank re-reading its launcher's config):
    a value other than the default counts as given. A checkpoint written by
    another ckparity or torch, or at another CPU capability, is refused: a
    resume could not repeat the uninterrupted run's bits."""
    path = latest(given.resume)
    manifest = read_manifest(path, f"--resume {given.resume}")
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
    path = latest(config.resume)
    manifest = read_manifest(path, f"--resume {config.resume}")
    saved = manifest["config"]
    return {"directory": config.resume, "step": manifest["step"],
            "changed": {name: [saved.get(name), getattr(config, name)] for name in RESUME_MAY_CHANGE
                        if name != "resume" and saved.get(name) != getattr(config, name)}}


def restore(directory: str, components: dict, ranks: Ranks = SINGLE) -> int:
    """Loads the latest checkpoint of ``directory`` into ``components`` (built
    as for a fresh run) and the RNGs; returns the step it was written after.
    The ranks of a --tp/--dp run take the newest step all of them hold."""
    path = latest(directory, _root(directory, ranks))
    step = agreed_min(ranks, int(path.name.split("-")[1]))
    path = path.parent / f"step-{step:09d}"
    if not (path / "checkpoint.json").is_file():
        raise UsageError(f"--resume {directory}: rank {ranks.rank} does not hold step {step}, the newest step "
                         "every rank's latest reaches")
    manifest = read_manifest(path, f"--resume {directory}")
    state = read_state(path, manifest)
    try:
        for name, component in components.items():
            if component is not None:
                load_state(component, state["components"][name])
        _set_rng_state(state["rng"])
    except (KeyError, RuntimeError, TypeError, ValueError) as err:  # a manifest whose tensors do not fit this run
        raise UsageError(f"--resume {directory}: {path} does not fit the run its config describes "
                         f"({type(err).__name__}: {str(err)[:160]})") from None
    return manifest["step"]
