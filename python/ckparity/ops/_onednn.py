"""oneDNN's order for torch's bfloat16 GEMMs, measured at run time: the chunks and the tile width
[Note: oneDNN's AMX bf16 order] (csrc/linear_bf16.c) takes from its caller, or, without AMX, the chunks of
[Note: oneDNN's AVX-512 bf16 order] (a chain over K's pairs: the width probe reads 2, Order's width 0).

Why measured rather than modelled: both are oneDNN's heuristics by M, N, K, the operands' layouts and its
threads (3 chunks of 352 at 64 x 1000 x 1000, one at 256 x 1000 x 256; tiles of 32, or 30 at K = 300), not
published, and another oneDNN or CPU picks others. torch itself says what they are: an output summing
+2^30, -2^30 and a single 1 comes out 1 only where the 1 is in another partial sum than the pair, or meets
it after it cancels (2^30 + 1 is 2^30 in float32); B's ones and zeros choose which places an output sums.

A measured order is then checked (_confirmed) on products that would show another order, and a shape
whose check fails is not followed (None): the op then runs the float32 GEMM rounded once. Each (shape,
layouts, torch threads) is measured once per process: a few products of the shape (4 ms at 24 x 97 x 48,
33 ms at 64 x 1000 x 1000 here)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .._native import check, ffi, lib

_BIG = 2.0 ** 30
MAX_TILES = 256  # the most tiles a chunk probe counts: bf16 holds the integers to 256 exactly
_U16 = ffi.typeof("uint16_t *")


@dataclass(frozen=True)
class Order:
    width: int              # a tile's terms, or 0: each chunk one chain over K's pairs, the odd-placed term first
    starts: tuple[int, ...]  # where K's chunks after the first start


def product(a: torch.Tensor, b: torch.Tensor, order: Order, bias: torch.Tensor | None = None, *,
            library=lib) -> torch.Tensor:
    """a (M, K) . b (K, N) (+ bias (N), contiguous, in the float32 sum), bf16 of any strides, in ``order``
    (ckp_gemm_bf16_tiles): (M, N) bf16."""
    (M, K), N = a.shape, b.shape[1]
    out = torch.empty(M, N, dtype=torch.bfloat16)
    starts = ffi.new("int64_t[]", list(order.starts)) if order.starts else ffi.NULL
    check(library.ckp_gemm_bf16_tiles(ffi.cast(_U16, a.data_ptr()), *a.stride(), ffi.cast(_U16, b.data_ptr()),
                                      *b.stride(), M, K, N, order.width, starts, len(order.starts),
                                      ffi.NULL if bias is None else ffi.cast(_U16, bias.data_ptr()),
                                      ffi.cast(_U16, out.data_ptr())), "linear (bf16)", library)
    return out


def _operand(rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """A zero bf16 (rows, cols) matrix, laid out as a transposed view when ``transposed``."""
    return torch.zeros(cols, rows, dtype=torch.bfloat16).t() if transposed else torch.zeros(rows, cols,
                                                                                            dtype=torch.bfloat16)


class _Probe:
    """torch.mm of (M, K) and (K, N) bf16 with the given layouts, planted terms in A and ones and zeros in B."""

    def __init__(self, M: int, K: int, N: int, a_t: bool, b_t: bool) -> None:
        self.M, self.K, self.N, self.a_t, self.b_t = M, K, N, a_t, b_t

    def survivors(self, plus: int, minus: int, ones: list[int]) -> list[int]:
        """Of the places ``ones``, those whose 1 survives beside +2^30 at ``plus`` and -2^30 at ``minus``. Up to
        M x N places a product: place i's 1 in row i % M of A, and B's column i // M % N the only column
        whose weight there is 1 (0 elsewhere: a product of 0 adds nothing, so each output sums the pair and
        one place; the values in B do not change oneDNN's blocking, its shape and layout do)."""
        alive, per = [], self.M * self.N
        for s in range(0, len(ones), per):
            part = ones[s:s + per]
            a, b = _operand(self.M, self.K, self.a_t), _operand(self.K, self.N, self.b_t)
            a[:, plus], a[:, minus] = _BIG, -_BIG
            b[plus, :], b[minus, :] = 1.0, 1.0
            for i, j in enumerate(part):
                a[i % self.M, j] = 1.0
                b[j, i // self.M] = 1.0
            y = torch.mm(a, b).tolist()
            alive += [j for i, j in enumerate(part) if y[i % self.M][i // self.M] == 1.0]
        return alive

    def width(self) -> int:
        """The first tile's terms: with the pair at 0 and 1 (its even and its odd chain) every 1 in that tile
        is absorbed; the first that survives opens the next tile."""
        alive = self.survivors(0, 1, list(range(2, min(self.K, 70))))
        return min(alive) if alive else self.K + self.K % 2  # one tile: an odd K's last pair padded with a zero

    def starts(self, width: int) -> tuple[int, ...]:
        """Where the chunks after the first start. Row r holds +2^30 first, -2^30 at tile t_r's first term and a
        1 at every later tile's first: its sum counts the 1s that survive, and they are the tiles from one on
        (a suffix): from t_r's next tile while t_r is in the first chunk (the running sum is 0 again there),
        else from the chunk after t_r's (t_r's chunk holds -2^30 until the chunks are added). So one product
        gives every tile's first survivor (exact: at most MAX_TILES ones, bf16 counts to 256)."""
        if width >= self.K:  # one tile
            return ()
        tiles = torch.arange(width, self.K, width)
        last = (self.K - 1) // width * width  # the last tile's first term
        first_alive = {}
        for s in range(0, len(tiles), self.M):
            part = tiles[s:s + self.M]
            a, b = _operand(self.M, self.K, self.a_t), _operand(self.K, self.N, self.b_t)
            b.fill_(1.0)
            rows = torch.arange(len(part))
            later = part[:, None] < tiles[None, :]  # (row, tile): the tiles after row r's t
            a[rows[:, None].expand_as(later)[later], tiles[None, :].expand_as(later)[later]] = 1.0
            a[rows, 0], a[rows, part] = _BIG, -_BIG
            counts = torch.mm(a, b)[:len(part), 0].tolist()
            for t, c in zip(part.tolist(), counts):
                first_alive[t] = last - (int(c) - 1) * width if c else None
        # the first tile past the first chunk (the last tile has no later tile to ask: the check decides there)
        opening = next((t for t in first_alive if t != last and first_alive[t] != t + width), None)
        found = [] if opening is None else [opening]
        while found and (nxt := first_alive.get(found[-1])) is not None and found[-1] < nxt < self.K:
            found.append(nxt)  # (on another oneDNN the counts need not be a suffix: the check then refuses)
        return tuple(found)

    def order(self) -> Order | None:
        """The order the probes read (not yet checked), or None where they read none: K over 8192 is not read
        (AMX: more tiles than a bf16 sum counts exactly; the pairs' chain: a product per M candidate chunk starts,
        which at K = 65537 took minutes)."""
        if self.K > MAX_TILES * 32:
            return None
        width = self.width()
        if width == 2:  # the pair cancelled and every later 1 survived: VDPBF16PS's chain over pairs, no AMX tiles
            return Order(0, self.pair_starts())  # ([Note: oneDNN's AVX-512 bf16 order] in csrc/linear_bf16.c)
        if width < 2 or width % 2:
            return None
        return Order(width, self.starts(width))

    def pair_starts(self) -> tuple[int, ...]:
        """Where the chunks after the first start, for the pairs' chain (chunks start at even k). Row r asks
        about s: a 1 at s - 2, then -2^30 at s and +2^30 at s + 1 (added first: a pair's odd-placed term leads).
        Within one chunk 1 + 2^30 is 2^30 and the pair cancels it: 0. If s starts a chunk the 1 is alone in the
        one before, the pair cancels in its own: 1. (A chunk of one last term adds as the chain would: no
        matter.)"""
        candidates = list(range(2, self.K - 1, 2))
        found = []
        for s in range(0, len(candidates), self.M):
            part = candidates[s:s + self.M]
            a, b = _operand(self.M, self.K, self.a_t), _operand(self.K, self.N, self.b_t)
            b.fill_(1.0)
            for i, k in enumerate(part):
                a[i, k - 2], a[i, k], a[i, k + 1] = 1.0, -_BIG, _BIG
            y = torch.mm(a, b)[:, 0].tolist()
            found += [k for i, k in enumerate(part) if y[i] == 1.0]
        return tuple(found)


@functools.lru_cache(maxsize=None)
def _measured(M: int, K: int, N: int, a_t: bool, b_t: bool, threads: int) -> Order | None:
    if K < 2 or M < 2 or N < 2:  # oneDNN's paths for one row or one column: other orders, not measured here
        return None
    order = _Probe(M, K, N, a_t, b_t).order()
    return order if order is not None and _confirmed(order, M, K, N, a_t, b_t) else None


def _confirmed(order: Order, M: int, K: int, N: int, a_t: bool, b_t: bool) -> bool:
    """Whether ckparity's C in ``order`` gives torch's bits on products that would show another order: rows
    of +2^30, -2^30 and a 1 at random places (256 rows, in 2 to 16 products: which partial sums each place
    shares is the whole order), B's columns scaled by powers of two (a column summed otherwise would show),
    and one product of normal values. Random values alone would not do: rounded to bf16, another grouping
    of a small product changes no output as often as not (measured: a wrong width passed at 8 x 64 x 16)."""
    g = torch.Generator().manual_seed(K)
    a, b = _operand(M, K, a_t), _operand(K, N, b_t)
    b.copy_(torch.exp2(torch.arange(N) % 7.0).expand(K, N))
    for _ in range(min(16, max(2, -(-256 // M)))):
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
