"""ckparity check KERNEL --backend NAME: the conformance suite ckparity runs on
its own kernels, run on any registered backend (yours, loaded by --plugin).

Each property is a set of cases run on the backend and on torch (and on
torch in float64, the exact answer's stand-in), with a verdict
(check/properties.py):

- ``contract``: a user's backend's contract check (docs/plugins.md), run
  here so that a crash in it is a verdict, not a dead command;
- ``widths``: the record's widths (kernels.WIDTHS: every width 1..300 and
  large ones up to 8191), 1 and 3 rows: vector tails and blockings hide there;
- ``options``: what the slot's contract passes besides the plain call
  (ignored rows and label smoothing; no weight; a 3-D input); an option the
  backend declares unsupported is the row ``option NAME``: not supported;
- ``layouts``: every tensor of the slot's call in every layout torch takes
  (strided, transposed, a storage offset, expanded rows and columns) must
  give the bits the same values give contiguous, and torch's by the rule;
  the call with 0 rows too;
- ``threads``: a large case at 1 and 2 torch threads, the same bits;
- ``batch_invariance``: the same row at batches 1..17, at their start,
  middle and end, at 1 and 2 threads -> the bits of the row alone (or, where
  torch's own bits vary, torch's in every arrangement: the report counts
  both);
- ``bad_input``: a wrong shape or an out-of-range target must raise, not
  return;
- ``torch_inputs``: torch's own OpInfo sample inputs of the op the slot
  stands for that fall within the slot's contract (needs expecttest; the
  report's ``not_run`` says so when it is missing).

A backend built with the ckparity.plugin helpers gets contiguous float32
copies and has its shapes checked by the helper: ``layouts``,
``threads`` and the shape rows of ``bad_input`` would test the helper, not
your C, and are in ``not_run`` with that reason instead of a bitwise that
cannot fail.

Each property reports its cases, how many fail (``failing``), the failures
counted by what the cases vary besides the width (``groups``: rows=1,
rows=3, an option), and the worst ones with their figures (``worst``: max
|diff|, ULPs, the float64 error beside torch's). The verdicts and what check
and the gates make of them are check/rule.py's RULE, the one pass rule.
``ckparity check`` runs the suite in a child process (check/isolation.py).
"""

from __future__ import annotations

from .isolation import DEFAULT_TIMEOUT, CheckSetupError, isolated_check, run
from .properties import ADAMW_STEPS, adamw_sizes
from .rule import RULE, VERDICTS, check_passes, gate_passes
from .suite import SCHEMA, check, covered, record_of, table

__all__ = ["ADAMW_STEPS", "DEFAULT_TIMEOUT", "RULE", "SCHEMA", "VERDICTS", "CheckSetupError", "adamw_sizes",
           "check", "check_passes", "covered", "gate_passes", "isolated_check", "record_of", "run", "table"]
