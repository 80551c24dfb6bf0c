"""Serving techniques beyond plain batching: one module each, behind one seam.

A feature is a :class:`Feature` subclass registered here with :func:`register`. It says when a
scenario turns it on (:meth:`Feature.enabled`), declares what the engine may assume about it, and
offers hooks that the continuous scheduler (the model, :mod:`simbatch.schedulers.continuous`) calls
at its rules' points. A hook a feature leaves alone costs nothing: the scheduler calls only the hooks
its enabled features define, gathered once when it is built.

Declarations:

- ``repeatable``: whether consecutive steps a feature takes part in can be identical. When any
  enabled feature says no (speculative decoding: every step accepts a random number of drafts), the
  accelerated engine plans every step by the model's rules, one request at a time, and never takes a
  run of steps in one go; it reads the declaration, never a feature's name.
- ``columns``: per-request counters, attributes of :class:`~simbatch.model.request.Request` the
  recorder keeps and the requests frame shows.

Hooks (see :class:`Feature` for the exact contracts):

- ``decode_tokens(req, spare)`` in rule 1: the tokens a decoding request computes this step beyond
  its own one (speculative decoding: its drafts);
- ``applied(req, n)`` when a step ends: of the ``n`` tokens a decode computed, how many it keeps and
  emits (speculative decoding: one plus the drafts accepted);
- ``step_ms(plan)``: time the feature adds to a step (speculative decoding: the drafter's passes);
- ``summary(requests)``: the keys it adds to a run's summary, with vLLM's names.

Prefix caching and disaggregated prefill/decode cut deeper: the one is how the KV manager keys and
shares blocks (:mod:`simbatch.memory.prefix_cache`), the other how a cluster's pools hand requests over
(:mod:`simbatch.engine.disaggregated`); their feature classes carry their declarations and summary
keys, and the scheduler reaches their mechanics through the KV manager and the hand-over calls.
docs/extending.md walks through adding a feature.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import pandas as pd

    from simbatch.config import Scenario
    from simbatch.model.request import Request
    from simbatch.schedulers.base import StepPlan

HOOKS = ("decode_tokens", "applied", "step_ms")


class Feature(ABC):
    """A serving technique: its declarations, and the hooks it overrides (the others do nothing)."""

    name: ClassVar[str] = ""
    repeatable: ClassVar[bool] = True
    columns: ClassVar[tuple[tuple[str, str], ...]] = ()  # (Request attribute, numpy dtype)

    def __init__(self, scenario: Scenario):
        self.scenario = scenario

    @staticmethod
    @abstractmethod
    def enabled(scenario: Scenario) -> bool:
        """Whether ``scenario`` (one replica's) turns the feature on."""

    def decode_tokens(self, req: Request, spare: int) -> int:
        """Tokens ``req``, decoding, computes this step beyond its own one: at most ``spare`` (what the
        budget leaves once every later decode of the step has its own token)."""
        return 0

    def applied(self, req: Request, n: int) -> int:
        """``req`` computed ``n`` decode tokens this step (its own and ``n - 1`` extra): how many it keeps
        and emits, at least one."""
        return n

    def step_ms(self, plan: StepPlan) -> float:
        """Time the feature adds to the step ``plan`` describes, ms. A feature whose time falls on steps
        that could repeat must declare ``repeatable = False``: a run of identical steps is costed by
        the cost model alone (:class:`~simbatch.model.cost.StepRun`)."""
        return 0.0

    @staticmethod
    def summary(requests: pd.DataFrame) -> dict[str, float]:
        """The keys the feature adds to a run's summary (over every request of the frame)."""
        return {}


REGISTRY: dict[str, type[Feature]] = {}


def register(cls: type[Feature]) -> type[Feature]:
    """Register a feature class (a class decorator) under its ``name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"a feature needs a name of its own: {cls.name!r}")
    if getattr(cls.enabled, "__isabstractmethod__", False):
        raise TypeError(f"feature {cls.name} must say when a scenario enables it (enabled)")
    REGISTRY[cls.name] = cls
    return cls


def features_for(scenario: Scenario) -> list[Feature]:
    """The enabled features of one replica's scenario, in registration order, built for it."""
    _load()
    return [cls(scenario) for cls in REGISTRY.values() if cls.enabled(scenario)]


def feature_classes(scenarios: list[Scenario]) -> list[type[Feature]]:
    """The features any of these (replicas') scenarios enables, in registration order."""
    _load()
    return [cls for cls in REGISTRY.values() if any(cls.enabled(s) for s in scenarios)]


def hooks(features: list[Feature], name: str) -> tuple:
    """The bound ``name`` hooks of the features that override it."""
    return tuple(getattr(f, name) for f in features if getattr(type(f), name) is not getattr(Feature, name))


def _load() -> None:
    """Import the feature modules, which register themselves."""
    from simbatch.features import speculative  # noqa: F401
