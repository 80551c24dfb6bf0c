"""Batching modes: plain-Python schedulers behind one interface (see :mod:`.base`)."""

from simbatch.config import Scenario
from simbatch.kv import KVCacheManager
from simbatch.policies import make_queue
from simbatch.schedulers.base import BaseScheduler, StepOutcome, StepPlan
from simbatch.schedulers.continuous import ContinuousScheduler
from simbatch.schedulers.request_level import RequestLevelScheduler


def make_scheduler(scenario: Scenario, tenant_names: tuple[str, ...] = ("default",)) -> BaseScheduler:
    """A fresh scheduler with its own KV cache and waiting queue, for one engine."""
    kv = KVCacheManager(scenario.kv_cache)
    waiting = make_queue(scenario.scheduler, tenant_names)
    cls = ContinuousScheduler if scenario.batching.mode == "continuous" else RequestLevelScheduler
    return cls(scenario, kv, waiting)


__all__ = ["BaseScheduler", "ContinuousScheduler", "RequestLevelScheduler", "StepOutcome", "StepPlan",
           "make_scheduler"]
