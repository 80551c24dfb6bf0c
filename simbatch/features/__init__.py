"""Serving techniques beyond plain batching: one module each, behind one seam.

A feature is a :class:`Feature` subclass registered with :func:`register` in
:data:`simbatch.registry.FEATURES`, as the other registries' entries are: a ``name``, a one-line
``description``, and declarations the engine reads instead of the name. It says when a scenario
turns it on (:meth:`Feature.enabled`), and offers hooks that the continuous scheduler (the model,
:mod:`simbatch.schedulers.continuous`) calls at its rules' points. A hook a feature leaves alone
costs nothing: the scheduler calls only the hooks its enabled features define, gathered once when it
is built. Features run in iteration-level batching modes (``BatchingMode.iteration_level``).

Declarations:

- ``repeatable``: whether consecutive steps a feature takes part in can be identical. When any
  enabled feature says no (speculative decoding: every step accepts a random number of drafts), the
  accelerated engine plans every step by the model's rules, one request at a time, and never takes a
  run of steps in one go; it reads the declaration, never a feature's name.
- ``columns``: per-request counters, attributes of :class:`~simbatch.model.request.Request` the
  recorder keeps and the requests frame shows.
- ``switch``: the scenario setting that turns it on (the shipped ones have their own, with vLLM's
  names: ``device.speculative``); a feature of your own is turned on by name in the scenario's
  ``features`` section, with the options its ``Options`` model (pydantic) declares, which the schema
  validates and the feature reads as ``self.options``.

Hooks (see :class:`Feature` for the exact contracts):

- ``decode_tokens(req, spare)`` in rule 1: the tokens a decoding request computes this step beyond
  its own one (speculative decoding: its drafts);
- ``applied(req, n)`` when a step ends: of the ``n`` tokens a decode computed, how many it keeps and
  emits (speculative decoding: one plus the drafts accepted);
- ``step_ms(plan)``: time the feature adds to a step (speculative decoding: the drafter's passes);
- ``admits(req)`` in rule 3, before a waiting request's cache lookup: whether this step can take it
  (multi-LoRA: at most ``max_loras`` adapters); a request it refuses is passed over, not waited for;
- ``admitted(req)`` once rule 3 has admitted it, and ``left(req)`` when it leaves the running set
  (finished, preempted, handed off);
- ``summary(requests)``: the keys it adds to a run's summary, with vLLM's names.

Prefix caching and disaggregated prefill/decode cut deeper: the one is how the KV manager keys and
shares blocks (:mod:`simbatch.memory.prefix_cache`), the other how a cluster's pools hand requests over
(:mod:`simbatch.engine.disaggregated`); their feature classes carry their declarations and summary
keys, and the scheduler reaches their mechanics through the KV manager and the hand-over calls.
docs/extending.md walks through adding a feature.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel

from simbatch.model.request import Request
from simbatch.registry import FEATURES

if TYPE_CHECKING:
    import pandas as pd

    from simbatch.config import Scenario
    from simbatch.model.step import StepPlan

HOOKS = ("decode_tokens", "applied", "step_ms", "admits", "admitted", "left")


class Feature:
    """A serving technique: its declarations, and the hooks it overrides (the others do nothing)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line, for the docs
    repeatable: ClassVar[bool] = True
    columns: ClassVar[tuple[tuple[str, str], ...]] = ()  # (Request attribute, numpy dtype)
    switch: ClassVar[str] = "features"  # the scenario setting that turns it on
    Options: ClassVar[type[BaseModel] | None] = None  # its options under features.<name>, validated by the schema
    examples: ClassVar[tuple[dict, ...]] = ({},)  # option sets that exercise it (the equivalence tests draw them)

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self.options = None if self.Options is None else self.Options.model_validate(scenario.features[self.name])

    @classmethod
    def enabled(cls, scenario: Scenario) -> bool:
        """Whether ``scenario`` (one replica's) turns the feature on: by default, when its ``features``
        section names it. A feature with a setting of its own (``switch``) reads that instead."""
        return cls.name in scenario.features

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
    def admits(self, req: Request) -> bool:
        """Whether the step being planned can take ``req``, waiting, in rule 3 (checked before its
        lookup and its blocks); a request refused is passed over, and later ones may be admitted."""
        return True

    def admitted(self, req: Request) -> None:
        """Rule 3 admitted ``req`` into the step being planned (its blocks are allocated)."""
        return None

    def left(self, req: Request) -> None:
        """``req`` left the running set: finished, preempted, or handed off to a decode replica."""
        return None

    @staticmethod
    def summary(requests: pd.DataFrame) -> dict[str, float]:
        """The keys the feature adds to a run's summary (over every request of the frame)."""
        return {}


def register(cls: type[Feature]) -> type[Feature]:
    """Register a feature class (a class decorator) under its ``name``."""
    if cls.switch != "features" and getattr(cls.enabled, "__func__", None) is Feature.enabled.__func__:
        raise TypeError(f"feature {cls.name} is turned on by {cls.switch}: it must say how it reads it (enabled)")
    if not (isinstance(cls.repeatable, bool) and all(hasattr(Request, a) for a, _ in cls.columns)):
        raise TypeError(f"feature {cls.name}: repeatable must be a bool, and each column an attribute of Request")
    return FEATURES.register(cls)


def features_for(scenario: Scenario) -> list[Feature]:
    """The enabled features of one replica's scenario, in registration order, built for it."""
    _load()
    return [cls(scenario) for cls in FEATURES if cls.enabled(scenario)]


def feature_classes(scenarios: list[Scenario]) -> list[type[Feature]]:
    """The features any of these (replicas') scenarios enables, in registration order."""
    _load()
    return [cls for cls in FEATURES if any(cls.enabled(s) for s in scenarios)]


def hooks(features: list[Feature], name: str) -> tuple:
    """The bound ``name`` hooks of the features that override it."""
    return tuple(getattr(f, name) for f in features if getattr(type(f), name) is not getattr(Feature, name))


def _load() -> None:
    """Import the feature modules, which register themselves."""
    from simbatch.features import lora  # noqa: F401  (it imports the others first: speculative, host_tier)
