"""check's cheats property: a backend that writes an input, hands back an output aliasing an input or a
previous call's output, caches its result, or calls torch's own op is named, each on a planted cheat;
a backend that does the work honestly (x - (-y) for the residual add: the same sum, not torch's add)
is not, nor is any of ckparity's own."""

from __future__ import annotations

import pytest
import torch

from ckparity import kernels
from ckparity.check import cheats, suite


def _sum(x, y):
    """x + y without torch's add: x - (-y) is the same IEEE sum"""
    return torch.sub(x, torch.neg(y))


def _writes_y(x, y):
    """cheat: zeroes y after using it (a scratch buffer taken from the caller)"""
    out = _sum(x, y)
    y.data.zero_()
    return out


def _aliases_x(x, y):
    """cheat: the sum written into x's memory and x handed back (an in-place kernel behind an
    out-of-place API)"""
    x.data.copy_(_sum(x, y).data)
    return x.view_as(x)


class _StaticBuffer(torch.autograd.Function):
    """cheat: every call's result in one buffer kept across calls"""
    buffers: dict = {}

    @staticmethod
    def forward(ctx, x, y):
        out = _StaticBuffer.buffers.setdefault(tuple(x.shape), torch.empty(x.shape))
        return out.copy_(_sum(x, y))

    @staticmethod
    def backward(ctx, g):
        return g, g


class _Cached(torch.autograd.Function):
    """cheat: the first result for a shape returned for every later call of that shape"""
    results: dict = {}

    @staticmethod
    def forward(ctx, x, y):
        return _Cached.results.setdefault(tuple(x.shape), _sum(x, y)).clone()

    @staticmethod
    def backward(ctx, g):
        return g, g


CHEATS = {"cheat_writes_input": (_writes_y, "writes its input y"),
          "cheat_aliases_input": (_aliases_x,
                                  "shares memory with its input x"),
          "cheat_static_buffer": (_StaticBuffer.apply, "a previous call's output"),
          "cheat_cached": (_Cached.apply, "a cached result"),
          "cheat_calls_torch": (torch.add, "calls torch's own add and hands back its bits")}
for _name, (_fn, _) in CHEATS.items():
    kernels.register("residual", _name, _fn)
kernels.register("residual", "honest_sub", _sum)


def _cheats_row(kernel: str, backend: str) -> dict:
    """The cheats property alone (check runs it after the others: tests/test_check.py runs check whole)."""
    record = kernels.KERNELS[kernel]
    return cheats.cheats(record.conformance, record.torch_ops, record.backends[backend], record.backends["torch"],
                         torch.Generator().manual_seed(0)).report()


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_planted_cheat_is_named(name):
    row = _cheats_row("residual", name)
    assert row["verdict"] == "wrong" and any(CHEATS[name][1] in f for f in row["failures"]), row["failures"]


def test_check_runs_the_cheats_property_and_fails_a_cheat():
    report = suite.check("residual", "cheat_cached")
    assert not report["passed"] and "cheats" in {r["property"] for r in report["properties"]}
    assert "cheats" not in {r["property"] for r in suite.check("residual", "torch")["properties"]}


def test_an_honest_backend_is_no_cheat():
    row = _cheats_row("residual", "honest_sub")
    assert row["verdict"] == "bitwise" and row["cases"] == 4, row


@pytest.mark.parametrize("kernel", ["rms_norm", "swiglu", "rope", "cross_entropy", "linear", "embedding",
                                    "residual"])
def test_ckparitys_own_backends_do_not_cheat(kernel):
    for backend in kernels.KERNELS[kernel].builtin:
        if backend != "torch":
            row = _cheats_row(kernel, backend)
            assert row["verdict"] == "bitwise", (backend, row["failures"])
