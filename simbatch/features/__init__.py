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

Hooks (see :class:`Feature` for the exact contracts), in the order a step meets them, each where
vLLM V1's scheduler lets its KV cache manager, its KV connector or its LoRA bookkeeping act:

- rule 1, ``decode_tokens(req, spare)``: the tokens a decoding request computes this step beyond its
  own one (speculative decoding: its drafts);
- rule 3, the request at the head of WAITING, ``receives(req)``: whether its KV comes from elsewhere,
  to be received rather than computed (vLLM's KV connector with an asynchronous load); if so the
  scheduler holds it (a slot and the blocks of its KV, no budget) and tells ``receiving(req)``, which
  starts its transfer (disaggregated pools);
- rule 3, each waiting request, ``admits(req)``: whether this step can take it at all (multi-LoRA: at
  most ``max_loras`` adapters); a request it refuses is passed over, not waited for;
- rule 3, a request with nothing computed, ``lookup(req)``: how many of its prompt's tokens it may
  start from, computed already (vLLM's ``get_computed_blocks``: prefix caching, on the device and in
  the host tier), then ``take_cached(req, n)``: whether it fits on them with ``n`` more, and if so it
  takes them;
- rule 3, ``admitted(req)``: it was admitted, its blocks allocated (multi-LoRA: its adapter is in a
  slot; the host tier: the blocks it loads);
- the end of a step, ``prefill_computed(req)`` after each prefill chunk is computed (prefix caching:
  its full blocks become findable); ``applied(req, n)``: of the ``n`` tokens a decode computed, how
  many it keeps and emits (speculative decoding: one plus the drafts accepted); ``hands_off(req)``
  when a request samples its first token with more to come: whether it leaves to be decoded
  elsewhere, its blocks kept until its KV has left (a prefill replica);
- ``left(req)`` whenever a request leaves the running set: finished, preempted, or handed off;
- the loop, ``step_ms(plan)``: time the feature adds to a step (speculative decoding: the drafter's
  passes; the host tier: its loads);
- ``summary(requests)``: the keys it adds to a run's summary, with vLLM's names.

A feature that works on blocks does so through the replica's KV cache manager (``self.kv``, set when
the scheduler is built), which stays the only writer of blocks and computed tokens: prefix caching's
keys and sharing are :mod:`simbatch.memory.prefix_cache`'s, and the feature
(:mod:`simbatch.features.prefix_caching`) is the scheduler-side policy that calls them. Disaggregated
pools (:mod:`simbatch.features.disaggregation`) have a cluster side too, the dispatcher between the
pools (:mod:`simbatch.engine.disaggregated`), which routes and times what the feature starts.
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
    from simbatch.memory.kv import KVCacheManager
    from simbatch.model.step import StepPlan

HOOKS = ("decode_tokens", "receives", "receiving", "admits", "lookup", "take_cached", "admitted", "prefill_computed",
         "hands_off", "left", "applied", "step_ms")


class Feature:
    """A serving technique: its declarations, and the hooks it overrides (the others do nothing)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""  # one line, for the docs
    repeatable: ClassVar[bool] = True
    columns: ClassVar[tuple[tuple[str, str], ...]] = ()  # (Request attribute, numpy dtype)
    switch: ClassVar[str] = "features"  # the scenario setting that turns it on
    Options: ClassVar[type[BaseModel] | None] = None  # its options under features.<name>, validated by the schema
    examples: ClassVar[tuple[dict, ...]] = ({},)  # option sets that exercise it (the equivalence tests draw them)

    kv: KVCacheManager | None = None  # the replica's KV cache manager, set when its scheduler is built

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

    def receives(self, req: Request) -> bool:
        """Whether ``req``, at the head of WAITING, gets its KV from elsewhere instead of computing it.

        vLLM's scheduler asks its KV connector (``get_num_new_matched_tokens``) how many of a waiting
        request's tokens a remote worker holds, and whether they load asynchronously; such a request
        gets its blocks and waits for them (``WAITING_FOR_REMOTE_KVS``) without being scheduled. Here
        a request this says yes to is held, if a slot and the blocks of its computed tokens are free,
        without budget (it computes nothing yet), and :meth:`receiving` is told; if not, admission
        stops (it is the head: nobody overtakes it). It joins the running set once its KV is in
        (:meth:`~simbatch.schedulers.continuous.ContinuousScheduler.deliver`), at the next plan."""
        return False

    def receiving(self, req: Request) -> None:
        """``req``'s blocks are reserved on this replica (:meth:`receives`): its KV may start to come."""

    def lookup(self, req: Request) -> int:
        """Tokens of ``req``'s prompt, waiting with nothing computed, whose KV it may start from: it
        does not compute them. The feature keeps what it found for :meth:`take_cached`, which follows
        for the same request if it may be admitted (admission considers one request at a time).

        vLLM: ``kv_cache_manager.get_computed_blocks(request)``, the longest run of cached blocks
        from the start of its prompt (never its last token, whose logits must be computed). One
        enabled feature at most may define it."""
        return 0

    def take_cached(self, req: Request, num_new_tokens: int) -> bool:
        """Whether the device has room for ``req`` on the tokens :meth:`lookup` found and
        ``num_new_tokens`` more, and if so ``req`` takes them (they are its first blocks, computed);
        if not, nothing changes. vLLM's ``allocate_slots(request, num_new_tokens,
        new_computed_blocks=...)``, which refuses, or touches the cached blocks (off the free queue)
        and allocates; the scheduler allocates the new tokens' blocks after this."""
        return True

    def prefill_computed(self, req: Request) -> None:
        """A prefill chunk of ``req`` was computed in the step that ended (its ``num_computed_tokens``
        count it). vLLM's ``cache_blocks``: the full blocks of a prefix become findable by later
        lookups as soon as their KV exists."""

    def hands_off(self, req: Request) -> bool:
        """``req`` sampled its first token here and has more to generate: whether it leaves this
        replica to be decoded elsewhere. If so it leaves the running set as if finished, its blocks
        kept until its KV has been sent
        (:meth:`~simbatch.schedulers.continuous.ContinuousScheduler.release_sent`): vLLM's prefill
        instance finishes the request, and its KV connector's ``request_finished`` delays freeing its
        blocks until the decode instance has read them."""
        return False

    def applied(self, req: Request, n: int) -> int:
        """``req`` computed ``n`` decode tokens this step (its own and ``n - 1`` extra): how many it keeps
        and emits, at least one."""
        return n

    def step_ms(self, plan: StepPlan) -> float:
        """Time the feature adds to the step ``plan`` describes, ms. A feature whose time falls on steps
        that could repeat must declare ``repeatable = False``: a run of identical steps is costed by
        the cost model alone (:class:`~simbatch.model.cost.StepRun`)."""
        return 0.0

    def admits(self, req: Request) -> bool:
        """Whether the step being planned can take ``req``, waiting, in rule 3 (checked before its
        lookup and its blocks); a request refused is passed over, and later ones may be admitted.
        vLLM skips a request whose LoRA adapter would make the step's adapters more than
        ``max_loras``, whatever its policy, and tries the next."""
        return True

    def admitted(self, req: Request) -> None:
        """Rule 3 admitted ``req`` into the step being planned (its blocks are allocated), after
        :meth:`take_cached` if it started from cached tokens."""
        return None

    def left(self, req: Request) -> None:
        """``req`` left the running set: finished, preempted, or handed off (:meth:`hands_off`)."""
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


def defining(features: list[Feature], name: str) -> list[Feature]:
    """The features that override hook ``name``."""
    return [f for f in features if getattr(type(f), name) is not getattr(Feature, name)]


def hooks(features: list[Feature], name: str) -> tuple:
    """The bound ``name`` hooks of the features that override it."""
    return tuple(getattr(f, name) for f in defining(features, name))


def _load() -> None:
    """Import the feature modules, which register themselves (each imports the one registered before
    it, so that the order is the same whichever a process imports first: prefix_caching, speculative,
    host_tier, lora, disaggregation)."""
    from simbatch.features import disaggregation  # noqa: F401
