"""ckparity's C attention (csrc/attention.c) against torch's F.scaled_dot_product_attention: ATen's CPU flash
kernel's bits where its GEMMs follow MKL's modelled order (kernels/attention.py says where), the same bits at
any ckparity thread count everywhere, no less accurate than torch against float64 on any CPU, and inputs it
does not take refused by name. The sweep over every head dim and sequence length is the record's claim
(tests/test_capability.py runs it at every capability)."""

from __future__ import annotations

import importlib
import itertools

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import cpu
from ckparity._native import ffi, lib
from ckparity.errors import InvalidArgument
from ckparity.kernels.attention import followed, followed_bf16
from ckparity.kernels.sweeping import grad_run, same_bits, torch_threads
import ckparity.ops.attention as ops_attention
from ckparity.ops.attention import attention, attention_backward, attention_forward, bf16_followed

MODELLED = cpu.mkl_not_followed() is None
SHAPES = [  # B, Hq, Hkv, Tq, Tk, d, causal
    (2, 4, 2, 64, 64, 32, True),     # the llama twin's GQA
    (1, 2, 2, 37, 37, 24, False),    # a q block of 32 and a tail of 5, a head dim off the vector width
    (1, 1, 1, 200, 200, 48, True),   # q blocks of 64
    (1, 2, 1, 40, 100, 16, False),   # more keys than queries
    (1, 2, 1, 600, 600, 16, True),   # key blocks of 512 and 88
]


def _run(fn, q, k, v, up, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    y = fn(*leaves, **kw)
    y.backward(up)
    return [y.detach()] + [t.grad for t in leaves]


def _inputs(B, H, Hkv, tq, tk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, tq, d, generator=g), torch.randn(B, Hkv, tk, d, generator=g),
            torch.randn(B, Hkv, tk, d, generator=g), torch.randn(B, H, tq, d, generator=g))


@pytest.mark.skipif(not MODELLED, reason=f"MKL's {cpu.mkl_branch()} branch: its sgemm order is not followed")
@pytest.mark.parametrize("shape", SHAPES, ids=[f"B{s[0]}H{s[1]}/{s[2]}T{s[3]}x{s[4]}d{s[5]}{'c' if s[6] else ''}"
                                               for s in SHAPES])
def test_bit_identical_to_torchs_flash_kernel(shape):
    _assert_torchs_bits(*shape)


def _assert_torchs_bits(B, H, Hkv, tq, tk, d, causal, threads=1, scale=None):
    """followed() covers the sizes, and out, dq, dk, dv are torch's bits there at `threads` torch threads (both
    sides run at that count: ckparity follows MKL at torch's); torch's results."""
    assert followed(tq, tk, d)
    q, k, v, up = _inputs(B, H, Hkv, tq, tk, d)
    kw = {"is_causal": causal, "enable_gqa": H != Hkv, "scale": scale}
    with torch_threads(threads):
        ours = _run(attention, q, k, v, up, **kw)
        theirs = _run(F.scaled_dot_product_attention, q, k, v, up, **kw)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
        assert same_bits(a, b), f"{name} at {threads} threads: {(a != b).sum().item()} of {a.numel()} differ"
    return theirs


@pytest.mark.skipif(not MODELLED or cpu.mkl_avx2_own() or cpu.mkl_strict(),
                    reason="MKL's AVX-512 branch's own order (its gemv is followed on the AVX2 branch and in strict mode)")
def test_a_one_row_q_block_is_where_the_claim_stops():
    """T = 33: the last q block is one row, which MKL multiplies on its gemv path (another order): followed()
    excludes it, and the bits do differ there -- the exclusion is a measured one, not a guess."""
    assert not followed(33, 33, 32) and followed(36, 36, 32)
    q, k, v, up = _inputs(1, 1, 1, 33, 33, 32)
    ours = _run(attention, q, k, v, up, is_causal=True)
    with torch_threads(1):
        theirs = _run(F.scaled_dot_product_attention, q, k, v, up, is_causal=True)
    assert not same_bits(ours[0][..., -1, :], theirs[0][..., -1, :])
    assert same_bits(ours[0][..., :32, :], theirs[0][..., :32, :])  # the full block of 32 rows is torch's bits


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own()), reason="MKL's AVX2 branch's own order (a CPU without "
                                                                  "AVX-512)")
@pytest.mark.parametrize("tq, tk, d", [(34, 34, 32), (37, 37, 7), (3, 3, 32), (20, 515, 16), (9, 9, 5)],
                         ids=["q-tail-2", "d-7", "T-3", "key-tail-3", "T-9-d-5"])
def test_on_mkls_avx2_branch_its_small_paths_are_torchs_bits_where_aten_writes_the_gradients(tq, tk, d):
    """On MKL's AVX2 branch a q block of 2-3 rows, a key block of 2-3 keys or a head dim under 12 puts P.V, dS.K,
    dS^T.Q or P^T.dO on MKL's small paths by columns ([Note: MKL's AVX2 small sgemm by columns]), followed: torch's
    bits. Those start a row of C at its 16-byte boundary, so dQ, dK and dV must lie where ATen writes them, (B, T,
    H, d): written contiguous (B, H, T, d) instead, an odd head dim of 5+ gives other bits (the layout is ATen's,
    not a guess)."""
    assert followed(tq, tk, d)
    _assert_torchs_bits(1, 2, 2, tq, tk, d, False)
    if d % 4 == 0:
        return  # every row starts on the boundary in either layout
    q, k, v, up = _inputs(1, 2, 2, tq, tk, d)
    out, lse = torch.empty(q.shape), torch.empty(q.shape[:3])
    attention_forward(q, k, v, d ** -0.5, False, out, lse)
    dq, dk, dv = torch.empty(q.shape), torch.empty(k.shape), torch.empty(v.shape)
    attention_backward(up.transpose(1, 2).contiguous().transpose(1, 2), q, k, v, out, lse, d ** -0.5, False,
                       dq, dk, dv)
    with torch_threads(1):
        theirs = _run(F.scaled_dot_product_attention, q, k, v, up)
    assert not all(same_bits(a, b) for a, b in zip((dq, dk, dv), theirs[1:]))


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own()), reason="MKL's AVX2 branch's own order (a CPU without "
                                                                  "AVX-512)")
@pytest.mark.parametrize("B, H, Hkv, tq, tk, d", [(1, 4, 2, 5, 5, 33), (2, 2, 2, 11, 11, 24), (1, 2, 1, 20, 523, 16),
                                                  (1, 2, 2, 8, 8, 13)],
                         ids=["T-5-d-33-gqa", "T-11", "key-tail-11", "T-8-d-13"])
def test_on_mkls_avx2_branch_key_blocks_under_12_are_torchs_bits(B, H, Hkv, tq, tk, d):
    """Q.K^T and dO.V^T of 4..11 keys run MKL's small sgemm, followed ([Note: MKL's AVX2 small sgemm]): 4 or 8
    lanes without FMA from a q or dO row's first 16-byte boundary -- so an odd head dim (rows that start anywhere)
    and several heads (dO read as ATen reads it, (B, T, H, d)) are torch's bits too."""
    _assert_torchs_bits(B, H, Hkv, tq, tk, d, True)


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own()), reason="MKL's AVX2 branch's own order (a CPU without "
                                                                  "AVX-512)")
def test_on_mkls_avx2_branch_dout_is_read_where_it_lies_as_aten_reads_it():
    """ATen's backward reads grad_out.transpose(1, 2) made contiguous: a dout already (B, T, H, d) is read where it
    lies, so one a float off a 16-byte boundary moves torch's bits (MKL's small sgemm sums a row from its first
    boundary); ckparity's bits move with them, and a (B, H, T, d) dout (copied by both) keeps them."""
    B, H, T, d = 1, 2, 7, 34
    q, k, v, up = _inputs(B, H, H, T, T, d)
    store = torch.empty(B * T * H * d + 1)
    store[1:] = up.transpose(1, 2).contiguous().flatten()
    off = store[1:].view(B, T, H, d).transpose(1, 2)  # up's values, (B, T, H, d), 4 bytes past the boundary
    with torch_threads(1):
        theirs, theirs_off = (_run(F.scaled_dot_product_attention, q, k, v, u, is_causal=True) for u in (up, off))
    assert not same_bits(theirs[1], theirs_off[1])  # the alignment is torch's, not a guess
    for u, t in ((up, theirs), (off, theirs_off)):
        ours = _run(attention, q, k, v, u, is_causal=True)
        assert all(same_bits(a, b) for a, b in zip(ours, t))


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own()), reason="MKL's AVX2 branch's own order (a CPU without "
                                                                  "AVX-512)")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("B, H, Hkv, tq, tk, d", [(2, 4, 2, 33, 33, 5), (2, 4, 2, 33, 33, 13), (1, 2, 2, 20, 513, 8),
                                                  (2, 2, 1, 65, 65, 24)],
                         ids=["one-row-q-block-d5", "one-row-q-block-d13", "one-key-block", "one-row-q-block-d24"])
def test_on_mkls_avx2_branch_one_row_q_blocks_and_one_key_blocks_are_torchs_bits(B, H, Hkv, tq, tk, d, threads):
    """A q block of one row or a key block of one is MKL's gemv ([Note: MKL's AVX2 sgemv]): followed on its AVX2
    branch -- its groups of 4 outputs take their lead from where the matrix's fourth row starts, so every kv head
    past the first (K's rows elsewhere) and a head dim not a multiple of 4 are in the cases."""
    _assert_torchs_bits(B, H, Hkv, tq, tk, d, tq == tk, threads)


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own() and followed(1, 1, 1)),
                    reason="d = 1 on MKL's AVX2 branch's own order where its one-column forms were measured (a Zen 5)")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("B, H, Hkv, tq, tk, scale", [(2, 1, 1, 41, 41, None), (1, 2, 2, 35, 35, None),
                                                      (2, 2, 2, 33, 33, 0.3), (2, 3, 1, 20, 513, 0.3),
                                                      (1, 2, 1, 1, 1, 0.3)],
                         ids=["second-item-off-a-boundary", "dq-strided", "one-row-q-block", "one-key-block", "T1"])
def test_on_mkls_avx2_branch_a_head_dim_of_1_is_torchs_bits(B, H, Hkv, tq, tk, scale, threads):
    """d = 1 makes every P.V, dQ, dK and dV one column: MKL's gemv (P.V and dQ, ATen handing it neither operand
    transposed) or its sweep (dK and dV, A transposed) -- forms the strides cannot tell apart, so the flash kernel
    names them ([Note: MKL's AVX2 sgemv], ckp_gemm_serial's form). In the cases: the sweep's outputs before C's
    first 16-byte boundary (a second batch item 41 rows on), dQ's column strided by the heads (the 3 outputs after
    the groups of 4 another order), a one-row q block (cpublas hands MKL an ldc of 1 there), a one-key block,
    T = 1, and a scale
    (alpha on the sweep's vector, on the gemv's dot product, and on Q.K^T's rank-1 rows)."""
    _assert_torchs_bits(B, H, Hkv, tq, tk, 1, tq % 2 == 1, threads, scale)


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own()), reason="MKL's AVX2 branch's own order (a CPU without "
                                                                  "AVX-512)")
@pytest.mark.parametrize("B, H, Hkv, tq, tk, d", [(2, 4, 2, 11, 11, 8), (1, 2, 1, 11, 11, 5), (2, 2, 2, 19, 19, 5)])
def test_on_mkls_avx2_branch_each_item_uses_its_aten_threads_buffer(B, H, Hkv, tq, tk, d):
    """ATen gives each of its threads a slice of one buffer, so at 2 torch threads the second thread's blocks start
    another number of floats past a 16-byte boundary ([Note: ATen's per-thread buffers]), which MKL's small paths
    read: a block of under 12 keys or a head dim under 12 with a slice that is not a multiple of 4 floats. Torch's
    bits at 2 threads, causal and not."""
    for causal in (False, True):
        _assert_torchs_bits(B, H, Hkv, tq, tk, d, causal, threads=2)


@pytest.mark.skipif(not (MODELLED and cpu.mkl_avx2_own()), reason="MKL's AVX2 branch's own order (a CPU without "
                                                                  "AVX-512)")
@pytest.mark.parametrize("B, H, Hkv, tq, tk, d, causal", [(1, 2, 1, 37, 37, 24, True), (1, 1, 1, 9, 40, 16, False)],
                         ids=["backward-one-kv-head", "forward-one-q-block"])
def test_on_mkls_avx2_branch_a_pass_of_one_parallel_item_runs_mkl_at_torchs_threads(B, H, Hkv, tq, tk, d, causal):
    """ATen runs a pass whose parallel loop has one item (the backward's B x Hkv, the forward's B x Hq x q blocks)
    on the calling thread, where MKL has torch's threads: at 2 it shares a GEMM of 5..11 rows by rows ([Note:
    MKL's AVX2 sgemm on two threads]). ckparity follows it: torch's bits at 1 and 2 torch threads, and torch's own
    2-thread bits are not its 1-thread ones (so the test would fail without the share)."""
    runs = [_assert_torchs_bits(B, H, Hkv, tq, tk, d, causal, threads=n) for n in (1, 2)]
    assert not all(same_bits(a, b) for a, b in zip(*runs))


@pytest.mark.skipif(not MODELLED, reason=f"MKL's {cpu.mkl_branch()} branch: its sgemm order is not followed")
def test_check_passes_the_c_attention_and_its_followed_widths_are_torchs_bits():
    """`ckparity check attention --backend c`: its conformance cases (T = 5: a key block of 5, on MKL's AVX2 branch
    its small sgemm) are torch's bits at every head dim followed() covers, the rest as accurate as torch -- on the
    AVX2 branch it said "wrong" (the 16-lane dot products were less accurate there, and a NaN error torch shared
    failed non_finite)."""
    from ckparity.check import suite
    from ckparity.check.properties import ROWS
    from ckparity.kernels.attention import T

    report = suite.check("attention", "c")
    assert report["passed"] and report["verdict"] in ("bitwise", "as accurate as torch"), suite.table(report)
    widths = next(r for r in report["properties"] if r["property"] == "widths")
    conformance = ckparity.kernels.KERNELS["attention"].conformance
    followed_cases = sum(followed(T, T, d) for d in conformance.widths) * len(conformance.rows or ROWS)
    assert widths["bit_identical"] >= followed_cases and widths["failing"] == 0, widths


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_same_bits_at_any_ckparity_thread_count(shape):
    B, H, Hkv, tq, tk, d, causal = shape
    q, k, v, up = _inputs(B, H, Hkv, tq, tk, d, seed=1)
    kw = {"is_causal": causal, "enable_gqa": H != Hkv}
    before = ckparity.get_num_threads()
    try:
        ckparity.set_num_threads(1)
        one = _run(attention, q, k, v, up, **kw)
        ckparity.set_num_threads(2)
        two = _run(attention, q, k, v, up, **kw)
    finally:
        ckparity.set_num_threads(before)
    assert all(same_bits(a, b) for a, b in zip(one, two))


def test_no_less_accurate_than_torch_against_float64():
    """On any CPU (bitwise or not): each output's worst error against the float64 evaluation of the same
    formula is within twice torch's."""
    B, H, Hkv, tq, tk, d, causal = 2, 4, 2, 100, 100, 40, True
    q, k, v, up = _inputs(B, H, Hkv, tq, tk, d, seed=2)
    kw = {"is_causal": causal, "enable_gqa": True}
    exact = _run(F.scaled_dot_product_attention, q.double(), k.double(), v.double(), up.double(), **kw)
    ours = _run(attention, q, k, v, up, **kw)
    theirs = _run(F.scaled_dot_product_attention, q, k, v, up, **kw)
    for name, e, a, b in zip(("out", "dq", "dk", "dv"), exact, ours, theirs):
        err_ours, err_torch = (a.double() - e).abs().max().item(), (b.double() - e).abs().max().item()
        assert err_ours <= 2 * err_torch + 1e-12, f"{name}: {err_ours} against torch's {err_torch}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_empty_inputs_are_torchs(dtype):
    """No queries, a head dim of 0 (it raised ZeroDivisionError: the default scale 1 / sqrt(0) was computed
    first; torch's is inf, on nothing), or no keys (refused as a softmax over nothing): torch's output (zeros plus
    the inputs' sums times 0: one NaN in the query makes every output NaN) and gradients, causal or not, GQA."""
    cases = (((1, 2, 4, 0), (1, 2, 4, 0)), ((2, 4, 3, 0), (2, 2, 5, 0)), ((1, 2, 0, 8), (1, 2, 4, 8)),
             ((1, 2, 3, 8), (1, 2, 0, 8)), ((2, 4, 5, 8), (2, 2, 0, 8)), ((3, 8), (0, 8)))
    for (qs, ks), is_causal in itertools.product(cases, (False, True)):
        inputs = [torch.randn(shape, dtype=dtype, requires_grad=True) for shape in (qs, ks, ks)]
        inputs[0].data.view(-1)[:1] = float("nan")
        kw = {"enable_gqa": len(qs) == 4 and qs[1] != ks[1], "is_causal": is_causal}
        up = torch.ones(qs, dtype=dtype)
        ours = grad_run(lambda *t: attention(*t, **kw), inputs, up)
        theirs = grad_run(lambda *t: F.scaled_dot_product_attention(*t, **kw), inputs, up)
        assert all(a.shape == b.shape and same_bits(a, b) for a, b in zip(ours, theirs)), (qs, ks, is_causal)


def test_3d_inputs_and_a_transposed_layout_are_taken():
    """(H, T, d) inputs and a (B, T, H, d) projection viewed as (B, H, T, d) (the twins' layout): computed,
    equal to the contiguous 4-D call's bits."""
    q, k, v, _ = _inputs(1, 2, 2, 20, 20, 8, seed=3)
    base = attention(q, k, v, is_causal=True)
    assert same_bits(attention(q[0], k[0], v[0], is_causal=True), base[0])
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, T, H, d) storage
    assert not qt.is_contiguous() and same_bits(attention(qt, k, v, is_causal=True), base)


@pytest.mark.skipif(bf16_followed(), reason="torch's bf16 flash kernel is followed here: its own tests below")
def test_bfloat16_is_computed_in_float32_and_rounded_once():
    q, k, v, _ = _inputs(1, 2, 1, 16, 16, 8, seed=4)
    qb, kb, vb = (t.bfloat16().requires_grad_(True) for t in (q, k, v))
    y = attention(qb, kb, vb, is_causal=True, enable_gqa=True)
    assert y.dtype == torch.bfloat16
    assert same_bits(y, attention(qb.float(), kb.float(), vb.float(), is_causal=True, enable_gqa=True).bfloat16())
    y.sum().backward()
    assert qb.grad.dtype == torch.bfloat16 and kb.grad.shape == kb.shape


def test_bfloat16_is_the_same_bits_at_any_thread_count_and_as_accurate_as_torchs():
    """bfloat16 where torch's GEMMs are oneDNN's is not torch's bits (its flash kernel rounds P and dP to bf16 and
    runs oneDNN's bf16 GEMMs) -- where they are MKL's AVX2 and ATen's own it is (tests below); either way the
    float32 kernel on the widened values gives the same bits at 1 and 2 threads, and against float64 of the same
    bf16 values each output's worst error is no larger than torch's bf16 SDPA's (the outputs and gradients both
    round once to bf16 at the end)."""
    B, H, Hkv, tq, tk, d = 2, 4, 2, 100, 100, 40
    q, k, v, up = (t.bfloat16() for t in _inputs(B, H, Hkv, tq, tk, d, seed=6))
    kw = {"is_causal": True, "enable_gqa": True}
    before = ckparity.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            ckparity.set_num_threads(n)
            runs.append(_run(attention, q, k, v, up, **kw))
    finally:
        ckparity.set_num_threads(before)
    assert all(a.dtype == torch.bfloat16 and same_bits(a, b) for a, b in zip(*runs))
    exact = _run(F.scaled_dot_product_attention, q.double(), k.double(), v.double(), up.double(), **kw)
    theirs = _run(F.scaled_dot_product_attention, q, k, v, up, **kw)
    for name, e, a, b in zip(("out", "dq", "dk", "dv"), exact, runs[0], theirs):
        err_ours, err_torch = (a.double() - e).abs().max().item(), (b.double() - e).abs().max().item()
        assert err_ours <= err_torch, f"{name}: {err_ours} against torch's {err_torch}"


BF16_SHAPES = [  # B, Hq, Hkv, T, d, causal: GQA, MHA, T past 192 (q blocks of 64) with P's row in whole pairs of
    # vectors (192), a vector more (200) and a tail (191, 250), head dims from 1, two q blocks with a tail
    (2, 4, 2, 32, 16, True), (1, 4, 2, 200, 64, True), (1, 4, 2, 192, 64, False), (1, 2, 2, 191, 32, False),
    (2, 2, 2, 250, 16, True), (2, 4, 2, 37, 1, True), (2, 2, 1, 37, 5, False), (2, 4, 4, 100, 40, True)]


@pytest.mark.skipif(not (bf16_followed() and followed_bf16(5, 5)),
                    reason="bf16 sequences under 12 are followed where measured: MKL's AVX2 code on an AVX-512 CPU")
def test_a_short_bf16_sequence_reads_mkls_widened_copies_from_16_byte_boundaries():
    """T = 5 (key blocks of 5: MKL's bf16 GEMM on its small paths, whose order starts after the k before a row's
    16-byte boundary): torch's bits at every head dim 24..47, where widened rows at the tensors' own offsets (rows
    of 30 or 31 floats) gave dQ other bits -- a query whose only key is itself cancels dS = dP - dsum to its low
    bits."""
    for d in range(24, 48):
        q, k, v, up = (t.bfloat16() for t in _inputs(1, 2, 2, 5, 5, d, seed=d))
        for threads in (1, 2):
            with torch_threads(threads):
                theirs = _run(F.scaled_dot_product_attention, q, k, v, up, is_causal=True)
                ours = _run(attention, q, k, v, up, is_causal=True)
            for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
                assert same_bits(a, b), f"d={d} {name} at {threads} threads: {(a != b).sum().item()} differ"


@pytest.mark.skipif(not (bf16_followed() and followed_bf16(33, 513)),
                    reason="bf16 one-row q blocks and one-key blocks are followed where measured: MKL's AVX2 code on "
                           "an AVX-512 CPU")
@pytest.mark.parametrize("tq, tk, dims", [(1, 1, range(1, 41)), (33, 33, range(1, 121)), (33, 35, range(1, 61)),
                                          (193, 193, range(2, 120, 3)), (20, 513, range(4, 70, 5))],
                         ids=["T1", "one-row-q-block", "one-row-q-block-35-keys", "one-row-q-block-of-64s",
                              "one-key-block"])
def test_a_bf16_one_row_q_block_or_one_key_block_takes_mkls_bf16_gemv(tq, tk, dims):
    """A q block of one row or a key block of one gives MKL's bf16 GEMM one row or one column: its own paths, not
    its sgemm on the widened copies (csrc/attention.c's mkl_bf16_gemv) -- Q.K^T and dO.V^T its dot form (4 lanes
    from k = 0, C before the terms left, alpha -- the backward's scale -- on the matrix's elements), P.V of one row
    its axpy form (blocks of 4 onto C, the terms left last to first: 35 keys leave 3). bf16 outputs hide most
    order changes, so many head dims: without those paths T = 1 and 33 differ, and without each rule some case."""
    for d in dims:
        q, k, v, up = (t.bfloat16() for t in _inputs(2, 2, 1, tq, tk, d, seed=d))
        for causal in (False, True):
            with torch_threads(1):
                theirs = _run(F.scaled_dot_product_attention, q, k, v, up, is_causal=causal, enable_gqa=True)
                ours = _run(attention, q, k, v, up, is_causal=causal, enable_gqa=True)
            for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
                assert same_bits(a, b), f"d={d} causal={causal} {name}: {(a != b).sum().item()} of {a.numel()} differ"


@pytest.mark.skipif(not bf16_followed(), reason="torch's bf16 flash kernel runs oneDNN's or AMX GEMMs here")
@pytest.mark.parametrize("shape", BF16_SHAPES, ids=[f"B{s[0]}H{s[1]}/{s[2]}T{s[3]}d{s[4]}{'c' if s[5] else ''}"
                                                    for s in BF16_SHAPES])
def test_bfloat16_where_followed_is_torchs_bf16_flash_kernel_bit_for_bit(shape):
    """Where torch's bf16 flash kernel runs MKL's AVX2 bf16 GEMM and ATen's own bf16 loops or oneDNN's AVX-512 bf16
    brgemm, out, dq, dk and dv are its bits (fexp_u20 summed in two registers, P and dS rounded to bf16, the
    gradients accumulated in bf16) at 1 and 2 torch threads (every pass here has two items or more) and 1 and 2
    ckparity threads."""
    B, H, Hkv, T, d, causal = shape
    assert followed_bf16(T, T)
    q, k, v, up = (t.bfloat16() for t in _inputs(B, H, Hkv, T, T, d, seed=T + d))
    kw = {"is_causal": causal, "enable_gqa": H != Hkv}
    before = ckparity.get_num_threads()
    try:
        for threads in (1, 2):
            with torch_threads(threads):
                theirs = _run(F.scaled_dot_product_attention, q, k, v, up, **kw)
                ckparity.set_num_threads(threads)
                ours = _run(attention, q, k, v, up, **kw)
            for name, a, b in zip(("out", "dq", "dk", "dv"), ours, theirs):
                assert a.dtype == torch.bfloat16 and same_bits(a, b), \
                    f"{name} at {threads} threads: {(a != b).sum().item()} of {a.numel()} differ"
    finally:
        ckparity.set_num_threads(before)


@pytest.mark.skipif(not bf16_followed(), reason="torch's bf16 flash kernel runs oneDNN's or AMX GEMMs here")
def test_the_bf16_sweep_sees_the_float_kernel_rounded_once(monkeypatch):
    """The bf16 claim's sweep can fail: with the float32 kernel on the widened values rounded once (what ckparity ran
    before, and runs where torch's GEMMs are oneDNN's), its cases differ from torch's in out, dq, dk and dv."""
    record = importlib.import_module("ckparity.kernels.attention")
    monkeypatch.setattr(ops_attention, "bf16_followed", lambda: False)
    tally = record.Tally()
    g = torch.Generator().manual_seed(1)
    for T, d in ((64, 32), (200, 64)):
        record._case(tally, f"T={T} d={d}", 2, 4, 2, T, T, d, True, g, dtype=torch.bfloat16)
    assert all(tally.result()[q]["differing"] > 0 for q in ("out", "dq", "dk", "dv")), tally.result()


@pytest.mark.skipif(ops_attention.bf16_gemm() != lib.CKP_BF16_GEMM_ONEDNN,
                    reason="torch's bf16 gradients are added by oneDNN's AVX-512 bf16 brgemm only where it runs without AMX")
def test_where_onednn_adds_the_bf16_gradients_atens_loops_would_not_be_torchs(monkeypatch):
    """On a CPU whose bf16 GEMMs are oneDNN's AVX-512 brgemm (an AMD Zen 5), dQ, dK and dV are added through its
    chain over pairs with the scale and the sum post-op ([Note: oneDNN's AVX-512 bf16 order]): with ATen's own loops
    there instead (what an AVX2-only CPU runs), the sweep's cases differ from torch's in dq, dk and dv, not out."""
    record = importlib.import_module("ckparity.kernels.attention")
    monkeypatch.setattr(ops_attention, "bf16_gemm", lambda: lib.CKP_BF16_GEMM_ATEN)
    tally = record.Tally()
    g = torch.Generator().manual_seed(1)
    for T, d in ((64, 32), (200, 64), (300, 48)):
        record._case(tally, f"T={T} d={d}", 2, 4, 2, T, T, d, True, g, dtype=torch.bfloat16)
    result = tally.result()
    assert result["out"]["differing"] == 0 and all(result[q]["differing"] > 0 for q in ("dq", "dk", "dv")), result


def test_a_bf16_backward_with_an_unknown_gemm_is_refused_and_writes_nothing():
    """ckp_attention_backward_bf16's bf16_gemm names ATen's loops or oneDNN's brgemm; another value is refused by
    name before anything is written."""
    T, d = 16, 8
    q, k, v, dout = (torch.randn(1, 1, T, d).bfloat16() for _ in range(4))
    out, lse = torch.empty(1, 1, T, d, dtype=torch.bfloat16), torch.empty(1, 1, T)
    attention_forward(q, k, v, d ** -0.5, True, out, lse)
    grads = [torch.full((1, 1, T, d), 7.0).bfloat16() for _ in range(3)]
    st = [ffi.new("int64_t[3]", [T * d, T * d, d]) for _ in range(8)]
    h = lambda t: ffi.cast("uint16_t *", t.data_ptr())  # noqa: E731
    status = lib.ckp_attention_backward_bf16(h(dout), st[0], h(q), st[1], h(k), st[2], h(v), st[3], h(out),
                                             ffi.cast("float *", lse.data_ptr()), 1, 1, 1, T, T, d, d ** -0.5, 1,
                                             h(grads[0]), st[4], h(grads[1]), st[5], h(grads[2]), st[6], 2, 1)
    assert status == lib.CKP_ERR_BAD_OPTION and "bf16_gemm" in ffi.string(lib.ckp_last_error()).decode()
    assert all(g.eq(7.0).all() for g in grads)


@pytest.mark.parametrize("call,message", [
    (lambda q, k, v: attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool)), "attn_mask is not built"),
    (lambda q, k, v: attention(q, k, v, dropout_p=0.1), "dropout is not built"),
    (lambda q, k, v: attention(q, k[:, :1], v[:, :1]), "needs enable_gqa=True"),
    (lambda q, k, v: attention(q, k[:, :1, :, :3], v[:, :1, :, :3], enable_gqa=True), "key's head dim"),
    (lambda q, k, v: attention(q, k, v[..., :4]), "key and value must have one shape"),
    (lambda q, k, v: attention(q, k, v, scale=float("inf")), "scale must be finite"),
    (lambda q, k, v: attention(q, k[:1], v[:1]), "batch dims differ"),
])
def test_bad_input_is_refused_by_name(call, message):
    q, k, v, _ = _inputs(2, 2, 2, 5, 5, 8)
    with pytest.raises(InvalidArgument, match=message):
        call(q, k, v)


@pytest.mark.parametrize("strides", [(0, 0, 0), (40, 8, 4), (-40, 40, 8)], ids=["all-0", "rows-overlap", "negative"])
def test_the_c_backward_refuses_gradients_whose_rows_overlap_and_writes_nothing(strides):
    """ckp_attention_backward writes dq, dk and dv by their strides (where ATen writes them): strides that give
    two rows one float (or point backwards) are refused before anything is written."""
    from ckparity._native import ffi, lib

    B, H, T, d = 1, 2, 5, 8
    q, k, v, up = _inputs(B, H, H, T, T, d)
    out, lse = torch.empty(q.shape), torch.empty(q.shape[:3])
    attention_forward(q, k, v, d ** -0.5, False, out, lse)
    grads = [torch.full((B * H * T * d,), 7.0) for _ in range(3)]

    def at(t):
        return ffi.cast("float *", t.data_ptr())

    def st(t):
        return ffi.new("int64_t[3]", list(t.stride()[:3]))
    bad = ffi.new("int64_t[3]", list(strides))
    start = grads[0][40:] if strides[0] < 0 else grads[0]
    status = lib.ckp_attention_backward(at(up), st(up), at(q), st(q), at(k), st(k), at(v), st(v), at(out), at(lse),
                                        B, H, H, T, T, d, d ** -0.5, 0, at(start), bad, at(grads[1]), st(q),
                                        at(grads[2]), st(q), 1)
    assert status == lib.CKP_ERR_BAD_SIZE
    assert "its own d floats" in ffi.string(lib.ckp_last_error()).decode()
    assert all(bool((g == 7.0).all()) for g in grads)
