"""RankAgreement: the observer that holds the ranks of a --tp/--dp run to one
set of replicated CK parameters."""

from __future__ import annotations

from ..twins.ranked import Ranks, RanksDisagree, fingerprints
from .protocol import Observer, StepRecord


class RankAgreement(Observer):
    """Observer: whether the ranks' copies of the replicated CK parameters
    are still bit-identical after each step (they should be: the same
    gradients, the same optimizer, the same bits).

    The first mismatch ends the run (RanksDisagree, on every rank: each saw
    every rank's digest): past it the ranks' own comparisons with the torch
    twin differ, and a data-dependent choice -- the localizer's replay of a
    failing step, say -- would send one rank into collectives the others never
    join, a hang until --rank-timeout."""

    STATE = ("first_mismatch_step", "checked_steps")

    def __init__(self, config, ranks: Ranks) -> None:
        self.config, self.ranks = config, ranks
        self.first_mismatch_step: int | None = None
        self.checked_steps = 0

    def after_step(self, record: StepRecord) -> None:
        if self.ranks.world_size == 1:
            return
        step = record.step
        digests = fingerprints(record.ck.replicated_params())
        self.checked_steps += 1
        if len(set(digests)) > 1:
            self.first_mismatch_step = step
            raise RanksDisagree(step)

    def report_into(self, result: dict) -> None:
        result["ranks"] = self.report()
        if result["ranks"]["replicated_params_identical"] is False and result["status"] == "pass":
            result.update(status="fail", pass_parity=False)
        result["env"]["world_size"] = self.ranks.world_size

    def report(self) -> dict:
        config = self.config
        return {"world_size": self.ranks.world_size, "tp": config.tp, "dp": config.dp,
                "replicated_params_identical": self.first_mismatch_step is None if self.checked_steps else None,
                "first_rank_mismatch_step": self.first_mismatch_step, "checked_steps": self.checked_steps}
