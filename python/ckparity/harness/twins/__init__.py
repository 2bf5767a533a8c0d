"""The twins: the models (``models``), the Twin that runs micro-steps and
steps (``stepper``), and ``factory.build_twin(config, kind)`` for every kind."""
