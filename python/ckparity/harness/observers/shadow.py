"""The float64 shadow: who is closer to exact arithmetic, the CK twin or the
torch twin?

A third twin — the torch model in float64 (the torch twin's initial weights,
cast), torch's ops and torch's AdamW in float64 — trains on the same batches.
Two measures:

- along the run: each float32 twin's max |param - shadow param| and
  |loss - shadow loss| per step. Over a long run chaos amplifies any
  difference, so this says where the twins ended up, not who rounds better;
- local probes, every ``shadow_every`` steps: from the torch twin's current
  state, one step by a fresh CK twin, a fresh torch twin (float32) and the
  shadow (float64). Each float32 twin's local gradient error is its max
  |grad - shadow grad| over the step's accumulated gradients, and its local
  param error its max |param - shadow param| after the update. Both start
  from the same state, so a probe measures one step's rounding, free of the
  history. A probe's verdict reads the gradient error first — the loss and
  layer kernels differ there, while a param error is mostly the float32
  rounding of the stored params, which both twins share (measured: equal to
  3 digits on the stress profile) — and the param error when the gradients
  tie (an optimizer's difference shows only there).

"tie": two errors within 10% of each other (or both zero) — neither twin is
measurably closer. closer_to_f64 over the probes is the twin with more
probe wins; a tie when the wins are equal."""

from __future__ import annotations

import copy
import statistics
import time

import torch

from ...measure import nan_max
from ..twins.stepper import Twin
from ..twins.factory import build_twin
from .protocol import Observer, StepRecord

TIE = 0.10


def _max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return nan_max(float((a[n].double() - b[n]).abs().max()) for n in a)


def _closer(ck: float, ref: float) -> str:
    if abs(ck - ref) <= TIE * max(ck, ref):
        return "tie"
    return "ck" if ck < ref else "torch"


class Float64Shadow(Observer):
    STATE = ("twin", "series", "probes", "seconds")

    def __init__(self, config, ref: Twin) -> None:
        self.config = config
        self.twin = build_twin(config, "f64", snapshot=ref.snapshot())
        self.series: dict[str, list] = {k: [] for k in ("step", "ck_param_diff", "torch_param_diff",
                                                          "ck_loss_diff", "torch_loss_diff")}
        self.probes: dict[str, list] = {k: [] for k in ("step", "ck_local_grad_error", "torch_local_grad_error",
                                                          "ck_local_param_error", "torch_local_param_error")}
        self.seconds = 0.0

    def after_step(self, record: StepRecord) -> None:
        step, windows, ck, ref, losses = record.step, record.windows, record.ck, record.ref, record.losses
        start = time.perf_counter()
        self.twin.zero_grad()
        shadow_losses = [float(loss) for loss, _ in self.twin.micro_steps(windows)]
        self.twin.update(self.config.max_grad_norm)
        shadow_params = self.twin.params()
        shadow_loss = statistics.fmean(shadow_losses)
        self.series["step"].append(step)
        for twin in (ck, ref):
            self.series[f"{twin.name}_param_diff"].append(_max_abs(twin.params(), shadow_params))
            self.series[f"{twin.name}_loss_diff"].append(abs(statistics.fmean(losses[twin.name]) - shadow_loss))
        if step % self.config.shadow_every == 0:
            self._probe(step, windows, ref)
        self.seconds += time.perf_counter() - start

    def _probe(self, step: int, windows, ref: Twin) -> None:
        state = ref.snapshot()
        twins = [build_twin(self.config, side) for side in ("ck", "torch")]
        for twin in twins:
            twin.restore(copy.deepcopy(state))
        twins.append(build_twin(self.config, "f64", snapshot=state))
        grads = []
        for twin in twins:
            twin.zero_grad()
            twin.micro_steps(windows)
            grads.append({n: g.clone() for n, g in twin.grads().items()})
            twin.update(self.config.max_grad_norm)
        exact = twins[2].params()
        self.probes["step"].append(step)
        for twin, twin_grads in zip(twins[:2], grads):
            self.probes[f"{twin.name}_local_grad_error"].append(_max_abs(twin_grads, grads[2]))
            self.probes[f"{twin.name}_local_param_error"].append(_max_abs(twin.params(), exact))

    def report_into(self, result: dict) -> None:
        result["shadow"] = self.report(result["steps"])

    def twins(self) -> list[Twin]:
        return [self.twin]

    def report(self, steps: int) -> dict:
        s, p = self.series, self.probes
        summary = {"closer_to_f64": None, "closer_to_f64_locally": None}
        if s["step"]:
            final = (s["ck_param_diff"][-1], s["torch_param_diff"][-1])
            summary.update(closer_to_f64=_closer(*final), final_ck_param_diff=final[0],
                           final_torch_param_diff=final[1])
        if p["step"]:
            verdicts = [_closer(cg, tg) if _closer(cg, tg) != "tie" else _closer(cp, tp) for cg, tg, cp, tp in zip(
                p["ck_local_grad_error"], p["torch_local_grad_error"], p["ck_local_param_error"],
                p["torch_local_param_error"])]
            wins = {side: verdicts.count(side) for side in ("ck", "torch", "tie")}
            summary.update(
                closer_to_f64_locally="tie" if wins["ck"] == wins["torch"] else max(("ck", "torch"), key=wins.get),
                probe_wins=wins, **{f"median_{key}": statistics.median(p[key]) for key in p if key != "step"})
        summary["seconds_per_step"] = self.seconds / steps if steps else None
        return {"summary": summary, "series": s, "probes": p, "tie_within": TIE}
