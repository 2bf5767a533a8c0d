"""Large outputs on buffers that are reused once no tensor holds them.

[Note: reused buffers for large outputs]
torch's CPU allocator hands a large tensor memory the process gets from the
kernel each time (glibc returns a freed block of this size to it), so every
call of an op pays its outputs' page faults again: the bf16 rms_norm forward
over (8192, 4096) runs its C call in 8-9 ms and costs 19-20 ms through the op
(`ckparity bench`), and on a VM that hands free memory back to its host some
of those calls cost 50 ms and more ([Note: huge pages for large outputs]).
Training calls the same ops with the same shapes step after step, so the ops
take their large outputs (HUGE_PAGES_FROM bytes and up) from here: a buffer of
the same size that no tensor holds any more is handed out again, its pages
already faulted in; otherwise a new one is made. Measured with the bench's
rows, bf16 and float32, the two builds in turn (docs/performance.md): the
call's median falls toward its C calls and the means stop jumping.

A buffer is held while any tensor on it lives: the op gets a tensor made by
torch.frombuffer on a fresh view of the buffer, whose storage holds that view
until the storage is freed -- whichever view or alias of the output lives
longest -- and a weakref finalizer on the view returns the buffer. Buffers no
tensor holds are kept up to CKP_OUTPUT_POOL_MB megabytes (default 1024; 0: no
reuse, every output fresh as torch's), the oldest dropped first, checked
each time a buffer is returned or made; empty_cache() drops them all.
Reuse changes no value (the ops write every element of an output) and no
tensor's behaviour but one: such a tensor cannot be resized in place beyond
its size (``resize_``), as for any tensor made by torch.frombuffer.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Callable

import numpy as np
import torch

from .errors import InvalidArgument

ALIGN = 2 << 20  # a buffer starts on a 2 MB boundary: whole huge pages, and no vector load splits a cache line


def budget_from_env() -> int:
    value = os.environ.get("CKP_OUTPUT_POOL_MB", "1024")
    if not value.isdigit():
        raise InvalidArgument(f"CKP_OUTPUT_POOL_MB must be a whole number of megabytes (0: no reuse of large "
                              f"outputs), got {value!r}")
    return int(value) << 20


class Pool:
    """Buffers by size; ``tensor(nbytes, dtype, shape)`` is the one way in."""

    def __init__(self, budget: int, advise: Callable[[int, int], None]) -> None:
        self.budget = budget
        self.advise = advise            # (address, nbytes): asks for huge pages on a new buffer
        self.idle: list[np.ndarray] = []  # buffers no tensor holds, oldest first
        self.returned: list[np.ndarray] = []  # filled by the finalizers, which may run inside take()
        self.lock = threading.Lock()

    def tensor(self, nbytes: int, dtype: torch.dtype, shape) -> torch.Tensor:
        buffer = self._take(nbytes)
        view = buffer[:]  # the lease: its end, when the storage lets go of it, returns the buffer
        weakref.finalize(view, self._give_back, buffer)
        # resize_ within the storage, not .view(dtype).view(shape): autograd adds a second gradient term into
        # the first in place only if the first is no view (else it allocates their sum afresh: float32
        # rms_norm's two dx terms cost a buffer more and a pass, measured)
        return torch.frombuffer(view, dtype=dtype).resize_(shape)

    def empty_cache(self) -> None:
        with self.lock:
            self._settle()
            self.idle.clear()

    def idle_bytes(self) -> int:
        with self.lock:
            self._settle()
            return sum(b.nbytes for b in self.idle)

    def _take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            self._settle()
            for k, buffer in enumerate(self.idle):
                if buffer.nbytes == nbytes:
                    return self.idle.pop(k)
        # torch's allocator, not numpy's: numpy asks Linux for huge pages on its own (CKP_HUGE_PAGES decides here)
        raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8).numpy()
        start = -raw.ctypes.data % ALIGN
        buffer = raw[start:start + nbytes]
        self.advise(buffer.ctypes.data, nbytes)
        return buffer

    def _give_back(self, buffer: np.ndarray) -> None:
        # a finalizer runs wherever the last reference went, maybe inside _take on this thread: list.append is
        # atomic, and the lock is only tried, never waited for
        self.returned.append(buffer)
        if self.lock.acquire(blocking=False):
            try:
                self._settle()
            finally:
                self.lock.release()

    def _settle(self) -> None:
        """Under the lock: returned buffers become idle ones, the oldest dropped past the budget."""
        while self.returned:
            self.idle.append(self.returned.pop(0))
        total = sum(b.nbytes for b in self.idle)
        while self.idle and total > self.budget:
            total -= self.idle.pop(0).nbytes
