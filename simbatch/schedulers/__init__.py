"""Batching modes: plain-Python schedulers behind one interface (see :mod:`.base`).

Each mode of :data:`simbatch.registry.MODES` has its scheduler class attached to its name where the
class is defined (:mod:`.continuous`, :mod:`.request_level`); a mode of your own attaches its own
(docs/extending.md).
"""

from simbatch.config import Scenario
from simbatch.memory.kv import KVCacheManager
from simbatch.registry import MODES
from simbatch.schedulers.base import BaseScheduler
from simbatch.schedulers.continuous import ContinuousScheduler
from simbatch.schedulers.policies import make_queue
from simbatch.schedulers.request_level import RequestLevelScheduler


def scheduler_class(scenario: Scenario) -> type[BaseScheduler]:
    """The model's scheduler for the scenario's batching mode."""
    return MODES.attached(scenario.batching.mode, "scheduler")


def make_scheduler(scenario: Scenario, tenant_names: tuple[str, ...] = ("default",),
                   cls: type[BaseScheduler] | None = None) -> BaseScheduler:
    """A fresh scheduler of the scenario's batching mode, with its own KV cache and waiting queue,
    for one engine: the model's own (``cls``: an accelerated twin of it, from :mod:`simbatch.engine.accel`)."""
    kv = KVCacheManager(scenario.kv_cache)
    waiting = make_queue(scenario.scheduler, tenant_names)
    return (cls or scheduler_class(scenario))(scenario, kv, waiting)


__all__ = ["BaseScheduler", "ContinuousScheduler", "RequestLevelScheduler", "make_scheduler", "scheduler_class"]
