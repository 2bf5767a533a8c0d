"""What a record's bit-identity sweep (Claim.sweep) writes into and runs
with: the tally of cases and differing cases, a forward+backward run, and
torch at a given thread count. ckparity.sweep runs the sweeps."""

from __future__ import annotations

import contextlib
import math

import torch


@contextlib.contextmanager
def torch_threads(n: int):
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sgemm_thread_counts() -> tuple[int, ...]:
    """The torch thread counts a claim over torch's sgemm is swept at: 1 and 2 in MKL's strict order
    (MKL_CBWR=AUTO,STRICT: the same bits at every thread count) and in its AVX2 branch's own (2 threads share a
    few-row product by rows, followed: [Note: MKL's AVX2 sgemm on two threads]); one in its AVX-512 branch's own
    order (at 2 threads MKL splits some GEMMs' K between them, not followed)."""
    from .. import cpu

    return (1, 2) if cpu.mkl_strict() or cpu.mkl_avx2_own() else (1,)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: -0.0 is not +0.0; a NaN matches any NaN (torch's NaN bits are not a result)."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    nan = a.isnan() & b.isnan()
    return bool(((a.view(ints) == b.view(ints)) | nan).all())


class Tally:
    """Per quantity: cases swept, and the cases whose bits differ."""

    def __init__(self):
        self.swept: dict[str, int] = {}
        self.differing: dict[str, list[str]] = {}

    def add(self, quantity: str, case: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
        self.swept[quantity] = self.swept.get(quantity, 0) + 1
        if ours.shape != theirs.shape or ours.dtype != theirs.dtype or not same_bits(ours, theirs):
            self.differing.setdefault(quantity, []).append(case)

    def outcome(self, quantity: str, case: str, as_expected: bool) -> None:
        """A case judged by its caller (an error raised, or not, where torch raises one)."""
        self.swept[quantity] = self.swept.get(quantity, 0) + 1
        if not as_expected:
            self.differing.setdefault(quantity, []).append(case)

    def result(self) -> dict:
        return {q: {"swept": n, "differing": len(self.differing.get(q, [])), "examples": self.differing.get(q, [])[:8]}
                for q, n in self.swept.items()}


def spread(*shape: int, generator: torch.Generator, octaves: int) -> torch.Tensor:
    """Normal values scaled by 2^-octaves..2^octaves: an order of additions shows through bf16's rounding far more
    often on them than on normal values alone (which hid the bf16 dot's lanes at AVX512 in all but 2 of 1929 small
    products, and a one-item attention pass's 2-thread order in all but 3 of 72)."""
    return torch.randn(*shape, generator=generator) * torch.exp2(
        torch.randint(-octaves, octaves + 1, shape, generator=generator).float())


def grad_run(fn, inputs, upstream):
    """fn(*inputs) and the gradients of every input that requires one."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point() and t.requires_grad) for t in inputs]
    out = fn(*leaves)
    out.backward(upstream)
    return [out.detach()] + [t.grad for t in leaves if t.requires_grad]


# widths for special_rows: one element, under a vector, one 8- and 16-lane vector's worth and more,
# odd tails, and a row past the vector loops' blocks
SPECIAL_WIDTHS = (1, 7, 64, 97, 300, 1003)
SPECIAL_ROWS = 26  # special_rows' rows


def special_rows(g: torch.Generator, width: int, dtype: torch.dtype) -> torch.Tensor:
    """(SPECIAL_ROWS, width) values of ``dtype`` whose rows hold what the kernels treat apart: a NaN, an inf beside
    a -inf, an inf alone (at the row's start, inside, and its last elements: the vector loops' lanes and
    tails), a row of -inf, rows whose maximum is a zero of either sign (which zero a max keeps), a row
    spread over 120 below its maximum (exps that underflow through the subnormals, SLEEF's range selects
    at work) and one whose least value is 85.5 below it, exact in bf16 (at the edge of the rows whose
    exps skip those selects: ckp_exp_sleef_normal). Every sweep runs them: a bit-identity claim then covers such input
    (NaN matching any NaN: same_bits)."""
    x = torch.randn(SPECIAL_ROWS, width, generator=g) * 3
    x[24] = torch.linspace(5.0, -115.0, width) if width > 1 else 5.0
    x[25] = 4.0 - torch.tensor([0.0, 20.0, 50.0, 80.0, 84.0, 85.0, 85.25, 85.5])[torch.arange(width) % 8]
    for row, at in enumerate((0, 17, 63, 64, width // 2, width - 17, width - 1)):
        at %= width
        x[row, at] = math.nan
        x[7 + row, at], x[7 + row, (at + 1) % width] = math.inf, -math.inf
        x[14 + row, at] = math.inf
    x[21] = -math.inf
    x[22:] = -x[22:].abs()
    x[22, 5 % width], x[22, (width - 2) % width] = -0.0, 0.0  # the first zero -0
    x[23, 3 % width], x[23, 40 % width] = 0.0, -0.0
    return x.to(dtype)
