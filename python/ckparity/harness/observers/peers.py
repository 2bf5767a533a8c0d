"""How the way peers test would judge this run: their pass criteria,
computed on the twins' own steps (the report's ``peers``).

The torch twin plays the peers' reference and the CK twin their kernel run;
both start from the same weights and see the same batches, as the peers'
tests arrange. What is taken from each peer is its criterion -- which
quantities, at which steps, against which tolerance -- not its model,
data or learning rate: the run's own are used, so each row says whether
that criterion would have caught this run's difference, and when.

- ``liger_fp32`` / ``liger_bf16``: Liger-Kernel's convergence test
  (linkedin/Liger-Kernel, test/convergence/fp32/test_mini_models.py and
  bf16/test_mini_models.py, ``test_mini_model``): 32 steps; the loss of every
  step, then every parameter after the last step, each through
  ``assert_verbose_allclose`` (test/utils.py: |expected - actual| <= atol +
  rtol * |actual|, the kernel run's value as ``actual``). Tolerances of the
  mini_llama3 rows: fp32 loss atol 1e-8 rtol 2e-5, params atol 5e-3 rtol
  1e-5; bf16 loss atol 1e-3 rtol 1e-2, params atol 1e-2 rtol 1e-2. Logits
  are not compared (commented out there). A failure is known only when the
  32 steps are done: its step is 32.
- ``llm_c``: llm.c's test (karpathy/llm.c, test_gpt2.c): at the first step,
  the logits (largest |difference| at most 1e-2) and every gradient
  (``check_tensor``, |difference| <= 2e-2 per element); at each of the
  first 10 steps, the loss (|difference| < 1e-2). Its step is the first
  step one of these fails at.

A criterion the run ended before it could finish is ``reached: false`` and
detects nothing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..twins.stepper import Twin
from .protocol import Observer, StepRecord


@dataclass(frozen=True)
class Liger:
    steps: int
    loss: tuple[float, float]    # atol, rtol
    params: tuple[float, float]


@dataclass(frozen=True)
class LlmC:
    steps: int = 10
    logits: float = 1e-2
    grads: float = 2e-2
    loss: float = 1e-2


CRITERIA = {"liger_fp32": Liger(32, (1e-8, 2e-5), (5e-3, 1e-5)),
            "liger_bf16": Liger(32, (1e-3, 1e-2), (1e-2, 1e-2)),
            "llm_c": LlmC()}


def allclose(expected: torch.Tensor, actual: torch.Tensor, atol: float, rtol: float) -> bool:
    """Liger's assert_verbose_allclose as a predicate: within atol + rtol*|actual|
    everywhere, NaN and inf where the other has them."""
    expected, actual = expected.double(), actual.double()
    close = (expected - actual).abs() <= atol + rtol * actual.abs()
    same_special = (expected.isnan() & actual.isnan()) | (expected.isinf() & (expected == actual))
    return bool((close | same_special).all())


def _step_loss(losses: list[float]) -> torch.Tensor:
    """A step's loss as the peers log it: the mean over its micro-batches."""
    return torch.tensor(sum(losses) / len(losses), dtype=torch.float64)


class PeerCriteria(Observer):
    STATE = ("results", "losses")

    def __init__(self) -> None:
        # per criterion: the step it failed at (None: not yet / not at all), which quantity, whether it finished
        self.results = {name: {"detected": False, "step": None, "failed": [], "reached": False} for name in CRITERIA}
        self.losses: dict[str, list[float]] = {"ck": [], "torch": []}

    def _fail(self, name: str, step: int, what: str) -> None:
        result = self.results[name]
        result["failed"].append(what)
        if not result["detected"]:
            result.update(detected=True, step=step)

    def before_update(self, step: int, outputs: dict[str, list], ck: Twin, ref: Twin,
                      identical: dict[str, bool]) -> None:
        if step != 1:
            return
        llm_c = CRITERIA["llm_c"]
        (_, ck_acts), (_, ref_acts) = outputs["ck"][0], outputs["torch"][0]
        if not allclose(ref_acts["logits"].float(), ck_acts["logits"].float(), llm_c.logits, 0.0):
            self._fail("llm_c", step, "logits")
        ck_grads, ref_grads = ck.grads(), ref.grads()
        if any(not allclose(ref_grads[n].float(), g.float(), llm_c.grads, 0.0) for n, g in ck_grads.items()):
            self._fail("llm_c", step, "grads")

    def after_step(self, record: StepRecord) -> None:
        step = record.step
        for twin in ("ck", "torch"):
            self.losses[twin].append(float(_step_loss(record.losses[twin])))
        llm_c = CRITERIA["llm_c"]
        if step <= llm_c.steps:
            d = abs(self.losses["ck"][-1] - self.losses["torch"][-1])
            if not d < llm_c.loss:  # NaN fails
                self._fail("llm_c", step, "loss")
            self.results["llm_c"]["reached"] = step == llm_c.steps or self.results["llm_c"]["reached"]
        for name, criterion in CRITERIA.items():
            if isinstance(criterion, Liger) and step == criterion.steps:
                self._liger(name, criterion, record)

    def _liger(self, name: str, criterion: Liger, record: StepRecord) -> None:
        self.results[name]["reached"] = True
        steps = criterion.steps
        ck, ref = torch.tensor(self.losses["ck"][-steps:]), torch.tensor(self.losses["torch"][-steps:])
        if len(self.losses["ck"]) < steps or not allclose(ref, ck, *criterion.loss):
            self._fail(name, steps, "loss")
        ck_params, ref_params = record.ck.params(), record.ref.params()
        if any(not allclose(ref_params[n], p, *criterion.params) for n, p in ck_params.items()):
            self._fail(name, steps, "params")

    def report_into(self, result: dict) -> None:
        result["peers"] = self.results
