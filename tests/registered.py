"""Hypothesis strategies that draw from the registries (:mod:`simbatch.registry`) as they stand.

Every draw reads the registry at draw time, so a policy, batching mode, router or serving feature
registered by a module of one's own (docs/extending.md) is drawn by every property test that uses
these, the reference-against-accelerated equivalence tests first (tests/test_fast_forward.py),
without editing a test. What a scenario may combine is read from the entries' declarations, never
their names: serving features, prefix caching and async scheduling only under an iteration-level
mode, a client only where a request-level batch cannot wait for ever for a full batch.
"""

from __future__ import annotations

from hypothesis import strategies as st

import simbatch.engine  # noqa: F401  (the shipped schedulers, twins and routers attach themselves)
import simbatch.features.disaggregation  # noqa: F401  (the shipped serving features register themselves)
from simbatch.registry import FEATURES, MODES, POLICIES, ROUTERS, Registry


@st.composite
def registered(draw, registry: Registry, where=lambda entry: True) -> str:
    """The name of an entry of ``registry`` (one that ``where`` accepts), as it stands when drawn."""
    return draw(st.sampled_from([e.name for e in registry if where(e)]))


def policies():
    return registered(POLICIES)


def modes(iteration_level: bool | None = None):
    """A batching mode; with ``iteration_level`` set, one that declares it so."""
    return registered(MODES, lambda m: iteration_level is None or m.iteration_level == iteration_level)


def routers(reads_load: bool | None = None):
    """A router; with ``reads_load`` set, one that declares it so (a signal delay applies to those)."""
    return registered(ROUTERS, lambda r: reads_load is None or r.reads_load == reads_load)


def iteration_level(mode: str) -> bool:
    return MODES[mode].iteration_level


@st.composite
def speculative(draw) -> dict:
    """``device.speculative``: the setting speculative decoding has of its own (vLLM's)."""
    spec = draw(st.fixed_dictionaries({
        "num_speculative_tokens": st.integers(1, 6), "acceptance_rate": st.floats(0, 0.95),
        "draft_cost_ms": st.floats(0, 3)}))
    if spec["acceptance_rate"] > 0 and draw(st.booleans()):  # a rate per request
        spec["acceptance_rate_concentration"] = draw(st.floats(0.5, 20))
    return spec


@st.composite
def host_tier(draw) -> dict:
    """The ``kv_cache`` keys of a host KV tier (it needs prefix caching, drawn beside it)."""
    return {"host_blocks": draw(st.integers(1, 2000)), "host_link_gb_s": draw(st.floats(0.5, 100)),
            "host_load_overlap": draw(st.booleans()), "kv_bytes_per_token": draw(st.sampled_from([4096.0, 131072.0]))}


@st.composite
def lora(draw) -> dict:
    """A ``lora`` section and the ``workload.adapters`` its requests name (under ``adapters``): fewer GPU
    slots than adapters or more, Zipf or uniform popularity, some requests for the base model or none."""
    max_loras = draw(st.integers(1, 4))
    return {"max_loras": max_loras, "max_cpu_loras": max_loras + draw(st.integers(0, 4)),
            "host_link_gb_s": draw(st.floats(1, 100)), "adapter_bytes": draw(st.sampled_from([1e6, 8.4e7, 1e9])),
            "adapters": {"count": draw(st.integers(1, 10)), "popularity": draw(st.sampled_from(["zipf", "uniform"])),
                         "base_share": draw(st.sampled_from([0.0, 0.3]))}}


def prefix_caching():
    """``kv_cache.enable_prefix_caching`` on (the scenario draws the shared prefixes it finds)."""
    return st.just(True)


@st.composite
def disaggregated(draw) -> dict:
    """``cluster.disaggregated``'s shape: one or two replicas a pool, the decode pool with its own
    slots and blocks (a fraction of the tokens budget, and a count), routed by any router; the link is
    the test's (its transfers' lengths decide whether they fall on step boundaries)."""
    return {"prefill": draw(st.integers(1, 2)), "decode": draw(st.integers(1, 2)),
            "decode_num_blocks": draw(st.integers(40, 3000)), "decode_seqs": draw(st.integers(1, 24)),
            "decode_router": draw(routers())}


# The shipped features that have a setting of their own: how to draw it, by the setting's dotted key.
# A feature of one's own is turned on under `features` with one of its declared `examples`.
OWN_SETTINGS = {"device.speculative": speculative, "kv_cache.enable_prefix_caching": prefix_caching,
                "kv_cache.host_blocks": host_tier, "lora": lora, "cluster.disaggregated": disaggregated}
# Features turned on by a setting of the cluster's: they change what the replicas are, and are drawn
# by the tests of such clusters (features(cluster=True)) rather than by every scenario.
CLUSTER_SETTINGS = ("cluster.disaggregated",)


@st.composite
def features(draw, mode: str, cluster: bool = False) -> dict[str, object]:
    """Which serving features a scenario of batching ``mode`` turns on, each by its switch: dotted key
    -> its setting (``device.speculative`` -> a mapping, ``features`` -> name -> options), every
    registered feature drawn on or off. Under a request-level mode, none. ``cluster``: the features a
    cluster setting turns on (``CLUSTER_SETTINGS``) instead, each always on (a test of such clusters
    draws them)."""
    on: dict[str, object] = {"device.speculative": None, "kv_cache.enable_prefix_caching": False,
                             "kv_cache.host_blocks": None, "lora": None,
                             "cluster.disaggregated": None, "features": {}}
    if not iteration_level(mode):
        return on
    for feature in FEATURES:
        if (feature.switch in CLUSTER_SETTINGS) != cluster or not (cluster or draw(st.booleans())):
            continue
        if feature.switch == "features":
            on["features"][feature.name] = draw(st.sampled_from(feature.examples))
        elif feature.switch in OWN_SETTINGS:
            on[feature.switch] = draw(OWN_SETTINGS[feature.switch]())
        else:
            raise AssertionError(f"feature {feature.name} is turned on by {feature.switch}: tell "
                                 "tests/registered.py how to draw it (OWN_SETTINGS)")
    return on


def client_safe(batching: dict) -> dict:
    """``batching`` with a request-level batch timer set where it was off: a client capping the requests
    in flight can deadlock a batcher that waits for a full batch (simbatch.config.scenario)."""
    mode = MODES[batching["mode"]]
    if mode.iteration_level or mode.batch_timer is None or batching.get(mode.batch_timer) is not None:
        return batching
    return {**batching, mode.batch_timer: 50.0}
