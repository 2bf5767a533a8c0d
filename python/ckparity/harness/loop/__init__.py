"""The training loop and what it is made of: the run's config, the token
stream, how two tensors are compared, the report and where it is written,
what the machine must hold; ``run.train`` is the loop."""
