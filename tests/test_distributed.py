"""ckparity.distributed.vocab_parallel_cross_entropy on gloo, world sizes 1,
2 and 3 (uneven shards of V = 37): the loss and the gathered dlogits against
single-process F.cross_entropy and ckparity.cross_entropy on the full
logits, with ignored rows, all rows ignored, label smoothing and z-loss;
the same bits run after run; how far apart the world sizes land."""

from __future__ import annotations

import socket
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import ckparity
from ckparity.distributed import shard_range, vocab_parallel_cross_entropy
from parity import MEASUREMENTS, max_ulp

N, V = 11, 37
CASES = {
    "mean": dict(reduction="mean"),
    "ignored rows": dict(reduction="mean", ignored=[0, 4, 5]),
    "all ignored": dict(reduction="mean", ignored=list(range(N))),
    "label smoothing, sum": dict(reduction="sum", label_smoothing=0.1),
    "z-loss, none": dict(reduction="none", z_loss=1e-3),
}


def inputs(case: dict):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, V, generator=g) * 3
    target = torch.randint(0, V, (N,), generator=g)
    target[case.get("ignored", [])] = -100
    upstream = torch.rand(N, generator=g) + 0.5 if case["reduction"] == "none" else torch.tensor(1.7)
    return logits, target, upstream


def options(case: dict) -> dict:
    return {k: v for k, v in case.items() if k in ("reduction", "label_smoothing", "z_loss")}


def _worker(rank: int, world_size: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    start, end = shard_range(V, rank, world_size)
    results = {}
    for name, case in CASES.items():
        logits, target, upstream = inputs(case)
        runs = []
        for _ in range(2):  # run after run
            shard = logits[:, start:end].clone().requires_grad_(True)
            loss = vocab_parallel_cross_entropy(shard, target, vocab_start=start, vocab_size=V, **options(case))
            loss.backward(upstream)
            runs.append((loss.detach(), shard.grad))
        results[name] = runs
        shard = logits[:, start:end].bfloat16().requires_grad_(True)  # bf16: widened, rounded where stored
        loss = vocab_parallel_cross_entropy(shard, target, vocab_start=start, vocab_size=V, **options(case))
        loss.backward(upstream.bfloat16())
        results[f"{name}, bf16"] = [(loss.detach(), shard.grad)]
    results["loss_parallel"] = _torch_loss_parallel(world_size)
    torch.save(results, f"{out}.rank{rank}")  # shards differ in width: gloo's all_gather takes equal sizes only
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


def _torch_loss_parallel(world_size: int):
    """torch's own vocab-parallel loss on the "mean" case: the logits a DTensor sharded by vocabulary (torch's
    shards, as even as DTensor makes them), the target replicated."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (world_size,))
    logits, target, upstream = inputs(CASES["mean"])
    dt = distribute_tensor(logits.clone(), mesh, [Shard(1)]).requires_grad_(True)
    with loss_parallel():
        loss = F.cross_entropy(dt, distribute_tensor(target, mesh, [Replicate()]))
        loss.backward(distribute_tensor(upstream, mesh, [Replicate()]))
    return loss.full_tensor().detach(), dt.grad.full_tensor()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world_size: int, out: str, attempts: int = 3) -> None:
    """The ranks on a fresh port; again when a rank dies by a signal. One CI run saw rank 0 abort inside torch's
    gloo ("terminate called without an active exception", SIGABRT) at world size 2 or 3; 40 launches here under
    load never did: a crash in torch's C++, not a wrong result. A rank that raises a Python error is not
    retried, and a crash on every attempt still fails."""
    for attempt in range(attempts):
        try:
            mp.start_processes(_worker, args=(world_size, free_port(), out), nprocs=world_size, start_method="spawn")
            return
        except mp.ProcessExitedException as e:
            if e.signal_name is None or attempt == attempts - 1:
                raise
            warnings.warn(f"world size {world_size}: {e}; launching again ({attempt + 2} of {attempts})")


@pytest.fixture(scope="module")
def by_world_size(tmp_path_factory):
    results = {}
    for world_size in (1, 2, 3):
        out = str(tmp_path_factory.mktemp("dist") / f"ws{world_size}.pt")
        launch(world_size, out)
        ranks = [torch.load(f"{out}.rank{r}") for r in range(world_size)]
        # every rank holds the whole loss; the gradient is the ranks' shards side by side
        results[world_size] = {name: [(ranks[0][name][k][0], torch.cat([r[name][k][1] for r in ranks], dim=1))
                                      for k in range(len(ranks[0][name]))] for name in ranks[0]
                                if name != "loss_parallel"}
        results[world_size]["loss_parallel"] = ranks[0]["loss_parallel"]
        assert all(torch.equal(r[name][0][0], ranks[0][name][0][0]) for r in ranks for name in CASES
                   if not ranks[0][name][0][0].isnan().any())
    return results


def reference(fn, case, logits=None, upstream=None):
    """fn's loss and gradient on the case's inputs (or the given logits and upstream, in their dtype)."""
    given_logits, target, given_upstream = inputs(case)
    logits = given_logits if logits is None else logits
    upstream = (given_upstream if upstream is None else upstream).to(logits.dtype)
    x = logits.clone().requires_grad_(True)
    loss = fn(x, target, **options(case))
    loss.backward(upstream)
    return loss.detach(), x.grad


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_single_process(by_world_size, world_size, name):
    case = CASES[name]
    (loss, dlogits), again = by_world_size[world_size][name]
    assert torch.equal(loss, again[0]) or (loss.isnan().all() and again[0].isnan().all()), "loss moved run to run"
    assert torch.equal(dlogits, again[1]), "dlogits moved run to run"
    for fn in (F.cross_entropy, ckparity.cross_entropy):
        if fn is F.cross_entropy and case.get("z_loss"):
            continue  # z-loss is ckparity's extension
        ref_loss, ref_grad = reference(fn, case)
        torch.testing.assert_close(loss, ref_loss, equal_nan=True, rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(dlogits, ref_grad, rtol=2e-6, atol=1e-7)
    if name == "all ignored":
        assert loss.isnan() and not dlogits.any()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_matches_torch_loss_parallel(by_world_size, world_size):
    loss, dlogits = by_world_size[world_size]["mean"][0]
    theirs_loss, theirs_grad = by_world_size[world_size]["loss_parallel"]
    torch.testing.assert_close(loss, theirs_loss, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(dlogits, theirs_grad, rtol=2e-6, atol=1e-7)
    MEASUREMENTS.append({"name": f"vocab_parallel_ce[mean, world {world_size}] vs loss_parallel",
                         "loss_ulp": max_ulp(loss, theirs_loss), "grad_ulp": max_ulp(dlogits, theirs_grad)})


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("name", list(CASES))
def test_bf16_is_the_single_process_default_rounded(by_world_size, world_size, name):
    """bf16 shards: float math on the widened values, the loss and dlogits rounded once. So within one bf16 ULP
    of ckparity.cross_entropy on the whole bf16 logits (the float32 results differ by the all-reduce's order,
    which can move a rounding), bf16 in and out, and no farther from float64 than torch's bf16 eager."""
    case = CASES[name]
    ((loss, dlogits),) = by_world_size[world_size][f"{name}, bf16"]
    assert loss.dtype == dlogits.dtype == torch.bfloat16
    logits, target, upstream = inputs(case)
    logits, upstream = logits.bfloat16(), upstream.bfloat16()
    ours, ref = reference(ckparity.cross_entropy, case, logits, upstream)
    assert max_ulp(loss, ours) <= 1 and max_ulp(dlogits, ref) <= 1
    if case.get("z_loss"):
        return  # z-loss is ckparity's extension: torch has no bf16 result to hold it to
    exact = reference(F.cross_entropy, case, logits.double(), upstream.double())
    theirs = reference(F.cross_entropy, case, logits, upstream)
    for a, c, e in zip((loss, dlogits), theirs, exact):
        if e.isnan().all():
            assert a.isnan().all()
            continue
        assert (a.double() - e).abs().mean() <= (c.double() - e).abs().mean()
    MEASUREMENTS.append({"name": f"vocab_parallel_ce[{name}, bf16, world {world_size}] vs ckparity bf16",
                         "loss_ulp": max_ulp(loss, ours), "grad_ulp": max_ulp(dlogits, ref)})


def test_world_sizes_land_close(by_world_size):
    """The all-reduce order is the only thing the world size changes: measured in ULPs between world sizes, and
    each world size's error against a float64 evaluation."""
    for name, case in CASES.items():
        logits, target, upstream = inputs(case)
        x = logits.double().requires_grad_(True)
        exact = F.cross_entropy(x, target, **{k: v for k, v in options(case).items() if k != "z_loss"})
        if case.get("z_loss"):
            lse = torch.logsumexp(x, 1)
            exact = exact + case["z_loss"] * lse ** 2 * (target != -100)
        exact.backward(upstream.double())
        base_loss, base_grad = by_world_size[1][name][0]
        for ws in (2, 3):
            loss, grad = by_world_size[ws][name][0]
            figures = {"name": f"vocab_parallel_ce[{name}, world {ws} vs 1]", "loss_ulp": max_ulp(loss, base_loss),
                       "grad_ulp": max_ulp(grad, base_grad),
                       "grad_error64": float((grad.double() - x.grad).abs().max()),
                       "grad_error64_world1": float((base_grad.double() - x.grad).abs().max())}
            MEASUREMENTS.append(figures)
            assert figures["loss_ulp"] <= 1 and figures["grad_ulp"] <= 1, figures


def test_an_ignored_rows_gradient_is_nan_where_its_row_is_not_finite():
    """The shard backward of an ignored row is torch's 0 - exp(logp) * 0: +0 when the row's global max and
    exp-sum are finite, NaN on every element when either is not (a NaN or an inf in some shard, a row of
    -inf: what single-process ckparity.cross_entropy and torch give). The sum is checked as well as the max:
    an all-reduce MAX may drop a shard's NaN, the SUM cannot."""
    from ckparity import _bindings

    logits = torch.randn(4, 5)
    target = torch.full((4,), -100)
    inf, nan = float("inf"), float("nan")
    global_max = torch.tensor([1.0, inf, nan, 2.0])
    global_sums = torch.tensor([[3.0, 0, 0], [nan, 0, 0], [nan, 0, 0], [nan, 0, 0]], dtype=torch.float64)
    dlogits = torch.full_like(logits, 7.0)
    _bindings.vocab_parallel_ce_backward(logits, target, 0, 5, -100, 0.0, 0.0, global_max, global_sums,
                                         torch.ones(4), dlogits)
    assert torch.equal(dlogits[0], torch.zeros(5)) and not dlogits[0].signbit().any()
    assert dlogits[1:].isnan().all()
