"""ckparity.gelu (csrc/gelu.c, csrc/gelu_erf.c): F.gelu(x, approximate="tanh") bit for bit in float32 and
bfloat16 -- forward and backward, at torch's thread count (torch splits a large tensor between its threads and
computes each piece's last elements with libm's tanhf: the C follows the split it is told), at any thread count
of its own -- and the erf form as oneDNN computes it at the ISA oneDNN runs; other dtypes refused by name. (The width sweep at each capability: the record's claim, tests/test_capability.py;
check's properties: tests/test_slots.py; its C API: tests/test_fuzz_c_api.py and tests/test_overlaps.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity._bindings import pointer
from ckparity._native import ffi, lib
from ckparity.errors import InvalidArgument, InvalidType
from ckparity.kernels.gelu import _erf_followed
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


def test_other_forms_and_dtypes_are_refused_by_name():
    x = torch.randn(4)
    with pytest.raises(InvalidArgument, match="approximate must be 'none' or 'tanh'"):
        ckparity.gelu(x, approximate="sigmoid")
    with pytest.raises(InvalidType, match="float32 or bfloat16"):
        ckparity.gelu(x.half(), approximate="tanh")


def test_a_second_derivative_is_refused_not_silently_wrong():
    x = torch.randn(8, requires_grad=True)
    (g,) = torch.autograd.grad(ckparity.gelu(x, approximate="tanh").sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        g.sum().backward()


# --- the erf form (F.gelu's default): oneDNN's gelu_erf ------------------------------------------------------

ERF_PROBE = """
import json, torch, torch.nn.functional as F, ckparity
from ckparity import cpu
from ckparity.kernels.sweeping import same_bits
g = torch.Generator().manual_seed(5)
x = torch.cat([torch.randn(4097, generator=g) * 3, torch.linspace(-12, 12, 2001), torch.logspace(-40, -36, 40)])
out = {"isa": cpu.onednn_isa()}
for dtype in (torch.float32, torch.bfloat16):
    xs = x.to(dtype).requires_grad_(True)
    dy = torch.randn(xs.shape, generator=g).to(dtype)
    ours = [ckparity.gelu(xs)]; ours += torch.autograd.grad(ours[0], xs, dy)
    theirs = [F.gelu(xs)]; theirs += torch.autograd.grad(theirs[0], xs, dy)
    out[str(dtype)] = [same_bits(a, b) for a, b in zip(ours, theirs)]
    # the other oneDNN ISA's formula: torch's bits only by chance
    form = ckparity.ops.gelu.erf_form(xs) ^ 1
    y = torch.empty_like(xs)
    ckparity._native.lib.__getattribute__("ckp_gelu_erf_forward" + ("_bf16" if dtype == torch.bfloat16 else ""))(
        ckparity._bindings.pointer(xs.detach()), xs.numel(), form, 1, ckparity._bindings.pointer(y))
    out[str(dtype) + " other form"] = same_bits(y, theirs[0])
print(json.dumps(out))
"""


@pytest.mark.parametrize("pin", [None, "AVX512_CORE", "AVX2"])
def test_the_erf_form_is_onednns_at_the_isa_onednn_runs(pin):
    """torch hands F.gelu(x) (erf) to oneDNN, whose formula is its ISA's: the minimax erf at avx512 ISAs (and,
    where the CPU converts to bf16 in hardware, denormal results flushed), Abramowitz and Stegun's below. Pinned
    with ONEDNN_MAX_CPU_ISA in a fresh process, y and dx are torch's bits in float32 and bfloat16 (bf16 below
    avx512: torch runs ATen's own erf, and so does ckparity), and the other ISA's formula is not."""
    flags = ckparity.cpu._cpu_flags()
    if pin == "AVX512_CORE" and not ckparity.cpu.AVX512_CORE_FLAGS <= flags:
        pytest.skip("this CPU has no avx512_core: oneDNN cannot run it")
    env = dict(os.environ, **({"ONEDNN_MAX_CPU_ISA": pin} if pin else {}))
    done = subprocess.run([sys.executable, "-c", ERF_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert pin is None or out["isa"] == pin  # cpu.onednn_isa reads the pin as oneDNN does (reports' env too)
    assert out["torch.float32"] == [True, True] and not out["torch.float32 other form"]
    assert out["torch.bfloat16"] == [True, True]
    if out["isa"].startswith("AVX512"):
        assert not out["torch.bfloat16 other form"]


@pytest.mark.skipif(_erf_followed(torch.bfloat16) is not None, reason=str(_erf_followed(torch.bfloat16)))
def test_bf16_erf_results_that_are_float_denormals_are_torchs_in_the_forward_and_the_backward():
    """Where oneDNN converts to bf16 in hardware (vcvtneps2bf16), a float denormal result is flushed to a zero of
    its sign; elsewhere it is rounded. Tiny x (the forward's x / 2) and tiny dy (the backward's dy * 0.5 at x = 0),
    of both signs, 64 elements (the vector code's blocks of 16 and the rest): torch's bits either way."""
    tiny = torch.tensor([2.0 ** -128, -(2.0 ** -129), 2.0 ** -133, -(2.0 ** -126), 0.0, -0.0, 1e-3, 2.0]).repeat(8)
    x, dy = tiny.bfloat16(), tiny.flip(0).bfloat16()
    for xs, dys in ((x, dy), (torch.zeros(64).bfloat16(), dy), (x, torch.full((64,), 2.0 ** -125).bfloat16())):
        assert all(same_bits(a, b) for a, b in zip(_both(ckparity.gelu, xs, dys), _both(F.gelu, xs, dys)))


def test_the_erf_form_of_one_element_is_atens_scalar_code():
    """A tensor of one element never reaches oneDNN (use_mkldnn wants two): ATen's scalar formula, with libm's
    erff and expf, is torch's bits at every value; ATen's erf GELU on 300 elements is not oneDNN's."""
    g = torch.Generator().manual_seed(6)
    for v in (torch.randn(300, generator=g) * 4).tolist() + [0.0, -0.0, 5.6, -30.0]:
        x, dy = torch.tensor([v]), torch.tensor([0.37])
        assert all(same_bits(a, b) for a, b in zip(_both(ckparity.gelu, x, dy), _both(F.gelu, x, dy))), v
    x = torch.randn(300, generator=g) * 4
    y = torch.empty_like(x)
    lib.ckp_gelu_erf_forward(pointer(x), 300, lib.CKP_GELU_ERF_ATEN, 1, pointer(y))
    assert not same_bits(y, F.gelu(x)), "ATen's scalar formula reproduced oneDNN's: the case shows nothing"


@pytest.mark.parametrize("threads", [1, 2])
def test_with_onednn_disabled_the_erf_form_is_atens_own(threads):
    """torch.backends.mkldnn.enabled = False: torch runs ATen's erf GELU -- Vectorized<float>::erf on whole
    vector pairs (A&S with SLEEF's exp, the backward's last sum an FMA), libm's erff on each piece's tail, the
    pieces its threads' --, and so does ckparity, float32 and bf16, past the grains."""
    from ckparity.kernels.gelu import _onednn_disabled
    g = torch.Generator().manual_seed(8)
    with _onednn_disabled(), torch_threads(threads):
        for dtype in (torch.float32, torch.bfloat16):
            for n in (7, 37, 65, 300, *SIZES[:3]):
                x, dy = (torch.randn(n, generator=g) * 3).to(dtype), torch.randn(n, generator=g).to(dtype)
                assert all(same_bits(a, b) for a, b in zip(_both(ckparity.gelu, x, dy), _both(F.gelu, x, dy))), (n, dtype)


def test_the_erf_form_of_a_strided_x_is_its_contiguous_copys():
    """torch runs ATen's vectorized erf on a strided x (not followed): ckparity computes its contiguous copy."""
    x = torch.randn(40, 64).t()
    assert same_bits(ckparity.gelu(x), F.gelu(x.contiguous()))


def test_a_form_outside_the_enum_is_refused_by_the_c():
    x = torch.randn(8)
    y = torch.empty_like(x)
    assert lib.ckp_gelu_erf_forward(pointer(x), 8, 3, 1, pointer(y)) == lib.CKP_ERR_BAD_OPTION
    assert lib.ckp_gelu_erf_forward(pointer(x), 8, lib.CKP_GELU_ERF_BF16_FLUSH, 1, pointer(y)) == lib.CKP_ERR_BAD_OPTION
    assert "form must be" in ffi.string(lib.ckp_last_error()).decode()
