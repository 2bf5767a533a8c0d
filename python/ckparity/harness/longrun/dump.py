"""--dump-step N [--dump-dir D], ``ckparity replay D`` and ``ckparity.harness.longrun.dump.load_dump(D)``:
one step taken out of a run, to be recomputed and studied on its own.

The dump holds both twins' state before step N (weights, optimizer state, lr
scheduler: harness/longrun/checkpoint.py's state_of), the step's micro-batches, and
each twin's activations, their gradients and the parameter gradients of that
step (before the update), as ``D/tensors.safetensors`` plus ``D/dump.json``
(schema ckparity.dump/1: the step, the config, the state with each tensor
named by its key). ``load_dump`` gives it back as tensors; ``replay``
recomputes the step from it -- the CK twin and the torch twin each from its
own state, and each again in float64 (torch's ops, from that twin's state) --
and gives the same rows as the divergence tracer: per forward stage, backward
stage and parameter gradient, CK against torch, and each twin against its
float64 recomputation. ``faithful`` says whether the recomputed CK and torch
activations have the dumped bits (the step replays exactly)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from ..basics.checkpoint_format import pack, sha256, unpack, unshare
from .checkpoint import state_of
from ..basics.config import RunConfig, UsageError
from ..observers.localize import stage_rows
from ..observers.protocol import Observer
from ..basics.report import TEMP_PREFIX, fsync, write_new
from ..twins.factory import build_twin

SCHEMA = "ckparity.dump/1"


def _acts(outputs: list) -> tuple[list[dict], list[dict]]:
    """Per micro-batch: the activations, and their gradients where they have one."""
    values = [{stage: t.detach() for stage, t in acts.items()} for _, acts in outputs]
    grads = [{stage: t.grad for stage, t in acts.items() if t.grad is not None} for _, acts in outputs]
    return values, grads


class StepDump(Observer):
    """The observer of --dump-step N: both twins' state before step N and its
    batch (before_step), the step's activations and gradients (before_update),
    written to --dump-dir (default reports/dump-step-N); the report's "dump"
    names the directory."""

    STATE = ("path",)

    def __init__(self, config) -> None:
        self.config, self.step, self.path = config, config.dump_step, None
        self.tensors: dict = {}
        self.state: dict = {}

    def keeps_activations(self, step: int) -> bool:
        return step == self.step

    def before_step(self, step: int, windows, ck, ref) -> None:
        if step == self.step:
            self.state = {"before": pack({"ck": state_of(ck), "torch": state_of(ref)}, "before", self.tensors),
                          "batch": pack([list(w) for w in windows], "batch", self.tensors)}

    def before_update(self, step: int, outputs: dict, ck, ref, identical) -> None:
        if step != self.step:
            return
        for side, twin in (("ck", ck), ("torch", ref)):
            acts, act_grads = _acts(outputs[side])
            self.state[side] = pack({"acts": acts, "act_grads": act_grads, "grads": twin.grads()}, side, self.tensors)
        self.path = str(self.write(self.config.dump_dir or f"reports/dump-step-{step}"))
        self.tensors, self.state = {}, {}

    def report_into(self, result: dict) -> None:
        result["dump"] = self.path

    def write(self, directory: str) -> Path:
        """The dump into ``directory`` (checked before the run: longrun/directory.py), each file
        written anew beside its name and renamed over it, fsynced; the json last, so a dump.json
        always has its tensors."""
        from safetensors.torch import save_file

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=root)
        os.close(fd)
        try:
            save_file(unshare(self.tensors), tmp)
            fsync(Path(tmp))
            os.replace(tmp, root / "tensors.safetensors")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        write_new(root / "dump.json", json.dumps({"schema": SCHEMA, "step": self.step, "config": self.config.to_dict(),
                                                  "tensors_sha256": sha256(root / "tensors.safetensors"),
                                                  "state": self.state}))
        return root


def load_dump(directory: str) -> dict:
    """A dump as Python objects: {"step", "config" (a RunConfig), "batch" [(tokens, targets)],
    "before" {"ck", "torch": each twin's state}, "ck"/"torch" {"acts", "act_grads", "grads"}}.
    Every way it can be broken is a UsageError naming the file: not JSON, another schema, tensors
    that are not the ones its json recorded (checksum), a config this ckparity does not know."""
    from safetensors.torch import load_file

    root = Path(directory)
    if not (root / "dump.json").is_file():
        raise UsageError(f"{directory}: no step dump there (no dump.json)")
    try:
        manifest = json.loads((root / "dump.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{root / 'dump.json'}: not readable JSON ({type(err).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        schema = manifest.get("schema") if isinstance(manifest, dict) else None
        raise UsageError(f"{directory}: schema {schema!r}, expected {SCHEMA}")
    tensors_file = root / "tensors.safetensors"
    if not tensors_file.is_file():
        raise UsageError(f"{directory}: dump.json without its tensors.safetensors")
    if manifest.get("tensors_sha256") not in (None, sha256(tensors_file)):
        raise UsageError(f"{tensors_file}: not the tensors its dump.json recorded (its SHA-256 differs)")
    try:
        tensors = load_file(str(tensors_file))
        state = {part: unpack(packed, tensors) for part, packed in manifest["state"].items()}  # part by part
        config = RunConfig(**manifest["config"])
        return {"step": manifest["step"], "config": config, "batch": [tuple(w) for w in state["batch"]],
                **{k: state[k] for k in ("before", "ck", "torch")}}
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001 -- a broken file is the user's input, said so, not a traceback
        raise UsageError(f"{directory}: not a whole step dump ({type(err).__name__}: {str(err)[:120]})") from None


def _step(twin, windows) -> tuple[list[dict], dict]:
    twin.zero_grad()
    outputs = twin.micro_steps(windows, keep_activations=True)
    return [acts for _, acts in outputs], twin.grads()


def replay(directory: str) -> dict:
    """The step recomputed from its dump (see the module's docstring)."""
    dump = load_dump(directory)
    config = dump["config"]
    windows = dump["batch"]
    runs = {}
    for side in ("ck", "torch"):
        twin = build_twin(config, side)
        twin.restore(dump["before"][side])
        runs[side] = _step(twin, windows)
        runs[f"{side}_f64"] = _step(build_twin(config, "f64", snapshot=dump["before"][side]), windows)
    faithful = all(torch.equal(a[stage], b[stage])
                   for side in ("ck", "torch") for a, b in zip(runs[side][0], dump[side]["acts"]) for stage in b)

    def rows(a: str, b: str) -> dict:
        return stage_rows(config, runs[a][0], runs[b][0], runs[a][1], runs[b][1])
    return {"schema": SCHEMA, "step": dump["step"], "faithful": faithful, "ck_vs_torch": rows("ck", "torch"),
            "ck_vs_float64": rows("ck", "ck_f64"), "torch_vs_float64": rows("torch", "torch_f64")}
