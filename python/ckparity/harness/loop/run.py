"""ckparity train: the training loop of both twins — build twins, feed the
same batches, step, compare, record — and the report it leaves."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from dataclasses import fields
from pathlib import Path

import torch

import ckparity

from ... import kernels
from ..longrun import checkpoint, directory, schedule
from ..twins import init_from
from ..basics import progress, report
from ..basics.config import RunConfig, UsageError
from ..basics.data import Batches, load_tokens
from .resources import check_memory
from ..longrun.dump import StepDump
from ..basics.interrupts import Interrupted, stop_on_signals
from ..observers.agreement import RankAgreement
from ..observers.drift import DivergenceTracer, DriftSeries, FirstFail, Localizer, NonFinite, StepComparison
from ..observers.envelope import NoiseEnvelope
from ..observers.peers import PeerCriteria
from ..observers.forecast import forecast
from ..observers.protocol import Observer, StepRecord
from ..observers.shadow import Float64Shadow
from ..observers.spikes import SpikeTriage
from ..twins.ranked import SINGLE, RanksDisagree, agreed_signal, join, leave
from ..twins.factory import build_twins

DEFAULT_JSON_OUT = "reports/train_latest.json"


def environment() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import numpy

    return {
        "ckparity": ckparity.__version__, "torch": torch.__version__, "numpy": numpy.__version__,
        "python": platform.python_version(), "ckparity_threads": ckparity.get_num_threads(),
        "torch_threads": torch.get_num_threads(), "cpu": cpu, "cores": os.cpu_count(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "library_cpu_capability": ckparity.cpu.library_capability(), "capability_matched": ckparity.cpu.matched(),
        "mkl_branch": ckparity.cpu.mkl_branch(), "mkl_strict": ckparity.cpu.mkl_strict(),
        "mkl": ckparity.cpu.mkl_version(),
        "onednn_isa": ckparity.cpu.onednn_isa(),
        "compiler_flags": ckparity.build_info(), "library_isa": ckparity._native.isa(),
        "output_pool_mb": ckparity._tensors.POOL.budget >> 20 if ckparity._tensors.POOL else 0,
        "huge_pages": ckparity._tensors._MADVISE is not None, "library": str(ckparity._native.LIBRARY_PATH),
    }


class _Progress:
    """A tqdm bar on a terminal outside CI; nothing otherwise."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled and sys.stderr.isatty() and not os.environ.get("CI"):
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", leave=False)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def prepare(config: RunConfig) -> Batches:
    """Everything that can refuse the run, before any of it runs: the
    report path, the directories it writes (longrun/directory.py), the data,
    flags that could not take effect, memory."""
    report.check_writable(config.json_out or DEFAULT_JSON_OUT, "--json-out")
    if config.checkpoint_every:
        checkpoints = config.checkpoint_dir or checkpoint.DEFAULT_DIR
        resuming = config.resume is not None and Path(checkpoints).resolve() == Path(config.resume).resolve()
        directory.claim_checkpoint_dir(checkpoints, resuming=resuming, overwrite=config.overwrite_checkpoints)
    if config.dump_step:
        directory.check_dump_dir(config.dump_dir or f"reports/dump-step-{config.dump_step}")
    batches = Batches(load_tokens(config), config)
    if config.dump_step > batches.num_steps:
        raise UsageError(f"--dump-step {config.dump_step} is beyond the run's {batches.num_steps} steps")
    if config.localize_step > batches.num_steps:
        raise UsageError(f"--localize-step {config.localize_step} is beyond the run's {batches.num_steps} steps")
    if config.warmup_steps and config.warmup_steps >= batches.total_steps:
        raise UsageError(f"--warmup-steps {config.warmup_steps} leaves none of the run's {batches.total_steps} steps "
                         "after the warmup")
    check_memory(config)
    return batches


def train(config: RunConfig) -> dict:
    """Runs both twins; returns the report (also written to config.json_out,
    by rank 0 of a --tp/--dp run)."""
    directory.new_run()
    resumed = None
    if config.resume:  # the checkpoint's config (its dims already from any --init-from)
        config = checkpoint.resume_config(config)
        resumed = checkpoint.resumed_from(config)
    else:
        config = init_from.configure(config)  # the dims of --init-from's weights, before the data needs the vocab
    batches = prepare(config)
    ranks = join(config)
    try:
        return _train(config, batches, ranks, resumed)
    finally:
        leave(ranks)


def observers_for(config: RunConfig, ck, ref, ranks) -> dict[str, Observer]:
    """The run's observers, by name (a checkpoint stores each under it), in
    the order they see a step: the one list (observers/protocol.py)."""
    first_fail = FirstFail(config)
    observers = {"series": DriftSeries(), "first_fail": first_fail, "nonfinite": NonFinite(),
                 "agreement": RankAgreement(config, ranks), "divergence": DivergenceTracer(config),
                 "localizer": Localizer(config, first_fail)}
    optional = {"shadow": (config.f64_shadow, lambda: Float64Shadow(config, ref)),
                "envelope": (config.envelope, lambda: NoiseEnvelope(config, ref)),
                "spikes": (config.spike_triage, lambda: SpikeTriage(config)),
                "dump": (config.dump_step, lambda: StepDump(config)),
                # the peers' criteria compare whole models: a run split over ranks has none
                "peers": (config.tp * config.dp == 1, PeerCriteria)}
    observers.update({name: make() for name, (wanted, make) in optional.items() if wanted})
    return observers


class _Stepper:
    """One step of both twins, shown to every observer."""

    def __init__(self, config: RunConfig, ck, ref, observers: dict[str, Observer]) -> None:
        self.ck, self.ref, self.observers = ck, ref, list(observers.values())
        self.max_grad_norm = config.max_grad_norm
        self.snapshot = None  # the CK twin's state at a step's start, reused step to step

    def __call__(self, step: int, windows) -> None:
        ck, ref, observers = self.ck, self.ref, self.observers
        if any(o.wants_snapshot(step) for o in observers):
            self.snapshot = ck.snapshot(reuse=self.snapshot)
        progress.note(step=step)
        for o in observers:
            o.before_step(step, windows, ck, ref)
        comparison = StepComparison(step, ck, ref)
        for twin in (ck, ref):
            twin.zero_grad()
        keep = any(o.keeps_activations(step) for o in observers)
        # [Note: the twins take turns going first] the twin that runs first in a step pays for what
        # ran before it (the snapshot's copy, the observers' work: caches, freed memory); with the CK
        # twin always first, a CK twin on torch's own kernels timed 9% slower than the torch twin
        # (repro preset 850). Alternating evens the step times out; the twins share nothing, so the
        # bits do not depend on the order.
        order = (ck, ref) if step % 2 == 0 else (ref, ck)
        outputs = {twin.name: twin.micro_steps(windows, keep) for twin in order}
        for pair in zip(outputs["ck"], outputs["torch"]):
            comparison.micro_step(*pair)
        comparison.backward_done()
        for o in observers:
            o.before_update(step, outputs, ck, ref, comparison.identical)
        del outputs  # the kept activations
        for twin in order:
            if twin is ck:
                progress.note(stage="update", kernel=kernels.FLAGS["ck_optimizer_backend"])
            twin.update(self.max_grad_norm)
        record = StepRecord(step, windows, ck, ref, comparison.finish(), comparison.losses, comparison.identical,
                            comparison.finite, self.snapshot)
        for o in observers:
            o.after_step(record)


class _Checkpoints:
    """--checkpoint-every: after every Nth step, and after the step a signal arrives in (every rank alike)."""

    def __init__(self, config: RunConfig, components: dict, ranks) -> None:
        self.config, self.components, self.ranks = config, components, ranks
        self.written = {"checkpoints": 0, "checkpoint_s": 0.0, "checkpoint_bytes": None}

    def after_step(self, step: int, stop) -> None:
        if not self.config.checkpoint_every:
            return
        stop.signum = agreed_signal(self.ranks, stop.signum)  # every rank stops after the same step
        if step % self.config.checkpoint_every == 0 or stop.signum is not None:
            start = time.perf_counter()
            path = checkpoint.save(self.config.checkpoint_dir or checkpoint.DEFAULT_DIR, step, self.config,
                                   self.components, self.ranks)
            self.written.update(checkpoints=self.written["checkpoints"] + 1,
                                checkpoint_s=self.written["checkpoint_s"] + time.perf_counter() - start,
                                checkpoint_bytes=sum(f.stat().st_size for f in path.iterdir()))


def _train(config: RunConfig, batches: Batches, ranks, resumed: dict | None) -> dict:
    if config.threads:
        ckparity.set_num_threads(config.threads)
    if config.torch_threads or config.threads:
        torch.set_num_threads(config.torch_threads or config.threads)
    ck, ref = build_twins(config)
    observers = observers_for(config, ck, ref, ranks)
    for twin in (ck, ref, *(t for o in observers.values() for t in o.twins())):
        schedule.attach(twin, config, batches.total_steps)
    components = {"ck": ck, "torch": ref, **observers}
    done = checkpoint.restore(config.resume, components, ranks) if config.resume else 0
    stepper, checkpoints = _Stepper(config, ck, ref, observers), _Checkpoints(config, components, ranks)
    progress = _Progress(batches.num_steps, not config.no_progress and ranks.is_writer)
    status, error, stopped_by = "pass", None, None
    started = time.perf_counter()
    with stop_on_signals() as stop:
        if config.checkpoint_every:
            stop.hold()  # a signal is acted on at the end of its step, after that step's checkpoint
        try:
            for step, windows in batches.after(done):
                stepper(step, windows)
                progress.update()
                checkpoints.after_step(step, stop)
                if stop.signum is not None:
                    raise Interrupted(stop.signum)
        except RanksDisagree:  # the report says so (ranks.first_rank_mismatch_step) and fails the run
            pass
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM/SIGHUP through stop_on_signals
            status, stopped_by = "interrupted", err.signum if isinstance(err, Interrupted) else 2
        except Exception as err:  # the report still says what was measured before it
            status, error = "error", f"{type(err).__name__}: {err}"
        finally:
            stop.hold()
            progress.close()
        result = _report(config, batches, observers, (ck, ref), status, error, time.perf_counter() - started)
        result["resume"] = resumed  # where it went on from, and what the resume changed
        result["stopped_by_signal"] = stopped_by
        result["timing"].update(checkpoints.written)  # what the checkpoints cost (timings: not compared on resume)
        _write(config, result, ranks, stop)
    return result


def _write(config: RunConfig, result: dict, ranks, stop) -> None:
    """The report, by the writer rank; again if a signal came while it was written."""
    _mark_late_signal(result, stop)
    if ranks.is_writer:
        report.write_json(config.json_out or DEFAULT_JSON_OUT, result)
        if _mark_late_signal(result, stop):  # it came while the report was being written
            report.write_json(config.json_out or DEFAULT_JSON_OUT, result)


def _mark_late_signal(result: dict, stop) -> bool:
    """A signal that came after the loop (while the report was made) still
    stops the run: status interrupted, its exit code, and a gate does not go
    on. True if this changed the result."""
    if stop.signum is None or result["status"] == "interrupted":
        return False
    result.update(status="interrupted", pass_parity=False, stopped_by_signal=stop.signum)
    return True


def lost_report(config: RunConfig, error: str) -> dict:
    """The report of a run whose measurements were lost with the process
    that held them (a --tp/--dp rank 0 that died): status "error", no steps."""
    batches = Batches(load_tokens(config), config)
    first_fail = FirstFail(config)
    observers = {"series": DriftSeries(), "first_fail": first_fail, "nonfinite": NonFinite(),
                 "agreement": RankAgreement(config, SINGLE), "localizer": Localizer(config, first_fail)}
    result = _report(config, batches, observers, None, "error", error, None)
    result.update(stopped_by_signal=None, divergence=None, forecast=None, forecast_param_fail_step=None, resume=None)
    result["env"]["world_size"] = config.tp * config.dp
    return result


# report keys of observers a run may not have: null unless one reports them
OPTIONAL_KEYS = ("divergence", "shadow", "envelope", "noise_verdict", "spikes", "dump", "peers")


def _report(config, batches, observers: dict[str, Observer], twins, status, error, wall) -> dict:
    series, first_fail, nonfinite = observers["series"], observers["first_fail"], observers["nonfinite"]
    # an interrupted or broken run proves nothing about the steps it did not reach
    pass_parity = (status == "pass" and not first_fail.parity_failed and not nonfinite.one_sided
                   and len(series) == batches.num_steps)
    if status == "pass" and not pass_parity:
        status = "fail"
    columns = series.columns
    result = {
        "schema": report.SCHEMA,
        "status": status,
        "pass_parity": pass_parity,
        "error": error,
        "config": config.to_dict(),
        "env": environment(),
        "steps": len(series),
        "planned_steps": batches.num_steps,
        "micro_steps": sum(len(batches.step(s)) for s in range(len(series))),
        **first_fail.steps,
        "first_nonfinite_step": nonfinite.first_step,
        "one_sided_nonfinite": nonfinite.one_sided,
        "max_loss_abs_diff": series.largest("loss_abs_diff"),
        "max_param_abs_diff": series.largest("param_abs_diff"),
        "max_grad_abs_diff": series.largest("grad_abs_diff"),
        "max_logit_abs_diff": series.largest("logit_abs_diff"),
        "max_moment_abs_diff": series.largest("moment_abs_diff"),
        # the same maxima in ULPs of each quantity's dtype (loop/diff.py), and the tolerances in effect:
        # the flags' float32 values scaled to the compute dtype (RunConfig.tolerance)
        "max_ulp_diff": {q: series.largest(f"{q}_ulp_diff") for q in ("loss", "logit", "grad", "param", "moment")},
        "tolerances": {"compute_dtype": config.compute_dtype,
                       **{f.name: config.tolerance(f.name) for f in fields(config) if f.name.endswith("_tol")}},
        "final_ck_loss": columns["ck_loss"][-1] if len(series) else None,
        "final_torch_loss": columns["torch_loss"][-1] if len(series) else None,
        "series": columns,
        "localization": observers["localizer"].result,
        "timing": {
            "wall_s": wall,
            "ck_total_s": twins[0].seconds if twins else None, "torch_total_s": twins[1].seconds if twins else None,
            "ck_step_ms_median": statistics.median(columns["ck_step_ms"]) if len(series) else None,
            "torch_step_ms_median": statistics.median(columns["torch_step_ms"]) if len(series) else None,
        },
    }
    result.update({key: None for key in OPTIONAL_KEYS})
    for observer in observers.values():
        observer.report_into(result)
    # a drift beyond the noise envelope (by size, or an error that leans one way) fails the run
    # though no tolerance was crossed: a bias below one ULP never crosses one (docs/envelope.md)
    result["failed_by_envelope"] = result["noise_verdict"] == "beyond_noise" and result["status"] in ("pass", "fail")
    if result["failed_by_envelope"] and result["status"] == "pass":
        result.update(status="fail", pass_parity=False)
    # --expect-bitwise: any bit of difference fails, at the step the divergence tracer saw it first
    result["failed_by_bitwise"] = (config.expect_bitwise and observers["divergence"].first_step is not None
                                   and result["status"] in ("pass", "fail"))
    if result["failed_by_bitwise"] and result["status"] == "pass":
        result.update(status="fail", pass_parity=False)
    if "divergence" in observers:  # the forecast's start: the first step whose bits differ
        result["forecast"] = forecast(columns["step"], columns["param_abs_diff"], config.tolerance("param_tol"), batches.num_steps,
                                      observers["divergence"].first_step)
        result["forecast_param_fail_step"] = result["forecast"]["param_fail_step"]
    return result
