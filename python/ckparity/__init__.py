"""ckparity: C kernels for an LLM training step, checked against PyTorch.

See README.md for the API and the parity each function promises.
"""

from . import nn
from ._native import CkparityError, build_info, version
from .ops.cross_entropy import cross_entropy
from .threads import get_num_threads, set_num_threads

__version__ = version()

__all__ = [
    "CkparityError",
    "build_info",
    "cross_entropy",
    "get_num_threads",
    "nn",
    "set_num_threads",
    "__version__",
]
