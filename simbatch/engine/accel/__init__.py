"""Accelerations of the engine: the same frames as the reference, bit for bit, in fewer events.

There is one engine loop (:mod:`simbatch.engine.replica`); what an acceleration changes sits behind
one seam, the :class:`Accelerator` the loop holds. It answers the loop's two questions: how many
steps like the one just planned run if nothing arrives (their durations summed exactly by the cost
model, :class:`~simbatch.model.cost.StepRun`), and how to apply ``n`` of them at once.

- :class:`Stepping` is the **null accelerator**, the reference engine (``sim.fast_forward:
  false``): the batching mode's own scheduler, the model, and one step at a time.
- :func:`engine_scheduler` gives the accelerated engine: the batching mode's accelerated *twin* of
  its scheduler (attached to the mode in :data:`simbatch.registry.MODES`), which plans the very same
  steps at a cost that follows what changes in a step rather than the batch, and takes runs of
  identical steps in one go: lockstep decodes for continuous batching (:mod:`.lockstep`), a batch's
  decode steps for request-level batching (:mod:`.batches`). A lone replica may also run ahead of
  SimPy's clock (the loop's ``run_ahead``).

Where an acceleration has nothing to gain it declines, and the model's rules run as written: a
feature that makes consecutive steps differ (speculative decoding's random acceptances) says so in
its declaration (:mod:`simbatch.features`), and its requests are planned one at a time.
"""

from __future__ import annotations

from typing import Protocol

from simbatch.config import Scenario
from simbatch.engine.accel import batches, lockstep  # noqa: F401  (they attach the twins)
from simbatch.model.step import StepOutcome, StepPlan
from simbatch.registry import MODES
from simbatch.schedulers import make_scheduler
from simbatch.schedulers.base import BaseScheduler


class Accelerator(Protocol):
    """What the engine loop asks beyond ``schedule`` and ``finish_step``."""

    def repeatable_steps(self, plan: StepPlan, step: int) -> int:
        """How many consecutive steps identical to ``plan`` (itself included) run if nothing arrives."""

    def plan_survives_arrivals(self) -> bool:
        """Whether the run planned last goes on unchanged now that requests have arrived mid-run."""

    def finish_steps(self, plan: StepPlan, n: int, end_s: float, step: int) -> StepOutcome:
        """Apply ``n`` repeats of ``plan`` (``step`` is the first one's number, ``end_s`` the last one's end)."""

    def kv_blocks_during(self, i: int) -> int:
        """Device blocks in use during the ``i``-th step (1-based) of the run planned last."""

    def kv_blocks_sum(self, n: int) -> int:
        """Sum over the first ``n`` steps of the run planned last of the blocks in use."""


class Stepping:
    """The null accelerator: every plan is one step (the reference engine)."""

    __slots__ = ("scheduler",)

    def __init__(self, scheduler: BaseScheduler):
        self.scheduler = scheduler

    def repeatable_steps(self, plan: StepPlan, step: int) -> int:
        return 1

    def plan_survives_arrivals(self) -> bool:
        return False

    def finish_steps(self, plan: StepPlan, n: int, end_s: float, step: int) -> StepOutcome:
        assert n == 1, "the reference engine applies one step at a time"
        return self.scheduler.finish_step(plan, end_s, step)

    def kv_blocks_during(self, i: int) -> int:
        return self.scheduler.kv_blocks_used

    def kv_blocks_sum(self, n: int) -> int:
        return n * self.scheduler.kv_blocks_used


def engine_scheduler(scenario: Scenario, tenant_names: tuple[str, ...] = ("default",),
                     accelerated: bool | None = None) -> tuple[BaseScheduler, Accelerator]:
    """The scheduler one engine of ``scenario`` runs, and its accelerator: the model's scheduler and
    the null accelerator for the reference engine, the batching mode's twin (attached to the mode in
    :data:`simbatch.registry.MODES`; its own accelerator) otherwise. A mode with no twin runs the
    reference engine either way. ``accelerated`` defaults to ``sim.fast_forward``."""
    if accelerated is None:
        accelerated = scenario.sim.fast_forward
    twin = MODES.find(scenario.batching.mode, "twin") if accelerated else None
    if twin is None:
        model = make_scheduler(scenario, tenant_names)
        return model, Stepping(model)
    scheduler = make_scheduler(scenario, tenant_names, twin)
    return scheduler, scheduler
