"""One gate in a process of its own, as gate --backend runs each gate with a user's backends
(run_gates): ``python -m ckparity.gates NAME SETTINGS_JSON OUT_DIR RESULT_JSON CARRY_JSON`` runs the
gate NAME with those settings, having loaded the configured plugins and what CARRY names
(kernels.carried), and writes its result to RESULT_JSON. A process that dies writes none: the
parent reports how it ended."""

import json
import sys
from pathlib import Path

from .. import kernels
from ..harness.basics import progress
from ..harness.basics.report import write_json
from . import run_one

kernels.load_configured()
kernels.load_carried(json.loads(sys.argv[5]))
progress.start()  # the place of the gate's own twins (fd_gradients', depth_sweep's), for a parent whose child died
write_json(sys.argv[4], run_one(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])))
