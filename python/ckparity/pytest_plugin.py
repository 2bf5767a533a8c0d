"""ckparity's checks in your own test suite (the ``pytest11`` entry point
"ckparity", active once ckparity is installed).

    def test_my_rms_norm(ckparity_check):
        ckparity_check("rms_norm", my_rms_norm, expect="bitwise")

``ckparity_check(kernel, backend, expect=...)`` registers ``backend`` (a
callable, under its qualified name, after the slot's contract check; or the
name of a registered backend), runs ``ckparity check`` on it and fails the
test with the check's table unless the overall verdict is ``expect`` or
better in ckparity.check.VERDICTS' order (bitwise, as accurate as torch,
less accurate, nondeterministic, wrong, crashes). It returns the report
(schema ckparity.check/1) for further assertions. The default ``expect``,
"as accurate as torch", is the bar ckparity holds its own non-bitwise
kernels to."""

from __future__ import annotations

from typing import Callable

import pytest


def _check(kernel: str, backend: Callable | str, expect: str = "as accurate as torch") -> dict:
    from . import check, kernels

    if expect not in check.VERDICTS:
        raise ValueError(f"expect must be one of {check.VERDICTS}, got {expect!r}")
    if callable(backend):
        fn, backend = backend, f"pytest:{getattr(backend, '__module__', '?')}.{getattr(backend, '__qualname__', '?')}"
        kernels.register_backend(kernel, backend, fn)
    report = check.check(kernel, backend)
    if check.VERDICTS.index(report["verdict"]) > check.VERDICTS.index(expect):
        pytest.fail(f"expected {expect!r} or better\n{check.table(report)}", pytrace=False)
    return report


@pytest.fixture
def ckparity_check() -> Callable[..., dict]:
    """ckparity_check(kernel, backend, expect="as accurate as torch") -> the check's report."""
    return _check
