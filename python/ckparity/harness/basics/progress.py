"""Where a run is, in a few bytes another process can read after this one dies: the step, the
stage (forward, backward, update) and the kernel record whose slot was entered last. A process's
writes to a shared file mapping outlive a segfault or an abort, where a report cannot be written:
`ckparity train` runs a user's backends in a child (loop/child.py) that keeps its place here
(CKP_PROGRESS_FILE), and reads it when the child dies by a signal.

Off (every call a single test of a module global) unless the variable names a file."""

from __future__ import annotations

import json
import mmap
import os

ENV = "CKP_PROGRESS_FILE"
SIZE = 256  # bytes: a JSON object padded with spaces

_map: mmap.mmap | None = None
_where = {"step": None, "stage": None, "kernel": None, "notes": 0}  # notes: every note changes the bytes (a watcher
                                                                   # tells a run that moves from one that hangs)


def start() -> None:
    """Maps the file ENV names, if any (the child calls this before its run)."""
    global _map
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "wb+") as f:
        f.write(b" " * SIZE)
        f.flush()
        _map = mmap.mmap(f.fileno(), SIZE)


def enabled() -> bool:
    return _map is not None


def note(**where) -> None:
    """Records where the run is (step=, stage=, kernel=; a new step clears the stage and kernel)."""
    if _map is None:
        return
    if "step" in where:
        _where.update(stage=None, kernel=None)
    _where.update(where, notes=_where["notes"] + 1)
    text = json.dumps(_where).encode()[:SIZE]
    _map[:SIZE] = text + b" " * (SIZE - len(text))


def raw(path: str) -> bytes:
    """The record's bytes as they are now (b"" before the child maps it): what a watcher compares."""
    try:
        with open(path, "rb") as f:
            return f.read(SIZE)
    except OSError:
        return b""


def read(path: str) -> dict | None:
    """The last place a (dead) process noted in ``path``; None if it noted none."""
    try:
        with open(path, "rb") as f:
            text = f.read(SIZE).strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None
