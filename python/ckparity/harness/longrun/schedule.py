"""--lr-schedule constant|linear|cosine --warmup-steps W: the learning rate
step by step, by torch's own scheduler classes, on every twin that trains
(the CK and torch twins, the float64 shadow, the envelope's members).

Each twin's optimizer gets its own scheduler of the same classes; a
scheduler only writes its optimizer's param_groups' "lr" from Python floats,
so ckparity's AdamW and torch's read the same lr at every step, bit for bit
(tests/test_schedule.py). The schedule:

- warmup: torch.optim.lr_scheduler.LinearLR from lr/W to lr over W steps
  (W = 0: none);
- then "constant" (ConstantLR, factor 1), "linear" (LinearLR to 0 over the
  remaining steps) or "cosine" (CosineAnnealingLR to 0 over them);
- the two chained by SequentialLR at step W.

A twin restored from a snapshot (a replay of one step) carries the lr of that
step in its optimizer's state; its scheduler does not matter for that step.
"""

from __future__ import annotations

from torch.optim import lr_scheduler

SCHEDULES = ("constant", "linear", "cosine")


def attach(twin, config, total_steps: int) -> None:
    """Gives ``twin`` the run's schedule over ``total_steps`` optimizer steps --
    the whole run's (every epoch), not --max-steps': a run cut short and
    resumed (harness/longrun/checkpoint.py) follows the one schedule. Nothing for a
    constant lr without warmup: the twin keeps its lr."""
    if config.lr_schedule == "constant" and config.warmup_steps == 0:
        return
    optimizer, warmup = twin.optimizer, config.warmup_steps
    rest = total_steps - warmup
    main = {"constant": lambda: lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0),
            "linear": lambda: lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=0.0, total_iters=rest),
            "cosine": lambda: lr_scheduler.CosineAnnealingLR(optimizer, T_max=rest)}[config.lr_schedule]
    if warmup == 0:
        twin.scheduler = main()
        return
    ramp = lr_scheduler.LinearLR(optimizer, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup)
    twin.scheduler = lr_scheduler.SequentialLR(optimizer, [ramp, main()], milestones=[warmup])
