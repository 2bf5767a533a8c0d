"""distributed_parity: the CK twin over ranks against the single-process torch twin."""

from __future__ import annotations

from pathlib import Path

from ..harness.basics.config import RunConfig
from .common import harness_gate
from .record import Gate



def run(settings: dict, out_dir: Path | None = None) -> dict:
    """The CK twin split over ranks (gloo, processes on this machine) against
    the single-process torch twin, in the gate's dtype: --tp W (lm_head and
    loss by vocabulary) and --dp W (micro-batches, summed gradients) must pass
    parity, and the ranks' replicated parameters must stay bit-identical to
    each other."""
    runs = {f"{model}_{kind}{w}": RunConfig(model=model, max_steps=settings["steps"], grad_accum=settings["grad_accum"],
                                            dtype=settings["dtype"], **({"num_layers": 2} if model != "tiny" else {}),
                                            **{kind: w})
            for model in settings["models"] for w in settings["world_sizes"] for kind in ("tp", "dp")}
    return harness_gate(runs, out_dir, "distributed_parity", settings)


GATE = Gate(
    name="distributed_parity", run=run,
    settings={"dtype": "float32", "world_sizes": [2], "steps": 5, "grad_accum": 4, "models": ["stacked"]},
    full={"world_sizes": [2, 3], "steps": 100, "models": ["tiny", "stacked"]},
    checks="the stacked model's CK twin over ranks (gloo): `--tp W` and `--dp W` for W in `world_sizes` ([2]; full "
           "[2, 3], tiny too), `steps` 5 (full 100)",
    passes="every run `pass_parity` and the ranks' replicated params bit-identical")
