"""linear: F.linear(x, weight, bias) -- every projection of the twins (fc1,
fc2, q/k/v/o) and the lm_head. Its C backend (csrc/linear.c) follows MKL's
one-thread sgemm on MKL's AVX-512 branch ([Note: MKL's sgemm order], [Note:
MKL's skinny sgemm]): bit for bit with torch's F.linear, its dX and dW, and its
dbias there, where each of the three GEMMs has 2 rows or more and 2 columns or
more (one row or one column is MKL's gemv, another order), outside the one
skinny region not followed (2 or 3 columns, a few rows, 32 <= K < 24 times the rows); on
a CPU without AVX-512 or an AMD one past Zen 4, MKL's AVX2 branch ([Note: MKL's AVX2 order], its small
paths' Notes, [Note: MKL's AVX2 sgemv], [Note: MKL's AVX2 sgemm on two
threads]): every GEMM at 1 and 2 torch threads.
A user's GEMM is judged here ("as accurate as torch" unless bitwise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import cpu
from .._native import ffi
from ..ops import _aten_bf16, _onednn
from ..ops.linear import gemm, linear
from .benching import Case, compiled_fwd_bwd, fwd_bwd
from .contract import grads_present, tensor_like
from .layouts import LayoutCase
from .probing import out
from .record import WIDTHS, BadInput, CBuffer, CEntry, Claim, Conformance, Kernel
from .sweeping import Tally, grad_run, sgemm_thread_counts, spread, torch_threads

OUT = 19  # the conformance output width: odd (no vector multiple), dW of 16+ rows (followed), not a batch size


def _contract(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, generator=g).requires_grad_(True)
    w = torch.randn(6, 10, generator=g).requires_grad_(True)
    y = fn(x, w)
    tensor_like(y, (2, 3, 6), "linear(x (2, 3, 10), weight (6, 10))")
    y.backward(torch.randn(2, 3, 6, generator=g))
    grads_present({"x": x, "weight": w})


def _make(width, rows, g):
    """x (rows, K = width), weight (OUT, K), bias (OUT): the width is the reduction's length."""
    return {"x": torch.randn(rows, width, generator=g), "weight": torch.randn(OUT, width, generator=g) / width ** 0.5,
            "bias": torch.randn(OUT, generator=g)}


_BAD = (BadInput("a weight of K 5 for x of K 8", "shape", lambda fn: fn(torch.randn(3, 8), torch.randn(4, 5))),)


def _opinfo_sample(s):
    weight = s.args[0]
    bias = s.args[1] if len(s.args) > 1 else s.kwargs.get("bias")
    if s.input.dim() < 1 or weight.dim() != 2:  # the slot: (..., K) x (OUT, K)
        return None
    tensors = {"x": s.input, "weight": weight, **({"bias": bias} if bias is not None else {})}
    return (lambda f, t: f(t["x"], t["weight"], t.get("bias"))), tensors, tuple(tensors)



# every K block rule's edges (384 and its multiples, 192's (MKL's AVX2 strict order), the shared remainder, odd tails) and the twins' shapes
LARGE_K = (383, 384, 385, 511, 575, 576, 577, 767, 768, 769, 1000, 1151, 1152, 1153, 1537, 2047, 4097)
TWIN_SHAPES = ((512, 64, 256), (512, 128, 64), (256, 32, 96), (256, 48, 32), (256, 32, 64), (1024, 256, 1024))


def _case(tally: Tally, label: str, M: int, K: int, N: int, g: torch.Generator, bias: bool = False,
          special: bool = False, quantities=("y", "dx", "dweight", "dbias")) -> None:
    quantities = tuple(q for q in quantities if q in _followed(M, K, N))
    if not quantities:
        return
    x = torch.randn(M, K, generator=g).requires_grad_(True)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).requires_grad_(True)
    if special:  # NaN, inf and -inf in rows of x, and a zero row: the chains carry them as torch's do
        with torch.no_grad():
            x[0, K // 2], x[1, 0], x[2, K - 1], x[3] = float("nan"), float("inf"), float("-inf"), 0.0
    inputs = [x, w] + ([torch.randn(N, generator=g).requires_grad_(True)] if bias else [])
    up = torch.randn(M, N, generator=g)
    for threads in sgemm_thread_counts():
        with torch_threads(threads):  # ckparity's GEMMs follow MKL at torch's thread count too
            ours, theirs = grad_run(linear, inputs, up), grad_run(F.linear, inputs, up)
        for q, a, b in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
            if q in quantities:
                tally.add(q, f"{label} torch threads {threads}", a, b)


def _followed(M: int, K: int, N: int) -> tuple[str, ...]:
    """The quantities of F.linear at x (M, K), weight (N, K) whose GEMMs take a path csrc/linear.c follows (dbias
    is a sum: always). MKL's strict order: every one. Its AVX-512 branch: none in y's one skinny region ([Note:
    MKL's skinny sgemm]). Its AVX2 branch's own order: every one ([Note: MKL's AVX2 small sgemm] and its
    'by columns' Note below 4 rows or 12 columns)."""
    every = ("y", "dx", "dweight", "dbias")
    if cpu.mkl_strict() or cpu.mkl_avx2_own():
        return every
    return () if (N == 2 and M < 16 or N == 3 and M < 11) and 32 <= K < 24 * M else every


def _skinny_sweep(tally: Tally, g: torch.Generator) -> None:
    """Few rows: the quarters path's edge (K = 24 M) and long K, the halving path (K <= N <= 11, and 2 or 3
    columns to K 31), K = 1's rank-1 update with and without a bias (the regions not followed: skipped by _case)."""
    for M in range(2, 16):
        for K in (24 * M - 1, 24 * M, 24 * M + 1, 24 * M + 17, 385, 1000):
            for N in (2, 4, 19, 200):
                _case(tally, f"M={M} K={K} N={N}", M, K, N, g, bias=K % 2 == 0)
    for N in range(4, 12):
        for M in (2, N - 1):
            for K in range(2, N + 1):
                _case(tally, f"M={M} K={K} N={N}", M, K, N, g, bias=K % 2 == 0)
    for N, M in ((2, 2), (2, 15), (3, 4), (3, 10), (3, 11)):
        for K in range(2, 32, 3):
            _case(tally, f"M={M} K={K} N={N}", M, K, N, g, bias=K % 2 == 0)
    for N in range(2, 12):  # MKL's AVX2 small path: 4 lanes in C's whole groups of 4 columns, 8 after; K's tails
        for K in list(range(2, 34)) + [61, 97, 383]:
            _case(tally, f"M=6 K={K} N={N}", 6, K, N, g, bias=K % 2 == 1)
    for M, N in ((2, 2), (10, 200), (40, 3)):  # dX and dW of K = 1 have one column: MKL's gemv
        for bias in (False, True):
            _case(tally, f"M={M} K=1 N={N}", M, 1, N, g, bias=bias, quantities=("y", "dbias"))


def sweep(tally: Tally, g: torch.Generator) -> None:
    """y, dx, dweight and dbias against F.linear at sgemm_thread_counts(): K over every width from 2 (K = 1 makes
    dX one column: MKL's gemv) and the large ones and block edges, below and from 192 columns, M over
    2..300, N over 16..300, the twins' shapes, a bias, non-finite rows."""
    _skinny_sweep(tally, g)
    for K in [k for k in WIDTHS if k >= 2] + list(LARGE_K):
        _case(tally, f"M=17 K={K} N=33", 17, K, 33, g, bias=True)
    for M in range(16, 301):
        _case(tally, f"M={M} K=385 N=19", M, 385, 19, g, bias=M % 5 == 0)
    for N in range(16, 301):
        _case(tally, f"M=20 K=97 N={N}", 20, 97, N, g, bias=N % 3 == 0)
    for K in LARGE_K:  # from 192 columns on, a K over 768 ends in its remainder alone (csrc/linear.c)
        _case(tally, f"M=16 K={K} N=200", 16, K, 200, g)
    for N in range(184, 200):
        _case(tally, f"M=16 K=1000 N={N}", 16, 1000, N, g)
    for M, K, N in TWIN_SHAPES:
        _case(tally, f"twins M={M} K={K} N={N}", M, K, N, g, bias=True)
    for M, K, N in ((4, 12, 12), (4, 13, 15), (5, 12, 13), (15, 12, 12)):  # the AVX2 order's smallest GEMMs
        _case(tally, f"M={M} K={K} N={N}", M, K, N, g, bias=True)
    for K in (7, 384, 1000):
        _case(tally, f"non-finite rows M=24 K={K} N=40", 24, K, 40, g, special=True)
    # MKL's strict order and its AVX2 branch's own cover its gemv too: one row, one column, K = 1's dX and dW
    if cpu.mkl_strict() or cpu.mkl_avx2_own():
        for M, K, N in ((1, 300, 19), (1, 1000, 200), (1, 7, 1), (19, 300, 1), (300, 1000, 1), (1, 1, 33), (33, 1, 1),
                        (17, 1, 33), (3, 1, 19)):
            _case(tally, f"gemv M={M} K={K} N={N}", M, K, N, g, bias=True)
        for K in range(2, 301):
            _case(tally, f"gemv M=1 K={K} N=3", 1, K, 3, g, bias=K % 2 == 0)


# y's GEMM at shapes of each kind the claim covers: one chunk, K chunked, a tile of 30, a K tail of 1
_ONEDNN_KINDS = ((8, 64, 256), (64, 1000, 1000), (64, 300, 1000), (24, 97, 48))


def _onednn_not_followed() -> str | None:
    """Why bf16 linear is not oneDNN's bits in this process, or None: the orders ops/_onednn.py measures are
    oneDNN's AMX brgemm's and its AVX-512 bf16 brgemm's (VDPBF16PS's chain over pairs, an AMD Zen 5's); elsewhere
    (another oneDNN) the check refuses them and the op runs the float32 GEMM rounded once -- so the claim needs
    every kind of shape it covers confirmed, not one."""
    if _aten_bf16.torch_runs_aten():
        return "torch runs its bf16 matmul on ATen's own loops here, not oneDNN (linear.aten)"
    if any(_onednn.order(M, K, N, False, True) is None for M, K, N in _ONEDNN_KINDS):
        return "oneDNN's bf16 matmul here is not the AMX or AVX-512 bf16 brgemm order ckparity measures (as " \
               "accurate as torch)"
    return None


def _onednn_bias_not_followed() -> str | None:
    """Why bf16 linear with a bias is not oneDNN's bits here, or None: the bias is measured in the sum of oneDNN's
    AVX-512 bf16 brgemm (the chain over pairs) only."""
    reason = _onednn_not_followed()
    if reason is None and _onednn.order(64, 1000, 1000, False, True).width != 0:
        return "a bias on oneDNN's AMX brgemm is not measured (the float32 GEMM rounded once)"
    return reason


def _case_bf16(tally: Tally, label: str, lead: tuple[int, ...], K: int, N: int, g: torch.Generator,
               threads: tuple[int, ...] = (1,), bias: bool = False) -> None:
    x = torch.randn(*lead, K, generator=g).bfloat16().requires_grad_(True)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).bfloat16().requires_grad_(True)
    inputs = [x, w] + ([torch.randn(N, generator=g).bfloat16().requires_grad_(True)] if bias else [])
    up = torch.randn(*lead, N, generator=g).bfloat16()
    for n in threads:
        with torch_threads(n):  # oneDNN's order is its choice at torch's thread count: measured at each
            ours, theirs = grad_run(linear, inputs, up), grad_run(F.linear, inputs, up)
        for q, a, b in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
            tally.add(q, f"{label} torch threads {n}", a, b)


def sweep_bf16_bias(tally: Tally, g: torch.Generator) -> None:
    """bf16 y, dx, dweight and dbias with a bias against F.linear on oneDNN's AVX-512 bf16 brgemm: K over every
    width from 4 and the large ones, M and N over 2..300, the twins' shapes and a 3-D x at 1 and 2 torch threads."""
    for K in [k for k in WIDTHS if k >= 4] + list(LARGE_K):
        _case_bf16(tally, f"M=24 K={K} N=48 bias", (24,), K, 48, g, bias=True)
    for M in range(2, 301):
        _case_bf16(tally, f"M={M} K=97 N=33 bias", (M,), 97, 33, g, bias=True)
    for N in range(3, 301):
        _case_bf16(tally, f"M=20 K=97 N={N} bias", (20,), 97, N, g, bias=True)
    for M, K, N in TWIN_SHAPES:
        _case_bf16(tally, f"twins M={M} K={K} N={N} bias", (M,), K, N, g, threads=(1, 2), bias=True)
    _case_bf16(tally, "x (2, 9, 37) N=17 bias", (2, 9), 37, 17, g, threads=(1, 2), bias=True)


def sweep_bf16(tally: Tally, g: torch.Generator) -> None:
    """bf16 y, dx and dweight without a bias against F.linear (oneDNN): K over every width from 4 and the
    large ones, M over 2..300, N over 3..300, K's block edges, the twins' shapes (at 1 and 2 torch threads), a
    3-D x. Products of up to 16^3 multiply-adds are not oneDNN's but ATen's own loops (linear.aten's sweep);
    K < 4 is not swept here."""
    for K in [k for k in WIDTHS if k >= 4]:
        _case_bf16(tally, f"M=24 K={K} N=48", (24,), K, 48, g)
    for M in range(2, 301):
        _case_bf16(tally, f"M={M} K=97 N=33", (M,), 97, 33, g)
    for N in range(3, 301):
        _case_bf16(tally, f"M=20 K=97 N={N}", (20,), 97, N, g)
    for K in LARGE_K:
        _case_bf16(tally, f"M=16 K={K} N=200", (16,), K, 200, g, threads=(1, 2))
    for M, K, N in TWIN_SHAPES:
        _case_bf16(tally, f"twins M={M} K={K} N={N}", (M,), K, N, g, threads=(1, 2))
    _case_bf16(tally, "x (2, 9, 37) N=17", (2, 9), 37, 17, g, threads=(1, 2))


def _telling(*shape: int, g: torch.Generator, planted: bool) -> torch.Tensor:
    """Values on which a sum's order shows through bf16's rounding: ones and zeros with +-2^30 at about one place
    in eight (``planted``: which ones a big term swallows, and where two cancel, is the order), or normal values
    spread over 2^-8..2^8 (sweeping.spread)."""
    if planted:
        big = torch.rand(shape, generator=g) < 0.125
        signs = torch.randint(0, 2, shape, generator=g).float() * 2 - 1
        return torch.where(big, signs * 2.0 ** 30, torch.randint(0, 2, shape, generator=g).float())
    return spread(*shape, generator=g, octaves=8)


def _case_bf16_aten(tally: Tally, label: str, lead: tuple[int, ...], K: int, N: int, g: torch.Generator,
                    bias: bool = False) -> None:
    for planted in (False, True):
        x, w = _telling(*lead, K, g=g, planted=planted), _telling(N, K, g=g, planted=planted)
        inputs = [x.bfloat16().requires_grad_(True), w.bfloat16().requires_grad_(True)]
        inputs += [_telling(N, g=g, planted=False).bfloat16().requires_grad_(True)] if bias else []
        up = _telling(*lead, N, g=g, planted=planted).bfloat16()
        for n in (1, 2):  # ATen's loops share outputs between threads: the same bits at both, followed at both
            with torch_threads(n):
                ours, theirs = grad_run(linear, inputs, up), grad_run(F.linear, inputs, up)
            for q, a, b in zip(("y", "dx", "dweight", "dbias"), ours, theirs):
                tally.add(q, f"{label}{' planted' if planted else ''} torch threads {n}", a, b)


def sweep_bf16_aten(tally: Tally, g: torch.Generator) -> None:
    """bf16 y, dx, dweight and dbias against F.linear where torch runs ATen's own bf16 loops, at 1 and 2 torch
    threads, on contiguous operands (on a strided or transposed one torch's bf16 bits move with the layout --
    another loop, or the bias after the rounded product -- and ckparity's do not: the layouts sweep holds them to
    the contiguous copy's). Without oneDNN: K over every width and the large ones (the dot's 64-term blocks, its
    16-term tails, the chains' K mod 4), M and N over 1..300 (one row and one output are other loops' layouts),
    the twins' shapes, a bias, a 3-D, 5-D and 1-D x. With oneDNN, which takes the products past 16^3
    multiply-adds: the same kinds at products up to 16^3, and the floor's own edge."""
    if not _aten_bf16.torch_runs_aten():
        _sweep_bf16_aten_small(tally, g)
        return
    for K in WIDTHS + list(LARGE_K):
        _case_bf16_aten(tally, f"M=17 K={K} N=33", (17,), K, 33, g, bias=K % 2 == 0)
    for M in range(1, 301):
        _case_bf16_aten(tally, f"M={M} K=97 N=19", (M,), 97, 19, g, bias=M % 2 == 1)
    for N in range(1, 301):
        _case_bf16_aten(tally, f"M=20 K=97 N={N}", (20,), 97, N, g, bias=N % 2 == 1)
    for M, K, N in TWIN_SHAPES:
        _case_bf16_aten(tally, f"twins M={M} K={K} N={N}", (M,), K, N, g, bias=True)
    for bias in (False, True):
        for lead in ((2, 9), (2, 1, 2, 3), ()):
            _case_bf16_aten(tally, f"x {lead + (37,)} N=17 bias {bias}", lead, 37, 17, g, bias)


def _sweep_bf16_aten_small(tally: Tally, g: torch.Generator) -> None:
    """sweep_bf16_aten where oneDNN takes the larger products: K over every width to 300 (3 x 4 outputs) and the
    large ones to 4096 (one or two rows), M and N over 1..300 (K = 3 and 4 the other), K = 16 at every M and N to
    16, a 3-D, 5-D and 1-D x, each at M·K·N up to 16^3 (ATen's floor for oneDNN)."""
    for K in [k for k in WIDTHS + list(LARGE_K) if k <= _aten_bf16.ONEDNN_FLOOR]:
        M = 3 if K <= 341 else 2 if 2 * K <= _aten_bf16.ONEDNN_FLOOR else 1
        N = min(4, _aten_bf16.ONEDNN_FLOOR // (M * K))
        _case_bf16_aten(tally, f"M={M} K={K} N={N}", (M,), K, N, g, bias=K % 2 == 0)
    for M in range(1, 301):
        _case_bf16_aten(tally, f"M={M} K=3 N=4", (M,), 3, 4, g, bias=M % 2 == 1)
    for N in range(1, 301):
        _case_bf16_aten(tally, f"M=4 K=3 N={N}", (4,), 3, N, g, bias=N % 2 == 1)
    for M in range(1, 17):
        for N in range(1, 17):
            _case_bf16_aten(tally, f"M={M} K=16 N={N}", (M,), 16, N, g, bias=(M + N) % 2 == 0)
    for bias in (False, True):
        for lead, N in (((2, 3), 17), ((2, 1, 2, 3), 9), ((), 17)):
            _case_bf16_aten(tally, f"x {lead + (37,)} N={N} bias {bias}", lead, 37, N, g, bias)


def _layout_cases(g):
    """x 2-D and 3-D (transposed: taken by its strides), the weight, the bias; 0 rows."""
    for label, shape in (("(20, 37)", (20, 37)), ("(2, 9, 37)", (2, 9, 37)), ("(0, 37)", (0, 37))):
        yield LayoutCase(f"x {label}, weight (17, 37), bias", linear, F.linear,
                         lambda f, t: f(t["x"], t["weight"], t["bias"]), ("x", "weight", "bias"),
                         {"x": torch.randn(shape, generator=g), "weight": torch.randn(17, 37, generator=g),
                          "bias": torch.randn(17, generator=g)}, claim="linear")


def _probe(g: torch.Generator):
    for M, K, N in ((16, 5, 17), (33, 385, 40), (100, 1000, 70), (13, 64, 3)):
        x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)

        def run(L, fill, x=x, w=w, b=b):
            shape = (x.shape[0], w.shape[0])
            y, y_bias, y_after, dx = out(shape, fill), out(shape, fill), out(shape, fill), out(x, fill)
            gemm(x, w.t(), y, library=L)
            gemm(x, w.t(), y_bias, b, library=L)
            gemm(x, w.t(), y_after, b, True, library=L)
            gemm(y, w, dx, library=L)  # a dX: the weight read as it lies
            return y, y_bias, y_after, dx
        yield f"linear M={M} K={K} N={N}", run


def _entry() -> CEntry:
    def call(L, p, s):
        return L.ckp_gemm(p["a"], s["K"], 1, p["b"], 1, s["K"], s["M"], s["K"], s["N"], p["bias"], 0, p["c"], 1)
    return CEntry("gemm", (CBuffer("a", "f", lambda s: s["M"] * s["K"]), CBuffer("b", "f", lambda s: s["N"] * s["K"]),
                           CBuffer("bias", "f", lambda s: s["N"]), CBuffer("c", "f", lambda s: s["M"] * s["N"], True)),
                  {"M": 3, "K": 4, "N": 5}, call)


def _bf16_entry() -> CEntry:
    """ckp_gemm_bf16_tiles at (3 x 4) . (4 x 5), one chunk start where ``starts`` holds one in (0, K) (the fuzz's
    random values rarely are: then no chunks, so that its calls are not all refused); tiles of 2, or the pairs'
    chain (width 0) where that start is even."""
    def call(L, p, s):
        start = p["starts"] != ffi.NULL and 0 < p["starts"][0] < s["K"]
        width = 0 if start and p["starts"][0] % 2 == 0 else 2
        return L.ckp_gemm_bf16_tiles(p["a"], s["K"], 1, p["b"], s["N"], 1, s["M"], s["K"], s["N"], width,
                                     p["starts"] if start else ffi.NULL, int(start), p["bias"], p["c"])
    return CEntry("gemm_bf16_tiles", (CBuffer("a", "h", lambda s: s["M"] * s["K"]),
                                      CBuffer("b", "h", lambda s: s["K"] * s["N"]),
                                      CBuffer("starts", "i", lambda s: 1), CBuffer("bias", "h", lambda s: s["N"]),
                                      CBuffer("c", "h", lambda s: s["M"] * s["N"], True)),
                  {"M": 3, "K": 4, "N": 5}, call)


def _bf16_aten_entry() -> CEntry:
    """ckp_gemm_bf16_aten at (3 x 4) . (4 x 5) with a bias, in the chain (the form whose bias starts the sums)."""
    def call(L, p, s):
        return L.ckp_gemm_bf16_aten(p["a"], s["K"], 1, p["b"], s["N"], 1, s["M"], s["K"], s["N"], p["bias"], 0,
                                    L.CKP_ATEN_BF16_CHAIN, p["c"])
    return CEntry("gemm_bf16_aten", (CBuffer("a", "h", lambda s: s["M"] * s["K"]),
                                     CBuffer("b", "h", lambda s: s["K"] * s["N"]),
                                     CBuffer("bias", "h", lambda s: s["N"]),
                                     CBuffer("c", "h", lambda s: s["M"] * s["N"], True)),
                  {"M": 3, "K": 4, "N": 5}, call)


def _dbias_entry(bf16: bool = False) -> CEntry:
    """ckp_linear_dbias, or its bf16 twin, at (3 x 5)."""
    name, kind = ("linear_dbias_bf16", "h") if bf16 else ("linear_dbias", "f")
    return CEntry(name, (CBuffer("dy", kind, lambda s: s["M"] * s["N"]), CBuffer("dbias", kind, lambda s: s["N"], True)),
                  {"M": 3, "N": 5}, lambda L, p, s: getattr(L, f"ckp_{name}")(p["dy"], s["M"], s["N"], p["dbias"], 1))


def _bench(g: torch.Generator, select):
    # the twins' projection, a large one, and skinny ones (MKL's small paths below 4 rows or 12 columns)
    for M, K, N in ((512, 64, 256), (2048, 4096, 4096), (3, 4096, 4096), (4096, 4096, 8), (512, 8, 1024)):
        shape = f"M={M},K={K},N={N}"
        if select("linear", shape):
            x, w = torch.randn(M, K, generator=g).requires_grad_(True), torch.randn(N, K, generator=g)
            y, dx, dw = torch.empty(M, N), torch.empty(M, K), torch.empty(N, K)

            def c_calls(x=x.detach(), w=w, y=y, dx=dx, dw=dw):
                gemm(x, w.t(), y)   # y = x.Wᵀ
                gemm(y, w, dx)      # dX = dY.W (y standing in for dY)
                gemm(y.t(), x, dw)  # dW = dYᵀ.X
            # forward reads x and W and writes y; backward reads dy, W and x, writes dx and dW
            yield Case("linear", shape, fwd_bwd(linear, x, w), fwd_bwd(F.linear, x, w),
                       4 * (2 * M * K + 2 * N * K + 2 * M * N), c_calls, 3,
                       compiled=compiled_fwd_bwd(F.linear, x, w), once=M * N * K > 1 << 30)


KERNEL = Kernel(
    name="linear",
    flag="ck_linear_backend",
    slot="linear",
    torch_ops=("linear", "matmul", "mm", "addmm", "__matmul__", "bmm"),
    spellings=("gemm", "matmul"),
    # the twins' slot: (x (..., K), weight (OUT, K), bias (OUT) or None) -> (..., OUT), F.linear's contract
    backends={"c": linear, "torch": F.linear},
    contract=_contract,
    conformance=Conformance(
        make=_make, call=lambda fn, t: fn(t["x"], t["weight"]), differentiated=("x", "weight"), widths=WIDTHS,
        rows=(3, 17),  # 3: MKL's skinny paths (K >= 72: 16-lane dot products); 17: its blocked one
        bad=_BAD, options=(("bias", lambda f, t: f(t["x"], t["weight"], t["bias"]), ("x", "weight", "bias")),),
        opinfo=("nn.functional.linear", _opinfo_sample),
        speed=lambda g: {"x": torch.randn(512, 1024, generator=g),  # a projection of 512 tokens, d 1024
                         "weight": torch.randn(1024, 1024, generator=g) / 32, "bias": torch.randn(1024, generator=g)}),
    claims=(Claim("linear", ("y", "dx", "dweight", "dbias"), sweep, holds=cpu.mkl_not_followed,
                  condition="on MKL's AVX-512 branch: torch at 1 thread, every GEMM of 2+ rows and 2+ columns but y "
                            "of 2-3 columns with 32 <= K < 24 times the rows; on its AVX2 branch's own order (an AMD CPU without "
                            "AVX-512 or past Zen 4): torch at 1 and 2 threads, every GEMM (its small paths, its gemv and its 2 "
                            "threads' row shares followed, outputs lying as torch's); under MKL_CBWR=AUTO,STRICT "
                            "(and on MKL's AVX2 branch under AVX2,STRICT) every GEMM at 1 and 2 torch threads"),
            Claim("linear.onednn", ("y", "dx", "dweight"), sweep_bf16, dtype="bfloat16", holds=_onednn_not_followed,
                  condition="bf16 without a bias, x and weight contiguous, on oneDNN's AMX brgemm or its AVX-512 "
                            "bf16 brgemm without AMX (an AMD Zen 5's) (its order measured per GEMM: ops/_onednn.py), "
                            "products of M·N·K over 16^3 with K (each GEMM's) from 4 to 8192, at 1 and 2 torch "
                            "threads"),
            Claim("linear.onednn_bias", ("y", "dx", "dweight", "dbias"), sweep_bf16_bias, dtype="bfloat16",
                  holds=_onednn_bias_not_followed,
                  condition="bf16 with a bias, x, weight and bias contiguous, on oneDNN's AVX-512 bf16 brgemm without "
                            "AMX (an AMD Zen 5's): the bias in the float32 sum, dbias torch's float32 sum of dY rounded once; "
                            "products of M·N·K over 16^3 with K from 4 to 8192, at 1 and 2 torch threads"),
            Claim("linear.aten", ("y", "dx", "dweight", "dbias"), sweep_bf16_aten, dtype="bfloat16",
                  condition="bf16 where torch runs its matmul on ATen's own loops: every GEMM where torch runs no "
                            "oneDNN (a CPU without AVX-512, as an AMD CPU with AVX2 only, or oneDNN switched off), "
                            "and everywhere products of M·N·K up to 16^3 (ATen's floor for oneDNN); with or "
                            "without a bias, on contiguous operands (a view: its contiguous copy's bits, where "
                            "torch's move with the layout), at 1 and 2 torch threads")),
    not_claimed={"linear": "torch at 2 threads on MKL's AVX-512 branch without MKL_CBWR=AUTO,STRICT (MKL splits K "
                           "between them for some shapes, deciding by M, N and K), torch at 3+ threads on its AVX2 "
                           "branch's own order (MKL shares small products otherwise; measured at 4), MKL's gemv path on its "
                           "AVX-512 branch (one row or one column: x of one row, K = 1's dX and dW), y of 2-3 columns "
                           "with few rows and 32 <= K < 24 times the rows, MKL's "
                           "AVX2 branch without STRICT on a CPU with AVX-512 (MKL_CBWR=AVX2; MKL_CBWR=AVX512 on an AMD "
                           "CPU past Zen 4) or from Intel (measured on AMD only), bfloat16 on oneDNN with a bias, or on "
                           "another oneDNN path than the AMX or AVX-512 bf16 brgemm, or a GEMM's K over 8192 (not probed), or on AMX with a bias: as "
                           "accurate as torch"},
    probe=_probe,
    layouts=_layout_cases,
    bench=_bench,
    c_entries=(_entry(), _dbias_entry(), _dbias_entry(bf16=True), _bf16_entry(), _bf16_aten_entry()),
)
