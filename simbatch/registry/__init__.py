"""What a scenario can name: queue policies, batching modes, routers and serving features.

Each kind is a :class:`~simbatch.registry.base.Registry` of entries that declare, beside a name and
a one-line description, the properties the rest of the simulator reads instead of names: whether a
policy evicts at admission, whether a mode plans token by token, whether a router reads load.
Nothing decides by a name.

The layering. This package is the ground floor: it imports nothing else of simbatch, so the schema
(:mod:`simbatch.config`) can validate every name against it, and the generated docs list every
entry, with no upward import. It holds declarations only, and the pure maths that is a declaration
(a policy's keys). Implementations live where they belong and attach themselves to their entry's
name (:meth:`~simbatch.registry.base.Registry.attach`): a mode's scheduler in
:mod:`simbatch.schedulers`, its accelerated twin in :mod:`simbatch.engine.accel`, a router's class
in :mod:`simbatch.engine.router`; a serving feature registers its class from
:mod:`simbatch.features`. They are looked up once, when an engine is built.

An addition is one entry: a policy is a :class:`Policy`, a batching mode a :class:`BatchingMode`
and its scheduler class, a router a :class:`RoutingPolicy` and its class, a feature a
:class:`~simbatch.features.Feature` subclass. docs/extending.md works three through.
"""

from simbatch.registry.base import Registry
from simbatch.registry.features import FEATURES
from simbatch.registry.modes import MODES, BatchingMode
from simbatch.registry.policies import POLICIES, Key, Policy
from simbatch.registry.routers import ROUTERS, RoutingPolicy, load_routers

__all__ = ["FEATURES", "MODES", "POLICIES", "ROUTERS", "BatchingMode", "Key", "Policy", "Registry", "RoutingPolicy",
           "load_routers"]
