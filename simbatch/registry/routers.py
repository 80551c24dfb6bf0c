"""Routers: which replica an arriving request goes to (``cluster.router``, ``disaggregated.decode_router``).

A router is a :class:`RoutingPolicy` in :data:`ROUTERS`, with its class attached by name (role
``router``) in :mod:`simbatch.engine.router`, where each is described. What the rest reads instead
of a router's name:

- ``reads_load``: it reads the replicas' state (running, waiting, KV in use), so
  ``cluster.signal_delay_ms`` applies to it; a scenario setting a delay for a router that reads no
  load is refused;
- ``random``: it draws from the scenario's routing stream (built with ``rng=``);
- ``sessions``: it reads each request's session id (built with ``session=``);
- ``conversations``: it reads each request's conversation, its prefix stream (built with ``session=``
  holding those);
- ``reads_cache``: it reads the replicas' prefix caches, live (built with ``spec=`` its options and
  ``workload=`` the requests), so no ``cluster.signal_delay_ms`` applies to it.

The declarations live below the schema, which validates the names; the classes above it, in the
engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from simbatch.registry.base import Registry


@dataclass(frozen=True, eq=False)
class RoutingPolicy:
    """One router: what it declares (its class is attached to its name)."""

    name: str
    description: str
    reads_load: bool = False
    random: bool = False
    sessions: bool = False
    conversations: bool = False
    reads_cache: bool = False


ROUTERS: Registry[RoutingPolicy] = Registry("router", "cluster.router")

ROUTERS.register(RoutingPolicy("round_robin", "Replicas in turn."))
ROUTERS.register(RoutingPolicy("random", "Uniformly at random.", random=True))
ROUTERS.register(RoutingPolicy("least_outstanding", "Fewest requests running + waiting (join the shortest queue).",
                               reads_load=True))
ROUTERS.register(RoutingPolicy("least_kv", "Lowest fraction of KV blocks in use.", reads_load=True))
ROUTERS.register(RoutingPolicy("power_of_two", "Two replicas at random, the one with fewer outstanding requests.",
                               reads_load=True, random=True))
ROUTERS.register(RoutingPolicy(
    "session_affinity", "A session sticks to the replica its first request went to (placed by least_outstanding).",
    reads_load=True, sessions=True))

ROUTERS.register(RoutingPolicy(
    "session", "A conversation sticks to the replica its first turn went to (placed by least_outstanding).",
    reads_load=True, conversations=True))
ROUTERS.register(RoutingPolicy(
    "prefix_affinity", "The replica holding most of the prompt cached, scored against its waiting queue (llm-d).",
    reads_load=True, reads_cache=True))


def load_routers() -> tuple[str, ...]:
    """The routers that read load (``cluster.signal_delay_ms`` applies to them)."""
    return tuple(r.name for r in ROUTERS if r.reads_load)
