"""The cluster: which replicas it has, and which one an arriving request goes to.

A router is a small object with ``route(request_index, replicas) -> int``: given the request's
index in the workload and what it can see of the replicas, it answers a replica index. It reads a
replica only through ``index``, ``num_running``, ``num_waiting``, ``kv_blocks_used`` and
``kv_blocks_total``, so the same router runs on live replicas, on delayed snapshots of them
(:class:`Load`, for ``cluster.signal_delay_ms``) and on hand-built objects in tests. Every tie goes
to the lowest replica index, and every random draw comes from the seeded routing stream, so a
scenario routes identically on every run.

Each router is declared in :data:`simbatch.registry.ROUTERS` (whether it reads load, draws at random,
reads sessions) and its class attached to its name below. Policies, from blind to informed:

- ``round_robin``: replicas in turn.
- ``random``: uniformly at random. Poisson traffic split at random is Poisson on every replica at
  rate lambda/N (thinning), so each replica behaves as a single server at lambda/N.
- ``least_outstanding``: fewest requests in the replica, running + waiting: the work it holds, not
  only its queue (join the shortest queue).
- ``least_kv``: lowest fraction of KV blocks in use. Blind to waiting requests, which hold no
  blocks, so it sees a burst only once the replica has started serving it.
- ``power_of_two``: two distinct replicas drawn at random, the one with fewer outstanding requests
  (Mitzenmacher's "power of two choices": nearly the balance of least_outstanding while reading
  only two replicas).
- ``session_affinity``: a session's first request goes where least_outstanding says, and every
  later request of that session follows it (a warm prefix cache in a real server).
- ``session``: the same by *conversation* (the workload's prefix stream: a multi-turn conversation,
  or a trace's session): a conversation's turns stay on the replica its first turn went to, a new
  conversation (one that started over past ``max_context_tokens``, too) is placed by
  least_outstanding, and a request outside any conversation goes where least_outstanding says.
- ``prefix_affinity``: llm-d's blend of a prefix-cache scorer and a queue scorer. Each replica
  scores ``prefix_weight x hit + queue_weight x (q_max - q) / (q_max - q_min)``, ``hit`` the share of
  the request's prompt tokens that replica holds cached (the longest run of its blocks from the
  first, as its own prefix cache would find them), ``q`` its waiting requests (1 for all when they
  are equal), and the highest score wins. SGLang's cache-aware router's two guards are keys: a hit
  below ``cache_threshold`` counts 0, and an imbalanced fleet (outstanding requests differing by more
  than ``balance_abs_threshold`` and by a factor above ``balance_rel_threshold``) goes to the least
  outstanding replica whatever is cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from simbatch.config import Scenario
from simbatch.config.cluster import PrefixAffinity as PrefixAffinitySpec
from simbatch.model import streams
from simbatch.registry import ROUTERS
from simbatch.workload import WorkloadArrays
from simbatch.workload.prefix import OWN_STREAM


class Routable(Protocol):
    """What a router may read about a replica."""

    index: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int


@dataclass(frozen=True, slots=True)
class Load:
    """A replica's routing signals at one instant: what a router with a delayed view reads."""

    index: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int

    @classmethod
    def of(cls, replica: Routable) -> Load:
        return cls(replica.index, replica.num_running, replica.num_waiting, replica.kv_blocks_used,
                   replica.kv_blocks_total)


def outstanding(replica: Routable) -> tuple[int, int]:
    """Sort key: requests in the replica (running + waiting), then its index."""
    return replica.num_running + replica.num_waiting, replica.index


def kv_usage(replica: Routable) -> tuple[float, int]:
    """Sort key: fraction of the replica's KV blocks in use, then its index."""
    return replica.kv_blocks_used / replica.kv_blocks_total, replica.index


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        chosen = replicas[self._next % len(replicas)].index
        self._next += 1
        return chosen


class Random:
    def __init__(self, rng: np.random.Generator):
        self._rng = rng

    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        return replicas[int(self._rng.integers(len(replicas)))].index


class LeastOutstanding:
    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        return min(replicas, key=outstanding).index


class LeastKV:
    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        return min(replicas, key=kv_usage).index


class PowerOfTwo:
    def __init__(self, rng: np.random.Generator):
        self._rng = rng

    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        n = len(replicas)
        if n == 1:
            return replicas[0].index
        # A uniform pair of distinct replicas from two draws: the second skips over the first.
        a = int(self._rng.integers(n))
        b = int(self._rng.integers(n - 1))
        b += b >= a
        return min(replicas[a], replicas[b], key=outstanding).index


class SessionAffinity:
    """Sticky by session id; a session's first request is placed by least_outstanding."""

    def __init__(self, session: np.ndarray):
        self._session = session
        self._home: dict[int, int] = {}
        self._first = LeastOutstanding()

    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        session = int(self._session[request_index])
        home = self._home.get(session)
        # A home an autoscaler drained is gone: the session moves (its cache with it, in a real fleet).
        if home is None or not any(r.index == home for r in replicas):
            home = self._home[session] = self._first.route(request_index, replicas)
        return home


class Session(SessionAffinity):
    """Sticky by conversation (built with the prefix streams as its sessions); a request outside any
    conversation is placed by least_outstanding, as is a conversation's first turn."""

    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        if self._session[request_index] == OWN_STREAM:
            return self._first.route(request_index, replicas)
        return super().route(request_index, replicas)


class Probe(NamedTuple):
    """A request not yet created, as a prefix cache reads one (simbatch.memory.kv.content_of)."""

    request_id: int
    prompt_tokens: int
    prefix_stream: int
    shared_prefix_tokens: int
    block_hashes: np.ndarray | None
    hash_block_tokens: int
    num_generated: int = 0

    @classmethod
    def of(cls, wl: WorkloadArrays, i: int) -> Probe:
        hashes = wl.hashes
        return cls(i, int(wl.prompt_tokens[i]), int(wl.prefix_stream[i]), int(wl.shared_prefix_tokens[i]),
                   None if hashes is None else hashes.of(i), 0 if hashes is None else hashes.block_tokens)


class PrefixAffinity:
    """llm-d's prefix-cache and queue scorers, weighted, with SGLang's guards (module docstring).

    Reads each replica's prefix cache through ``prefix_hit_tokens(probe)`` (a live replica only: the
    cluster refuses ``signal_delay_ms`` with this router), ``probe`` the request as its prefix cache
    would see it on arrival (:class:`Probe`)."""

    def __init__(self, spec: PrefixAffinitySpec, workload: WorkloadArrays):
        self._spec, self._wl = spec, workload

    def route(self, request_index: int, replicas: Sequence[Routable]) -> int:
        spec = self._spec
        if spec.balance_abs_threshold is not None:
            loads = [r.num_running + r.num_waiting for r in replicas]
            lo, hi = min(loads), max(loads)
            if hi - lo > spec.balance_abs_threshold and hi > spec.balance_rel_threshold * lo:
                return min(replicas, key=outstanding).index
        waits = [r.num_waiting for r in replicas]
        lo, hi = min(waits), max(waits)
        probe = Probe.of(self._wl, request_index)
        best, best_score = replicas[0].index, -1.0
        for r, q in zip(replicas, waits, strict=True):
            hit = r.prefix_hit_tokens(probe) / probe.prompt_tokens if spec.prefix_weight else 0.0
            if hit < spec.cache_threshold:
                hit = 0.0
            score = spec.prefix_weight * hit + spec.queue_weight * (1.0 if hi == lo else (hi - q) / (hi - lo))
            if score > best_score:  # ties: the first, the lowest index
                best, best_score = r.index, score
        return best


ROUTERS.attach("round_robin", router=RoundRobin)
ROUTERS.attach("random", router=Random)
ROUTERS.attach("least_outstanding", router=LeastOutstanding)
ROUTERS.attach("least_kv", router=LeastKV)
ROUTERS.attach("power_of_two", router=PowerOfTwo)
ROUTERS.attach("session_affinity", router=SessionAffinity)


ROUTERS.attach("session", router=Session)
ROUTERS.attach("prefix_affinity", router=PrefixAffinity)


def make_router(scenario: Scenario, session: np.ndarray, policy: str | None = None, stream: int = streams.ROUTING,
                workload: WorkloadArrays | None = None):
    """The router ``scenario.cluster.router`` (or ``policy``) names, built with what it declares it reads:
    ``rng`` drawing from random ``stream``, ``session`` each request's session id, ``conversation`` each
    request's prefix stream, and (reading the caches) ``spec`` its options and ``workload`` the requests."""
    name = policy or scenario.cluster.router
    declared = ROUTERS[name]
    kwargs = {}
    if declared.random:
        kwargs["rng"] = streams.rng(scenario.seed, stream)
    if declared.sessions:
        kwargs["session"] = session
    if declared.conversations:
        kwargs["session"] = workload.prefix_stream
    if declared.reads_cache:
        kwargs["spec"], kwargs["workload"] = scenario.cluster.prefix_affinity or PrefixAffinitySpec(), workload
    return ROUTERS.attached(name, "router")(**kwargs)
