"""What every part of the harness stands on: the run config, the report's writing, the twins'
difference measure, the data, the signals that stop a run, and the checkpoint format (read by --resume
and by --init-from a checkpoint directory). It imports no other harness folder."""
