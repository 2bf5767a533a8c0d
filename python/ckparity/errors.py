"""The exceptions ckparity raises for bad input.

torch raises RuntimeError for most bad arguments (a weight of the wrong shape,
label_smoothing > 1, a target of the wrong size), Python's own types for some
(IndexError for an out-of-range class target). ckparity's errors subclass
both the Python type that says what is wrong and RuntimeError, so code
written against torch (`except RuntimeError`) and code written for Python
(`except ValueError`) both catch them."""

from __future__ import annotations


class CkparityError(RuntimeError):
    """A C status with no closer type; the base of every ckparity error."""


class InvalidArgument(CkparityError, ValueError):
    """A value, shape or option ckparity cannot take."""


class InvalidType(CkparityError, TypeError):
    """A tensor of the wrong dtype or device, or a non-tensor."""


class TargetOutOfRange(CkparityError, IndexError):
    """A class target outside [0, C) that is not ignore_index."""


def as_float(value, name: str) -> float:
    """A real-number argument as a float; anything else (a string, None, a tensor of more than one
    element) an InvalidType naming it, as torch's argument parser raises a TypeError."""
    if isinstance(value, (int, float)) or (hasattr(value, "__float__") and not isinstance(value, (str, bytes))
                                           and getattr(value, "numel", lambda: 1)() == 1):
        return float(value)
    raise InvalidType(f"{name} must be a number, got {type(value).__name__} {value!r}")


def as_int(value, name: str) -> int:
    """An integer argument as an int; a float, a string or None an InvalidType naming it (torch's
    argument parser refuses them with a TypeError)."""
    if hasattr(value, "__index__") and not isinstance(value, bool):
        return value.__index__()
    raise InvalidType(f"{name} must be an int, got {type(value).__name__} {value!r}")
