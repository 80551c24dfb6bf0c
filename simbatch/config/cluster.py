"""``cluster``: replicas behind a router, a heterogeneous fleet, or disaggregated prefill and decode pools.

Every replica runs the scenario's own sections unless a group says otherwise: a ``replica_specs``
group, or a disaggregated pool, replaces the scenario's ``device``, ``kv_cache`` or ``batching`` for
its replicas, whole (:func:`simbatch.config.scenario.replica_scenarios` builds what each runs). The
engine side is :mod:`simbatch.engine.cluster` (arrivals, admission, routing) and
:mod:`simbatch.engine.disaggregated` (the hand-over and its KV transfer).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from simbatch.config.base import (
    MAX_KV_BYTES_PER_TOKEN,
    MAX_LINK_GB_S,
    MIN_LINK_GB_S,
    ClockMs,
    ClockNonNegS,
    ClockS,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    Registered,
    _Model,
    seconds,
)
from simbatch.config.batching import Batching
from simbatch.config.device import Device
from simbatch.config.kv_cache import KVCache
from simbatch.registry import ROUTERS, load_routers

RouterName = Annotated[str, Registered(ROUTERS)]


class ReplicaSpec(_Model):
    """A group of alike replicas in a heterogeneous fleet.

    A section given here (device, kv_cache, batching) replaces the scenario's section for these
    replicas, whole: fields left out of it take their defaults. A section left out is the scenario's.
    """

    count: PosInt = Field(default=1, description="Replicas in this group.")
    device: Device | None = Field(
        default=None, description="This group's cost model, replacing the scenario's whole; the scenario's when omitted."
    )
    kv_cache: KVCache | None = Field(
        default=None, description="This group's KV cache, replacing the scenario's whole; the scenario's when omitted."
    )
    batching: Batching | None = Field(
        default=None, description="This group's batching, replacing the scenario's whole; the scenario's when omitted."
    )


class PrefixAffinity(_Model):
    """The ``prefix_affinity`` router's weights and guards (simbatch.engine.router).

    Each replica scores ``prefix_weight x hit + queue_weight x queue``: ``hit`` the share of the
    request's prompt tokens it holds cached, ``queue`` 1 for the replica with the fewest waiting
    requests and 0 for the most (min-max normalized), as llm-d's prefix-cache-scorer and queue-scorer;
    the defaults are llm-d's default profile's weights (3 and 2).
    """

    prefix_weight: NonNegFloat = Field(default=3.0, description="Weight of the cache hit (llm-d's "
                                       "prefix-cache-scorer weight).")
    queue_weight: NonNegFloat = Field(default=2.0, description="Weight of the waiting queue (llm-d's queue-scorer weight).")
    cache_threshold: float = Field(default=0.0, ge=0, le=1, description="A hit below this share of the prompt "
                                   "counts 0 (SGLang's --cache-threshold, 0.3 there; 0: every hit counts).")
    balance_abs_threshold: NonNegInt | None = Field(
        default=None, description="With balance_rel_threshold: when the replicas' outstanding requests differ by "
        "more than this and max > balance_rel_threshold x min, route to the least outstanding (SGLang's "
        "--balance-abs-threshold, 64 there); never when omitted.")
    balance_rel_threshold: float = Field(default=1.5, ge=1, description="SGLang's --balance-rel-threshold (1.5).")

    @model_validator(mode="after")
    def _weighs_something(self) -> PrefixAffinity:
        if self.prefix_weight == 0 and self.queue_weight == 0:
            raise ValueError("prefix_weight and queue_weight are both 0, so every replica scores alike; give "
                             "either a weight above 0")
        return self


MAX_TRANSFER_LATENCY_MS = 60_000.0
"""A KV transfer's fixed set-up at most a minute (RDMA and NVLink set-ups take microseconds to milliseconds)."""



class KVTransfer(_Model):
    """The link a request's KV crosses from its prefill replica to its decode replica."""

    bandwidth_gb_s: float = Field(ge=MIN_LINK_GB_S, le=MAX_LINK_GB_S,
                                  description="Bytes moved per second, in GB/s (10^9 bytes).")
    latency_ms: NonNegFloat = Field(default=0.0, le=MAX_TRANSFER_LATENCY_MS,
                                    description="Fixed cost of one transfer (set-up, handshake), ms.")

    def seconds_for(self, num_bytes: float) -> float:
        """One transfer of ``num_bytes``: bytes / bandwidth + latency, s."""
        return num_bytes / (self.bandwidth_gb_s * 1e9) + seconds(self.latency_ms)


class Disaggregated(_Model):
    """Disaggregated prefill and decode: two pools of replicas, and the KV transfer between them.

    A request is prefilled on a prefill replica (chosen by ``cluster.router``), samples its first
    token there, and moves on to a decode replica, which decodes it to the end (docs/concepts.md,
    "Disaggregated prefill and decode"). Replicas 0 .. prefill.count - 1 are the prefill pool, the
    rest the decode pool.
    """

    prefill: ReplicaSpec = Field(description="The prefill pool: count, and the sections it overrides.")
    decode: ReplicaSpec = Field(description="The decode pool: count, and the sections it overrides.")
    kv_transfer: KVTransfer
    decode_router: RouterName = Field(
        default="least_outstanding", description="Which decode replica a prefilled request goes to (as "
        "cluster.router, over the decode pool; read when its KV transfer is requested).")
    kv_bytes_per_token: PosFloat | None = Field(
        default=None, le=MAX_KV_BYTES_PER_TOKEN, description="Bytes per token. The KV of one token on one GPU (all layers, keys and "
        "values); from the prefill pool's device.preset when omitted (required without one).")

    def check_kv_bytes(self, has_preset: bool) -> None:
        """ValueError when ``kv_bytes_per_token`` is missing and ``has_preset`` (the prefill pool's device
        has a preset) is false: there is nothing to derive it from."""
        if self.kv_bytes_per_token is None and not has_preset:
            raise ValueError("cluster.disaggregated.kv_bytes_per_token is missing and the prefill pool's device "
                             "has no preset to derive it from; give kv_bytes_per_token (e.g. 131072 for "
                             "llama-3.1-8b in bf16) or set device.preset")


MAX_FLEET = 4096
"""At most 4,096 replicas in an autoscaled fleet: each is an engine held from the start of the run."""


class Autoscale(_Model):
    """A fleet that grows and shrinks with its load, as Kubernetes' Horizontal Pod Autoscaler runs one.

    Every ``interval_s`` the autoscaler reads ``metric`` over the replicas that take requests and
    asks for ``ceil(ready x metric / target)`` replicas (HPA's rule), between ``min_replicas`` and
    ``max_replicas``, with nothing done while metric / target is within ``tolerance`` of 1. A replica
    asked for starts at once and takes requests ``startup_delay_s`` later (a pod scheduled, the
    weights loaded, the engine warmed up); fewer replicas asked for take effect only when every
    recommendation of the last ``cooldown_s`` asks for fewer (HPA's scale-down stabilization
    window). A replica stopped takes no new requests and drains: it is released (and billed until
    then) when its last request finishes. ``cluster.replicas`` is the number ready at t = 0.
    """

    metric: Literal["queue_per_replica", "busy_fraction"] = Field(
        default="busy_fraction", description="queue_per_replica: requests in each replica, running + waiting "
        "(Knative's concurrency, KEDA on vllm:num_requests_running + waiting); busy_fraction: the share of the "
        "last interval each replica spent computing steps (a GPU-utilization target).")
    target: PosFloat = Field(description="The metric's target value per replica (busy_fraction: at most 1).")
    min_replicas: PosInt = Field(default=1, description="Never fewer replicas than this.")
    max_replicas: PosInt = Field(le=MAX_FLEET, description="Never more replicas than this.")
    startup_delay_s: ClockNonNegS = Field(default=120.0, description="From the decision to start a replica to "
                                          "its first request, s (scheduling, weight loading, warm-up).")
    cooldown_s: ClockNonNegS = Field(default=300.0, description="Scale down only to the highest replica count "
                                     "asked for over this long, s (HPA's downscale stabilization, 300 s).")
    interval_s: ClockS = Field(default=15.0, description="Time between two evaluations, s (HPA's sync period, "
                               "15 s).")
    tolerance: float = Field(default=0.1, ge=0, lt=1, description="No change while metric / target is within this "
                             "of 1 (HPA's 0.1).")
    usd_per_gpu_hour: PosFloat | None = Field(
        default=None, description="Price of one GPU-hour for the cost column; from the prices file of `simbatch "
        "plan` (simbatch/data/gpu_prices.yaml) by device.preset's GPU when omitted.")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscale:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas}); "
                             "swap them or raise max_replicas")
        if self.metric == "busy_fraction" and self.target > 1:
            raise ValueError(f"target {self.target:g} for busy_fraction, which is at most 1; give a share such as 0.7")
        return self


class Cluster(_Model):
    """Replicas behind a router, and the admission control in front of them."""

    replicas: PosInt = Field(
        default=1, description="Number of engines; with replica_specs, the sum of their counts (may be omitted)."
    )
    replica_specs: list[ReplicaSpec] | None = Field(
        default=None, min_length=1,
        description="A heterogeneous fleet: groups of replicas, in index order, each overriding sections.",
    )
    router: RouterName = Field(
        default="round_robin", description="Which replica an arriving request goes to (listed under Choices).",
    )
    prefix_affinity: PrefixAffinity | None = Field(
        default=None, description="The prefix_affinity router's weights and guards; llm-d's defaults when omitted.")
    signal_delay_ms: ClockMs = Field(
        default=0.0, description="Load-reading routers see each replica's state as it was this long ago, ms."
    )
    max_in_flight: PosInt | None = Field(
        default=None, description="Cap on requests in the cluster (waiting + running, all replicas); "
        "arrivals beyond it are rejected (429, reason cluster_full)."
    )
    disaggregated: Disaggregated | None = Field(
        default=None, description="Separate prefill and decode pools with a KV transfer between them "
        "(continuous batching only); replicas is then the pools' total.")
    autoscale: Autoscale | None = Field(
        default=None, description="Start and stop replicas with the load during the run (replicas is then the "
        "number ready at t = 0); a fixed fleet when omitted.")

    @model_validator(mode="before")
    @classmethod
    def _count_from_specs(cls, data):
        # The replica count is the specs' total, so everything that reads `replicas` reads the truth.
        specs = data.get("replica_specs") if isinstance(data, dict) else None
        pools = data.get("disaggregated") if isinstance(data, dict) else None
        if specs is None and isinstance(pools, dict | Disaggregated):
            get = pools.get if isinstance(pools, dict) else (lambda k: getattr(pools, k))
            specs = [get("prefill"), get("decode")]
        if isinstance(specs, list) and "replicas" not in data:
            counts = [s.get("count", 1) if isinstance(s, dict) else getattr(s, "count", None) for s in specs]
            if all(isinstance(c, int) and c > 0 for c in counts):
                data = {**data, "replicas": sum(counts)}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Cluster:
        if self.disaggregated is not None:
            if self.replica_specs is not None:
                raise ValueError("cluster.replica_specs with cluster.disaggregated: the pools are the fleet; give "
                                 "each pool's sections under disaggregated.prefill / disaggregated.decode")
            if self.max_in_flight is not None:
                raise ValueError(f"cluster.max_in_flight ({self.max_in_flight}) with cluster.disaggregated is not "
                                 "modelled (a request in transfer is in neither pool); remove max_in_flight, or "
                                 "cap each pool's queue with scheduler.max_waiting")
        if self.groups() is not None:
            total = sum(s.count for s in self.groups())
            if self.replicas != total:
                raise ValueError(f"replicas ({self.replicas}) disagrees with replica_specs, whose counts sum to "
                                 f"{total}; remove replicas or set it to {total}")
        if self.autoscale is not None:
            a = self.autoscale
            if self.groups() is not None:
                raise ValueError("cluster.autoscale with replica_specs or disaggregated pools is not modelled (which "
                                 "group would grow?); remove autoscale, or use one group of alike replicas")
            if not a.min_replicas <= self.replicas <= a.max_replicas:
                raise ValueError(f"cluster.replicas ({self.replicas}), the replicas ready at t = 0, is outside "
                                 f"autoscale's [{a.min_replicas}, {a.max_replicas}]; set it within them")
            if self.signal_delay_ms > 0:
                raise ValueError(f"signal_delay_ms ({self.signal_delay_ms}) with cluster.autoscale is not modelled "
                                 "(snapshots of a fleet that changes); remove one of them")
        if self.prefix_affinity is not None and self.router != "prefix_affinity":
            raise ValueError(f"cluster.prefix_affinity with router {self.router}, which reads no cache; set "
                             "router: prefix_affinity or remove prefix_affinity")
        if ROUTERS[self.router].reads_cache and self.signal_delay_ms > 0:
            raise ValueError(f"signal_delay_ms ({self.signal_delay_ms}) with router {self.router} is not modelled "
                             "(a snapshot of every replica's prefix cache per request); remove signal_delay_ms")
        if self.signal_delay_ms > 0 and not ROUTERS[self.router].reads_load:
            raise ValueError(f"signal_delay_ms ({self.signal_delay_ms}) has no effect on router {self.router}, "
                             f"which reads no load; remove it or use one of {', '.join(load_routers())}")
        return self

    @property
    def fleet_size(self) -> int:
        """Replicas the engine holds: every one an autoscaler may start, else ``replicas``."""
        return self.autoscale.max_replicas if self.autoscale is not None else self.replicas

    @property
    def signal_delay_s(self) -> float:
        return seconds(self.signal_delay_ms)

    def groups(self) -> list[ReplicaSpec] | None:
        """The groups of alike replicas, in index order (the two pools when disaggregated), or None
        when every replica runs the scenario's own sections."""
        if self.disaggregated is not None:
            return [self.disaggregated.prefill, self.disaggregated.decode]
        return self.replica_specs

    def named_groups(self) -> list[tuple[str, ReplicaSpec]]:
        """Each replica group with the dotted key that names it in a scenario file."""
        if self.disaggregated is not None:
            return [("cluster.disaggregated.prefill", self.disaggregated.prefill),
                    ("cluster.disaggregated.decode", self.disaggregated.decode)]
        return [(f"cluster.replica_specs.{i}", spec) for i, spec in enumerate(self.replica_specs or [])]
