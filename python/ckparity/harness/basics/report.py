"""Reports: strict JSON (non-finite floats as the strings "nan", "inf",
"-inf"), written so that nothing is lost and nothing is replaced:

- ``-`` is standard output; an existing path that is not a regular file (a
  FIFO, a character device, a link such as /dev/stdout) is written directly,
  never replaced;
- anything else is written atomically: a temp file in the same directory,
  flushed and fsync'ed, renamed onto the path, and the directory fsync'ed, so
  a crash never leaves an empty or half report under the final name;
- ``check_writable`` refuses an unwritable path before any work starts; if
  writing still fails at the end (a full disk), the report goes to a fallback
  file in the system temp dir and ReportNotWritten names it."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

from .config import UsageError

SCHEMA = "ckparity.drift/1"
STDOUT = "-"


class ReportNotWritten(OSError):
    """The report could not be written where asked; ``fallback`` holds it (or None)."""

    def __init__(self, message: str, fallback: Path | None) -> None:
        super().__init__(message)
        self.fallback = fallback


def strict(value):
    """The value with every non-finite float replaced by its string name."""
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def _special(path: Path) -> bool:
    """An existing path that must be written through, not replaced."""
    return path.is_symlink() or (path.exists() and not path.is_file())


def check_writable(path: str | Path, what: str) -> None:
    """Refuses (UsageError) a report path that cannot be written; creates its directory."""
    if str(path) == STDOUT:
        return
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"cannot write {what} {path}: it is a directory")
    if _special(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {what} {path}: permission denied")
        return
    check_writable_dir(path.parent, what)


def check_writable_dir(directory: str | Path, what: str) -> None:
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot write {what} in {directory}: {err.strerror or err}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {what} in {directory}: permission denied")


# the prefix of ckparity's in-flight writes: never a user's name; a killed
# write's leftovers are ckparity's to remove (longrun/checkpoint.py does)
TEMP_PREFIX = ".ckparity-"


def write_new(path: Path, data: str | bytes) -> None:
    """``data`` into ``path`` by a new file created exclusively next to it (a
    file or link already at the temporary name is never followed), fsynced,
    renamed over ``path`` (a link there is replaced, not followed), and the
    directory fsynced."""
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync(path.parent)


def fsync(path: Path) -> None:
    """A file's or a directory's entries on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str | Path, text: str) -> Path | None:
    """Writes text as the module docstring says; returns the path (None for stdout)."""
    if str(path) == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return None
    path = Path(path)
    try:
        if _special(path):
            with open(path, "w") as f:
                f.write(text)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_new(path, text)
        return path
    except OSError as err:
        fallback = Path(tempfile.gettempdir()) / f"ckparity-{os.getpid()}-{path.name or 'report'}"
        try:
            write_new(fallback, text)
        except OSError:
            fallback = None
        where = f"; written to {fallback} instead" if fallback else "; no fallback could be written either"
        raise ReportNotWritten(f"cannot write {path}: {err.strerror or err}{where}", fallback) from None


def write_json(path: str | Path, data: dict) -> Path | None:
    return write_text(path, json.dumps(strict(data), indent=1, allow_nan=False) + "\n")


def _number(value):
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return value


def read_report(path: str | Path) -> dict:
    """A report with its non-finite strings turned back into floats."""
    def revive(value):
        if isinstance(value, dict):
            return {k: revive(v) for k, v in value.items()}
        if isinstance(value, list):
            return [revive(v) for v in value]
        return _number(value)

    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} report (schema: {data.get('schema')!r})")
    return revive(data)
