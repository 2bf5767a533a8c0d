"""Reports: strict JSON (non-finite floats as the strings "nan", "inf",
"-inf"), written atomically (temp file, then rename)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

SCHEMA = "ckparity.drift/1"


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


def write_json(path: str | Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(strict(data), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


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
