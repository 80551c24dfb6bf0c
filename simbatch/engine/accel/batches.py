"""Request-level batching, accelerated: a batch's decode steps taken as one run.

A static or dynamic batch's membership is frozen and its memory reserved whole at its start
(:mod:`simbatch.schedulers.request_level`), so between its prefill and its next finishing request
every decode step is the same step: :class:`BatchRuns` says how many, and applies them at once, each
running request ``n`` tokens further, with exactly the state stepping one at a time leaves.

It overrides only the accelerator's calls, so it is the twin of any request-level scheduler that keeps
those two rules and changes when a batch forms: ``class Twin(BatchRuns, YourScheduler)`` (docs/extending.md).
"""

from __future__ import annotations

from simbatch.model.step import StepOutcome, StepPlan
from simbatch.registry import MODES
from simbatch.schedulers.request_level import RequestLevelScheduler


class BatchRuns(RequestLevelScheduler):
    """The request-level scheduler with runs of a batch's identical decode steps (its own accelerator)."""

    __slots__ = ()

    def repeatable_steps(self, plan: StepPlan, step: int) -> int:
        """A batch's decode steps repeat until its next request finishes; memory is reserved up front."""
        if not self._prefilled:
            return 1
        return min(r.output_tokens - r.num_generated for r in self.running)

    def plan_survives_arrivals(self) -> bool:
        return True  # a running batch's membership is frozen

    def kv_blocks_during(self, i: int) -> int:
        return self.kv.device.num_used  # reserved for the whole batch at its start

    def kv_blocks_sum(self, n: int) -> int:
        return n * self.kv.device.num_used

    def finish_steps(self, plan: StepPlan, n: int, end_s: float, step: int) -> StepOutcome:
        if n == 1:
            return self.finish_step(plan, end_s, step)
        outcome = StepOutcome([], n * plan.decode_seqs, [])
        self.kv.computed_each(self.running, n)
        for req in self.running:
            req.num_generated += n
            req.last_token_s = end_s
            req.last_token_step = step + n - 1
        return self._settle(end_s, outcome)


MODES.attach("static", twin=BatchRuns)
MODES.attach("dynamic", twin=BatchRuns)
