"""The long-horizon parity harness: a CK twin (C kernels) and a torch twin
trained side by side from identical weights, compared step by step.

Its rooms, each importing only the ones above it in this list:

- ``longrun/interrupts``, ``loop/config``, ``loop/data``, ``loop/diff``,
  ``loop/report``: the run's value, its data, how tensors are compared, how
  reports are written (no twin in them);
- ``twins/``: the models and the twins built from them, every kind through
  ``build_twin(config, kind)`` (ck, torch, f64), and the Twin that steps;
- ``ranks/``: the CK twin spread over torch.distributed ranks (``group``)
  and the local launcher that starts them (``launch``);
- ``observers/``: what watches a step and keeps what the report needs: the
  drift measures, first fails and the divergence tracer (``drift``), the
  localizing replay, the float64 shadow, the forecast, the noise envelope,
  spike triage;
- ``longrun/``: what lets a run be long: checkpoints and resume, step dumps,
  ``--init-from``, lr schedules;
- ``loop/run``: the training loop, built from all of the above;
- ``studies/``: runs of many runs: ``attribute`` (the ablation) and
  ``repro`` (presets, compare).
"""
