"""oneDNN's order for torch's bfloat16 GEMMs, measured at run time: the chunks and the tile width
[Note: oneDNN's AMX bf16 order] (csrc/linear_bf16.c) takes from its caller.

Why measured rather than modelled: both are oneDNN's heuristics by M, N, K, the operands' layouts and its
threads (3 chunks of 352 at 64 x 1000 x 1000, one at 256 x 1000 x 256; tiles of 32, or 30 at K = 300), not
published, and another oneDNN or CPU picks others. torch itself says what they are: a row of A holding
+2^30, -2^30 and a single 1, B all ones, gives the row's sum in oneDNN's order, and the 1 survives only where
it is in another partial sum than the pair, or meets it after it cancels (2^30 + 1 is 2^30 in float32).

A measured order is then checked: one random product of the shape and layouts, ckparity's C against torch,
every output equal -- or the shape is not followed (None), and the op says so. Each (shape, layouts, torch
threads) is measured once per process: a few GEMMs of the shape (2-3 at a twin's, ~15 at K = 4096)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .._native import check, ffi, lib

_BIG = 2.0 ** 30
_U16 = ffi.typeof("uint16_t *")


@dataclass(frozen=True)
class Order:
    width: int              # a tile's terms
    starts: tuple[int, ...]  # where K's chunks after the first start


def product(a: torch.Tensor, b: torch.Tensor, order: Order, *, library=lib) -> torch.Tensor:
    """a (M, K) . b (K, N), bf16 of any strides, in ``order`` (ckp_gemm_bf16_tiles): (M, N) bf16."""
    (M, K), N = a.shape, b.shape[1]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    starts = ffi.new("int64_t[]", list(order.starts)) if order.starts else ffi.NULL
    check(library.ckp_gemm_bf16_tiles(ffi.cast(_U16, a.data_ptr()), *a.stride(), ffi.cast(_U16, b.data_ptr()),
                                      *b.stride(), M, K, N, order.width, starts, len(order.starts),
                                      ffi.cast(_U16, out.data_ptr())), "linear (bf16)", library)
    return out


def _operand(rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """A zero bf16 (rows, cols) matrix, laid out as a transposed view when ``transposed``."""
    return torch.zeros(cols, rows, dtype=torch.bfloat16).t() if transposed else torch.zeros(rows, cols,
                                                                                            dtype=torch.bfloat16)


class _Probe:
    """torch.mm of (M, K) and (K, N) bf16 with the given layouts, its A's rows holding planted terms."""

    def __init__(self, M: int, K: int, N: int, a_t: bool, b_t: bool) -> None:
        self.M, self.K, self.N, self.a_t = M, K, N, a_t
        self.b = _operand(K, N, b_t)
        self.b.fill_(1.0)

    def survivors(self, plus: int, minus: int, ones: list[int]) -> list[int]:
        """Of the places ``ones``, those whose 1 survives beside +2^30 at ``plus`` and -2^30 at ``minus``."""
        alive = []
        for s in range(0, len(ones), self.M):
            part = ones[s:s + self.M]
            a = _operand(self.M, self.K, self.a_t)
            a[:, plus], a[:, minus] = _BIG, -_BIG
            for r, j in enumerate(part):
                a[r, j] = 1.0
            first = torch.mm(a, self.b)[:, 0].tolist()
            alive += [j for r, j in enumerate(part) if first[r] == 1.0]
        return alive

    def width(self) -> int:
        """The first tile's terms: with the pair at 0 and 1 (its even and its odd chain) every 1 in that tile
        is absorbed; the first that survives opens the next tile."""
        alive = self.survivors(0, 1, list(range(2, min(self.K, 70))))
        return min(alive) if alive else self.K + self.K % 2  # one tile: an odd K's last pair padded with a zero

    def starts(self, width: int) -> tuple[int, ...]:
        """Where the chunks after the first start: with +2^30 first and -2^30 in tile t, a 1 in the tile after
        t survives while t is in the first chunk (the running sum is 0 again there); past it, the first
        survivor opens the chunk after t's (t's chunk holds -2^30 until the chunks are added)."""
        tiles = list(range(width, self.K, width))

        def first_alive(t: int) -> int | None:
            alive = self.survivors(0, t, [u for u in range(width, self.K, width) if u != t])  # each tile's first
            return min(alive) if alive else None

        def in_first_chunk(t: int) -> bool:  # the last tile has no tile after it to ask: the check below decides
            return t == tiles[-1] or first_alive(t) == t + width

        lo, hi = 0, len(tiles)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if in_first_chunk(tiles[mid]) else (lo, mid)
        if lo == len(tiles):
            return ()
        found = [tiles[lo]]
        while (nxt := first_alive(found[-1])) is not None:
            found.append(nxt)
        return tuple(found)


@functools.lru_cache(maxsize=None)
def _measured(M: int, K: int, N: int, a_t: bool, b_t: bool, threads: int) -> Order | None:
    if K < 2:
        return None
    probe = _Probe(M, K, N, a_t, b_t)
    width = probe.width()
    if width < 2 or width % 2:
        return None
    order = Order(width, probe.starts(width))
    return order if _confirmed(order, M, K, N, a_t, b_t) else None


def _confirmed(order: Order, M: int, K: int, N: int, a_t: bool, b_t: bool) -> bool:
    """Whether ckparity's C in ``order`` gives torch's bits on products that would show another order: rows
    of +2^30, -2^30 and a 1 at random places (at least 256 of them: which partial sums each place shares is
    the whole order), B's columns scaled by powers of two (a column summed otherwise would show), and one
    product of normal values. Random values alone would not do: rounded to bf16, another grouping of a
    small product changes no output as often as not (measured: a wrong width passed at 8 x 64 x 16)."""
    g = torch.Generator().manual_seed(K)
    a, b = _operand(M, K, a_t), _operand(K, N, b_t)
    b.copy_(torch.exp2(torch.arange(N) % 7.0).expand(K, N))
    for _ in range(min(64, max(2, -(-256 // M)))):
        places = torch.stack([torch.randperm(K, generator=g)[:3] for _ in range(M)]) if K >= 3 else None
        if places is None:
            break
        a.zero_()
        rows = torch.arange(M)
        a[rows, places[:, 0]], a[rows, places[:, 1]], a[rows, places[:, 2]] = _BIG, -_BIG, 1.0
        if not torch.equal(product(a, b, order), torch.mm(a, b)):
            return False
    a.copy_(torch.randn(M, K, generator=g))
    b.copy_(torch.randn(K, N, generator=g))
    return torch.equal(product(a, b, order), torch.mm(a, b))


def order(M: int, K: int, N: int, a_t: bool, b_t: bool) -> Order | None:
    """oneDNN's order for torch.mm of bf16 (M, K) and (K, N), A and B transposed views where a_t and b_t say,
    at torch's thread count; None where the measured order does not give torch's bits on a random product
    of the shape (another oneDNN path: no AMX, or an order this model does not describe)."""
    return _measured(M, K, N, a_t, b_t, torch.get_num_threads())
