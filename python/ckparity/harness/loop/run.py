"""ckparity train: the training loop of both twins — build twins, feed the
same batches, step, compare, record — and the report it leaves."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time

import torch

import ckparity

from ..longrun import checkpoint, init_from, schedule
from . import report
from .config import RunConfig, UsageError
from .data import Batches, load_tokens
from ..longrun.interrupts import Interrupted, stop_on_signals
from ..ranks.group import SINGLE, RankAgreement, RanksDisagree, agreed_signal, join, leave
from ..longrun.dump import StepDump
from ..observers.envelope import NoiseEnvelope
from ..observers.forecast import forecast
from ..observers.drift import DivergenceTracer, DriftSeries, FirstFail, Localizer, NonFinite, StepComparison
from .resources import check_memory
from ..observers.shadow import Float64Shadow
from ..observers.spikes import SpikeTriage
from ..twins.build import build_twins

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
        "compiler_flags": ckparity.build_info(), "library": str(ckparity._native.LIBRARY_PATH),
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
    report path, the data, flags that could not take effect, memory."""
    report.check_writable(config.json_out or DEFAULT_JSON_OUT, "--json-out")
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
    if config.resume:  # the checkpoint's config (its dims already from any --init-from)
        config = checkpoint.resume_config(config)
    else:
        config = init_from.configure(config)  # the dims of --init-from's weights, before the data needs the vocab
    batches = prepare(config)
    ranks = join(config)
    try:
        return _train(config, batches, ranks)
    finally:
        leave(ranks)


def _train(config: RunConfig, batches: Batches, ranks) -> dict:
    if config.threads:
        ckparity.set_num_threads(config.threads)
        torch.set_num_threads(config.threads)
    ck, ref = build_twins(config)
    twins = (ck, ref)
    series, first_fail, nonfinite = DriftSeries(), FirstFail(config), NonFinite()
    localizer, divergence = Localizer(config), DivergenceTracer(config)
    agreement = RankAgreement(ranks)
    shadow = Float64Shadow(config, ref) if config.f64_shadow else None
    envelope = NoiseEnvelope(config, ref) if config.envelope else None
    spikes = SpikeTriage(config) if config.spike_triage else None
    for twin in (ck, ref, *([shadow.twin] if shadow else []), *(m for m, _ in (envelope.members if envelope else []))):
        schedule.attach(twin, config, batches.total_steps)
    components = {"ck": ck, "torch": ref, "series": series, "first_fail": first_fail, "nonfinite": nonfinite,
                  "localizer": localizer, "divergence": divergence, "agreement": agreement, "shadow": shadow,
                  "envelope": envelope, "spikes": spikes}
    done = checkpoint.restore(config.resume, components, ranks) if config.resume else 0
    written = {"checkpoints": 0, "checkpoint_s": 0.0, "checkpoint_bytes": None}
    dumped = None
    progress = _Progress(batches.num_steps, not config.no_progress and ranks.is_writer)
    status, error, stopped_by = "pass", None, None
    started, snapshot = time.perf_counter(), None
    with stop_on_signals() as stop:
        if config.checkpoint_every:
            stop.hold()  # a signal is acted on at the end of its step, after that step's checkpoint
        try:
            for step, windows in batches.after(done):
                # the CK twin's state at the start of the step, while a replay may need it
                if localizer.wants_snapshot(step) or divergence.wants_snapshot:
                    snapshot = ck.snapshot(reuse=snapshot)
                if spikes is not None:
                    spikes.before_step(ref)
                comparison = StepComparison(step, ck, ref)
                for twin in twins:
                    twin.zero_grad()
                dump = StepDump(config, step, ck, ref, windows) if step == config.dump_step else None
                keep = divergence.keeps_activations or dump is not None
                outputs = {twin.name: twin.micro_steps(windows, keep) for twin in twins}
                for pair in zip(outputs["ck"], outputs["torch"]):
                    comparison.micro_step(*pair)
                comparison.backward_done()
                if dump is not None:
                    dump.record(outputs, ck, ref)
                    dumped = str(dump.write(config.dump_dir or f"reports/dump-step-{step}"))
                divergence.before_update(outputs, ck, ref, comparison.identical)
                del outputs  # the kept activations
                for twin in twins:
                    twin.update(config.max_grad_norm)
                row = comparison.finish()
                series.append(row)
                failed_now = first_fail.observe(row)
                nonfinite.observe(step, comparison.finite)
                agreement.after_step(step, ck)
                divergence.after_step(step, snapshot, windows, comparison.identical, ck, ref)
                localizer.after_step(step, snapshot, windows, failed_now)
                if shadow is not None:
                    shadow.after_step(step, windows, ck, ref, comparison.losses)
                if envelope is not None:
                    envelope.after_step(step, windows, ref, row, comparison.losses["torch"])
                if spikes is not None:
                    spikes.after_step(step, windows, comparison.losses)
                progress.update()
                if config.checkpoint_every:  # every rank stops after the same step
                    stop.signum = agreed_signal(ranks, stop.signum)
                if config.checkpoint_every and (step % config.checkpoint_every == 0 or stop.signum is not None):
                    start = time.perf_counter()
                    path = checkpoint.save(config.checkpoint_dir or checkpoint.DEFAULT_DIR, step, config, components,
                                           ranks)
                    written.update(checkpoints=written["checkpoints"] + 1,
                                   checkpoint_s=written["checkpoint_s"] + time.perf_counter() - start,
                                   checkpoint_bytes=sum(f.stat().st_size for f in path.iterdir()))
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
        result = _report(config, batches, series, first_fail, nonfinite, localizer, (ck, ref), status, error,
                         time.perf_counter() - started)
        result["stopped_by_signal"] = stopped_by
        result["timing"].update(written)
        result["dump"] = dumped  # what the checkpoints cost (timings: not compared on resume)
        result["divergence"] = divergence.report()
        result["forecast"] = forecast(series.columns["step"], series.columns["param_abs_diff"], config.param_tol,
                                      batches.num_steps, divergence.first_step)
        result["forecast_param_fail_step"] = result["forecast"]["param_fail_step"]
        result["shadow"] = shadow.report(len(series)) if shadow is not None else None
        result["envelope"] = envelope.report() if envelope is not None else None
        result["noise_verdict"] = result["envelope"]["verdict"] if envelope is not None else None
        result["spikes"] = spikes.report() if spikes is not None else None
        result["ranks"] = agreement.report(config)
        if result["ranks"]["replicated_params_identical"] is False and result["status"] == "pass":
            result.update(status="fail", pass_parity=False)
        result["env"]["world_size"] = ranks.world_size
        if result["localization"] is not None:
            result["localization"]["first_divergence_step"] = divergence.first_step
        if ranks.is_writer:
            _mark_late_signal(result, stop)
            report.write_json(config.json_out or DEFAULT_JSON_OUT, result)
            if _mark_late_signal(result, stop):  # it came while the report was being written
                report.write_json(config.json_out or DEFAULT_JSON_OUT, result)
        else:
            _mark_late_signal(result, stop)
    return result


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
    result = _report(config, batches, DriftSeries(), FirstFail(config), NonFinite(), Localizer(config), None,
                     "error", error, None)
    result.update(stopped_by_signal=None, divergence=None, forecast=None, forecast_param_fail_step=None, shadow=None,
                  envelope=None, noise_verdict=None, spikes=None, dump=None,
                  ranks=RankAgreement(SINGLE).report(config))
    result["env"]["world_size"] = config.tp * config.dp
    return result


def _report(config, batches, series, first_fail, nonfinite, localizer, twins, status, error, wall) -> dict:
    # an interrupted or broken run proves nothing about the steps it did not reach
    pass_parity = (status == "pass" and not first_fail.parity_failed and not nonfinite.one_sided
                   and len(series) == batches.num_steps)
    if status == "pass" and not pass_parity:
        status = "fail"
    columns = series.columns
    return {
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
        "final_ck_loss": columns["ck_loss"][-1] if len(series) else None,
        "final_torch_loss": columns["torch_loss"][-1] if len(series) else None,
        "series": columns,
        "localization": localizer.result,
        "timing": {
            "wall_s": wall,
            "ck_total_s": twins[0].seconds if twins else None, "torch_total_s": twins[1].seconds if twins else None,
            "ck_step_ms_median": statistics.median(columns["ck_step_ms"]) if len(series) else None,
            "torch_step_ms_median": statistics.median(columns["torch_step_ms"]) if len(series) else None,
        },
    }
