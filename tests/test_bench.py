"""ckparity bench writes its JSON (no test asserts a time)."""

import json

import pytest
import torch
import torch.nn.functional as F

import ckparity
from ckparity import _bindings, bench, reference
from ckparity.cli import main
from ckparity.kernels import benching
from ckparity.kernels import cross_entropy as ce_record


def test_bench_json_has_every_field(tmp_path, monkeypatch, capsys):
    x = torch.randn(8, 256).requires_grad_(True)
    t = torch.randint(0, 256, (8,))

    def one_case(select=None, dtype="float32"):
        yield benching.Case("cross_entropy", "N=8,V=256", benching.fwd_bwd(ckparity.cross_entropy, x, t),
                            benching.fwd_bwd(F.cross_entropy, x, t), 8 * 8 * 256, ce_record.c_calls(x.detach(), t))

    monkeypatch.setattr(bench, "cases", one_case)
    out = tmp_path / "bench.json"
    assert main(["bench", "--json-out", str(out), "--repeats", "2", "--no-compile", "--no-distributed", "--no-memory"]) == 0
    data = json.loads(out.read_text())
    assert data["copy_gbps"] > 0 and data["threads"] == ckparity.get_num_threads()
    assert 0 < data["autograd_floor_us"] < float("inf")  # an empty Function's fwd+bwd takes some time
    assert data["capability"]["torch"] == torch.backends.cpu.get_cpu_capability()  # which kernels torch ran
    (row,) = data["results"]
    for key in ("kernel", "shape", "ckparity_ms", "torch_ms", "speedup", "bandwidth_fraction", "kernel_ms",
                "kernel_bandwidth_fraction", "overhead_us_per_call", "ckparity_mean_ms", "torch_mean_ms"):
        assert key in row
    assert row["speedup"] == row["torch_ms"] / row["ckparity_ms"]
    assert row["speedup_of_means"] == row["torch_mean_ms"] / row["ckparity_mean_ms"]
    assert row["speedup_vs_compile_of_means"] is None
    assert row["overhead_us_per_call"] == 1e3 * (row["ckparity_ms"] - row["kernel_ms"])
    assert row["torch_compile_ms"] is None and row["compile_error"] == "--no-compile"
    assert "| cross_entropy | N=8,V=256 |" in capsys.readouterr().out
    assert main(["bench", "--repeats", "0"]) == 2



def test_a_failing_kernel_closure_is_an_error(monkeypatch):
    """A direct C call that fails must stop the bench, not time an error path."""
    x = torch.randn(8, 256).requires_grad_(True)
    t = torch.randint(0, 256, (8,))
    t[0] = 999  # out of range: the kernel returns a status, the bench raises

    def bad_case(select=None, dtype="float32"):
        yield benching.Case("cross_entropy", "bad", lambda: None, lambda: None, 1, ce_record.c_calls(x.detach(), t))

    monkeypatch.setattr(bench, "cases", bad_case)
    with pytest.raises(IndexError, match="out of bounds"):
        bench.bench(1)


def test_torch_compile_column(monkeypatch):
    """The compiled counterpart is timed beside eager, or its row says why not."""
    x = torch.randn(8, 64).requires_grad_(True)

    ours, theirs = benching.fwd_bwd(ckparity.swiglu, x), benching.fwd_bwd(reference.swiglu, x)

    def one_case(select=None, dtype="float32"):
        yield benching.Case("swiglu", "N=8,H=32", ours, theirs, 1,
                            compiled=benching.compiled_fwd_bwd(reference.swiglu, x))
        yield benching.Case("swiglu", "broken", ours, theirs, 1, compiled=lambda: 1 / 0)

    monkeypatch.setattr(bench, "cases", one_case)
    ok, broken = bench.bench(1, distributed=False, memory=False)["results"]
    assert ok["torch_compile_ms"] > 0 and ok["speedup_vs_compile"] == ok["torch_compile_ms"] / ok["ckparity_ms"]
    assert broken["torch_compile_ms"] is None and broken["compile_error"].startswith("ZeroDivisionError")


def test_vocab_parallel_row_runs_two_ranks_against_loss_parallel():
    from ckparity import bench_ranks

    row = bench_ranks.vocab_parallel_row(2, N=64, V=1000)
    assert row["shape"].startswith("N=64,V=1000,world=2")
    assert row["ckparity_ms"] > 0 and row["torch_ms"] > 0 and row["speedup"] == row["torch_ms"] / row["ckparity_ms"]
    assert row["same_loss_bits"] is True  # both sides' losses are F.cross_entropy's within 0 ULP (see test_distributed)


def test_peak_memory_is_measured_in_a_fresh_process_per_side():
    """The in-place cross-entropy allocates no (N, V) buffer that torch's path does: its peak is lower
    by at least one (N, V) float32 buffer (262 MB), which only a per-side measurement can show."""
    from ckparity.bench import peak_memory as measure

    shape = "N=2048,V=32000,inplace_backward"
    ours, theirs = measure("cross_entropy", shape, "ckparity"), measure("cross_entropy", shape, "torch")
    assert ours["peak_since"] == theirs["peak_since"] == "call"
    assert ours["peak_mb"] >= ours["inputs_mb"] > 250  # the source logits are resident before the call
    assert theirs["peak_mb"] - ours["peak_mb"] > 250


def test_the_bf16_rows_are_bf16_and_apart_from_the_float32_ones():
    """bench --dtype bfloat16 builds the bf16 rows alone (their tensors bf16), the default none of them."""
    f32 = {(c.kernel, c.shape) for c in bench.cases(select=lambda k, s: k == "swiglu")}
    assert f32 == {("swiglu", "N=2048,H=8192"), ("swiglu", "N=8,H=128")}
    bf16 = list(bench.cases(select=lambda k, s: k in ("swiglu", "rope"), dtype="bfloat16"))
    assert {c.kernel for c in bf16} == {"swiglu", "rope"} and all(c.shape.endswith(" bf16") for c in bf16)


def test_a_fast_call_is_timed_as_a_run_of_calls_and_a_slow_one_alone():
    """Each sample lasts about SAMPLE_MS: a microsecond call runs many times a sample (one lone call measures
    the caches the previous side left), a call longer than that once; the result is per call either way."""
    import time

    from ckparity.bench import SAMPLE_MS, interleaved_median_ms

    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(2 * SAMPLE_MS / 1e3)

    fast_ms, slow_ms = interleaved_median_ms([fast, slow], repeats=3)
    assert calls["slow"] == 2 + 3  # warm-up, the call that sizes the run, then one per sample
    assert calls["fast"] > 2 + 3 * 10
    assert slow_ms >= 2 * SAMPLE_MS and fast_ms < SAMPLE_MS / 10


def test_a_call_slow_now_and_then_shows_in_the_mean_and_not_in_the_median(monkeypatch):
    """A call that is slow one time in three (a fresh output's pages faulted on the host, say) keeps its
    median and not its mean: the row's means, and the table's column of them, show what a run pays.
    On a clock the calls move (sleeps were late by milliseconds when another test file shared the
    cores: a median of 2 ms calls read 0.35x)."""
    import types

    calls, clock = {"n": 0}, {"s": 0.0}

    def perf_counter():  # a millisecond a read: the bench's other timings (the autograd floor) take 1 call a sample
        clock["s"] += 0.001
        return clock["s"]

    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=perf_counter))

    def sometimes_slow():
        calls["n"] += 1
        clock["s"] += 0.02 if calls["n"] % 3 == 0 else 0.002

    def steady():
        clock["s"] += 0.002

    def one_case(select=None, dtype="float32"):
        yield benching.Case("cross_entropy", "N=8,V=256", sometimes_slow, steady, 1)

    monkeypatch.setattr(bench, "cases", one_case)
    data = bench.bench(6, compile=False, distributed=False, memory=False)
    (row,) = data["results"]
    assert row["speedup"] > 0.7 and row["speedup_of_means"] < 0.5
    assert f"| {row['speedup_of_means']:.2f}x / - |" in bench.table(data)


def test_torch_compile_gets_a_cache_per_capability_unless_the_user_chose_one(monkeypatch, tmp_path):
    """inductor's cache is not keyed by the ATen capability (a bf16 bench at avx2 after one at avx512 died in
    the cached kernels): the bench gives each capability its own directory, and keeps a user's."""
    import torch

    from ckparity.bench import inductor_cache_per_capability

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    chosen = inductor_cache_per_capability()
    assert chosen.endswith("capability_" + torch.backends.cpu.get_cpu_capability().lower())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    assert inductor_cache_per_capability() == str(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_c_column_of_a_ptref_row_runs_ptref(monkeypatch, dtype):
    """A row's C column times the variant its op runs (it timed the default variant's kernel under a
    float32 ptref row's name until the row existed)."""
    seen = []
    for name in ("cross_entropy", "cross_entropy_bf16", "cross_entropy_default_bf16"):
        real = getattr(_bindings, name)
        monkeypatch.setattr(_bindings, name, lambda *a, real=real, **k: seen.append(a[2].variant) or real(*a, **k))
    x, t = torch.randn(4, 40).to(dtype), torch.randint(0, 40, (4,))
    ce_record.c_calls(x, t, variant="ptref")()
    ce_record.c_calls(x, t)()
    assert seen == [_bindings.CE_VARIANTS["ptref"], _bindings.CE_VARIANTS["default"]]


def test_kernel_runs_only_that_kernels_rows(tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--kernel", "rope", "--dtype", "bfloat16", "--json-out", str(out), "--repeats", "1",
                 "--no-compile", "--no-distributed", "--no-memory"]) == 0
    rows = json.loads(out.read_text())["results"]
    assert {row["kernel"] for row in rows} == {"rope"}
    assert [row["shape"] for row in rows] == [s for k, s in bench.selected("bfloat16", ["rope"])]
    assert len(rows) == 2  # the tiny row and the large one


def test_a_kernel_choice_with_no_rows_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "bench", lambda *a, **k: pytest.fail("bench ran"))
    out = tmp_path / "bench.json"
    # the vocab-parallel row is float32's and needs its ranks; the fused row needs the memory columns
    for argv in (["--kernel", "vocab_parallel_cross_entropy", "--dtype", "bfloat16"],
                 ["--kernel", "vocab_parallel_cross_entropy", "--no-distributed"],
                 ["--kernel", "fused_linear_cross_entropy", "--no-memory"]):
        assert main(["bench", "--json-out", str(out), *argv]) == 2
        assert "runs with these options" in capsys.readouterr().err
    assert not out.exists()
    assert main(["bench", "--kernel", "rmsnorm"]) == 2
    assert "invalid choice: 'rmsnorm'" in capsys.readouterr().err
    assert "vocab_parallel_cross_entropy" in bench.row_kernels() and "adamw" in bench.row_kernels()
