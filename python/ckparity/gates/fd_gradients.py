"""fd_gradients: the CK twin's gradients against float64 central differences."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import torch

from .. import kernels
from ..harness.basics.config import kernels_used
from ..harness.twins.factory import build_twins
from ..harness.twins.models import model_loss
from ..measure import nan_max
from .common import SHORT_RUN, brought, result, with_backends
from .record import Gate



def run(settings: dict, out_dir: Path | None = None) -> dict:
    """The CK twin's float32 gradients against float64 central differences of
    the same loss (the model in float64 with torch ops), on random coordinates
    of every parameter tensor."""
    failures, rows, exercised = [], [], set()
    g = torch.Generator().manual_seed(0)
    chosen = settings.get("ck_backends", {})
    # a chosen kernel no gate model calls brings the model that does; the optimizer and the clip, no model op
    # (slot None), take no part in gradients
    for model in [*settings["models"], *brought(chosen, settings["models"], SHORT_RUN)]:
        config = with_backends(replace(SHORT_RUN, model=model, ck_swiglu_backend=settings["ck_swiglu_backend"],
                                       ck_rmsnorm_backend=settings["ck_rmsnorm_backend"],
                                       ck_loss_backend=settings["ck_loss_backend"]), settings)
        exercised |= {k for k in kernels_used(config) if kernels.KERNELS[k].slot is not None}
        ck, ref = build_twins(config)
        # one window (B, T) = (1, seq_len), as the runs feed every model
        tokens = torch.randint(0, config.vocab, (1, config.seq_len), generator=g)
        targets = torch.randint(0, config.vocab, (1, config.seq_len), generator=g)
        ck.model.zero_grad(set_to_none=True)
        ck.micro_step(tokens, targets, 1.0)
        exact = copy.deepcopy(ref.model).double()

        def loss64():
            with torch.no_grad():
                return float(model_loss(exact, exact(tokens), targets))

        params64 = dict(exact.named_parameters())
        for name, p in ck.model.named_parameters():
            flat64 = params64[name].data.view(-1)
            picks = torch.randint(0, flat64.numel(), (settings["coordinates"],), generator=g)
            if name == "embedding.weight":  # only the rows of tokens in the batch have a gradient
                row = tokens.view(-1)[torch.randint(0, tokens.numel(), (settings["coordinates"],), generator=g)]
                picks = row * p.shape[1] + picks % p.shape[1]
            worst = 0.0
            for k in picks.tolist():
                saved = float(flat64[k])
                flat64[k] = saved + settings["step"]
                up = loss64()
                flat64[k] = saved - settings["step"]
                down = loss64()
                flat64[k] = saved
                fd = (up - down) / (2 * settings["step"])
                analytic = float(p.grad.view(-1)[k])
                err = abs(analytic - fd)
                worst = nan_max([worst, err / (settings["atol"] + settings["rtol"] * abs(fd))])
                if not err <= settings["atol"] + settings["rtol"] * abs(fd):  # NaN fails
                    failures.append(f"{model} {name}[{k}]: grad {analytic:.6g} vs finite difference {fd:.6g}")
            rows.append({"model": model, "tensor": name, "coordinates": len(picks), "worst_error_over_tol": worst})
    summary = (f"{sum(r['coordinates'] for r in rows)} coordinates over {len(rows)} tensors, "
               f"{len(failures)} over tolerance" + (f"; first: {failures[0]}" if failures else ""))
    return result(not failures, summary, rows=rows, failures=failures[:50],
                   exercised=sorted(exercised & set(chosen)))


GATE = Gate(
    name="fd_gradients", run=run,
    settings={"coordinates": 16, "step": 1e-6, "rtol": 1e-3, "atol": 2e-6, "models": ["tiny", "stacked"],
              "ck_swiglu_backend": "c", "ck_rmsnorm_backend": "c", "ck_loss_backend": "c"},
    full={"coordinates": 64},
    checks="the CK twin's float32 gradients vs float64 central differences (h = 1e-6) on `coordinates` (16; full 64) "
           "random coordinates of every parameter tensor of the tiny and the 2-layer stacked model",
    passes="`|g - fd| ≤ atol + rtol·|fd|` (2e-6, 1e-3) everywhere",
    kernels_here=True)  # its twins run in the gate's process
