"""ckparity's checks in your own test suite (the ``pytest11`` entry point
"ckparity", active once ckparity is installed).

    def test_my_rms_norm(ckparity_check):
        ckparity_check("rms_norm", my_rms_norm, expect="bitwise")

``ckparity_check(kernel, backend, expect=None, at_least=None, name=None)``
registers ``backend`` (a callable, under ``name`` or
``pytest:MODULE.QUALNAME`` made unique; its contract check is the check's
first property; or the name of a registered backend), runs ``ckparity check`` on it -- in a child process
where the backend can be carried there (ckparity.check.run: a crash in C is
the verdict ``crashes``, not a dead test run), in this one otherwise -- and
fails the test with the check's table unless the verdict is:

- ``expect``: exactly that verdict (``expect="crashes"`` holds a kernel that
  crashes, and fails on one that does not);
- ``at_least``: that verdict or a better one in ckparity.check.VERDICTS'
  order (bitwise, as accurate as torch, not supported, less accurate,
  nondeterministic, wrong, crashes).

Neither given: ``at_least="as accurate as torch"``, the bar ckparity holds
its own non-bitwise kernels to. It returns the report (schema
ckparity.check/1) for further assertions.

A whole engine in one test, as ``ckparity check --plugin engine.py`` judges it:

    def test_my_engine(ckparity_engine):
        report = ckparity_engine({"rms_norm": my_rms_norm, "swiglu": my_swiglu}, at_least="bitwise")
        assert report["correct_and_faster"] >= 1

``ckparity_engine(backends, at_least="as accurate as torch")`` registers each
(kernel -> callable or registered name) as ckparity_check does, checks and
times every one (ckparity.check.engine), and fails the test with the
engine's table unless every slot's verdict is ``at_least`` or better; it
returns the engine report (schema ckparity.check-engine/1)."""

from __future__ import annotations

from typing import Callable

import pytest


def _name_for(kernel: str, fn: Callable, name: str | None) -> str:
    """``name``, or pytest:MODULE.QUALNAME with a suffix if another callable has that name already."""
    from . import kernels

    if name is not None:
        return name
    base = f"pytest:{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    taken = kernels.backends(kernels.slot(kernel))
    candidate, k = base, 1
    while candidate in taken and taken[candidate] is not fn:
        k += 1
        candidate = f"{base}#{k}"
    return candidate


def _registered(kernel: str, backend: Callable | str, name: str | None) -> str:
    """The backend's name, a callable registered under it first (its contract: the check's first property)."""
    from . import kernels

    if not callable(backend):
        return backend
    fn, backend = backend, _name_for(kernel, backend, name)
    if kernels.backends(kernels.slot(kernel)).get(backend) is not fn:
        kernels.register_backend(kernel, backend, fn, check=False)
    return backend


def _check(kernel: str, backend: Callable | str, expect: str | None = None, at_least: str | None = None,
           name: str | None = None) -> dict:
    from . import check

    if expect is not None and at_least is not None:
        raise ValueError("give expect= (exactly this verdict) or at_least= (this or better), not both")
    bar = expect or at_least or "as accurate as torch"
    if bar not in check.VERDICTS:
        raise ValueError(f"the verdict must be one of {check.VERDICTS}, got {bar!r}")
    report = check.run(kernel, _registered(kernel, backend, name))
    verdict = report["verdict"]
    if expect is not None and verdict != expect:
        pytest.fail(f"expected exactly {expect!r}, got {verdict!r}\n{check.table(report)}", pytrace=False)
    if expect is None and check.VERDICTS.index(verdict) > check.VERDICTS.index(bar):
        pytest.fail(f"expected {bar!r} or better, got {verdict!r}\n{check.table(report)}", pytrace=False)
    return report


def _engine(backends: dict[str, Callable | str], at_least: str = "as accurate as torch") -> dict:
    from . import check
    from .check import engine
    from .check.rule import worst

    if at_least not in check.VERDICTS:
        raise ValueError(f"the verdict must be one of {check.VERDICTS}, got {at_least!r}")
    report = engine.check_engine([(kernel, _registered(kernel, b, None)) for kernel, b in backends.items()])
    short = ", ".join(f"{r['kernel']} {r['verdict']!r}" for r in report["rows"]
                      if worst([r["verdict"], at_least]) != at_least)
    if short:
        pytest.fail(f"expected {at_least!r} or better of every slot; {short}\n{engine.table(report)}", pytrace=False)
    return report


@pytest.fixture
def ckparity_engine() -> Callable[..., dict]:
    """ckparity_engine(backends, at_least="as accurate as torch") -> the engine's report."""
    return _engine


@pytest.fixture
def ckparity_check() -> Callable[..., dict]:
    """ckparity_check(kernel, backend, expect=None, at_least=None, name=None) -> the check's report."""
    return _check
