"""The per-step measures of a run: small objects that observe a step of the
training loop (harness/loop/run.py) and keep what the report needs.

- StepComparison: what one step's twins differ by, filled in as the step runs
  (losses and logits per micro-step, grads before the update, params and
  moments after it) and closed into one row of the report's series;
- DriftSeries: those rows, column by column;
- FirstFail: the first step at which each quantity leaves its tolerance;
- NonFinite: the first step with a NaN or inf in either twin, and whether
  only one twin had it;
- Localizer: the replay of the step that
  failed first (or --localize-step);
- DivergenceTracer: the first step at which each quantity differs at all (any
  bit), and the stage and tensor that first differ at the first such step.
The float64 shadow (shadow.py) and the drift forecast (forecast.py) observe a
step the same way."""

from __future__ import annotations

import math
import statistics

import torch

from ...ops.clip_grad_norm import grad_norm
from ..basics.diff import tensor_figures, worst_diff
from .localize import first_difference, first_difference_in, localize, param_rows, stage_rows
from .protocol import Observer, StepRecord

# (series key, report key, tolerance field): the quantities with a first-fail step.
CHECKS = [
    ("loss_abs_diff", "first_loss_fail_step", "loss_tol"),
    ("param_abs_diff", "first_param_fail_step", "param_tol"),
    ("grad_abs_diff", "first_grad_fail_step", "grad_tol"),
    ("logit_abs_diff", "first_logit_fail_step", "logit_tol"),
    ("moment_abs_diff", "first_moment_fail_step", "moment_tol"),
]
# a run fails parity when one of these fails; the others inform
PARITY_KEYS = ("first_loss_fail_step", "first_param_fail_step")

SERIES_KEYS = (
    "step", "ck_loss", "torch_loss", "loss_abs_diff", "logit_abs_diff", "logit_rel_diff",
    "grad_abs_diff", "grad_rel_diff", "grad_tensor", "param_abs_diff", "param_rel_diff", "param_tensor",
    "moment_abs_diff", "moment_rel_diff", "moment_tensor", "ck_grad_norm", "torch_grad_norm",
    "ck_step_ms", "torch_step_ms",
    # each difference in ULPs of its dtype at the tensor's largest value (loop/diff.py)
    "loss_ulp_diff", "logit_ulp_diff", "grad_ulp_diff", "param_ulp_diff", "moment_ulp_diff")


def _norm(tensors, norm_type: float) -> float:
    """The norm of all the tensors together, in double by ckparity's own C
    reduction (one threaded pass, no copies of float32 ones; a bf16 twin's
    are widened first, exactly); a NaN or inf anywhere propagates."""
    tensors = [t.detach() if t.dtype == torch.float32 else t.detach().float() for t in tensors]
    return grad_norm(tensors, norm_type) if tensors else 0.0


class StepComparison:
    """One step of the (ck, torch) twins, compared as it runs."""

    def __init__(self, step: int, ck, ref) -> None:
        self.step, self.ck, self.ref = step, ck, ref
        self.seconds_at_start = (ck.seconds, ref.seconds)
        self.losses: dict[str, list[float]] = {"ck": [], "torch": []}
        self.loss_abs_diff = self.logit_abs_diff = self.logit_rel_diff = self.loss_ulp_diff = self.logit_ulp_diff = 0.0
        self.grad_diff: dict = {}
        self.grad_norms: dict[str, float] = {}
        self.finite: dict[str, bool] = {}
        # per quantity: the twins' values equal bit for bit at this step
        self.identical = {"logits": True, "loss": True, "grads": True, "params": True, "moments": True}

    def micro_step(self, ck_output, ref_output) -> None:
        """Each twin's (loss, activations) of one micro-batch."""
        (ck_loss, ck_acts), (ref_loss, ref_acts) = ck_output, ref_output
        self.losses["ck"].append(float(ck_loss))
        self.losses["torch"].append(float(ref_loss))
        ck_value, ref_value = self.losses["ck"][-1], self.losses["torch"][-1]
        d = abs(ck_value - ref_value)
        self.identical["loss"] &= d == 0.0 or (math.isnan(ck_value) and math.isnan(ref_value))
        self.loss_abs_diff = max(self.loss_abs_diff, d if math.isfinite(d) else math.inf)
        self.loss_ulp_diff = max(self.loss_ulp_diff, tensor_figures(ck_loss, ref_loss)[2])
        a, r, u = tensor_figures(ck_acts["logits"], ref_acts["logits"])
        self.identical["logits"] &= a == 0.0
        self.logit_abs_diff, self.logit_rel_diff = max(self.logit_abs_diff, a), max(self.logit_rel_diff, r)
        self.logit_ulp_diff = max(self.logit_ulp_diff, u)

    def backward_done(self) -> None:
        """The accumulated gradients, before clipping and the update change them."""
        ref_grads = self.ref.grads()
        self.grad_diff = worst_diff({n: (g, ref_grads[n]) for n, g in self.ck.grads().items()})
        self.identical["grads"] = self.grad_diff["identical"]
        self.grad_norms = {t.name: _norm(t.grads().values(), 2.0) for t in (self.ck, self.ref)}

    def finish(self) -> dict:
        """After the update: the step's row of the series."""
        ck, ref = self.ck, self.ref
        ref_params, ref_moments = ref.params(), ref.moments()
        params = worst_diff({n: (p, ref_params[n]) for n, p in ck.params().items()})
        moments = worst_diff({n: (m, ref_moments[n]) for n, m in ck.moments().items() if n in ref_moments})
        self.identical["params"], self.identical["moments"] = params["identical"], moments["identical"]
        # finite: the losses, the grads (their norm propagates NaN and inf) and the params (their max |p|)
        self.finite = {t.name: all(map(math.isfinite, self.losses[t.name])) and math.isfinite(self.grad_norms[t.name])
                       and math.isfinite(_norm(t.params().values(), math.inf)) for t in (ck, ref)}
        grads = self.grad_diff
        return {
            "step": self.step, "ck_loss": statistics.fmean(self.losses["ck"]),
            "torch_loss": statistics.fmean(self.losses["torch"]),
            "loss_abs_diff": self.loss_abs_diff, "logit_abs_diff": self.logit_abs_diff,
            "logit_rel_diff": self.logit_rel_diff,
            "grad_abs_diff": grads["abs"], "grad_rel_diff": grads["rel"], "grad_tensor": grads["tensor"],
            "param_abs_diff": params["abs"], "param_rel_diff": params["rel"], "param_tensor": params["tensor"],
            "moment_abs_diff": moments["abs"], "moment_rel_diff": moments["rel"], "moment_tensor": moments["tensor"],
            "ck_grad_norm": self.grad_norms["ck"], "torch_grad_norm": self.grad_norms["torch"],
            "ck_step_ms": 1e3 * (ck.seconds - self.seconds_at_start[0]),
            "torch_step_ms": 1e3 * (ref.seconds - self.seconds_at_start[1]),
            "loss_ulp_diff": self.loss_ulp_diff, "logit_ulp_diff": self.logit_ulp_diff, "grad_ulp_diff": grads["ulp"],
            "param_ulp_diff": params["ulp"], "moment_ulp_diff": moments["ulp"],
        }


class DriftSeries(Observer):
    """The per-step rows, column by column (the report's "series")."""

    STATE = ("columns",)  # what a checkpoint carries (harness/longrun/checkpoint.py)

    def __init__(self) -> None:
        self.columns: dict[str, list] = {key: [] for key in SERIES_KEYS}

    def after_step(self, record: StepRecord) -> None:
        for key, value in record.row.items():
            self.columns[key].append(value)

    def __len__(self) -> int:
        return len(self.columns["step"])

    def largest(self, key: str):
        """The largest value of a column (None before the first step)."""
        values = self.columns[key]
        return max(values) if values else None


class FirstFail(Observer):
    STATE = ("steps",)

    def __init__(self, config) -> None:
        self.tolerances = {report_key: config.tolerance(tol) for _, report_key, tol in CHECKS}
        self.steps: dict[str, int | None] = {report_key: None for _, report_key, _ in CHECKS}

    def after_step(self, record: StepRecord) -> None:
        """Records the step's new failures."""
        for series_key, report_key, _ in CHECKS:
            if self.steps[report_key] is None and not record.row[series_key] <= self.tolerances[report_key]:
                self.steps[report_key] = record.step

    def parity_failed_at(self, step: int) -> bool:
        """True when loss or params failed first at ``step``."""
        return any(self.steps[key] == step for key in PARITY_KEYS)

    @property
    def parity_failed(self) -> bool:
        return any(self.steps[key] is not None for key in PARITY_KEYS)


class NonFinite(Observer):
    STATE = ("first_step", "one_sided")

    def __init__(self) -> None:
        self.first_step: int | None = None
        self.one_sided = False

    def after_step(self, record: StepRecord) -> None:
        if self.first_step is None and not all(record.finite.values()):
            self.first_step = record.step
        self.one_sided = self.one_sided or record.finite["ck"] != record.finite["torch"]


class Localizer(Observer):
    """Replays the first step whose loss or params fail (or --localize-step)
    from the CK twin's state at its start (after ``first_fail`` has seen the step)."""

    STATE = ("result",)

    def __init__(self, config, first_fail: FirstFail) -> None:
        self.config, self.first_fail = config, first_fail
        self.at = config.localize_step or None
        self.result: dict | None = None

    def wants_snapshot(self, step: int) -> bool:
        return self.result is None and (self.at is None or self.at == step)

    def after_step(self, record: StepRecord) -> None:
        step = record.step
        if self.result is None and (self.at == step or (self.at is None and self.first_fail.parity_failed_at(step))):
            self.result = localize(self.config, step, record.snapshot, record.windows)


class DivergenceTracer(Observer):
    """The first step at which the twins differ at all, per quantity, and at
    the first such step the stage and tensor whose bits differ first. Until
    then the twins are bit-identical, so that step ran from one shared state:
    in one process its own activations (kept, with their gradients, while
    ``keeps_activations``) are read stage by stage -- no replay, no per-step
    snapshot. Over ranks (--tp/--dp, whose twins run other micro-batches when
    keeping activations) the step is replayed from a snapshot instead."""

    QUANTITIES = ("logits", "loss", "grads", "params", "moments")
    STATE = ("per_quantity", "first_step", "where")

    def __init__(self, config) -> None:
        self.config = config
        self.live = config.tp * config.dp == 1
        self.per_quantity: dict[str, int | None] = {q: None for q in self.QUANTITIES}
        self.first_step: int | None = None
        self.where = {"stage": None, "kernel": None, "tensor": None}
        self._rows: dict | None = None

    def wants_snapshot(self, step: int) -> bool:
        return self.first_step is None and not self.live

    def keeps_activations(self, step: int) -> bool:
        return self.first_step is None and self.live

    def before_update(self, step: int, outputs: dict[str, list], ck, ref, identical: dict[str, bool]) -> None:
        """The live step's forward and backward rows, taken before the update
        (a clip rescales the grads in place) and only when they differ."""
        if self.keeps_activations(step) and not (identical["logits"] and identical["loss"] and identical["grads"]):
            self._rows = stage_rows(self.config, [a for _, a in outputs["ck"]], [a for _, a in outputs["torch"]],
                                    ck.grads(), ref.grads())

    def after_step(self, record: StepRecord) -> None:
        step, identical, ck, ref = record.step, record.identical, record.ck, record.ref
        for quantity in self.QUANTITIES:
            if self.per_quantity[quantity] is None and not identical[quantity]:
                self.per_quantity[quantity] = step
        if self.first_step is None and not all(identical.values()):
            self.first_step = step
            if self.live:
                rows = self._rows or {"forward": [], "backward": []}
                self.where = first_difference_in({**rows, "params": param_rows(self.config, ck.params(),
                                                                                ref.params())})
            else:
                self.where = first_difference(self.config, record.snapshot, record.windows)
        self._rows = None

    def report_into(self, result: dict) -> None:
        result["divergence"] = {"first_step": self.first_step, **self.where, "per_quantity": self.per_quantity}
        if result["localization"] is not None:
            result["localization"]["first_divergence_step"] = self.first_step
