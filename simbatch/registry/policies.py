"""Queue policies: who is served next from WAITING, and who is evicted from RUNNING.

A policy is a :class:`Policy` in :data:`POLICIES`: plain *key functions* and the properties the
schedulers and the accelerated engine read instead of its name. The waiting request with the
smallest key goes first, and among running requests the one with the largest victim key is
preempted first. Every key ends with the request id (its arrival sequence number), so ties are
broken the same way in every run, and a key without its last element is the request's *level*.

Keys are functions of the request alone, computed once when it joins WAITING: a policy's order of
the waiting requests never changes while they wait. That is what lets WAITING be a heap, and a run
of identical steps go on unchanged until something arrives (:mod:`simbatch.engine.accel`).

- ``fcfs``: arrival order. Preempted requests keep their key: with head-of-line blocking FCFS admits
  in arrival order, so a preempted request arrived before anything still waiting and returns to the
  front (as vLLM V1 puts it); with backfilling, older requests that were passed over stay ahead of it.
- ``priority``: lower value first, arrival breaks ties. With ``aging_s``, a waiting request's
  effective priority drops by one level every ``aging_s`` seconds it waits. All waiting requests age
  at the same rate, so their order depends only on ``priority + arrival_s / aging_s``: a static key,
  and no rescans as time passes.
- ``sjf``: shortest prompt first, or shortest true output (``sjf_key: output``): the latter is an
  oracle no real server has, an upper bound on what length prediction could buy.
- ``fair``: weighted fair share of running slots: the next request comes from the tenant with the
  fewest running requests per unit of weight; FCFS within a tenant (its queue structure,
  ``tenant_share``, is :class:`simbatch.schedulers.policies.FairQueue`).

Victims: the worst key under ``priority`` (worst priority, then the newest arrival); the newest
admitted (LIFO, cheapest to recompute) under every other policy. A request only ever evicts one ranked
below it; ``scheduler.max_preemptions`` protects a request preempted that often, unless every running
request is stalled on memory, when the lowest-ranked goes all the same.

Why here, below the schema: :mod:`simbatch.config` validates ``scheduler.policy`` against this
registry and lists it in the generated docs, so the declarations must be importable without the
schedulers; and the keys are pure maths on a request's fields, so the whole policy lives here. The
queue structures are the schedulers' (:mod:`simbatch.schedulers.policies`), chosen by the declared
``queue``. A new policy is one :meth:`~simbatch.registry.base.Registry.register` call
(docs/extending.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simbatch.registry.base import Registry

Key = Callable[[Any], tuple]
"""A request -> its sort key (a tuple ending with its request id)."""


@dataclass(frozen=True, eq=False)
class Policy:
    """One queue policy: its keys, and what it declares about them."""

    name: str
    description: str
    waiting_key: Callable[[Any], Key]
    """The ``scheduler`` section -> the order of WAITING (smallest first)."""
    victim_key: Callable[[Any], Key] | None = None
    """The ``scheduler`` section -> the order of RUNNING for preemption (largest first); None: the newest
    admitted first, whatever the key (the schedulers then scan RUNNING from its end)."""
    evicts_at_admission: bool = False
    """A waiting request that does not fit may preempt a running one of strictly worse level."""
    arrival_order: bool = False
    """Keys grow with arrival: a request that arrives goes behind every request already waiting, so
    with head-of-line blocking it cannot be admitted while an older one waits at the head."""
    queue: str = "keyed"
    """The structure WAITING needs: ``keyed`` (a heap on the waiting key), ``tenant_share`` (per tenant)."""
    reads: Mapping[str, str] = field(default_factory=dict)
    """The ``scheduler`` keys it reads, each with what it does there (under another policy they do nothing)."""
    vllm: str | None = None
    """vLLM's ``--scheduling-policy`` of the same meaning, when vLLM has one."""


POLICIES: Registry[Policy] = Registry("queue policy", "scheduler.policy")


def _by_arrival(cfg) -> Key:
    return lambda r: (r.request_id,)


def _by_priority(cfg) -> Key:
    if cfg.aging_s is None:
        return lambda r: (r.priority, r.request_id)
    aging = cfg.aging_s
    return lambda r: (r.priority + r.arrival_s / aging, r.request_id)


def _priority_victims(cfg) -> Key:
    order = _by_priority(cfg)
    return lambda r: (*order(r), r.admitted_seq)


def _by_length(cfg) -> Key:
    if cfg.sjf_key == "output":
        return lambda r: (r.output_tokens, r.request_id)
    return lambda r: (r.prompt_tokens, r.request_id)


POLICIES.register(Policy(
    "fcfs", "First come, first served: arrival order (vLLM's default).",
    _by_arrival, arrival_order=True, vllm="fcfs"))
POLICIES.register(Policy(
    "priority", "Lower priority value first, arrival breaks ties; evicts a running request of worse priority.",
    _by_priority, _priority_victims, evicts_at_admission=True, reads={"aging_s": "it ages priorities"},
    vllm="priority"))
POLICIES.register(Policy(
    "sjf", "Shortest job first: shortest prompt, or shortest true output (an oracle).",
    _by_length, reads={"sjf_key": "it picks the length sjf orders by"}))
POLICIES.register(Policy(
    "fair", "Weighted fair share of running slots across tenants, FCFS within a tenant.",
    _by_arrival, queue="tenant_share", reads={"tenant_weights": "they weight the tenants' shares"}))
