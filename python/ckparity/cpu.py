"""The torch CPU capability the C kernels follow.

torch builds its CPU kernels once per capability (DEFAULT, AVX2, AVX512) and
runs one of them per process: ``torch.backends.cpu.get_cpu_capability()``,
fixed when torch starts and lowered by ``ATEN_CPU_CAPABILITY``. The vector
width, SLEEF's exp against libm's, and whether the build contracted a * b + c
into an FMA differ between them, and so do torch's bits. ckparity's library
takes the capability as a setting (``ckp_set_capability``); this module sets
it to torch's when ckparity is imported, so the kernels repeat the arithmetic
of the torch they are compared with. A capability ckparity has no arithmetic
for (torch on ARM, POWER or s390x reports others) is not silently treated as
one it knows: ``capability()`` says so, and no bit-identity is claimed.
"""

from __future__ import annotations

import platform

import torch

from ._native import check, ffi, lib

# The order is ckp_capability's: DEFAULT = 0, AVX2 = 1, AVX512 = 2.
CAPABILITIES = ("DEFAULT", "AVX2", "AVX512")

_X86 = platform.machine().lower() in ("x86_64", "amd64")


def torch_capability() -> str:
    """The capability torch's CPU kernels run at in this process."""
    return torch.backends.cpu.get_cpu_capability()


def library_capability() -> str:
    """The capability the loaded C library follows."""
    return CAPABILITIES[lib.ckp_get_capability()]


def matched() -> bool:
    """True if the C library repeats the arithmetic torch runs here."""
    return _X86 and torch_capability() == library_capability()


def capability() -> dict:
    """torch's capability, the library's, and whether they match (for reports and ``ckparity info``)."""
    return {"torch": torch_capability(), "library": library_capability(), "matched": matched()}


def follow_torch() -> None:
    """Sets the library's capability to torch's (at import; again after a
    ``CKP_LIB`` swap or a ``ckp_set_capability`` made behind ckparity's back)."""
    name = torch_capability()
    if _X86 and name in CAPABILITIES:
        check(lib.ckp_set_capability(CAPABILITIES.index(name)), "ckp_set_capability")
