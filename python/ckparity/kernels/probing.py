"""What a record's probe (Kernel.probe) is made of: its C calls through a
given library (``ffi.dlopen``: the installed one, a single-ISA build, a
mutant) into outputs that start filled with ``fill``, so that a build that
leaves an output unwritten cannot match another by reading the same
leftover memory. ckparity.builds runs the probes."""

from __future__ import annotations

import torch


def out(like, fill: float, dtype=None) -> torch.Tensor:
    """An output of ``like``'s shape (a tensor or a shape) filled with ``fill``."""
    return torch.full(like.shape if isinstance(like, torch.Tensor) else like, fill,
                      dtype=dtype or (like.dtype if isinstance(like, torch.Tensor) else torch.float32))
