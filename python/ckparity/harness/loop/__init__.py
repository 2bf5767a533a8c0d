"""The training loop: ``run.train``, what the machine must hold for it
(``resources``), and a run in a process of its own (``child``); the config,
data, comparison and report it is made of are in basics/."""
