"""The shape of a gate's record: what the runner and the docs need to know of one gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Gate:
    """One parity gate: ``run(settings, out_dir)`` -> a result (common.result: passed, summary, details).

    ``settings`` are the quick tier's (every key a TOML override may set, gates.example.toml); ``full``
    the full tier's changes; ``dtypes`` what another dtype (gate --dtype) changes -- a gate with a
    ``dtype`` setting runs in it. ``checks`` and ``passes`` say in words what it runs and its pass rule
    (docs/harness.md's table is made of them). ``kernels_here``: its own twins call the CK twin's kernels in
    the gate's process (not in training children or check's child), so under gate --backend it runs in a
    process of its own, where a user's crashing kernel ends this gate only."""
    name: str
    run: Callable[[dict, Path | None], dict]
    settings: dict
    checks: str
    passes: str
    full: dict = field(default_factory=dict)
    dtypes: dict[str, dict] = field(default_factory=dict)
    kernels_here: bool = False
