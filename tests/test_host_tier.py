"""The host KV tier: what the device's prefix cache evicts is kept on the host, found and loaded back."""

from __future__ import annotations

import pytest
from builders import req

from simbatch.config import KVCache
from simbatch.features.host_tier import HostKVTier, load_ms_per_block
from simbatch.inputs.loading import ScenarioError, scenario_from_dict
from simbatch.memory.host_tier import HostTier
from simbatch.memory.kv import KVCacheManager
from simbatch.model.step import StepPlan
from simbatch.simulation import simulate


def test_the_tier_drops_the_least_recently_stored_first():
    tier = HostTier(3)
    tier.store([1, 2, 3])
    tier.store([1])  # held already: now the most recent
    tier.store([4])  # full: 2 goes
    assert 2 not in tier and all(k in tier for k in (1, 3, 4))
    assert tier.run([3, 4, 1, 2]) == 3 and tier.run([2, 3]) == 0
    tier.take([3, 4])
    assert (tier.num_used, tier.num_free, tier.num_dropped, tier.num_refreshed, tier.num_loaded) == (1, 2, 1, 1, 2)
    tier.check()


def _kv(host_blocks: int) -> KVCacheManager:
    return KVCacheManager(KVCache(block_size=4, num_blocks=4, enable_prefix_caching=True, host_blocks=host_blocks,
                                  host_link_gb_s=1.0))


def _served(kv: KVCacheManager, r) -> None:
    assert kv.allocate_slots(r, r.prompt_tokens - r.num_computed_tokens) is not None
    kv.computed(r, r.prompt_tokens - r.num_computed_tokens)
    kv.release(r)


def test_blocks_the_device_evicts_are_found_on_the_host_and_loaded_back():
    """A's 3 full blocks are evicted by B's 4; C (A's content) finds them on the host, not on the device,
    and loads them into blocks of its own, which evicts 3 of B's to the host in turn."""
    kv = _kv(host_blocks=8)
    a, b, c = req(0, 13, 1), req(1, 16, 1), req(2, 13, 1)
    a.prefix_stream = c.prefix_stream = 7
    _served(kv, a)
    _served(kv, b)  # takes every block: A's cached ones go to the host
    assert kv.host_tier.num_used == 3
    hits = kv.cached_prefix(c)
    assert len(hits) == 0 and kv.host_prefix(c, 0) == 3  # never the block of the last token
    assert kv.fits(c, hits, 3 * 4 + 1)
    kv.load_from_host(c, 3)
    assert (c.num_computed_tokens, c.blocks, c.host_loaded_blocks) == (12, 3, 3)
    assert kv.host_tier.num_used == 3 and kv.host_tier.num_loaded == 3  # B's three evicted blocks came in
    kv.check_conservation([c], [])
    _served(kv, c)
    kv.check_conservation([], [])


def test_without_a_tier_evicted_blocks_are_gone():
    kv = _kv(host_blocks=0)
    a, b, c = req(0, 13, 1), req(1, 16, 1), req(2, 13, 1)
    a.prefix_stream = c.prefix_stream = 7
    _served(kv, a)
    _served(kv, b)
    assert kv.host_tier is None and len(kv.cached_prefix(c)) == 0


SCENARIO = {"seed": 3, "workload": {"num_requests": 300, "arrival": {"rate": 4.0}, "num_sessions": 24,
                                    "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400},
                                    "output_tokens": {"dist": "uniform", "low": 10, "high": 120},
                                    "prefix": {"multi_turn": True, "max_context_tokens": 8192}},
            "device": {"tau0_ms": 5.0, "beta_ms": 0.1, "prefill_ms_per_token": 0.05},
            "kv_cache": {"block_size": 16, "num_blocks": 800, "enable_prefix_caching": True}}


def _run(host_blocks: int, **kv):
    spec = {**SCENARIO, "kv_cache": {**SCENARIO["kv_cache"], **kv}}
    if host_blocks:
        spec["kv_cache"] |= {"host_blocks": host_blocks, "host_link_gb_s": kv.get("host_link_gb_s", 25.0),
                             "kv_bytes_per_token": 131072}
    return simulate(scenario_from_dict(spec), check_invariants=True)


def test_the_tier_catches_what_long_conversations_lose():
    """Two dozen conversations outgrow an 800-block device: the host tier turns recomputed turns into loads."""
    without, with_tier = _run(0), _run(20_000)
    s0, s1 = without.summary, with_tier.summary
    assert s1["external_prefix_cache_hits"] > 0
    assert s1["prefix_cache_hit_rate"] > s0["prefix_cache_hit_rate"] + 0.2
    assert s1["mean_ttft_ms"] < s0["mean_ttft_ms"]
    rq = with_tier.requests
    assert (rq["num_host_cached_tokens"] <= rq["num_cached_tokens"]).all()


def test_a_tier_nobody_returns_to_changes_nothing():
    """Prompts that share nothing: the tier fills with what the device evicts and is never asked, so
    every frame is that of the run without it."""
    spec = {**SCENARIO, "workload": {k: v for k, v in SCENARIO["workload"].items() if k not in ("prefix", "num_sessions")}}
    runs = []
    for host in (0, 5000):
        s = {**spec, "kv_cache": {**spec["kv_cache"], "host_blocks": host, "host_link_gb_s": 25.0,
                                  "kv_bytes_per_token": 131072}}
        runs.append(simulate(scenario_from_dict(s), check_invariants=True))
    common = [c for c in runs[0].requests.columns]
    assert runs[0].requests.equals(runs[1].requests[common]) and runs[0].iterations.equals(runs[1].iterations)
    assert runs[1].summary["external_prefix_cache_hits"] == 0


def test_a_load_overlaps_the_compute_or_precedes_it():
    """16-token blocks of 131072 B/token over 1 GB/s: 2.097152 ms a block. A step of 100 prefill tokens
    costs 5 + 0.05 x 100 = 10 ms; 20 blocks load in 41.94 ms: 31.94 ms more overlapped, 41.94 ms serial."""
    for overlap, extra in ((True, 20 * 2.097152 - 10), (False, 20 * 2.097152)):
        spec = {**SCENARIO, "kv_cache": {**SCENARIO["kv_cache"], "host_blocks": 100, "host_link_gb_s": 1.0,
                                         "kv_bytes_per_token": 131072, "host_load_overlap": overlap}}
        scenario = scenario_from_dict(spec)
        assert load_ms_per_block(scenario) == pytest.approx(2.097152)
        feature = HostKVTier(scenario)
        r = req(0, 400, 1)
        r.host_loaded_blocks = 20
        feature.admitted(r)
        plan = StepPlan()
        plan.prefill_tokens = 100
        assert feature.step_ms(plan) == pytest.approx(extra)
        assert feature.step_ms(plan) == pytest.approx(extra)  # asked again: the same plan, the same time
        assert feature.step_ms(StepPlan()) == 0.0


@pytest.mark.parametrize(("kv", "words"), [
    ({"host_blocks": 10, "host_link_gb_s": 25}, "enable_prefix_caching is false"),
    ({"host_blocks": 10, "enable_prefix_caching": True, "kv_bytes_per_token": 131072}, "give kv_cache.host_link_gb_s"),
    ({"host_blocks": 10, "enable_prefix_caching": True, "host_link_gb_s": 25}, "kv_bytes_per_token"),
    ({"host_blocks": 10**8, "enable_prefix_caching": True, "host_link_gb_s": 25}, "host_blocks"),
])
def test_a_tier_that_cannot_work_is_refused(kv, words):
    with pytest.raises(ScenarioError, match=words):
        scenario_from_dict({"workload": {"num_requests": 1}, "kv_cache": kv})
