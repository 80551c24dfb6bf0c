"""Routing: which replica an arriving request goes to, decided at its arrival instant.

A router is a small object with ``route(request_index) -> replica``; policies that look at load read
the replicas' state as it is at that instant.
"""

from __future__ import annotations

from typing import Protocol

from simbatch import streams
from simbatch.config import Scenario


class Routable(Protocol):
    index: int
    num_waiting: int
    num_running: int
    kv_blocks_used: int


class RoundRobin:
    """Replicas in turn."""

    def __init__(self, replicas: list):
        self.replicas = replicas
        self._next = 0

    def route(self, request_index: int):
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica


class Random:
    """A uniformly random replica, from the seeded routing stream."""

    def __init__(self, replicas: list, seed: int):
        self.replicas = replicas
        self._rng = streams.rng(seed, streams.ROUTING)

    def route(self, request_index: int):
        return self.replicas[int(self._rng.integers(len(self.replicas)))]


def make_router(scenario: Scenario, replicas: list):
    policy = scenario.cluster.router
    if policy == "random":
        return Random(replicas, scenario.seed)
    return RoundRobin(replicas)
