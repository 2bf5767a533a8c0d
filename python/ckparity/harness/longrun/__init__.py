"""What lets a run be long and be trusted: checkpoints and --resume
(``checkpoint``), --dump-step and replay (``dump``), lr schedules (the
signals that stop a run: basics/interrupts.py; --init-from: twins/init_from.py)."""
