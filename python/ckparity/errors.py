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
