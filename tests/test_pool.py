"""[Note: reused buffers for large outputs]: a large output is handed out again
only once no tensor holds it, the ops' bits on a reused buffer are torch's,
idle buffers stay within CKP_OUTPUT_POOL_MB, and 0 turns reuse off."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import _tensors
from ckparity._pool import ALIGN, Pool

LARGE = (2048, 1024)  # 8 MB in float32: above HUGE_PAGES_FROM

pytestmark = pytest.mark.skipif(_tensors.POOL is None, reason="CKP_OUTPUT_POOL_MB=0 in this environment")


def _pool(budget: int = 1 << 30) -> Pool:
    return Pool(budget, lambda address, nbytes: None)


def test_a_buffer_is_handed_out_again_only_when_nothing_holds_it():
    pool = _pool()
    a = pool.tensor(8 << 20, torch.float32, LARGE)
    alias = a[5:]  # a view keeps the storage, and so the buffer
    address = a.data_ptr()
    del a
    b = pool.tensor(8 << 20, torch.float32, LARGE)
    assert b.data_ptr() != address
    del alias
    c = pool.tensor(8 << 20, torch.float32, LARGE)
    assert c.data_ptr() == address and address % ALIGN == 0
    other = pool.tensor(4 << 20, torch.bfloat16, (1024, 2048))  # another size: never an idle buffer of 8 MB
    assert other.data_ptr() not in (b.data_ptr(), c.data_ptr())


def test_idle_buffers_stay_within_the_budget_and_empty_cache_drops_them():
    pool = _pool(budget=20 << 20)
    held = [pool.tensor(8 << 20, torch.float32, LARGE) for _ in range(5)]
    assert pool.idle_bytes() == 0
    del held
    assert pool.idle_bytes() == 16 << 20  # two of the five: a third would pass 20 MB
    pool.empty_cache()
    assert pool.idle_bytes() == 0


def test_threads_never_share_a_buffer():
    pool = _pool(budget=64 << 20)
    clashes = []

    def work(k):
        for i in range(200):
            t = pool.tensor(4 << 20, torch.float32, (1 << 20,))
            t.fill_(k)
            if not bool((t == k).all()):
                clashes.append((k, i))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clashes == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_ops_on_reused_buffers_are_torchs_bits(dtype):
    """Each op writes every element of its outputs: a reused buffer's leftovers (NaN here) never show."""
    g = torch.Generator().manual_seed(3)
    for step in range(3):
        x = torch.randn(LARGE, generator=g).to(dtype).requires_grad_(True)
        w = torch.randn(LARGE[1], generator=g).to(dtype)
        target = torch.randint(0, LARGE[1], (LARGE[0],), generator=g)
        ours = [ckparity.rms_norm(x, LARGE[1:], w), ckparity.swiglu(x)]
        theirs = [F.rms_norm(x, LARGE[1:], w), F.silu(x[:, :512]) * x[:, 512:]]
        for a, b in zip(ours, theirs):
            large = a.numel() * a.element_size() >= _tensors.HUGE_PAGES_FROM
            assert (a.data_ptr() % ALIGN == 0) == large and torch.equal(a, b)
            (da,), (db,) = torch.autograd.grad(a.float().sum(), x), torch.autograd.grad(b.float().sum(), x)
            assert torch.equal(da, db)
            a.detach().fill_(float("nan"))  # what the next step's buffer holds when it comes back
        loss = ckparity.cross_entropy(x, target, variant="ptref" if dtype == torch.bfloat16 else "default")
        (dx,) = torch.autograd.grad(loss, x)
        (tdx,) = torch.autograd.grad(F.cross_entropy(x, target), x)
        assert torch.equal(dx, tdx) if dtype == torch.bfloat16 else torch.allclose(dx, tdx, atol=1e-9)
        dx.fill_(float("nan"))
    assert _tensors.POOL.idle_bytes() > 0  # they were reused: the step's outputs came back


def _in_process(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)


def test_zero_turns_reuse_off_and_a_bad_value_is_refused_by_name():
    code = ("import torch, ckparity; from ckparity import _tensors as T; t = T.empty((2048, 1024), torch.float32); "
            "t.resize_(4); print(T.POOL is None)")  # a torch.empty output resizes; a reused buffer's cannot
    done = _in_process({"CKP_OUTPUT_POOL_MB": "0"}, code)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr
    done = _in_process({"CKP_OUTPUT_POOL_MB": "lots"}, "import ckparity")
    assert done.returncode != 0 and "CKP_OUTPUT_POOL_MB must be a whole number" in done.stderr
