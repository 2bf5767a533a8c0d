"""ckparity: C kernels for an LLM training step, checked against PyTorch.

See README.md for the API and the parity each function promises.
"""

from . import nn, optim
from ._native import build_info, version
from ._tensors import empty_cache
from .cpu import capability, follow_torch
from .errors import CkparityError
from .kernels import register_backend
from .ops.clip_grad_norm import clip_grad_norm_
from .ops.cross_entropy import cross_entropy
from .ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from .ops.gelu import gelu
from .ops.layer_norm import layer_norm
from .ops.rms_norm import rms_norm
from .ops.rope import rope
from .ops.swiglu import swiglu
from .threads import get_num_threads, set_num_threads

__version__ = version()
follow_torch()

__all__ = [
    "CkparityError",
    "build_info",
    "capability",
    "clip_grad_norm_",
    "cross_entropy",
    "empty_cache",
    "fused_linear_cross_entropy",
    "gelu",
    "layer_norm",
    "get_num_threads",
    "nn",
    "register_backend",
    "optim",
    "rms_norm",
    "rope",
    "set_num_threads",
    "swiglu",
    "__version__",
]
