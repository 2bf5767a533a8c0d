"""What lets a run be long and be trusted: checkpoints and --resume
(``checkpoint``), --dump-step and replay (``dump``), --init-from, lr
schedules, and stopping on signals with the report written (``interrupts``)."""
