"""The bench's distributed row: ckparity.distributed.vocab_parallel_cross_entropy
against torch's loss_parallel (F.cross_entropy on a DTensor sharded by
vocabulary), forward+backward, at world size 2 on this machine (gloo, one
process per rank, one thread each so the ranks do not fight for the cores).

Each rank times both sides in turn, repeat by repeat, and a barrier starts
every timing so the ranks run a call together; rank 0's medians are the row.
torch shards as DTensor makes them; ckparity's shards are shard_range's,
identical here (V divides evenly)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from .harness.ranks.launch import free_port

N, V, WORLD = 2048, 32000, 2


def _rank(rank: int, port: int, repeats: int, out: str, N: int, V: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    import ckparity
    from ckparity.distributed import shard_range, vocab_parallel_cross_entropy

    torch.set_num_threads(1)
    ckparity.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    g = torch.Generator().manual_seed(0)
    logits, target = torch.randn(N, V, generator=g), torch.randint(0, V, (N,), generator=g)
    start, end = shard_range(V, rank, WORLD)
    shard = logits[:, start:end].clone().requires_grad_(True)
    mesh = init_device_mesh("cpu", (WORLD,))
    dlogits = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_(True)
    dtarget = distribute_tensor(target, mesh, [Replicate()])

    def ours():
        shard.grad = None
        loss = vocab_parallel_cross_entropy(shard, target, vocab_start=start, vocab_size=V)
        loss.backward()
        return loss

    def theirs():
        dlogits.grad = None
        with loss_parallel():
            loss = F.cross_entropy(dlogits, dtarget)
            loss.backward()
        return loss

    same_loss = bool(torch.equal(ours().detach(), theirs().full_tensor().detach()))
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("theirs", theirs)):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - t0))
    if rank == 0:
        torch.save({"ours": statistics.median(times["ours"]), "theirs": statistics.median(times["theirs"]),
                    "same_loss": same_loss}, out)
    dist.barrier()  # no rank tears gloo down while another still talks to it (an abort otherwise, now and then)
    dist.destroy_process_group()


def shape(N: int = N, V: int = V) -> str:
    """The row's shape, as the table names it."""
    return f"N={N},V={V},world={WORLD} (1 thread/rank)"


def vocab_parallel_row(repeats: int, N: int = N, V: int = V) -> dict:
    """The bench row (the schema of bench.bench's rows, with what applies)."""
    with tempfile.TemporaryDirectory(prefix="ckparity-bench-ranks-") as scratch:
        out = str(Path(scratch) / "rank0.pt")
        try:
            mp.start_processes(_rank, args=(free_port(), repeats, out, N, V), nprocs=WORLD, start_method="spawn")
        except mp.ProcessExitedException:
            # gloo's teardown still aborts a rank now and then ("terminate called without an active
            # exception", after the final barrier): once rank 0 has written the row, the measurement is whole
            if not Path(out).is_file():
                raise
        measured = torch.load(out)
    return {"kernel": "vocab_parallel_cross_entropy", "shape": shape(N, V),
            "ckparity_ms": measured["ours"], "torch_ms": measured["theirs"],
            "speedup": measured["theirs"] / measured["ours"], "torch_compile_ms": None, "speedup_vs_compile": None,
            "compile_error": "torch's counterpart is loss_parallel on DTensor (not compiled)",
            # the bytes one rank must move (its shard: read logits, write dlogits, twice over)
            "ckparity_gbps": 8 * N * (V // WORLD) / (measured["ours"] * 1e6), "same_loss_bits": measured["same_loss"]}
