"""ckparity.linear (csrc/linear.c): F.linear's semantics on every layout, MKL's one-thread sgemm order
where MKL's branch is the modelled one (the width sweep: the record's claim, tests/test_capability.py),
the same bits at any thread count of ours, a claim that drops where MKL's branch is another, the twins
bit-identical with the C linear, and planted GEMM bugs caught."""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import cpu, kernels
from ckparity._native import lib
from ckparity.check import suite
from ckparity.errors import InvalidArgument, InvalidType
from ckparity.harness.basics.config import RunConfig
from ckparity.harness.loop.run import train
from ckparity.kernels.layouts import LAYOUTS
from ckparity.kernels.sweeping import grad_run, same_bits, torch_threads
from ckparity.ops import _aten_bf16, _onednn
from ckparity.ops.attention import bf16_gemm
from ckparity.ops.linear import gemm, linear

ONEDNN_NOT_FOLLOWED = importlib.import_module("ckparity.kernels.linear")._onednn_not_followed()

MODELLED = cpu.mkl_not_followed() is None
needs_modelled_mkl = pytest.mark.skipif(not MODELLED, reason=f"MKL's {cpu.mkl_branch()} branch: not followed")


def _both(x, w, b=None):
    """(ours, torch's on one thread): y and every gradient, on fresh leaves."""
    inputs = [t for t in (x, w, b) if t is not None]
    up = torch.randn(*x.shape[:-1], w.shape[0], generator=torch.Generator().manual_seed(1))
    ours = grad_run(lambda *a: linear(*a), [t.detach().requires_grad_(True) for t in inputs], up)
    with torch_threads(1):
        theirs = grad_run(lambda *a: F.linear(*a), [t.detach().requires_grad_(True) for t in inputs], up)
    return ours, theirs


@needs_modelled_mkl
@pytest.mark.parametrize("layout", ["contiguous", "x transposed", "weight transposed", "x strided", "3-D x",
                                    "3-D x transposed", "1-D x", "weight expanded"])
def test_every_layout_gives_torchs_bits(layout):
    """Operands taken by their strides (a transposed or strided x or weight read where it lies): torch's bits."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(40, 385, generator=g), torch.randn(24, 385, generator=g), torch.randn(24, generator=g)
    if layout == "x transposed":
        x = x.t().contiguous().t()
    elif layout == "weight transposed":
        w = w.t().contiguous().t()
    elif layout == "x strided":
        x = torch.randn(40, 770, generator=g)[:, ::2]
    elif layout == "3-D x":
        x = x.reshape(4, 10, 385)
    elif layout == "3-D x transposed":
        x = x.reshape(10, 4, 385).transpose(0, 1)
    elif layout == "1-D x":  # one row: MKL's gemv; the forward's dot products are not claimed, its shapes are
        x = x[0]
    elif layout == "weight expanded":
        w = w[:1].expand(24, 385)
    ours, theirs = _both(x, w, b)
    for a, c in zip(ours, theirs):
        assert a.shape == c.shape and a.dtype == c.dtype
    if layout != "1-D x":
        assert all(same_bits(a, c) for a, c in zip(ours, theirs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_degenerate_shapes_are_torchs(dtype):
    """0 rows, K = 0 (every output the empty sum plus the bias) and a weight of 0 outputs (an empty y; it was an
    error, a NULL output pointer): torch's values and gradients."""
    for xs, ws in (((0, 5), (3, 5)), ((4, 0), (3, 0)), ((2, 0, 5), (3, 5)), ((3, 5), (0, 5)), ((2, 3, 5), (0, 5)),
                   ((5,), (0, 5))):
        x, w, b = torch.randn(xs, dtype=dtype), torch.randn(ws, dtype=dtype), torch.randn(ws[0], dtype=dtype)
        for bias in (None, b):
            ours, theirs = _both(x, w, bias)
            assert all(a.shape == c.shape and same_bits(a, c) for a, c in zip(ours, theirs)), (xs, ws, bias)


def test_bad_input_is_refused_by_name():
    with pytest.raises(InvalidArgument, match=r"x \(3, 8\) and weight \(4, 5\) do not multiply"):
        linear(torch.randn(3, 8), torch.randn(4, 5))
    with pytest.raises(InvalidArgument, match=r"bias \(3,\) for a weight of 4 outputs"):
        linear(torch.randn(3, 8), torch.randn(4, 8), torch.randn(3))
    with pytest.raises(InvalidType, match="float32"):
        linear(torch.randn(3, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(InvalidType, match="ckparity takes one dtype"):
        linear(torch.randn(3, 8).bfloat16(), torch.randn(4, 8))


def test_our_bits_do_not_depend_on_our_thread_count():
    """Threads split rows and column panels, never K: 1 and 2 threads give the same bits (any MKL branch)."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(300, 1000, generator=g), torch.randn(700, 1000, generator=g)
    before = ckparity.get_num_threads()
    results = []
    try:
        for n in (1, 2):
            ckparity.set_num_threads(n)
            y = torch.empty(300, 700)
            gemm(x, w.t(), y)
            results.append(y)
    finally:
        ckparity.set_num_threads(before)
    assert torch.equal(results[0], results[1])


@needs_modelled_mkl
@pytest.mark.parametrize("M, K, N", [(256, 4096, 4096), (100, 11008, 512), (1024, 768, 2048), (64, 1000, 191),
                                     (64, 1000, 192)])
def test_large_shapes_are_torchs_on_one_thread(M, K, N):
    """K blocks past the sweep's (11008: llama's hidden), and both sides of the 192-column rule."""
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    y = torch.empty(M, N)
    gemm(x, w.t(), y)
    with torch_threads(1):
        assert torch.equal(y, x @ w.t())


def _in_process(code: str, **env) -> dict:
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(__file__))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


AVX2_OWN_PROBE = """
import json, torch, torch.nn.functional as F
import ckparity.sweep as s
from ckparity._native import lib
from ckparity.kernels.sweeping import grad_run, same_bits
torch.set_num_threads(1)
g = torch.Generator().manual_seed(5)
def differ(M, K, N):
    x, w, b = (torch.randn(*shape, generator=g).requires_grad_(True) for shape in ((M, K), (N, K), (N,)))
    up = torch.randn(M, N, generator=g)
    ours, theirs = grad_run(ckparity_linear, [x, w, b], up), grad_run(F.linear, [x, w, b], up)
    return [not same_bits(a, t) for a, t in zip(ours, theirs)]
from ckparity.ops.linear import linear as ckparity_linear
sweep = s.run(["linear"])
# under 4 rows or 12 columns: y (MKL's small sgemm), dX and dW (its small paths by columns): dX of 2 rows, dW of
# 3, both of K = 8
small = [differ(*shape) for shape in ((2, 97, 33), (16, 97, 3), (16, 8, 33), (3, 61, 7))]
lib.ckp_set_gemm_order(lib.CKP_GEMM_ORDER_MKL)  # the AVX-512 branch's blocks
avx512 = [differ(*shape) for shape in ((32, 1000, 64), (32, 300, 64), (64, 1153, 48))]
print(json.dumps({"sweep": sweep, "small": small, "avx512": avx512}))
"""


@pytest.mark.skipif(not cpu.mkl_avx2_own() or cpu._cpu_vendor() != "AuthenticAMD",
                    reason="MKL's AVX2 branch's own order: measured on an AMD CPU without AVX-512")
def test_on_mkls_own_avx2_branch_the_claims_gemms_are_torchs():
    """On a CPU without AVX-512 MKL runs its AVX2 code ([Note: MKL's AVX2 order], [Note: MKL's AVX2 small
    sgemm] and its by-columns Note): the claim's sweep over it finds 0 differing at 1 and 2 torch threads; y, dX and
    dW of 2 rows or 3..7 columns are torch's bits, and the AVX-512 branch's blocks (what ckparity ran here before)
    differ -- each condition can fail."""
    result = _in_process(AVX2_OWN_PROBE)
    sweep = result["sweep"]
    assert sweep["not_claimed_here"].get("linear") is None, sweep["not_claimed_here"]
    for quantity, tally in sweep["kernels"]["linear"].items():
        assert tally["differing"] == 0, (quantity, tally["examples"])
    assert sweep["kernels"]["linear"]["y"]["swept"] > 1000
    assert not any(any(d) for d in result["small"]), result["small"]
    assert all(d[0] for d in result["avx512"]), result["avx512"]


@pytest.mark.parametrize("pinned", [
    pytest.param("AVX2", marks=pytest.mark.skipif(not {"avx2", "fma", "avx512f"} <= cpu._cpu_flags(),
                 reason="MKL_CBWR=AVX2 pins a lower branch than the CPU's only where it has AVX-512")),
    pytest.param("AVX512", marks=pytest.mark.skipif(not cpu.avx512_but_mkl_avx2(),
                 reason="MKL_CBWR=AVX512 pins another branch than AUTO's only on an AMD CPU past Zen 4"))])
def test_on_a_pinned_mkl_branch_the_claim_is_dropped_and_would_be_false(pinned):
    """MKL_CBWR=AVX2 pins MKL's AVX2 code where AUTO runs its AVX-512 code, and MKL_CBWR=AVX512 its AVX-512 code
    where AUTO runs its AVX2 code (an AMD Zen 5): other orders. linear leaves what is bit-identical here, the sweep
    says why, and its figures show the claim would not hold (a condition that cannot fail proves nothing)."""
    result = _in_process("import json, ckparity.sweep as s, ckparity.kernels as k; r = s.run(['linear']); "
                         "print(json.dumps({'here': k.bit_identical(), 'sweep': r}))", MKL_CBWR=pinned)
    assert "linear" not in result["here"] and "rms_norm" in result["here"]
    assert pinned in result["sweep"]["not_claimed_here"]["linear"]
    assert result["sweep"]["kernels"]["linear"]["y"]["differing"] > 0


STRICT_PROBE = """
import json, os, torch, torch.nn.functional as F
import ckparity.sweep as s
from ckparity._native import lib
from ckparity.kernels.layouts import LAYOUTS
from ckparity.kernels.sweeping import grad_run, same_bits, torch_threads
from ckparity.ops.attention import attention
from ckparity.ops.linear import linear
g = torch.Generator().manual_seed(3)
# (M, K, N): MKL's own order at 2 threads splits K into halves (16x2048x16), at 768 (256x1000x128), at 1792
# (16x2048x384); its gemv (one row), a skinny path (4 rows), K = 1
cases = [(16, 2048, 16), (256, 1000, 128), (16, 2048, 384), (1, 1000, 200), (4, 1000, 128), (64, 1, 33)]
def run(threads):
    out = []
    for M, K, N in cases:
        x, w, b = (torch.randn(*shape, generator=g).requires_grad_(True) for shape in ((M, K), (N, K), (N,)))
        up = torch.randn(M, N, generator=g)
        ours = grad_run(linear, [x, w, b], up)
        with torch_threads(threads):
            out += [same_bits(a, t) for a, t in zip(ours, grad_run(F.linear, [x, w, b], up))]
    q, k, v = (torch.randn(1, h, 300, 32, generator=g).requires_grad_(True) for h in (2, 1, 1))
    up = torch.randn(1, 2, 300, 32, generator=g)
    kw = dict(is_causal=True, enable_gqa=True)
    ours = grad_run(lambda *t: attention(*t, **kw), [q, k, v], up)
    with torch_threads(threads):
        out += [same_bits(a, t) for a, t in zip(ours, grad_run(lambda *t: F.scaled_dot_product_attention(*t, **kw), [q, k, v], up))]
    return out
strict = {t: run(t) for t in (1, 2)}
full = os.environ["MKL_CBWR"].startswith("AUTO")  # the AVX2 branch: linear's sweep (attention's GEMMs: above)
sweep = s.run(["linear", "attention"] if full else ["linear"])
from ckparity.check import suite
check = {p["property"]: p["verdict"] for p in suite.check("linear", "c")["properties"]} if full else {}
lib.ckp_set_gemm_order(lib.CKP_GEMM_ORDER_MKL)
print(json.dumps({"strict": strict, "own_order": run(2), "sweep": sweep, "check": check}))
"""


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu._cpu_flags() or cpu._cpu_vendor() != "GenuineIntel",
                    reason="MKL's strict orders were measured on Intel CPUs with AVX2 only")
@pytest.mark.parametrize("cbwr", ["AUTO,STRICT", "AVX2,STRICT"])
def test_under_mkls_strict_order_every_gemm_is_torchs_at_1_and_2_threads(cbwr):
    """MKL_CBWR=AUTO,STRICT (the CPU's branch: AVX-512 or AVX2) and AVX2,STRICT: torch's GEMMs give one order at any
    thread count, which ckparity follows -- the shapes MKL's own order splits between 2 threads, its gemv and
    skinny paths, attention's backward past Tq 192 -- and MKL's own order (the default) is not torch's bits
    there, so the strict order is what makes them agree. The claim's sweep covers 1 and 2 torch threads there,
    0 differing, and check finds every property bitwise (batch invariance too: no gemv path to leave). Run on
    Intel CPUs, where the orders were measured (MKL picks its code by vendor; elsewhere not claimed)."""
    result = _in_process(STRICT_PROBE, MKL_CBWR=cbwr)
    assert all(result["strict"]["1"]) and all(result["strict"]["2"])
    assert not all(result["own_order"])
    sweep = result["sweep"]
    assert sweep["mkl_strict"] is True and sweep["not_claimed_here"] == {}
    for kernel in sweep["kernels"]:
        for quantity, tally in sweep["kernels"][kernel].items():
            assert tally["differing"] == 0, (kernel, quantity, tally["examples"])
    assert sweep["kernels"]["linear"]["y"]["swept"] > 3000  # both thread counts and the gemv cases
    # check: every property bitwise, the one-row batches and width 1's one-column GEMMs (MKL's gemv) too
    assert cbwr != "AUTO,STRICT" or set(result["check"].values()) == {"bitwise"}, result["check"]


@pytest.mark.skipif(not cpu.mkl_avx2_own(), reason="MKL's AVX2 branch's own order: measured on AMD CPUs")
def test_on_mkls_avx2_branch_a_k_of_1_keeps_the_sign_of_zero_torch_gives():
    """Signed zeros are bits: with K = 1 a zero x and a negative weight make a -0 product. MKL's rank-1 update
    keeps it (-0) but one row or one column is its gemv, whose sum starts at +0 (ckparity gave -0 there): y, dx and
    dweight of every layout torch's mm takes, at M and N 1..12, with no bias (with one, bias + product as before)."""
    for M, N, transposed in itertools.product(range(1, 13), range(1, 13), (False, True)):
        x = torch.zeros(1, M).t() if transposed else torch.zeros(M, 1)
        w = torch.full((N, 1), -1.0)
        ours = linear(x, w)
        theirs = F.linear(x, w)
        assert same_bits(ours, theirs), (M, N, transposed)
        out = torch.empty(M, N)
        gemm(x, w.t(), out)
        assert same_bits(out, theirs), (M, N, transposed)
    x, w, up = torch.zeros(3, 1, requires_grad=True), torch.zeros(1, 1, requires_grad=True), torch.full((3, 1), -2.0)
    for q, a, b in zip(("y", "dx", "dweight"), grad_run(linear, [x, w], up), grad_run(F.linear, [x, w], up)):
        assert same_bits(a, b), q


@pytest.mark.skipif(not cpu.mkl_avx2_own(), reason="MKL's AVX2 branch's own order: measured on AMD CPUs")
def test_on_mkls_avx2_branch_a_gemvs_zero_sum_onto_a_bias_of_minus_0_keeps_torchs_sign():
    """One x row or one output whose products are all -0 with a bias of -0: MKL's gemv chain starts from its first
    term and its lanes from +0, reduced only where a step ran, so y is -0 for a short K and +0 past the steps
    (ckparity gave +0 throughout). Every K 2..20, the weight's and x's placement off a 16-byte boundary (which
    moves the steps), one row of 1..9 outputs and one output of 2..6 rows."""
    signs = set()
    for K, off, (M, N) in itertools.product(range(2, 21), range(4), [(1, n) for n in range(1, 10)] + [(m, 1) for m in range(2, 7)]):
        x = torch.zeros(M * K + 4)[off:off + M * K].view(M, K)
        w = torch.full((N * K + 4,), -1.0)[3 - off:3 - off + N * K].view(N, K)
        b = torch.full((N,), -0.0)
        theirs = F.linear(x, w, b)
        assert same_bits(linear(x, w, b), theirs), (M, K, N, off)
        signs |= set(torch.signbit(theirs).flatten().tolist())
    assert signs == {True, False}  # both signs occur: the case is not a constant


@pytest.mark.skipif(not cpu.mkl_avx2_own() or cpu._cpu_vendor() != "AuthenticAMD",
                    reason="MKL's AVX2 branch's own order: measured on an AMD CPU without AVX-512")
@pytest.mark.parametrize("M, K, N", [(5, 40, 20), (6, 17, 12), (9, 8, 101), (11, 300, 64), (7, 2, 150)])
def test_on_mkls_own_avx2_branch_two_torch_threads_share_the_rows_and_ckparity_follows(M, K, N):
    """At 2 threads MKL's AVX2 branch shares a product of 5..11 rows between them by rows, in groups of 4, each
    share on its own path ([Note: MKL's AVX2 sgemm on two threads]; one row of y: MKL's small dot products, not its
    gemv): y, dX and dW are torch's bits at 1 and 2 torch threads, and torch's y at 2 threads is not its y at 1
    (the share is MKL's, not a guess)."""
    g = torch.Generator().manual_seed(6)
    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    up = torch.randn(M, N, generator=g)
    ys = []
    for n in (1, 2):
        with torch_threads(n):
            ours = grad_run(linear, [t.requires_grad_(True) for t in (x, w, b)], up)
            theirs = grad_run(F.linear, [x, w, b], up)
        for name, a, c in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
            assert same_bits(a, c), f"{name} at {n} torch threads: {(a != c).sum().item()} of {a.numel()} differ"
        ys.append(theirs[0])
    assert not same_bits(*ys)


@pytest.mark.skipif(not cpu.mkl_avx2_own() or cpu._cpu_vendor() != "AuthenticAMD",
                    reason="MKL's AVX2 branch's own order: measured on an AMD CPU without AVX-512")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["one row", "1-D x", "one output", "one of each", "weight strided off a boundary"])
def test_on_mkls_own_avx2_branch_its_gemv_is_followed(layout, threads):
    """One x row or one output is MKL's gemv ([Note: MKL's AVX2 sgemv]): its tail outputs take their lead from
    where the vector starts, its groups of 4 from where the group's fourth row starts -- so x lies 1 float past a
    16-byte boundary, and the strided weight starts 3 floats past one with rows 2 floats apart past K. y, dX, dW
    and dbias are torch's bits at 1 and 2 torch threads."""
    g = torch.Generator().manual_seed(8)
    K, N = 37, 13
    store = torch.randn(6 * K, generator=g)
    x = store[1:1 + K].view(1, K) if layout != "one output" else store[1:1 + 5 * K].view(5, K)
    w = torch.randn(N if layout not in ("one output", "one of each") else 1, K, generator=g)
    if layout == "1-D x":
        x = x[0]
    elif layout == "weight strided off a boundary":
        w = torch.randn(N * (K + 2) + 3, generator=g)[3:].view(N, K + 2)[:, :K]
    b = torch.randn(w.shape[0], generator=g)
    up = torch.randn(*x.shape[:-1], w.shape[0], generator=g)
    with torch_threads(threads):
        ours = grad_run(linear, [t.detach().requires_grad_(True) for t in (x, w, b)], up)
        theirs = grad_run(F.linear, [t.detach().requires_grad_(True) for t in (x, w, b)], up)
    for name, a, c in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
        assert same_bits(a, c), f"{name}: {(a != c).sum().item()} of {a.numel()} differ"


def test_a_torch_thread_count_under_one_is_refused_and_nothing_written():
    from ckparity._native import ffi, lib

    a, b, c = torch.randn(6, 20), torch.randn(20, 12), torch.full((6, 12), 7.0)
    at = lambda t: ffi.cast("float *", t.data_ptr())  # noqa: E731
    assert lib.ckp_gemm(at(a), 20, 1, at(b), 12, 1, 6, 20, 12, ffi.NULL, 0, at(c), 0) == lib.CKP_ERR_BAD_OPTION
    assert "torch_threads must be >= 1" in ffi.string(lib.ckp_last_error()).decode()
    assert bool((c == 7.0).all())


def test_a_gemm_order_that_is_none_is_refused():
    from ckparity._native import lib

    before = lib.ckp_get_gemm_order()
    assert lib.ckp_set_gemm_order(7) != 0 and lib.ckp_get_gemm_order() == before


@needs_modelled_mkl
@pytest.mark.parametrize("operand, layout", [("x", "transposed"), ("weight", "strided"), ("weight", "transposed"),
                                             ("weight", "expanded rows")])
def test_a_column_major_or_odd_operands_gradient_is_the_gemm_autograd_runs(operand, layout):
    """Autograd's mm backward gives a column-major x a column-major dX, computing dXᵀ = Wᵀ.dYᵀ, and a weight whose
    transpose is not column-major dW through dWᵀ = Xᵀ.dY: other GEMMs than dY.W and dYᵀ.X, which MKL's small paths
    sum in another order. ckparity runs the GEMM autograd runs: torch's bits; on MKL's AVX2 branch the GEMM it ran
    before gives other bits (3 rows, x of K 34, a weight 8 wide: its small paths)."""
    g = torch.Generator().manual_seed(3)
    K = 34 if operand == "x" else 8
    x, w, up = torch.randn(3, K, generator=g), torch.randn(19, K, generator=g), torch.randn(3, 19, generator=g)
    place = {"x": lambda t: t, "weight": lambda t: t, operand: LAYOUTS[layout]}

    def run(fn):
        leaves = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
        fn(place["x"](leaves[0]), place["weight"](leaves[1])).backward(up)
        return [t.grad for t in leaves]
    with torch_threads(1):
        theirs = run(F.linear)
    ours = run(linear)
    assert all(same_bits(a, b) for a, b in zip(ours, theirs))
    if cpu.mkl_avx2_own():
        before = torch.empty(3, K) if operand == "x" else torch.empty(19, K)
        if operand == "x":
            gemm(up, w, before)  # dX = dY.W
        else:
            gemm(up.t(), x, before)  # dW = dYᵀ.X
        assert not same_bits(before, theirs[0 if operand == "x" else 1])


@needs_modelled_mkl
def test_check_says_bitwise_where_followed_and_which_cases_are_not():
    """check's 3-row cases (MKL's skinny paths from K = 72) and 17-row ones are torch's bits but width 1, whose
    dX and dW have one column (MKL's gemv, not followed); the row alone (one row: gemv) keeps batch_invariance
    from bitwise, and it says the row moves only where torch's does."""
    record = kernels.KERNELS["linear"]
    report = suite.check("linear", "c")
    if cpu.mkl_avx2_own():
        return _check_on_mkls_avx2_branch(report)
    widths = next(r for r in report["properties"] if r["property"] == "widths")
    # width 1's dX and dW; at 2 torch threads, MKL splits some long K between its threads (not followed)
    split = sum(w > 768 for w in record.conformance.widths) if torch.get_num_threads() > 1 else 0
    assert widths["cases"] - widths["bit_identical"] <= len(record.conformance.rows) * (1 + split)
    assert widths["failing"] == 0
    layouts = next(r for r in report["properties"] if r["property"] == "layouts")
    assert layouts["verdict"] == "bitwise"  # an operand no BLAS takes is copied first, as ATen's addmm copies it
    batch = next(r for r in report["properties"] if r["property"] == "batch_invariance")
    assert batch["verdict"] == "as accurate as torch" and "where torch's do" in suite.table(report)
    threads = next(r for r in report["properties"] if r["property"] == "threads")
    assert threads["verdict"] == "bitwise"


def _check_on_mkls_avx2_branch(report):
    """MKL's AVX2 branch's own order: every property bitwise -- width 1 (dX and dW of one column: MKL's gemv, both
    its forms followed), the row alone of batch_invariance (one row: its gemv), every layout (a layout no BLAS
    takes copied first, as ATen copies it; a column-major operand's gradient through the GEMM autograd runs)."""
    assert {r["property"]: r["verdict"] for r in report["properties"]} == \
        {r["property"]: "bitwise" for r in report["properties"]}
    assert report["verdict"] == "bitwise"


PLAIN = RunConfig(model="stacked", num_layers=2, seq_len=16, batch_size=2, grad_accum=2, total_tokens=4096,
                  max_steps=12, no_progress=True, threads=1, ck_linear_backend="c", ck_loss_backend="c_ptref",
                  ck_optimizer_backend="torch")
LLAMA = replace(PLAIN, model="llama", heads=4, kv_heads=2, d_model=32, hidden=48, vocab=64)


@needs_modelled_mkl
@pytest.mark.parametrize("model", ["tiny", "stacked", "llama"])
def test_the_twins_stay_bit_identical_with_the_c_linear(model):
    config = LLAMA if model == "llama" else replace(PLAIN, model=model)
    report = train(config)
    assert report["status"] == "pass", report.get("error")
    assert report["divergence"]["first_step"] is None, report["divergence"]
    assert report["env"]["mkl_branch"] == cpu.mkl_branch()


def _drops_k_tail(x, weight, bias=None):
    """planted fault: the last K % 16 columns never reach the product (a vector loop without its tail)"""
    K = x.shape[-1] - x.shape[-1] % 16
    return linear(x[..., :K].contiguous(), weight[:, :K].contiguous(), bias)


def _wrong_stride(x, weight, bias=None):
    """planted fault: the weight read with a contiguous one's strides, whatever its own (a transposed weight
    read as if it were not)"""
    return linear(x, torch.as_strided(weight, weight.shape, (weight.shape[1], 1)), bias)


def _bias_twice(x, weight, bias=None):
    """planted fault: the bias added to the product twice (once as the seed, once after)"""
    y = linear(x, weight, bias)
    return y if bias is None else y + bias


for _name, _fn in (("fault_drops_k_tail", _drops_k_tail), ("fault_wrong_stride", _wrong_stride),
                   ("fault_bias_twice", _bias_twice)):
    kernels.register("linear", _name, _fn)


@pytest.mark.parametrize("fault, caught_at", [("fault_drops_k_tail", "widths"), ("fault_wrong_stride", "layouts"),
                                              ("fault_bias_twice", "options")])
def test_check_catches_a_planted_gemm(fault, caught_at):
    report = suite.check("linear", fault)
    assert not report["passed"] and report["verdict"] in ("wrong", "crashes"), suite.table(report)
    failing = {r["property"] for r in report["properties"] if r["verdict"] in ("wrong", "crashes")}
    assert caught_at in failing, suite.table(report)


@pytest.mark.parametrize("fault", ["fault_drops_k_tail", "fault_bias_twice"])
def test_train_catches_a_planted_gemm_at_step_1(fault):
    """stacked's linears have K 64 and 128 (no tail to drop): a width of 100 has one; the models' linears are
    bias-free, so the bias fault is run on the GEMM without a bias too and must then be torch's bits."""
    config = replace(PLAIN, d_model=100, hidden=72, ck_linear_backend=fault)
    report = train(config)
    if fault == "fault_bias_twice":  # no bias in the twins: the fault never bites, and nothing may be blamed
        assert report["divergence"]["first_step"] is None
    else:
        assert report["status"] == "fail" and report["first_loss_fail_step"] == 1


@pytest.mark.skipif(not MODELLED, reason=f"MKL's {cpu.mkl_branch()} branch: its sgemm order is not followed")
def test_a_contiguous_x_of_any_dims_takes_addmm_its_bias_in_the_sum():
    """F.linear folds a contiguous x of 4 and 5 dims into addmm, whose bias is C's start (summed into each K
    block's result in turn), not matmul and then the bias: at K = 1000 (several K blocks) y, dx, dweight and dbias
    are torch's bits; a transposed 4-D x is matmul and then the bias, torch's bits too. (Until this stop a 4-D x
    took the bias after: 537 of 960 outputs differed.)"""
    g = torch.Generator().manual_seed(12)
    for shape, transposed in (((2, 3, 4, 1000), False), ((2, 1, 2, 1, 1000), False), ((3, 2, 4, 1000), True)):
        x = torch.randn(*shape, generator=g)
        x = x.transpose(0, 1) if transposed else x
        w, b = torch.randn(40, 1000, generator=g), torch.randn(40, generator=g) * 100
        up = torch.randn(*x.shape[:-1], 40, generator=g)
        inputs = [x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True)]
        with torch_threads(1):
            ours, theirs = grad_run(linear, inputs, up), grad_run(F.linear, inputs, up)
        assert all(same_bits(a, t) for a, t in zip(ours, theirs)), (shape, transposed)


@pytest.mark.skipif(_aten_bf16.torch_runs_aten(), reason="torch runs ATen's own bf16 loops here: linear.aten's tests")
def test_bf16_with_a_bias_accumulates_in_float32_at_any_thread_count_and_is_as_accurate_as_torch():
    """bfloat16 on oneDNN with a bias is not torch's bits (how oneDNN adds it is not measured); it is the float32 GEMM
    rounded once: the same bits at 1 and 2 threads, and against float64 of the same bf16 values no less
    accurate than torch's bf16 (the worst element's error at most torch's worst, plus one bf16 rounding of the
    output)."""
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(64, 1000, generator=g).bfloat16(), torch.randn(96, 1000, generator=g).bfloat16()
    b = torch.randn(96, generator=g).bfloat16()
    before = ckparity.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            ckparity.set_num_threads(n)
            outs.append(linear(x, w, b))
    finally:
        ckparity.set_num_threads(before)
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    exact = x.double() @ w.double().t() + b.double()
    ours, theirs = (outs[0].double() - exact).abs(), (F.linear(x, w, b).double() - exact).abs()
    ulp = exact.abs() * 2.0 ** -8  # a bf16 ulp at the value: both sides round their result once
    assert (ours <= theirs + ulp).all() and ours.max() <= theirs.max() * 1.01


@pytest.mark.skipif(ONEDNN_NOT_FOLLOWED is not None, reason=str(ONEDNN_NOT_FOLLOWED))
def test_bf16_without_a_bias_is_onednns_bits_and_a_wrong_order_is_refused():
    """Where ops/_onednn.py measures oneDNN's order (AMX's tiles, or AVX-512 bf16's chain over pairs), y, dX and
    dW are torch's bits -- a 3-D x, K chunked (3 chunks at 64 x 1000 x 1000 on an AMX Xeon, 2 on an AMD Zen 5),
    an odd K -- at 1 and 2 ckparity threads; and the check a measured order must pass refuses a wrong one (another
    tile width, the pairs summed as AMX tiles of 2 where the chain is measured, another chunking), so a CPU whose
    oneDNN sums otherwise gets the float32 GEMM rounded once, not false bits."""
    g = torch.Generator().manual_seed(9)
    for lead, K, N in (((2, 8), 64, 128), ((64,), 1000, 1000), ((40,), 301, 72)):
        x = torch.randn(*lead, K, generator=g).bfloat16()
        w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16()
        up = torch.randn(*lead, N, generator=g).bfloat16()
        theirs = grad_run(F.linear, [x.requires_grad_(True), w.requires_grad_(True)], up)
        before = ckparity.get_num_threads()
        try:
            for n in (1, 2):
                ckparity.set_num_threads(n)
                ours = grad_run(linear, [x, w], up)
                assert all(same_bits(a, b) for a, b in zip(ours, theirs)), (lead, K, N, n)
        finally:
            ckparity.set_num_threads(before)
    measured = _onednn.order(64, 1000, 1000, False, True)
    assert measured.starts  # chunked: the chunking below is another
    for wrong in (_onednn.Order(16, measured.starts), _onednn.Order(2 if measured.width == 0 else 0, measured.starts),
                  _onednn.Order(measured.width, ())):
        assert wrong != measured and not _onednn._confirmed(wrong, 64, 1000, 1000, False, True)


@pytest.mark.skipif(importlib.import_module("ckparity.kernels.linear")._onednn_bias_not_followed() is not None,
                    reason="a bias is measured in oneDNN's AVX-512 bf16 brgemm's sum only (no AMX)")
def test_on_onednns_avx512_bf16_brgemm_a_bias_is_in_the_float32_sum(monkeypatch):
    """There F.linear's bias is added to the float32 sum and rounded once with it: y, dx, dweight and dbias are
    torch's bits (a 3-D x too), and the bias added after the rounded product (what F.linear does for an x it does
    not fold) differs from torch's y in the linear.onednn_bias sweep's cases."""
    record = importlib.import_module("ckparity.kernels.linear")
    tally = record.Tally()
    for lead, K, N in (((64,), 1000, 200), ((2, 9), 37, 17), ((40,), 301, 72)):
        record._case_bf16(tally, f"{lead} K={K} N={N}", lead, K, N, torch.Generator().manual_seed(K), bias=True)
    assert all(tally.result()[q]["differing"] == 0 for q in ("y", "dx", "dweight", "dbias")), tally.result()
    product = _onednn.product
    monkeypatch.setattr(_onednn, "product", lambda a, b, order, bias=None: product(a, b, order) if bias is None
                        else (product(a, b, order).float() + bias.float()).bfloat16())
    tally = record.Tally()
    for lead, K, N in (((64,), 1000, 200), ((40,), 301, 72)):
        record._case_bf16(tally, f"{lead} K={K} N={N}", lead, K, N, torch.Generator().manual_seed(K), bias=True)
    assert tally.result()["y"]["differing"] > 0, tally.result()


def test_the_pairs_chain_adds_a_pairs_odd_term_first_and_its_chunks_apart():
    """[Note: oneDNN's AVX-512 bf16 order] on any CPU (ckparity's C, not oneDNN): width 0 is one chain over K's
    pairs, the odd-placed term first -- (2^30, 0), (1, -2^30) sums to 1 (an even-first chain: 0) and (1, 0),
    (2^30, -2^30) to 0 (pairs summed first, AMX's tiles of 2: 1) -- an odd K's last pair padded, and a chunk
    start sums apart: 1, 0, -2^30, 2^30 is 0 as one chain and 1 with a chunk from the pair."""
    big = 2.0 ** 30

    def y(values, starts=()):
        a = torch.tensor([values], dtype=torch.bfloat16)
        return _onednn.product(a, torch.ones(len(values), 3, dtype=torch.bfloat16), _onednn.Order(0, starts))[0]

    assert y([big, 0, 1, -big]).eq(1).all() and y([1, 0, big, -big]).eq(0).all()
    assert _onednn.product(torch.tensor([[1, 0, big, -big]], dtype=torch.bfloat16), torch.ones(4, 3).bfloat16(),
                           _onednn.Order(2, ())).eq(1).all()  # the other reading, on the same inputs
    assert y([big, -big, 1]).eq(1).all() and y([1, big, -big]).eq(0).all()  # an odd K: the last term padded
    assert y([1, 0, -big, big]).eq(0).all() and y([1, 0, -big, big], starts=(2,)).eq(1).all()


@pytest.mark.skipif("avx512_bf16" not in cpu._cpu_flags(), reason="no VDPBF16PS here: width 0 is its emulation")
def test_vdpbf16ps_itself_and_its_emulation_give_the_same_bits(tmp_path):
    """Width 0 runs VDPBF16PS where the CPU has it and its float32 emulation elsewhere (CKP_BF16_EMULATE=1 forces
    it): the same bits over odd and even K, chunks, a bias, both layouts of B, denormal inputs and products under
    2^-126 (the emulation's FMA under DAZ and FTZ is the SDM's "FP32 FMA with DAZ in, FTZ out"). The bf16 flash
    backward's oneDNN accumulation too: its emulation passes the bf16 attention sweep against torch."""
    g = torch.Generator().manual_seed(7)
    cases = []
    for M, K, N, starts, bias, scale in ((17, 5, 33, (), False, 1.0), (33, 1000, 70, (512,), True, 1.0),
                                         (8, 64, 40, (16, 32), True, 2.0 ** -63), (12, 301, 9, (100,), False, 2.0 ** -66),
                                         (40, 2048, 48, (512, 1024, 1536), True, 1.0)):
        a = (torch.randn(M, K, generator=g) * scale).bfloat16()
        a[0, :3] = torch.tensor([2.0 ** -130, -(2.0 ** -128), 2.0 ** -127])  # denormal inputs
        b = (torch.randn(N, K, generator=g) * scale).bfloat16().t()  # y's layout; and a row-major copy
        cases.append((a, b, starts, (torch.randn(N, generator=g) * scale).bfloat16() if bias else None))
    torch.save(cases, tmp_path / "cases.pt")
    code = ("import sys, json, torch; from ckparity.ops import _onednn; import ckparity.sweep as s\n"
            "out = [_onednn.product(a, bt, _onednn.Order(0, st), bias) for a, b, st, bias in torch.load(sys.argv[1]) "
            "for bt in (b, b.contiguous())]\n"
            "torch.save(out, sys.argv[2])\n"
            "if len(sys.argv) > 3: print(json.dumps(s.run(['attention'], dtype='bfloat16')['kernels']['attention']))")
    environment = {k: v for k, v in os.environ.items() if k != "CKP_BF16_EMULATE"}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "cases.pt"), str(tmp_path / "native.pt")], check=True,
                   timeout=300, env=environment)
    swept = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cases.pt"), str(tmp_path / "emulated.pt"),
                            "sweep"], check=True, timeout=600, env={**environment, "CKP_BF16_EMULATE": "1"},
                           capture_output=True, text=True)
    native, emulated = (torch.load(tmp_path / f"{side}.pt") for side in ("native", "emulated"))
    assert len(native) == 2 * len(cases)
    if bf16_gemm() == lib.CKP_BF16_GEMM_ONEDNN:  # the accumulation's emulation runs in this sweep
        figures = json.loads(swept.stdout.strip().splitlines()[-1])
        assert all(f["swept"] > 2000 and f["differing"] == 0 for f in figures.values()), figures
    for i, (x, y) in enumerate(zip(native, emulated)):
        differing = (x.view(torch.int16) != y.view(torch.int16)).sum().item()
        assert same_bits(x, y), f"output {i}: {differing} of {x.numel()} differ"


def test_the_bf16_pairs_gemm_reads_a_in_place_or_packed_with_the_same_bits():
    """A row-major A of even K and even row stride on a 4-byte boundary is read in place as VDPBF16PS's pairs; any
    other (odd K, a view off that boundary, an odd row stride, a transposed A in panels) is packed: the same
    bits each way, chunks and a bias included, through the instruction and its emulation alike."""
    g = torch.Generator().manual_seed(11)
    for M, K, N, starts in ((19, 64, 40, ()), (33, 300, 70, (128,)), (9, 31, 33, ()), (40, 1000, 64, (512,))):
        a = torch.randn(M, K, generator=g).bfloat16()
        b, bias = torch.randn(K, N, generator=g).bfloat16(), torch.randn(N, generator=g).bfloat16()
        off = torch.empty(M * K + 1, dtype=torch.bfloat16)[1:].view(M, K)  # 2 bytes off the boundary
        wide = torch.empty(M, K + 1, dtype=torch.bfloat16)[:, :K]  # rows K + 1 apart
        wider = torch.empty(M, K + 2, dtype=torch.bfloat16)[:, :K]  # rows K + 2 apart: in place for an even K
        layouts = [a, off.copy_(a), wide.copy_(a), wider.copy_(a), a.t().contiguous().t()]
        for bias_or_none in (None, bias):
            outs = [_onednn.product(x, b, _onednn.Order(0, starts), bias_or_none) for x in layouts]
            assert all(same_bits(outs[0], o) for o in outs[1:]), (M, K, N, bias_or_none is None)


@pytest.mark.skipif(ONEDNN_NOT_FOLLOWED is not None, reason=str(ONEDNN_NOT_FOLLOWED))
def test_the_bf16_sweep_sees_an_order_that_is_not_onednns(monkeypatch):
    """The linear.onednn sweep can fail: with tiles of half oneDNN's width (the chains regrouped, every value the
    same), or for AVX-512 bf16's chain over pairs each pair summed first (AMX tiles of 2), its cases differ from
    torch's in y, dx and dweight."""
    record = importlib.import_module("ckparity.kernels.linear")
    measured = _onednn.order

    def regrouped(*shape):
        order = measured(*shape)
        return order if order is None else _onednn.Order(order.width // 2 if order.width else 2, order.starts)
    monkeypatch.setattr(_onednn, "order", regrouped)
    tally = record.Tally()
    for M, K, N in ((64, 1000, 200), (200, 1000, 64)):
        record._case_bf16(tally, f"M={M} K={K} N={N}", (M,), K, N, torch.Generator().manual_seed(M))
    assert all(tally.result()[q]["differing"] > 0 for q in ("y", "dx", "dweight")), tally.result()


@pytest.fixture
def aten_loops():
    """torch's bf16 matmul on ATen's own loops at every size: oneDNN switched off where torch runs it (those are
    the loops torch runs there anyway for products of up to 16^3 multiply-adds). Through flags(): once
    torch.testing's common_utils is imported the flags cannot be set otherwise; flags() sets oneDNN's TF32 as
    well, which warns that it is for Intel GPUs."""
    switch = torch.backends.mkldnn.flags(enabled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        switch.__enter__()
    try:
        assert _aten_bf16.torch_runs_aten()
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            switch.__exit__(None, None, None)


def _planted(M: int, K: int, N: int, g: torch.Generator, in_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 a (M, K) and b (K, N), one all ones, the other ones and zeros with +2^30 and -2^30 in each of its
    rows of K (in_b: each column of b): each output counts the ones that met neither of the pair before the pair
    cancelled (2^30 + 1 is 2^30 in float32), so the order of its sum shows."""
    planted = torch.randint(0, 2, (N, K) if in_b else (M, K), generator=g).float()
    for row in planted:
        p, q = torch.randperm(K, generator=g)[:2].tolist()
        row[p], row[q] = 2.0 ** 30, -(2.0 ** 30)
    if in_b:
        return torch.ones(M, K).bfloat16(), planted.t().contiguous().bfloat16()
    return planted.bfloat16(), torch.ones(K, N).bfloat16()


@pytest.mark.parametrize("a_column_major", [False, True])
@pytest.mark.parametrize("b_column_major", [False, True])
def test_on_atens_own_bf16_loops_each_layout_takes_its_loop_and_no_other_would_do(a_column_major, b_column_major,
                                                                                  aten_loops):
    """torch.mm and addmm of bf16 where torch runs ATen's loops: each of A's and B's layouts (and one row, one
    column) gives torch's bits in the loop ops/_aten_bf16.form picks, and on planted sums each other loop would
    not -- so a wrong pick cannot pass."""
    g = torch.Generator().manual_seed(3)
    for (M, K, N), in_b in itertools.product(((5, 97, 16), (1, 80, 16), (5, 97, 1)), (False, True)):
        a, b = _planted(M, K, N, g, in_b)
        a = a.t().contiguous().t() if a_column_major else a
        b = b.t().contiguous().t() if b_column_major else b
        bias = torch.ones(N).bfloat16()  # a 1 the pair absorbs, or not, by where it joins the sum
        for threads in (1, 2):
            with torch_threads(threads):
                theirs, theirs_bias = torch.mm(a, b), torch.addmm(bias, a, b)
            assert same_bits(_aten_bf16.product(a, b), theirs), (M, K, N, threads)
            assert same_bits(_aten_bf16.product(a, b, bias), theirs_bias), (M, K, N, threads)
        picked = _aten_bf16.form(a, b)
        for other in {_aten_bf16.DOT, _aten_bf16.PAIRS, _aten_bf16.CHAIN} - {picked}:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(_aten_bf16, "form", lambda *_, other=other: other)
                assert not same_bits(_aten_bf16.product(a, b), theirs) or \
                    not same_bits(_aten_bf16.product(a, b, bias), theirs_bias), (M, K, N, in_b, other)


def test_on_atens_own_bf16_loops_linear_is_torchs_bits_and_no_layout_moves_its_bits(aten_loops):
    """F.linear in bf16 where torch runs ATen's loops: for contiguous operands (a 2-D, 3-D, 5-D and 1-D x, one row,
    one output) y, dx, dweight and dbias are torch's bits, the bias in the sum's one rounding; on a transposed x,
    a transposed 3-D x and a column-major weight, where torch's own bits move with the layout (another loop, or
    the product rounded before the bias), they are ckparity's bits on contiguous copies -- which are torch's
    there; at 1 and 2 torch threads and 1 and 2 ckparity threads."""
    g = torch.Generator().manual_seed(11)
    xs = {"2-D": torch.randn(20, 97, generator=g), "3-D": torch.randn(2, 9, 97, generator=g),
          "5-D": torch.randn(2, 1, 2, 3, 97, generator=g), "1-D": torch.randn(97, generator=g),
          "one row": torch.randn(1, 97, generator=g),
          "3-D transposed": torch.randn(9, 2, 97, generator=g).transpose(0, 1),
          "column-major": torch.randn(97, 20, generator=g).t()}
    moved = 0
    for label, x in xs.items():
        for N, weight_t in ((19, False), (19, True), (1, False)):
            w = torch.randn(97, N, generator=g).t() if weight_t else torch.randn(N, 97, generator=g)
            inputs = [x.bfloat16().requires_grad_(True), (w / 10).bfloat16().requires_grad_(True),
                      torch.randn(N, generator=g).bfloat16().requires_grad_(True)]
            contiguous = [t.detach().contiguous().requires_grad_(True) for t in inputs]
            up = torch.randn(*x.shape[:-1], N, generator=g).bfloat16()
            for threads in (1, 2):
                with torch_threads(threads):
                    theirs = grad_run(F.linear, contiguous, up)
                    moved += not all(same_bits(a, b) for a, b in zip(grad_run(F.linear, inputs, up), theirs))
                    before = ckparity.get_num_threads()
                    try:
                        ckparity.set_num_threads(threads)
                        ours = grad_run(linear, inputs, up)
                    finally:
                        ckparity.set_num_threads(before)
                for q, a, b in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
                    assert a.dtype == torch.bfloat16 and same_bits(a, b), (label, N, weight_t, threads, q)
    assert moved > 0  # torch's own bits did move with some layout: what ckparity's do not


def test_the_aten_bf16_sweep_sees_a_wrong_loop(monkeypatch, aten_loops):
    """The linear.aten sweep can fail: with every layout taken as the dot, its cases differ in dx and dweight (y
    is the dot's own layout)."""
    record = importlib.import_module("ckparity.kernels.linear")
    monkeypatch.setattr(_aten_bf16, "form", lambda a, b: _aten_bf16.DOT)
    tally = record.Tally()
    g = torch.Generator().manual_seed(2)
    for M, K, N in ((64, 300, 1000), (33, 1000, 300)):  # dX's sums run over N: long ones show the order
        record._case_bf16_aten(tally, f"M={M} K={K} N={N}", (M,), K, N, g)
    result = tally.result()
    assert result["y"]["differing"] == 0 and all(result[q]["differing"] > 0 for q in ("dx", "dweight")), result


def test_atens_bf16_dot_runs_8_lanes_at_every_capability(aten_loops):
    """ATen's bf16 dot (y = x . W^T's loop) runs 8 registers of 8 lanes and 16-term tails at AVX512 too (measured
    on an AMD Zen 5): 16 lanes, which ckparity took there before, differ from K = 16 on. Each K to 130 on planted
    sums at this process's capability (the linear.aten sweep runs every capability: tests/test_capability.py)."""
    g = torch.Generator().manual_seed(5)
    for K in range(2, 131):
        a = _planted(3, K, 4, g, in_b=False)[0]
        b = torch.randint(0, 2, (4, K), generator=g).bfloat16().t()  # column-major: the dot's layout
        assert _aten_bf16.form(a, b) == _aten_bf16.DOT
        assert same_bits(_aten_bf16.product(a, b), torch.mm(a, b)), K


def test_bf16_dbias_is_torchs_sum_of_a_bf16_dy():
    """dbias of a bf16 dY is torch's dY.sum(0) in bf16: its vectors are 16 bf16 values, so 8..15 columns take
    the scalar groups of 4 (float32's vectorized outer sum differs there) and one column sums bf16 vectors of 16,
    split over torch's threads past its grain size; planted sums, where float32's order differs on some."""
    from ckparity.ops.linear import dbias
    g = torch.Generator().manual_seed(9)
    float_order_differs = 0
    for threads, (M, N) in itertools.product((1, 2), [(M, N) for M in (7, 9, 23, 40) for N in (1, 8, 9, 15, 16, 33)]
                                             + [(40000, 1), (70001, 1), (300, 40)]):
        big = torch.rand(M, N, generator=g) < 0.125
        dy = torch.where(big, (torch.randint(0, 2, (M, N), generator=g) * 2 - 1) * 2.0 ** 30,
                         torch.randint(0, 2, (M, N), generator=g).float()).bfloat16()
        ours, in_float32 = torch.empty(N, dtype=torch.bfloat16), torch.empty(N)
        with torch_threads(threads):
            theirs = dy.sum(0)
            dbias(dy, ours)
            dbias(dy.float(), in_float32)
        assert same_bits(ours, theirs), (threads, M, N)
        float_order_differs += not same_bits(in_float32.bfloat16(), theirs)
    assert float_order_differs > 0


def test_small_bf16_products_are_atens_loops_where_torch_runs_onednn(monkeypatch):
    """torch sends a bf16 mm of up to 16^3 multiply-adds to ATen's own loops even where it runs oneDNN (its
    mkldnn floor): F.linear's y, dX, dW and dbias there are torch's bits, every layout of the loops on planted
    sums, at 1 and 2 torch threads -- and taken as oneDNN's path (the float32 GEMM rounded once), some are not."""
    if _aten_bf16.torch_runs_aten():
        pytest.skip("torch runs ATen's bf16 loops at every size here (no oneDNN): the aten tests cover it")
    g, floor = torch.Generator().manual_seed(4), _aten_bf16.ONEDNN_FLOOR

    def differing() -> int:
        count = 0
        for (M, K, N), in_b in itertools.product(((2, 1024, 2), (4, 200, 5), (16, 16, 16), (3, 97, 1), (1, 300, 13)),
                                                 (False, True)):
            assert M * K * N <= floor
            a, b = _planted(M, K, N, g, in_b)
            inputs = [a.requires_grad_(True), b.t().contiguous().requires_grad_(True),
                      torch.randn(N, generator=g).bfloat16().requires_grad_(True)]
            up = _planted(M, N, 1, g, False)[0] if N >= 2 else torch.ones(M, 1).bfloat16()  # dX's sums run over N
            for threads in (1, 2):
                with torch_threads(threads):
                    ours, theirs = grad_run(linear, inputs, up), grad_run(F.linear, inputs, up)
                count += sum(not same_bits(p, q) for p, q in zip(ours, theirs))
        return count

    assert differing() == 0
    monkeypatch.setattr(_aten_bf16, "ONEDNN_FLOOR", 0)
    assert differing() > 0


def test_under_autocast_the_inputs_are_cast_to_bf16_as_torchs_linear_is():
    x, w = torch.randn(20, 64), torch.randn(24, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, theirs = linear(x, w), F.linear(x, w)
    assert ours.dtype == theirs.dtype == torch.bfloat16
    torch.testing.assert_close(ours, theirs, rtol=1e-2, atol=1e-2)
