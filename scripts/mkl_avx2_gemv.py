"""Measures MKL's gemv on its AVX2 branch in this process, as [Note: MKL's AVX2 sgemv] (csrc/linear.c) states it,
and writes reports/linear/mkl_avx2_gemv.json (run on a CPU without AVX-512: MKL's AVX2 branch).

GEMMs of one row or one column whose operands lie along K, at one torch thread: F.linear's y of one x row (x a
view 0..7 floats past a 32-byte boundary, so every placement of the vector against 16 bytes; N 1..13), of one
output column (x of 1..33 rows), a single dot product; the matrix (W, or x's rows) contiguous or with rows 1..3
floats apart past K, starting 0..3 floats past a boundary; and addmm with a bias and with
alpha 0.3 and beta 0 or 1 -- against the Note's model written here in numpy (not ckparity's C), and against the
readings it was told from: the same with FMA, the 1..3 outputs after the groups of 4 as the groups are, their
first p terms fixed at 4 whatever the vector's address, and the groups' lead taken from K (what a contiguous matrix
at a 16-byte boundary shows) rather than from where the group's fourth row starts. Then ckparity's C (ckp_gemm) on
the same GEMMs, at 1 and 2 torch threads. Last, the sign of a zero sum (`signs`): y, dX and dW whose products
are all -0, with a bias of -0, +0 or none, torch's against ckparity's.

    python scripts/mkl_avx2_gemv.py [--out reports/linear/mkl_avx2_gemv.json]
"""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np
import torch
import torch.nn.functional as F

from ckparity.harness.loop.run import environment
from ckparity.kernels.sweeping import same_bits
from ckparity.ops.linear import gemm, linear

F32 = np.float32
DEPTHS = (*range(2, 41), 63, 64, 65, 100, 129, 385, 1000)
READINGS = ("note", "fma", "tails_as_groups", "peel_always_4", "group_lead_by_K")


def _dot(v: np.ndarray, row: np.ndarray, out: int, outs: int, address: int, fourth: int, reading: str) -> F32:
    """Output `out` of `outs`: v . row as the reading orders it (address: the vector's, fourth: its group's fourth
    row's, in bytes)."""
    add = (lambda acc, a, b: F32(np.float64(a) * np.float64(b) + np.float64(acc))) if reading == "fma" else \
        (lambda acc, a, b: F32(acc + F32(a * b)))
    K, tail = len(v), out - outs // 4 * 4
    acc = [F32(0)] * 8
    if tail < 0 or reading == "tails_as_groups":
        r = min(K - 4 * ((K - 1) // 4) if reading == "group_lead_by_K" else 4 - (fourth % 16) // 4, K)
        end = r + (K - r) // 4 * 4
        for k in range(end):
            lane = 0 if k < r else (k - r) % 4
            acc[lane] = add(acc[lane], v[k], row[k])
        s = F32(F32(acc[0] + acc[2]) + F32(acc[1] + acc[3]))
        for k in range(end, K):
            s = add(s, v[k], row[k])
        return s
    lanes = 4 if tail == 1 else 8
    p = min(4 if reading == "peel_always_4" else 4 - (address % 16) // 4, K)
    end = p + (K - p) // 8 * 8
    for k in range(end):
        lane = 0 if k < p else (k - p) % lanes
        acc[lane] = add(acc[lane], v[k], row[k])
    if lanes == 4:
        s = F32(F32(acc[0] + acc[2]) + F32(acc[1] + acc[3]))
    else:
        half = 4
        while half:
            acc[:half] = [F32(acc[i] + acc[i + half]) for i in range(half)]
            half //= 2
        s = acc[0]
    for k in range(end, K):
        s = add(s, v[k], row[k])
    return s


def model(a: torch.Tensor, b: torch.Tensor, reading: str) -> np.ndarray:
    """C = a (M, K) . b (K, N) with M == 1 or N == 1, a's rows and b's columns along K."""
    one_row = a.shape[0] == 1
    v, rows = (a[0], b.t()) if one_row else (b[:, 0], a)
    address, vn, rn = v.data_ptr(), v.numpy(), rows.numpy()
    fourth = [rows.data_ptr() + (i // 4 * 4 + 3) * rows.stride(0) * 4 for i in range(len(rn))]
    dots = np.array([_dot(vn, rn[i], i, len(rn), address, fourth[i], reading) for i in range(len(rn))], dtype=F32)
    return dots.reshape(1, -1) if one_row else dots.reshape(-1, 1)


def _placed(n: int, off: int, g: torch.Generator) -> torch.Tensor:
    """n values, `off` floats past a 32-byte boundary."""
    store = torch.empty(n + 16)
    base = (-(store.data_ptr() // 4)) % 8  # floats to the store's first 32-byte boundary
    view = store[base + off:base + off + n]
    view.copy_(torch.randn(n, generator=g))
    return view


def _matrix(rows: int, K: int, seed: int, g: torch.Generator) -> torch.Tensor:
    """(rows, K): contiguous, or rows `seed % 3 + 1` floats apart past K, starting `seed` floats past a 32-byte
    boundary: the group's order takes its lead from where its fourth row starts."""
    ld = K if seed % 2 == 0 else K + seed % 3 + 1
    return _placed(rows * ld, seed, g).view(rows, ld)[:, :K]


def _ours(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[1])
    gemm(a, b, out)
    return out


def _zero_sums(x_at: int, w_at: int, M: int, K: int, N: int, bias: float | None, fn) -> dict[str, torch.Tensor]:
    """y, dX and dW of fn (F.linear or ckparity's) where every product of the one they name is -0 (x 0 against W -1,
    dY 0 against W, dY -1 against x 0): a zero sum's sign is then the sum's seeds'. x and W start x_at and w_at
    floats into their buffers."""
    out = {}
    for upstream, quantities in ((0.0, ("y", "dx")), (-1.0, ("dweight",))):
        xs, ws = torch.zeros(M * K + 8, requires_grad=True), torch.full((N * K + 8,), -1.0, requires_grad=True)
        x, w = xs[x_at:x_at + M * K].view(M, K), ws[w_at:w_at + N * K].view(N, K)
        y = fn(x, w) if bias is None else fn(x, w, torch.full((N,), bias))
        dx, dw = torch.autograd.grad(y, [x, w], torch.full((M, N), upstream))
        out |= {q: t for q, t in zip(("y", "dx", "dweight"), (y.detach(), dx, dw)) if q in quantities}
    return out


def _signs() -> dict:
    """The sign of a gemv's zero sum, at 1 and 2 torch threads: one row of 1..13 outputs and one output of 2..13
    rows, K 1..40, x and W 0..3 floats past a boundary, a bias of -0, +0 or none; torch's -0 outputs, and ckparity's
    differing, per quantity and bias."""
    tally = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for M, N in [(1, n) for n in range(1, 14)] + [(m, 1) for m in range(2, 14)]:
            for K, x_at, w_at, bias in itertools.product(range(1, 41), range(4), range(4), (-0.0, 0.0, None)):
                theirs = _zero_sums(x_at, w_at, M, K, N, bias, F.linear)
                ours = _zero_sums(x_at, w_at, M, K, N, bias, linear)
                for q in theirs:
                    t = tally.setdefault(f"{q} bias {bias} threads {threads}", {"probes": 0, "torch_minus_0": 0,
                                                                              "ckparity_differing": 0})
                    t["probes"] += 1
                    t["torch_minus_0"] += bool(torch.signbit(theirs[q]).any())
                    t["ckparity_differing"] += not same_bits(ours[q], theirs[q])
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/mkl_avx2_gemv.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    cases = []  # (label, a, b)
    for K in DEPTHS:
        for off in range(8):
            x = _placed(K, off, g).view(1, K)
            for N in (1, 2, 3, 4, 5, 7, 13):
                cases.append((f"one row K={K} N={N} x+{off}", x, _matrix(N, K, off, g).t()))
            w = _placed(K, off, g)
            for M in (2, 3, 5, 13, 33):
                cases.append((f"one column K={K} M={M} w+{off}", _matrix(M, K, 3 - off // 2, g), w.view(K, 1)))
    outputs, differing, ours_differing, examples = 0, {r: 0 for r in READINGS}, 0, []
    for label, a, b in cases:
        theirs = (a @ b).numpy()
        outputs += theirs.size
        for reading in READINGS:
            wrong = int((model(a, b, reading).view(np.int32) != theirs.view(np.int32)).sum())
            differing[reading] += wrong
            if reading == "note" and wrong:
                examples.append(label)
        ours_differing += not same_bits(_ours(a, b), torch.from_numpy(theirs))
    # alpha, beta and a bias (addmm) on one row: alpha times the rounded dot, C added to that; a bias after
    scaled = {"alpha_beta1": 0, "alpha_beta0": 0, "bias": 0, "ckparity_bias": 0}
    alpha = F32(0.3)
    for K in DEPTHS:
        for off in range(4):
            x, w = _placed(K, off, g).view(1, K), torch.randn(7, K, generator=g)
            c, bias = torch.randn(1, 7, generator=g), torch.randn(7, generator=g)
            dot = model(x, w.t(), "note")
            for name, beta, start in (("alpha_beta1", 1, c.numpy()), ("alpha_beta0", 0, np.zeros((1, 7), F32))):
                theirs = torch.addmm(c, x, w.t(), beta=beta, alpha=float(alpha)).numpy()
                scaled[name] += int(((start + (alpha * dot).astype(F32)).astype(F32) != theirs).sum())
            theirs = torch.addmm(bias, x, w.t())
            scaled["bias"] += int(((bias.numpy() + dot).astype(F32) != theirs.numpy()).sum())
            ours = torch.empty(1, 7)
            gemm(x, w.t(), ours, bias)
            scaled["ckparity_bias"] += not same_bits(ours, theirs)
    # its other form: one column of C whose A has its columns contiguous (dY^T.X of one input feature), or a single
    # product whose B is a contiguous column -- each element a chain without FMA from C (beta 1: a bias) or 0
    sweep = {"outputs": 0, "differing": 0, "sum_then_bias_differing": 0, "ckparity_gemms_differing": 0}
    for M in (2, 3, 5, 8, 13, 33, 100):
        for R in (1, 2, 3, 5, 13, 33):
            a = torch.randn(M, R, generator=g).t() if R > 1 else torch.randn(1, M, generator=g)
            b, bias = torch.randn(M, 1, generator=g), torch.randn(1, generator=g)
            theirs = torch.addmm(bias, a, b).numpy()[:, 0]
            chain, plain = np.full(R, bias.item(), F32), np.zeros(R, F32)
            for k in range(M):
                term = (a[:, k].numpy() * F32(b[k, 0].item())).astype(F32)
                chain, plain = (chain + term).astype(F32), (plain + term).astype(F32)
            sweep["outputs"] += R
            sweep["differing"] += int((chain.view(np.int32) != theirs.view(np.int32)).sum())
            sweep["sum_then_bias_differing"] += int(((plain + F32(bias.item())).astype(F32) != theirs).sum())
            ours = torch.empty(R, 1)
            gemm(a, b, ours, bias)
            sweep["ckparity_gemms_differing"] += not same_bits(ours, torch.from_numpy(theirs).view(R, 1))
    # at 2 torch threads (MKL may share a long gemv between them): ckparity's C against torch, and larger GEMMs
    torch.set_num_threads(2)
    large = [(_placed(K, off, g).view(1, K), torch.randn(N, K, generator=g).t()) for K in (385, 1000, 4096)
             for N in (13, 1000, 4097) for off in (0, 3)]
    large += [(torch.randn(N, K, generator=g), _placed(K, off, g).view(K, 1)) for K in (385, 4096) for N in (13, 4097)
              for off in (0, 3)]
    pairs = [(a, b) for _, a, b in cases] + large
    two_threads = sum(not same_bits(_ours(a, b), a @ b) for a, b in pairs)
    report = {"env": environment(), "gemms": len(cases), "outputs": outputs, "differing": differing,
              "ckparity_gemms_differing": ours_differing, "scaled": scaled, "sweep_form": sweep,
              "two_threads": {"gemms": len(pairs), "ckparity_differing": two_threads}, "signs": _signs(),
              "examples": examples[:40]}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "env"}))


if __name__ == "__main__":
    main()
