"""The order of torch's bfloat16 matmul where it runs ATen's own loops (no oneDNN: a CPU without AVX-512, as
an AMD CPU with AVX2 only; on a CPU with oneDNN's bf16, with oneDNN switched off -- torch runs the same loops there
for products of up to 16^3 multiply-adds), measured: [Note: ATen's bf16 GEMM] (csrc/linear_bf16_aten.c).

How it is read: an output whose terms are ones and zeros with +2^30 and -2^30 planted among them sums to the
ones that met neither of the pair in a partial sum before the pair cancelled (2^30 + 1 is 2^30 in float32); on
random inputs too, with exponents spread over 2^-8..2^8 so that the order shows through bf16's rounding. Every
torch.mm and addmm layout (A and B each row- or column-major), products of one row, one column and one term,
K over the dot's 64-term blocks and 16-term tails and the chains' K mod 4, at 1 and 2 torch threads.

Per capability (DEFAULT, AVX2 and this CPU's, each in a fresh process: ATEN_CPU_CAPABILITY), the report counts the
products ckparity's C (ckp_gemm_bf16_aten in the loop ckparity.ops._aten_bf16.form picks) gets wrong, and how
many each other reading gets wrong: every layout in one loop, the lanes reduced the other way, the bias added
after the rounded product, the float32 GEMM rounded once (ckparity's bf16 linear before). Writes
reports/linear/aten_bf16_order.json.

    .venv/bin/python scripts/aten_bf16_order.py [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys

import torch

SHAPES = [(M, K, N) for M, N in itertools.product((1, 2, 5, 17), (1, 3, 16, 33))
          for K in (1, 2, 3, 5, 15, 16, 17, 63, 64, 65, 79, 80, 97, 128, 300, 1000)]


def _planted(M, K, N, g):
    a = torch.randint(0, 2, (M, K), generator=g).float()
    b = torch.randint(0, 2, (K, N), generator=g).float()
    if K >= 2:
        for m in range(M):
            p, q = torch.randperm(K, generator=g)[:2].tolist()
            a[m, p], a[m, q] = 2.0 ** 30, -(2.0 ** 30)
    return a.bfloat16(), b.bfloat16()


def _spread(M, K, N, g):
    def one(*shape):
        return (torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-8, 9, shape, generator=g).float()))
    return one(M, K).bfloat16(), one(K, N).bfloat16()


def _laid(t, column_major):
    return t.t().contiguous().t() if column_major else t.contiguous()


def measure() -> dict:
    """In this process: the products each reading gets wrong, at 1 and 2 torch threads."""
    from ckparity._native import lib
    from ckparity.ops import _aten_bf16

    @contextlib.contextmanager
    def forced(form=None, capability=None):
        old_form, old_cap = _aten_bf16.form, lib.ckp_get_capability()
        if form is not None:
            _aten_bf16.form = lambda a, b: form
        if capability is not None:
            lib.ckp_set_capability(capability)
        try:
            yield
        finally:
            _aten_bf16.form = old_form
            lib.ckp_set_capability(old_cap)

    other_lanes = lib.CKP_CAPABILITY_AVX2 if lib.ckp_get_capability() == lib.CKP_CAPABILITY_DEFAULT \
        else lib.CKP_CAPABILITY_DEFAULT
    readings = {
        "ckparity": lambda a, b, bias: _aten_bf16.product(a, b, bias),
        "every layout as the dot": lambda a, b, bias: _with(forced(form=_aten_bf16.DOT), a, b, bias),
        "every layout as the four chains": lambda a, b, bias: _with(forced(form=_aten_bf16.PAIRS), a, b, bias),
        "every layout as one chain": lambda a, b, bias: _with(forced(form=_aten_bf16.CHAIN), a, b, bias),
        "the lanes reduced the other way": lambda a, b, bias: _with(forced(capability=other_lanes), a, b, bias),
        "the bias added after the rounded product": lambda a, b, bias: _aten_bf16.product(a, b, bias, bias is not None),
        "the float32 GEMM rounded once": lambda a, b, bias: torch.addmm(bias.float(), a.float(), b.float()).bfloat16()
        if bias is not None else torch.mm(a.float(), b.float()).bfloat16(),
    }

    def _with(ctx, a, b, bias):
        with ctx:
            return _aten_bf16.product(a, b, bias)

    g = torch.Generator().manual_seed(0)
    wrong = {threads: dict.fromkeys(readings, 0) for threads in (1, 2)}
    products = 0
    for (M, K, N), make, a_cm, b_cm, with_bias in itertools.product(SHAPES, (_planted, _spread), (False, True),
                                                                     (False, True), (False, True)):
        a, b = make(M, K, N, g)
        a, b = _laid(a, a_cm), _laid(b, b_cm)
        bias = torch.randn(N, generator=g).bfloat16() if with_bias else None
        products += 1
        for threads in (1, 2):
            torch.set_num_threads(threads)
            theirs = torch.addmm(bias, a, b) if with_bias else torch.mm(a, b)
            for name, reading in readings.items():
                wrong[threads][name] += int(not torch.equal(reading(a, b, bias).view(torch.int16),
                                                            theirs.view(torch.int16)))
    return {"capability": torch.backends.cpu.get_cpu_capability(), "products": products,
            "wrong_by_reading": {f"torch threads {t}": w for t, w in wrong.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/linear/aten_bf16_order.json")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one capability, as JSON
    parser.add_argument("--onednn-off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        torch.backends.mkldnn.enabled = not args.onednn_off
        print(json.dumps(measure()))
        return
    from ckparity.harness.loop.run import environment
    from ckparity.ops import _aten_bf16

    # where torch runs oneDNN for bf16, ATen's loops are what it runs with oneDNN off (and for small products)
    onednn_off = not _aten_bf16.torch_runs_aten()
    rows = []
    for capability in dict.fromkeys(("default", "avx2", torch.backends.cpu.get_cpu_capability().lower())):
        out = subprocess.run([sys.executable, __file__, "--measure"] + ["--onednn-off"] * onednn_off,
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "ATEN_CPU_CAPABILITY": capability}).stdout
        rows.append({**json.loads(out.splitlines()[-1]), "onednn": "off" if onednn_off else "not run for bf16"})
        print(rows[-1], flush=True)
    report = {"schema": "ckparity.aten_bf16_order/1", "env": environment(), "rows": rows}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
