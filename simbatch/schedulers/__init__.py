"""Batching modes: plain-Python schedulers behind one interface (see :mod:`.base`)."""

from simbatch.config import Scenario
from simbatch.kv import KVCacheManager
from simbatch.policies import make_queue
from simbatch.schedulers.base import IDLE, Answer, BaseScheduler, Idle, SleepUntil, StepOutcome, StepPlan
from simbatch.schedulers.continuous import ContinuousScheduler
from simbatch.schedulers.lockstep import LockstepScheduler
from simbatch.schedulers.request_level import RequestLevelScheduler


def make_scheduler(scenario: Scenario, tenant_names: tuple[str, ...] = ("default",)) -> BaseScheduler:
    """A fresh scheduler with its own KV cache and waiting queue, for one engine.

    Continuous batching is the plain model under ``sim.fast_forward: false`` and its accelerated
    twin, the lockstep scheduler, otherwise.
    """
    kv = KVCacheManager(scenario.kv_cache)
    waiting = make_queue(scenario.scheduler, tenant_names)
    if scenario.batching.mode != "continuous":
        cls = RequestLevelScheduler
    else:
        cls = LockstepScheduler if scenario.sim.fast_forward else ContinuousScheduler
    return cls(scenario, kv, waiting)


__all__ = ["IDLE", "Answer", "BaseScheduler", "ContinuousScheduler", "Idle", "SleepUntil", "LockstepScheduler", "RequestLevelScheduler", "StepOutcome", "StepPlan",
           "make_scheduler"]
