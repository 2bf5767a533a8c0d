"""Measures MKL's small sgemm on its AVX2 branch in this process, as [Note: MKL's AVX2 small sgemm] (csrc/linear.c)
states it, and writes reports/linear/mkl_avx2_small.json (run on a CPU without AVX-512: MKL's AVX2 branch).

F.linear's y (A's rows and B's columns along K) of 2..3 rows or 2..11 columns, at one torch thread, against the
Note's model written here in numpy (not ckparity's C): each element a dot product of x's row and w's row without
FMA -- the k before x's row reaches a 16-byte boundary (its address decides) a chain that starts lane 0, then
lanes of k mod L over whole L-groups (L = 4 in C's whole groups of 4 columns, 8 in the 1..3 after them), the
lanes halved, the k left over added in order -- and against the readings it was told from: the same lanes with
FMA, no boundary (lanes from k = 0), and ckparity's earlier 16-lane dot products. Each shape also with x a view
one float past a 16-byte boundary (every row's start moves), and alpha, beta 1 and a bias (addmm; K = 1 is a
rank-1 update there: alpha times x's element, times w's, added to C).

Then [Note: MKL's AVX2 small sgemm by columns]: torch.mm(a, b) with b's rows contiguous and a's rows ('NN': dX =
dY.W) or columns ('TN': dW = dY^T.X) contiguous, C of 1..9 rows against 2..37 columns (under 4 rows or 12
columns), K 2..385, C one to three floats past a 16-byte boundary (every row's start moves): each element a chain
without FMA over k from 0, the columns before C's row reaches a boundary (when 4+ columns remain after them) 8 k
at a time -- 4 products added one by one, then ((p4 + p5) + p6) + p7 -- against the same without those 8-k
steps, with them whatever remains, and an FMA chain; and addmm (beta 1, alpha 0.3) against C as the chain's
start with alpha on a's element, and against alpha times the product added to C after. And its path with both
a and b transposed ('TT': y and dW of a column-major x), C of 2..9 rows: a plain chain without FMA, alpha times it
added to C (beta 1), against C as the chain's start.

    python scripts/mkl_avx2_small.py [--out reports/linear/mkl_avx2_small.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F

from ckparity.harness.loop.run import environment

F32 = np.float32
# (M, K, N): 2-3 rows against 12+ columns, 2..11 columns against more rows, K with every tail mod 4 and 8
SHAPES = [(M, K, N) for M, N in ((6, 2), (6, 3), (8, 4), (5, 5), (8, 7), (4, 8), (9, 11), (2, 12), (3, 13), (2, 40))
          for K in (1, 2, 3, 5, 8, 13, 21, 32, 37, 61, 97, 300, 1000)]


def _dot(x: np.ndarray, w: np.ndarray, ahead: int, lanes: int, fused: bool, bounded: bool) -> F32:
    """x . w as the Note orders it (ahead: the floats before x's first 16-byte boundary)."""
    add = (lambda acc, a, b: F32(np.float64(a) * np.float64(b) + np.float64(acc))) if fused else \
        (lambda acc, a, b: F32(acc + F32(a * b)))
    K = len(x)
    peel = min(ahead, K) if bounded else 0
    acc = [F32(0)] * lanes
    for k in range(peel):
        acc[0] = add(acc[0], x[k], w[k])
    end = peel + (K - peel) // lanes * lanes
    for k in range(peel, end):
        acc[(k - peel) % lanes] = add(acc[(k - peel) % lanes], x[k], w[k])
    half = lanes // 2
    while half >= 1:
        acc[:half] = [F32(acc[i] + acc[i + half]) for i in range(half)]
        half //= 2
    s = acc[0]
    for k in range(end, K):
        s = add(s, x[k], w[k])
    return s


def _quarters16(x: np.ndarray, w: np.ndarray) -> F32:
    """ckparity's earlier reading: 16 FMA lanes reduced in quarters ([Note: MKL's skinny sgemm])."""
    v = [F32(0)] * 16
    for k in range(len(x)):
        v[k % 16] = F32(np.float64(x[k]) * np.float64(w[k]) + np.float64(v[k % 16]))
    q = [F32(F32(F32(v[j] + v[4 + j]) + v[8 + j]) + v[12 + j]) for j in range(4)]
    return F32(F32(q[0] + q[1]) + F32(q[2] + q[3]))


def _model(x: torch.Tensor, w: torch.Tensor, reading: str) -> np.ndarray:
    M, N = x.shape[0], w.shape[0]
    xn, wn = x.numpy(), w.numpy()
    out = np.zeros((M, N), F32)
    for m in range(M):
        ahead = (-(x.data_ptr() + 4 * m * x.stride(0)) % 16) // 4
        for n in range(N):
            lanes = 4 if n < N // 4 * 4 else 8
            out[m, n] = (_quarters16(xn[m], wn[n]) if reading == "quarters16" else
                         _dot(xn[m], wn[n], ahead, lanes, fused=reading == "fma", bounded=reading != "no_boundary"))
    return out


READINGS = ("note", "fma", "no_boundary", "quarters16")


COLUMN_SHAPES = [(M, K, N) for M in (1, 2, 3, 5, 9) for N in (2, 3, 4, 5, 6, 7, 9, 11, 12, 16, 37)
                 if M < 4 or N < 12 for K in (2, 3, 5, 9, 16, 31, 100, 385)]
COLUMN_READINGS = ("note", "no_peel", "peel_always", "fma")


def _columns(a: np.ndarray, b: np.ndarray, cols: np.ndarray, seed: np.ndarray, alpha: F32, eight: bool,
             fused: bool = False) -> np.ndarray:
    """C's columns cols of one row a (K,) . b (K, N): a chain over k from seed, alpha on a's element; eight: the
    peel columns' 8-k steps."""
    acc = seed.copy()
    products = [(F32(alpha * a[k]) * b[k, cols]).astype(F32) for k in range(len(a))]
    if fused:
        for k in range(len(a)):
            acc = (np.float64(F32(alpha * a[k])) * b[k, cols].astype(np.float64) + acc).astype(F32)
        return acc
    k = 0
    while eight and k + 8 <= len(a):
        p = products[k:k + 8]
        for i in range(4):
            acc = acc + p[i]
        acc = acc + (((p[4] + p[5]) + p[6]) + p[7])
        k += 8
    for p in products[k:]:
        acc = acc + p
    return acc


def _model_columns(a: np.ndarray, b: np.ndarray, c_ptr: int, seed: np.ndarray, alpha: F32, reading: str) -> np.ndarray:
    M, N = a.shape[0], b.shape[1]
    out = np.zeros((M, N), F32)
    for m in range(M):
        ahead = min((-(c_ptr + 4 * m * N) % 16) // 4, N)
        peel = ahead if (N - ahead >= 4 or reading == "peel_always") and reading != "no_peel" else 0
        head, rest = np.arange(peel), np.arange(peel, N)
        out[m, rest] = _columns(a[m], b, rest, seed[m, rest], alpha, False, reading == "fma")
        if peel:
            out[m, head] = _columns(a[m], b, head, seed[m, head], alpha, True, reading == "fma")
    return out


def _by_columns(g: torch.Generator) -> dict:
    totals = {r: 0 for r in COLUMN_READINGS} | {"addmm_seeded": 0, "addmm_after": 0}
    rows, outputs = [], 0
    alpha = F32(0.3)
    for layout in ("NN", "TN"):
        for M, K, N in COLUMN_SHAPES:
            a = torch.randn(K, M, generator=g).t() if layout == "TN" else torch.randn(M, K, generator=g)
            b, c0 = torch.randn(K, N, generator=g), torch.randn(M, N, generator=g)
            store = torch.empty(M * N + 3)
            for off in range(4):
                c = store[off:off + M * N].view(M, N)
                torch.mm(a, b, out=c)
                an, bn, zero = a.numpy(), b.numpy(), np.zeros((M, N), F32)
                row = {"layout": layout, "M": M, "K": K, "N": N, "c_floats_off": off, "outputs": M * N}
                for reading in COLUMN_READINGS:
                    row[f"differing_{reading}"] = int((_model_columns(an, bn, c.data_ptr(), zero, F32(1), reading)
                                                       != c.numpy()).sum())
                    totals[reading] += row[f"differing_{reading}"]
                c.copy_(c0)
                torch.addmm(c, a, b, alpha=float(alpha), out=c)
                seeded = _model_columns(an, bn, c.data_ptr(), c0.numpy(), alpha, "note")
                after = (c0.numpy() + alpha * _model_columns(an, bn, c.data_ptr(), zero, F32(1), "note")).astype(F32)
                row["differing_addmm_seeded"] = int((seeded != c.numpy()).sum())
                row["differing_addmm_after"] = int((after != c.numpy()).sum())
                totals["addmm_seeded"] += row["differing_addmm_seeded"]
                totals["addmm_after"] += row["differing_addmm_after"]
                outputs += M * N
                rows.append(row)
    print("by columns", json.dumps({"outputs": outputs, "differing": totals}), flush=True)
    return {"outputs": outputs, "differing": totals, "shapes": rows}


def _both_transposed(g: torch.Generator) -> dict:
    totals, outputs = {"note": 0, "seeded": 0}, 0
    for M, K, N in [(M, K, N) for M, K, N in COLUMN_SHAPES if M >= 2]:
        a, b = torch.randn(K, M, generator=g).t(), torch.randn(N, K, generator=g).t()
        c0 = torch.randn(M, N, generator=g)
        chain = np.zeros((M, N), F32)
        for k in range(K):
            chain = chain + (a.numpy()[:, k, None] * b.numpy()[None, k]).astype(F32)
        for alpha, beta in ((1.0, 0), (0.3, 0), (1.0, 1), (0.3, 1)):
            c = torch.addmm(c0, a, b, beta=beta, alpha=alpha).numpy()
            start = c0.numpy() if beta else np.zeros((M, N), F32)
            seeded = start.copy()
            for k in range(K):
                seeded = seeded + (F32(alpha) * a.numpy()[:, k, None] * b.numpy()[None, k]).astype(F32)
            totals["note"] += int(((start + F32(alpha) * chain).astype(F32) != c).sum())
            totals["seeded"] += int((seeded != c).sum())
            outputs += M * N
    print("both transposed", json.dumps({"outputs": outputs, "differing": totals}), flush=True)
    return {"outputs": outputs, "differing": totals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/mkl_avx2_small.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rows = []
    totals = {r: 0 for r in READINGS} | {"addmm": 0}
    elements = 0
    for M, K, N in SHAPES:
        store = torch.randn(M * K + 1, generator=g)
        w, c = torch.randn(N, K, generator=g), torch.randn(M, N, generator=g)
        for place, x in (("aligned", store[:M * K].clone().view(M, K)), ("one float off", store[1:].view(M, K))):
            y = F.linear(x, w).numpy()
            row = {"M": M, "K": K, "N": N, "x": place, "outputs": M * N}
            for reading in READINGS:
                row[f"differing_{reading}"] = int((_model(x, w, reading) != y).sum())
                totals[reading] += row[f"differing_{reading}"]
            # alpha multiplies the rounded sum, beta 1 adds C to that, a bias is added after (as ckp_gemm's)
            s = _model(x, w, "note")
            alpha = F32(0.3)
            addmm = torch.addmm(c, x, w.t(), beta=1, alpha=float(alpha)).numpy()
            biased = F.linear(x, w, c[0]).numpy()
            scaled = (F32(alpha) * x.numpy()).astype(F32) * w.numpy().T if K == 1 else F32(alpha) * s
            row["differing_addmm"] = int(((c.numpy() + scaled.astype(F32)).astype(F32) != addmm).sum()
                                         + ((s + c.numpy()[0]).astype(F32) != biased).sum())
            totals["addmm"] += row["differing_addmm"]
            elements += M * N
            rows.append(row)
        print(M, K, N, {k: v for k, v in rows[-1].items() if k.startswith("differing")}, flush=True)
    report = {"env": environment(), "outputs": elements, "differing": totals, "shapes": rows,
              "by_columns": _by_columns(g), "both_transposed": _both_transposed(g)}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({"outputs": elements, "differing": totals}))


if __name__ == "__main__":
    main()
