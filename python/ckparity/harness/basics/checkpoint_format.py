"""What a checkpoint directory holds, and reading it: the manifest's schema and
config version, a state's packing of tensors into safetensors and JSON, the
tensors' checksum. longrun/checkpoint.py writes and restores checkpoints
through it, longrun/dump.py packs a step's dump with it, and --init-from
(twins/init_from.py) reads a directory's weights with it (a layer below
both: the format is data, not the run that writes it)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import fields
from pathlib import Path

import torch

from .config import RunConfig, UsageError

SCHEMA = "ckparity.checkpoint/1"
# [Note: a manifest's config version]
# A manifest's config holds every RunConfig field. A key it lacks is refused by name (a hand-edited or
# truncated manifest would otherwise resume with a default the run never had), unless the manifest's
# config_version says the field did not exist yet when it was written: then its absence means the default,
# which is what that ckparity did. CONFIG_ADDED: each field added since version 1, with its version.
CONFIG_VERSION = 2
CONFIG_ADDED = {"torch_threads": 2}


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


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_step(name: str) -> bool:
    return bool(re.fullmatch(r"step-\d{9}", name))


def latest(directory: str, root: Path | None = None) -> Path:
    """The latest checkpoint of ``directory`` (under ``root``, a rank's; of rank 0's, by default, in a
    --tp/--dp one)."""
    if root is None:
        root = Path(directory)
        if not (root / "latest").is_file() and (root / "rank-0" / "latest").is_file():
            root = root / "rank-0"
    if not (root / "latest").is_file():
        raise UsageError(f"--resume {directory}: no checkpoint there (no 'latest' file)")
    name = (root / "latest").read_text(errors="replace").strip()
    if not is_step(name):  # never a path out of the directory
        raise UsageError(f"--resume {directory}: 'latest' names {name[:80]!r}, not a step of this directory")
    path = root / name
    if not (path / "checkpoint.json").is_file():
        raise UsageError(f"--resume {directory}: 'latest' names {path.name}, which is not a checkpoint")
    return path


def read_manifest(path: Path, what: str) -> dict:
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


def read_state(path: Path, manifest: dict) -> dict:
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


def twin_weights(directory: str, twin: str = "torch") -> dict[str, torch.Tensor]:
    """A twin's model weights at the latest checkpoint of ``directory`` (rank
    0's in a --tp/--dp one, whose torch twin is whole): what --init-from takes
    from a checkpoint directory."""
    path = latest(directory)
    state = read_state(path, read_manifest(path, directory))
    return dict(state["components"][twin]["model"])
