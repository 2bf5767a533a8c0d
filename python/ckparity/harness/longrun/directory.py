"""A directory ckparity writes is ckparity's, or refused -- before any work.

A checkpoint directory says whose it is: ``ckparity-run.json`` (schema
ckparity.checkpoint-dir/1) names the run that writes into it. A fresh run
(no --resume) takes a directory that does not exist or is empty, or one
whose marker names this very run (the other ranks of a --tp/--dp launch);
a directory that holds another run's checkpoints is refused unless
--overwrite-checkpoints says to start over (then only ckparity's own
entries are removed), and a directory that holds anything else -- a user's
files, a step dump -- is refused whatever the flags. A resume takes over the
directory it resumes from. A dump directory is empty, or holds a dump and
nothing else.

Writes in these directories go to new files created exclusively (never
through an existing file or link) and are fsynced, with their directory,
before anything names them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

from ..basics.config import UsageError
from ..basics.report import TEMP_PREFIX, fsync, write_new

MARKER = "ckparity-run.json"
MARKER_SCHEMA = "ckparity.checkpoint-dir/1"
STEP_PREFIX = "step-"


def run_id() -> str:
    """This run's name in a marker: the launch's for the ranks of a --tp/--dp
    run (they share it), else a new one per run."""
    if "WORLD_SIZE" in os.environ:
        launch = os.environ.get("CKP_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID", "none")
        return f"{launch}@{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    return _PROCESS_RUN.setdefault("id", uuid.uuid4().hex)


_PROCESS_RUN: dict[str, str] = {}


def new_run() -> None:
    """A new single-process run starts (train() calls it): a new run id."""
    _PROCESS_RUN["id"] = uuid.uuid4().hex


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith(TEMP_PREFIX))


def _marker(directory: Path) -> dict | None:
    path = directory / MARKER
    if path.is_symlink() or not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("schema") == MARKER_SCHEMA else None


def _ours(name: str) -> bool:
    """An entry ckparity puts in a checkpoint directory."""
    return name in (MARKER, "latest") or name.startswith((STEP_PREFIX, "rank-"))


def claim_checkpoint_dir(directory: str, *, resuming: bool, overwrite: bool) -> None:
    """Refuses (UsageError, naming it) a directory this run may not write
    checkpoints into; else makes it this run's (its marker)."""
    root = Path(directory)
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise UsageError(f"--checkpoint-dir {directory}: not a directory")
    root.mkdir(parents=True, exist_ok=True)
    entries, marker = _entries(root), _marker(root)
    mine = run_id()
    if not resuming and entries and not (marker and marker.get("run") == mine):
        foreign = [e for e in entries if not _ours(e)]
        if marker is None or foreign:
            raise UsageError(f"--checkpoint-dir {directory} holds files that are not ckparity's checkpoints "
                             f"({', '.join(foreign or entries)[:200]}); choose an empty or new directory")
        if not overwrite:
            raise UsageError(f"--checkpoint-dir {directory} holds the checkpoints of another run (started "
                             f"{marker.get('started')}): --resume {directory} to go on with it, "
                             "--overwrite-checkpoints to start over there, or another --checkpoint-dir")
        for name in entries:
            if name != MARKER:
                target = root / name
                target.unlink() if target.is_file() or target.is_symlink() else shutil.rmtree(target)
    if not (marker and marker.get("run") == mine):
        write_new(root / MARKER, json.dumps({"schema": MARKER_SCHEMA, "run": mine,
                                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))


def check_dump_dir(directory: str) -> None:
    """A dump goes into a new or empty directory, or over a dump: never into a checkpoint or a user's files."""
    root = Path(directory)
    if root.is_symlink() or (root.exists() and not root.is_dir()):
        raise UsageError(f"--dump-dir {directory}: not a directory")
    if not root.exists():
        return
    entries = _entries(root)
    if entries and sorted(entries) != ["dump.json", "tensors.safetensors"]:
        raise UsageError(f"--dump-dir {directory} holds other files than a step dump's "
                         f"({', '.join(entries)[:200]}); choose an empty or new directory")


def fsync_tree(directory: Path) -> None:
    """Every file of ``directory`` and the directory itself on disk."""
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            fsync(path)
    fsync(directory)
