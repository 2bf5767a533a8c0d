"""Replaying one step's window from one shared state through both twins,
stage by stage, and reading the replay two ways:

- localize: the first forward stage, backward stage and parameter tensor
  whose difference is over tolerance — and, when none is (the drift built up
  over many steps, no single step shows it), says so ("kind": "accumulated");
- first_difference: the first stage and tensor whose bits differ at all, for
  the first step at which the twins stop being bit-identical.

The shared state is the CK twin's weights and optimizer state at the start of
that step: the state in which the failure showed, so a fault that only bites
on drifted weights (a clamp that matters once probabilities are tiny) still
shows in the replay. Loaded into the torch twin, it isolates the kernels from
the drift that led there."""

from __future__ import annotations

import torch

from ... import kernels
from ..basics.diff import tensor_diff
from ..twins.factory import build_twin
from ..twins.models import KERNEL_TAG


def _row(stage: str, a: torch.Tensor, b: torch.Tensor, tol: float, kernel: str | None = None) -> dict:
    abs_diff, rel = tensor_diff(a, b)
    return {"stage": stage, "kernel": kernel, "abs_diff": abs_diff, "rel_diff": rel, "tol": tol,
            "over": abs_diff > tol, "identical": bool(torch.equal(a, b) or abs_diff == 0.0)}


def replay(config, snapshot: dict, windows) -> dict:
    """Rows for every forward stage, backward stage (from the loss back to the
    embedding, then the parameter grads) and parameter after the update, in
    the order the step computes them. A stage's figures are its worst over the
    window's micro-batches."""
    ck, ref = build_twin(config, "ck"), build_twin(config, "torch")
    for twin in (ck, ref):
        twin.restore(snapshot)
        twin.zero_grad()
    # per twin, per micro-batch, per stage
    acts = {twin.name: [a for _, a in twin.micro_steps(windows, keep_activations=True)] for twin in (ck, ref)}
    rows = stage_rows(config, acts["ck"], acts["torch"], ck.grads(), ref.grads())
    for twin in (ck, ref):
        twin.update(config.max_grad_norm)
    rows["params"] = param_rows(config, ck.params(), ref.params())
    return rows


def stage_rows(config, ck_acts: list[dict], ref_acts: list[dict], ck_grads: dict, ref_grads: dict) -> dict:
    """The forward and backward rows of one step from each twin's activations
    (per micro-batch, kept with their gradients) and parameter grads."""
    acts = {"ck": ck_acts, "torch": ref_acts}
    stages = list(ck_acts[0])
    # a stage's kernel is the record its slot names (models.KERNEL_TAG); its gradient's, the next stage's,
    # whose backward computes it (the models are sequential; the loss's gradient is the 1/K scale)
    made_by = [getattr(ck_acts[0][stage], KERNEL_TAG, None) for stage in stages]
    kernel_of = {**{stage: made_by[i] for i, stage in enumerate(stages)},
                 **{f"d{stage}": (made_by[i + 1] if i + 1 < len(stages) else None) for i, stage in enumerate(stages)}}

    def worst(stage: str, grad: bool, tol: float) -> dict:
        name, rows = (f"d{stage}" if grad else stage), []
        for a, b in zip(acts["ck"], acts["torch"]):
            x, y = (a[stage].grad, b[stage].grad) if grad else (a[stage], b[stage])
            if x is not None and y is not None:
                rows.append(_row(name, x, y, tol, kernel_of[name]))
        if not rows:
            return {"stage": name, "kernel": kernel_of[name], "abs_diff": 0.0, "rel_diff": 0.0, "tol": tol,
                    "over": False, "identical": True}
        row = max(rows, key=lambda r: (r["abs_diff"], not r["identical"]))
        row["identical"] = all(r["identical"] for r in rows)
        return row

    grad_tol = config.tolerance("grad_tol")
    forward = [worst(stage, False, config.tolerance("loss_tol" if stage == "loss" else "logit_tol")) for stage in stages]
    backward = [worst(stage, True, grad_tol) for stage in reversed(stages)]
    backward += [_row(f"{name}.grad", ck_grads[name], ref_grads[name], grad_tol) for name in ck_grads]
    return {"forward": forward, "backward": backward}


def param_rows(config, ck_params: dict, ref_params: dict) -> list[dict]:
    return [_row(name, ck_params[name], ref_params[name], config.tolerance("param_tol")) for name in ck_params]


def _first(rows: list[dict], key: str) -> str | None:
    return next((r["stage"] for r in rows if r[key]), None)


def localize(config, step: int, snapshot: dict, windows) -> dict:
    """``step`` is 1-based; ``windows`` the step's (tokens, targets) micro-batches."""
    rows = replay(config, snapshot, windows)
    found = {"first_forward_stage": _first(rows["forward"], "over"),
             "first_backward_stage": _first(rows["backward"], "over"),
             "first_param_tensor": _first(rows["params"], "over")}
    # Nothing over tolerance in one step from a shared state: the difference
    # that failed was built up over the steps before (see "divergence").
    kind = "single_step" if any(found.values()) else "accumulated"
    return {"step": step, "kind": kind, **found, **rows}


def first_difference(config, snapshot: dict, windows) -> dict:
    """The first stage of the step whose bits differ between the twins, and
    the first parameter grad and parameter that differ."""
    return first_difference_in(replay(config, snapshot, windows))


def first_difference_in(rows: dict) -> dict:
    """first_difference from a step's rows (replayed, or the live step's)."""
    first = next((r for r in rows["forward"] + rows["backward"] if not r["identical"]), None)
    stage, kernel = (first["stage"], first.get("kernel")) if first else (None, None)
    # parameter grads in the order backward produces them (the models are sequential: last layer first)
    grads = [r for r in rows["backward"] if r["stage"].endswith(".grad")][::-1]
    tensor = next((r["stage"] for r in grads + rows["params"] if not r["identical"]), None)
    if stage is None and tensor is not None:
        # forward and backward agree bit for bit: the optimizer step differs
        stage, kernel = "update", next(name for name, k in kernels.KERNELS.items() if k.optimizer)
    return {"stage": stage, "kernel": kernel, "tensor": tensor}
