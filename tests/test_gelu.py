"""ckparity.gelu (csrc/gelu.c): F.gelu(x, approximate="tanh") bit for bit in float32 and bfloat16 -- forward
and backward, at torch's
thread count (torch splits a large tensor between its threads and computes each piece's last elements with
libm's tanhf: the C follows the split it is told), at any thread count of its own -- and the erf form and
other dtypes refused by name. (The width sweep at each capability: the record's claim, tests/test_capability.py;
check's properties: tests/test_slots.py; its C API: tests/test_fuzz_c_api.py and tests/test_overlaps.py.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity.errors import InvalidArgument, InvalidType
from ckparity.kernels.sweeping import same_bits, torch_threads

SIZES = (16385, 40007, 65537, 100003, 262147)  # past both grains, odd: a piece ends inside a vector pair


def _both(fn, x, dy):
    x = x.clone().requires_grad_(True)
    y = fn(x)
    y.backward(dy)
    return y.detach(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torchs_bits_at_one_and_two_torch_threads_and_any_of_ours(dtype):
    """At 2 torch threads torch's pieces end elsewhere than at 1, which changes bits where its vector and
    scalar tanh differ: ours follow at each count, and ckparity's own threads change nothing."""
    g = torch.Generator().manual_seed(0)
    torch_moved = 0
    for n in SIZES:
        x, dy = (torch.randn(n, generator=g) * 3).to(dtype), torch.randn(n, generator=g).to(dtype)
        per_count = {}
        for threads in (1, 2):
            with torch_threads(threads):
                theirs = _both(lambda t: F.gelu(t, approximate="tanh"), x, dy)
                for ours_threads in (1, 2):
                    previous = ckparity.get_num_threads()
                    ckparity.set_num_threads(ours_threads)
                    try:
                        ours = _both(lambda t: ckparity.gelu(t, approximate="tanh"), x, dy)
                    finally:
                        ckparity.set_num_threads(previous)
                    for a, b, what in zip(ours, theirs, ("y", "dx")):
                        assert same_bits(a, b), f"{what}, n={n}: torch at {threads} threads, ours at {ours_threads}"
            per_count[threads] = theirs
        torch_moved += sum(int((a != b).sum()) for a, b in zip(per_count[1], per_count[2]))
    if torch.backends.cpu.get_cpu_capability() != "DEFAULT":  # DEFAULT: every element libm's, no split shows
        assert torch_moved > 0, "torch's bits did not depend on its thread count: the split was not exercised"


def test_any_shape_and_layout_is_its_contiguous_copys():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 40, generator=g).t()  # not contiguous
    assert same_bits(ckparity.gelu(x, approximate="tanh"), F.gelu(x.contiguous(), approximate="tanh"))
    empty = torch.randn(0, 5, requires_grad=True)
    y = ckparity.gelu(empty, approximate="tanh")
    y.sum().backward()
    assert y.shape == (0, 5) and empty.grad.shape == (0, 5)


def test_the_erf_form_and_other_dtypes_are_refused_by_name():
    x = torch.randn(4)
    with pytest.raises(InvalidArgument, match="oneDNN's eltwise gelu_erf"):
        ckparity.gelu(x)  # F.gelu's default form
    with pytest.raises(InvalidArgument, match="approximate must be 'none' or 'tanh'"):
        ckparity.gelu(x, approximate="sigmoid")
    with pytest.raises(InvalidType, match="float32 or bfloat16"):
        ckparity.gelu(x.half(), approximate="tanh")


def test_a_second_derivative_is_refused_not_silently_wrong():
    x = torch.randn(8, requires_grad=True)
    (g,) = torch.autograd.grad(ckparity.gelu(x, approximate="tanh").sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        g.sum().backward()
