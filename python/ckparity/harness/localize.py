"""Localization: replay one step's window from one shared state through both
twins, and name the first forward stage, the first backward stage and the
first parameter tensor whose difference is over tolerance.

The shared state is the CK twin's weights and optimizer state at the start of
that step: the state in which the failure showed, so a fault that only bites
on drifted weights (a clamp that matters once probabilities are tiny) still
shows in the replay. Loaded into the torch twin, it isolates the kernels from
the drift that led there."""

from __future__ import annotations

from .diff import tensor_diff
from .twins import build_twin


def _first_over(rows: list[dict]) -> str | None:
    return next((r["stage"] for r in rows if r["over"]), None)


def localize(config, step: int, snapshot: dict, windows) -> dict:
    """``step`` is 1-based; ``windows`` the step's (tokens, targets) micro-batches."""
    ck, ref = build_twin(config, "ck"), build_twin(config, "torch")
    for twin in (ck, ref):
        twin.restore(snapshot)
        twin.optimizer.zero_grad(set_to_none=True)
    scale = 1.0 / len(windows)
    acts = {"ck": [], "torch": []}  # per micro-batch, per stage
    for tokens, targets in windows:
        for twin in (ck, ref):
            acts[twin.name].append(twin.micro_step(tokens, targets, scale, keep_activations=True)[1])
    stages = list(acts["ck"][0])

    def stage_diff(stage, grad):
        """The worst difference of a stage (or its gradient) over the window's micro-batches."""
        worst = (0.0, 0.0)
        for a, b in zip(acts["ck"], acts["torch"]):
            x, y = (a[stage].grad, b[stage].grad) if grad else (a[stage], b[stage])
            if x is not None and y is not None:
                worst = max(worst, tensor_diff(x, y))
        return worst

    forward, backward = [], []
    for stage in stages:
        abs_diff, rel = stage_diff(stage, grad=False)
        tol = config.loss_tol if stage == "loss" else config.logit_tol
        forward.append({"stage": stage, "abs_diff": abs_diff, "rel_diff": rel, "tol": tol, "over": abs_diff > tol})
    for stage in reversed(stages):  # backward runs from the loss to the embedding
        abs_diff, rel = stage_diff(stage, grad=True)
        backward.append({"stage": f"d{stage}", "abs_diff": abs_diff, "rel_diff": rel, "tol": config.grad_tol,
                         "over": abs_diff > config.grad_tol})
    ck_grads, ref_grads = ck.grads(), ref.grads()
    for name in ck_grads:
        abs_diff, rel = tensor_diff(ck_grads[name], ref_grads[name])
        backward.append({"stage": f"{name}.grad", "abs_diff": abs_diff, "rel_diff": rel, "tol": config.grad_tol,
                         "over": abs_diff > config.grad_tol})

    for twin in (ck, ref):
        twin.update(config.max_grad_norm)
    params = []
    ck_params, ref_params = ck.params(), ref.params()
    for name in ck_params:
        abs_diff, rel = tensor_diff(ck_params[name], ref_params[name])
        params.append({"stage": name, "abs_diff": abs_diff, "rel_diff": rel, "tol": config.param_tol,
                       "over": abs_diff > config.param_tol})
    return {
        "step": step,
        "first_forward_stage": _first_over(forward),
        "first_backward_stage": _first_over(backward),
        "first_param_tensor": _first_over(params),
        "forward": forward,
        "backward": backward,
        "params": params,
    }
