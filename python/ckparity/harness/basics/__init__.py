"""What every part of the harness stands on: the run config, the report's writing, the twins'
difference measure, the data, and the signals that stop a run. It imports no other harness folder."""
