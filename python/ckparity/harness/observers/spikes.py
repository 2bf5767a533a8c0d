"""--spike-triage: a twin's loss jumped -- whose fault is it?

The rule: a step's loss (the mean over its micro-batches) is a spike when it
exceeds SPIKE_FACTOR times the median of that twin's previous WINDOW step
losses (at least MIN_HISTORY of them) and that median by at least MIN_JUMP
nats (late in a run, when the loss is near 0, a ratio alone would call
float noise a spike).

On a spike of either twin, the step is replayed -- forward and loss, one
micro-batch at a time -- from the torch twin's state at the start of the step
in two fresh twins: CK and the float64 shadow (torch's ops in float64). The
same state isolates the kernels from the drift that led there. The torch side
is the torch twin's own step: a float32 torch replay would be the same ops on
the same state, so it could only repeat the twin's loss bit for bit (a torch
forward is still run, for the stage analysis below, and the report says
whether it did repeat it: `torch_forward_identical`, a check that the state
restore is exact). The CK replay and the float64 one are judged by the same
rule against the torch twin's history, and the spike is classified:

- "kernel": the CK replay spikes, the torch twin did not (only the CK kernels
  see it);
- "torch_only": the torch twin spiked, the CK kernels on its state do not;
- "float32_numerics": both spike, the float64 replay does not;
- "dynamics_or_data": the float64 replay spikes too (the weights or the batch,
  not the arithmetic);
- "not_reproduced": neither the torch twin nor a replay spikes -- the CK
  twin's spike came from its own drifted state, not from this step's
  arithmetic on a shared one.

Each triage also names, per float32 twin, the forward stage whose output is
furthest from float64 (relative to the stage's scale), and the batch rows
with the largest loss (float64), with each twin's loss on them.

Cost: the torch twin's state is copied every step (into reused buffers) so
that a spike can be replayed from the start of its step; each triage builds
three twins and runs one forward per micro-batch in each. At most MAX_TRIAGES per run.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..basics.diff import tensor_diff
from ..twins.models import model_loss
from ..twins.factory import build_twin
from .protocol import Observer, StepRecord

SPIKE_FACTOR = 1.5
MIN_JUMP = 0.05
WINDOW = 20
MIN_HISTORY = 5
MAX_TRIAGES = 10
TOP_ROWS = 5


def is_spike(loss: float, history: list[float]) -> tuple[bool, float | None]:
    """(whether ``loss`` is a spike against the last WINDOW of ``history``, that median)."""
    recent = history[-WINDOW:]
    if len(recent) < MIN_HISTORY:
        return False, None
    median = statistics.median(recent)
    return (loss > SPIKE_FACTOR * median and loss - median > MIN_JUMP) or loss != loss, median


class Replay(NamedTuple):
    losses: list[float]      # per micro-batch
    acts: list[dict]         # per micro-batch, the forward activations
    rows: torch.Tensor       # every row's loss of the twin's logits, in float64, micro-batches concatenated


def _replay(twin, windows) -> Replay:
    losses, acts, rows = [], [], []
    with torch.no_grad():
        for tokens, targets in windows:
            out = twin.model(tokens)
            logits = out["logits"].reshape(-1, out["logits"].shape[-1])
            losses.append(float(model_loss(twin.model, out, targets)))
            acts.append(out)
            rows.append(F.cross_entropy(logits.double(), targets.reshape(-1), reduction="none"))
    return Replay(losses, acts, torch.cat(rows))


def _worst_stage(replay: Replay, exact: Replay) -> dict:
    """The forward stage (the loss included) with the largest difference from
    float64, relative to the stage's scale."""
    best = {"stage": None, "rel_diff": -1.0, "abs_diff": 0.0}
    for loss, acts, exact_loss, exact_acts in zip(replay.losses, replay.acts, exact.losses, exact.acts):
        figures = {stage: tensor_diff(acts[stage], exact_acts[stage]) for stage in acts}
        figures["loss"] = (abs(loss - exact_loss), abs(loss - exact_loss) / abs(exact_loss) if exact_loss else 0.0)
        for stage, (abs_diff, rel) in figures.items():
            if rel > best["rel_diff"]:
                best = {"stage": stage, "rel_diff": rel, "abs_diff": abs_diff}
    return best


def classify(ck: bool, ref: bool, f64: bool) -> str:
    """ck: the CK replay spiked; ref: the torch twin's own step did; f64: the float64 replay did."""
    if f64:
        return "dynamics_or_data"
    if ck and ref:
        return "float32_numerics"
    if ck:
        return "kernel"
    return "torch_only" if ref else "not_reproduced"


class SpikeTriage(Observer):
    STATE = ("history", "triages", "spike_steps")  # not the snapshot: it is taken at each step's start

    def __init__(self, config) -> None:
        self.config = config
        self.history: dict[str, list[float]] = {"ck": [], "torch": []}
        self.snapshot = None
        self.triages: list[dict] = []
        self.spike_steps: list[int] = []

    def before_step(self, step: int, windows, ck, ref) -> None:
        """The torch twin's state at the start of the step, for a replay."""
        self.snapshot = ref.snapshot(reuse=self.snapshot)

    def after_step(self, record: StepRecord) -> None:
        step, windows, losses = record.step, record.windows, record.losses
        spiked, medians = {}, {}
        for side in ("ck", "torch"):
            loss = statistics.fmean(losses[side])
            spiked[side], medians[side] = is_spike(loss, self.history[side])
            self.history[side].append(loss)
        if not any(spiked.values()):
            return
        self.spike_steps.append(step)
        if len(self.triages) < MAX_TRIAGES:
            self.triages.append(self._triage(step, windows, spiked, medians, losses))

    def _triage(self, step, windows, spiked, medians, losses) -> dict:
        twins = {side: build_twin(self.config, side) for side in ("ck", "torch")}
        for twin in twins.values():
            twin.restore(self.snapshot)
        twins["f64"] = build_twin(self.config, "f64", snapshot=self.snapshot)
        replays = {side: _replay(twin, windows) for side, twin in twins.items()}
        history = self.history["torch"][:-1]  # before this step
        replayed = {side: statistics.fmean(replays[side].losses) for side in ("ck", "f64")}
        replay_spikes = {side: is_spike(loss, history)[0] for side, loss in replayed.items()}
        exact_rows = replays["f64"].rows
        top = torch.topk(exact_rows, min(TOP_ROWS, exact_rows.numel())).indices.tolist()
        per_batch = exact_rows.numel() // len(windows)
        return {
            "step": step, "spiked": spiked, "median_before": medians,
            "loss": {side: statistics.fmean(v) for side, v in losses.items()},
            "replayed_loss": replayed, "replay_spiked": replay_spikes,
            "torch_forward_identical": replays["torch"].losses == losses["torch"],
            "class": classify(replay_spikes["ck"], spiked["torch"], replay_spikes["f64"]),
            "worst_stage": {side: _worst_stage(replays[side], replays["f64"]) for side in ("ck", "torch")},
            "top_rows": [{"micro_batch": i // per_batch, "row": i % per_batch,
                          **{f"{side}_loss": float(r.rows[i]) for side, r in replays.items()}}
                         for i in top],
        }

    def report_into(self, result: dict) -> None:
        classes = [t["class"] for t in self.triages]
        result["spikes"] = {"rule": {"factor": SPIKE_FACTOR, "min_jump_nats": MIN_JUMP, "window": WINDOW,
                         "min_history": MIN_HISTORY},
                "spike_steps": self.spike_steps, "triaged": len(self.triages),
                "classes": {c: classes.count(c) for c in sorted(set(classes))}, "triages": self.triages}
