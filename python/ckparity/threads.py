"""The C library's thread count (results never depend on it)."""

from __future__ import annotations

from ._native import check, lib
from .errors import InvalidArgument, InvalidType


def set_num_threads(num_threads: int) -> None:
    """Sets the threads every kernel uses. The default comes from
    CKP_NUM_THREADS, then CK_NUM_THREADS, then the number of cores."""
    if isinstance(num_threads, bool) or not isinstance(num_threads, int):
        raise InvalidType(f"num_threads must be an int, got {type(num_threads).__name__}")
    if num_threads < 1 or num_threads > 2**31 - 1:
        raise InvalidArgument(f"num_threads must be >= 1, got {num_threads}")
    check(lib.ckp_set_num_threads(num_threads), "set_num_threads")


def get_num_threads() -> int:
    return int(lib.ckp_get_num_threads())
