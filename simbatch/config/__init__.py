"""The scenario's schema: one pydantic model per section, which every YAML file maps onto 1:1.

Every knob of the simulator lives in this package, with its unit in its name and its default in one
place; models forbid unknown keys, so a typo in a scenario is an error, never a silent default.
``docs/scenarios.md`` is generated from the models. One module per section (:mod:`.workload`,
:mod:`.device`, :mod:`.kv_cache`, :mod:`.batching`, :mod:`.scheduler`, :mod:`.cluster`, :mod:`.frontend`, :mod:`.slo`,
:mod:`.metrics`, :mod:`.sim`; length distributions in :mod:`.lengths`, cards in :mod:`.cards`),
gathered by :mod:`.scenario`; :mod:`.base` holds what they share.

The schema is data and checks only. Presets, ``num_blocks: auto`` and the other derived values are
filled in by a separate step, :func:`simbatch.inputs.resolve.resolve` (not imported here: it uses
the hardware model, which uses this schema); :mod:`.loading` reads, validates and resolves a file;
:mod:`.guard` refuses runs too large for the machine.
"""

from simbatch.config.base import (
    MAX_CONTEXT_COST_MS,
    MAX_FRONTEND_MS,
    MAX_RATE,
    MAX_TOKENS,
    MeanTokens,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Tokens,
    seconds,
)
from simbatch.config.batching import Batching
from simbatch.config.cards import GpuCard, ModelCard
from simbatch.config.cluster import Autoscale, Cluster, Disaggregated, KVTransfer, ReplicaSpec
from simbatch.config.device import DEVICE_COSTS, Device, MoE, Speculative
from simbatch.config.frontend import Frontend
from simbatch.config.kv_cache import KVCache
from simbatch.config.lengths import (
    DATASET_SHAPES,
    Choice,
    DatasetShape,
    Empirical,
    Exponential,
    Fixed,
    LengthDist,
    LogNormal,
    Random,
    Uniform,
    Zipf,
)
from simbatch.config.metrics import LATENCY_METRICS, Metrics
from simbatch.config.provenance import Provenance, Resolution
from simbatch.config.scenario import Scenario, replica_scenarios, sized_caches, suggestion
from simbatch.config.scheduler import Scheduler
from simbatch.config.sim import Sim
from simbatch.config.slo import SLO
from simbatch.config.workload import Arrival, ClosedLoop, Prefix, RequestClass, Trace, Workload

__all__ = [
    "DATASET_SHAPES", "DEVICE_COSTS", "LATENCY_METRICS", "MAX_CONTEXT_COST_MS", "MAX_FRONTEND_MS", "MAX_RATE",
    "MAX_TOKENS", "SLO", "Arrival", "Autoscale", "Batching", "Choice", "ClosedLoop", "Cluster", "DatasetShape", "Device", "MoE",
    "Disaggregated", "Empirical", "Exponential", "Fixed", "Frontend", "GpuCard", "KVCache", "KVTransfer", "LengthDist",
    "LogNormal", "MeanTokens", "Metrics", "ModelCard", "NonNegFloat", "NonNegInt", "PosFloat", "PosInt", "Prefix",
    "Provenance", "Random", "ReplicaSpec", "RequestClass", "Resolution", "Scenario", "Scheduler", "Sim",
    "Speculative", "Tokens", "Trace", "Uniform", "Workload", "Zipf", "replica_scenarios", "seconds",
    "sized_caches", "suggestion",
]
