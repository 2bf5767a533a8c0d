"""The long-horizon parity harness: a CK twin (C kernels) and a torch twin
trained side by side from identical weights, compared step by step.

Its rooms, each importing only the ones above it in this list (tests/test_spine.py holds the order):

- ``basics/``: the run's config, its data, how tensors are compared, how
  reports are written, the signals that stop a run, the checkpoint format (no twin in them);
- ``twins/``: the models and the twins built from them, every kind through
  ``build_twin(config, kind)`` (ck, torch, f64), the Twin that steps, the CK
  twin spread over torch.distributed ranks (``ranked``), ``--init-from``;
- ``observers/``: what watches a step and keeps what the report needs: the
  drift measures, first fails and the divergence tracer (``drift``), the
  localizing replay, the float64 shadow, the forecast, the noise envelope,
  spike triage;
- ``longrun/``: what lets a run be long: checkpoints and resume, step dumps,
  lr schedules;
- ``loop/``: the training loop (``run``), built from all of the above, and a
  run in a process of its own (``child``);
- ``ranks/``: the local launcher that starts a run's ranks (``launch``);
- ``studies/``: runs of many runs: ``attribute`` (the ablation) and
  ``repro`` (presets, compare).
"""
