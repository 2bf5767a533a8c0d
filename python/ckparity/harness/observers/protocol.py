"""What every observer of the loop shares: the one record of a finished
step it is handed, and the hooks the loop calls on each, in the order of the
observer list (loop/run.py builds that list once).

An observer keeps what the report needs and says what a checkpoint must
carry (``STATE``, names of its attributes; longrun/checkpoint.py). The
hooks have defaults that do nothing, so an observer defines only what it
uses:

- ``wants_snapshot(step)``: the CK twin's state at the step's start is
  needed (a replay); the loop takes it once for all who ask;
- ``keeps_activations(step)``: the micro-steps keep activations and their
  gradients (the live divergence tracer, a step dump);
- ``before_step(step, windows, ck, ref)``: before the twins' micro-steps;
- ``before_update(step, outputs, ck, ref, identical)``: after backward,
  before the optimizers (gradients still unclipped);
- ``after_step(record)``: after both twins' update;
- ``report_into(result)``: the keys it adds to the run's report;
- ``twins()``: the twins of its own that train each step (they follow the
  run's lr schedule too).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..twins.stepper import Twin


@dataclass
class StepRecord:
    """One finished step, as every observer sees it."""
    step: int
    windows: list               # the step's micro-batches, (tokens, targets) each
    ck: Twin
    ref: Twin                   # the torch twin
    row: dict                   # the step's row of the report's series (StepComparison.finish())
    losses: dict[str, list]     # per twin ("ck", "torch"), the micro-steps' losses
    identical: dict[str, bool]  # per quantity, whether the twins' bits agreed this step
    finite: dict[str, bool]     # per twin, whether everything it computed was finite
    snapshot: dict | None       # the CK twin's state at the step's start, if an observer wanted it


class Observer:
    STATE: tuple[str, ...] = ()

    def wants_snapshot(self, step: int) -> bool:
        return False

    def keeps_activations(self, step: int) -> bool:
        return False

    def before_step(self, step: int, windows: list, ck: Twin, ref: Twin) -> None:
        pass

    def before_update(self, step: int, outputs: dict[str, list], ck: Twin, ref: Twin,
                      identical: dict[str, bool]) -> None:
        pass

    def after_step(self, record: StepRecord) -> None:
        pass

    def report_into(self, result: dict) -> None:
        pass

    def twins(self) -> list[Twin]:
        return []
