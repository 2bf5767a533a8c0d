"""Loads the C library through cffi and turns its status codes into exceptions.

The cffi declarations are read from ``ckparity.h`` (the region between the
CDEF markers), so the header stays the single description of the C API.
``CKP_LIB=/path/to/libckparity.so`` loads another build of the library (for
testing a kernel build against the same Python side).
"""

from __future__ import annotations

import os
from pathlib import Path

import cffi

from .errors import CkparityError, InvalidArgument, TargetOutOfRange

_PACKAGE_DIR = Path(__file__).resolve().parent
HEADER_PATH = _PACKAGE_DIR / "ckparity.h"


def _cdef_source(header: Path) -> str:
    text = header.read_text()
    begin, end = "/* CKP_CDEF_BEGIN */", "/* CKP_CDEF_END */"
    if begin not in text or end not in text:
        raise ImportError(f"{header} has no {begin} ... {end} region")
    return text.split(begin, 1)[1].split(end, 1)[0]


def _library_path() -> Path:
    override = os.environ.get("CKP_LIB")
    if override:
        path = Path(override)
        if not path.is_file():
            raise ImportError(f"CKP_LIB={override} is not a file")
        return path
    candidates = sorted(_PACKAGE_DIR.glob("libckparity*.so")) + sorted(_PACKAGE_DIR.glob("libckparity*.dylib"))
    if not candidates:
        raise ImportError(
            f"libckparity is not installed in {_PACKAGE_DIR}; build and install the package "
            "(./scripts/test.sh does) or set CKP_LIB"
        )
    return candidates[0]


ffi = cffi.FFI()
ffi.cdef(_cdef_source(HEADER_PATH))
LIBRARY_PATH = _library_path()
lib = ffi.dlopen(str(LIBRARY_PATH))


# Which exception each C status becomes (ckparity.errors: each is also a
# RuntimeError, as torch's are). torch raises IndexError for an out-of-range
# class target, so ckparity does too.
_EXCEPTIONS = {
    lib.CKP_ERR_NULL_POINTER: InvalidArgument,
    lib.CKP_ERR_BAD_SIZE: InvalidArgument,
    lib.CKP_ERR_TARGET_OUT_OF_RANGE: TargetOutOfRange,
    lib.CKP_ERR_BAD_OPTION: InvalidArgument,
    lib.CKP_ERR_ALIASING: InvalidArgument,
    lib.CKP_ERR_OUT_OF_MEMORY: MemoryError,
}


def check(status: int, what: str, library=None) -> None:
    """Raises the Python exception for a non-OK status of the C call ``what``
    (made through ``library``, the loaded one by default)."""
    if status == lib.CKP_OK:
        return
    library = library or lib
    name = ffi.string(library.ckp_status_str(status)).decode()
    detail = ffi.string(library.ckp_last_error()).decode()
    raise _EXCEPTIONS.get(status, CkparityError)(f"{what}: {detail} ({name})")


def version() -> str:
    return ffi.string(lib.ckp_version()).decode()


def build_info() -> str:
    return ffi.string(lib.ckp_build_info()).decode()


def isa(library=None) -> str:
    """Whose code the loaded library's hot loops run ("x86-64-v4", "x86-64-v3", "baseline")."""
    return ffi.string((library or lib).ckp_isa()).decode()
