"""Screening: every configuration judged by closed forms alone, before anything is simulated.

A configuration is ruled out, with its reason, when

- the scenario rejects it (a preset whose heads do not split over its GPUs, weights that leave no
  room for a KV cache, a token budget below the slot count);
- some request of the traffic can never be served (it needs more KV blocks than the cache holds, or a
  prompt above the token budget without chunked prefill: :func:`simbatch.engine.cluster.rejection_reasons`);
- an SLO is out of reach even for a request alone on its server
  (:func:`simbatch.analysis.planning.lone_request_bounds`, on the very requests every replication
  draws): no number of replicas meets it;
- it would need more replicas than the search allows only to be stable.

The others survive with the fewest replicas (or pool units) that are stable, lambda < N mu
(:func:`simbatch.analysis.planning.min_replicas`, mu from
:func:`simbatch.analysis.capacity.expected_stability` of one replica or unit): the search starts there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simbatch.analysis.capacity import expected_stability
from simbatch.analysis.planning import lone_request_bounds, min_replicas
from simbatch.app.plan.limits import ATTAINMENT, INCOMPLETE, Limit
from simbatch.app.plan.space import Config
from simbatch.app.sweep.runner import Point, load_point
from simbatch.config import replica_scenarios
from simbatch.workload import WorkloadArrays


@dataclass
class Screen:
    """A configuration after screening: its one-unit point, and either why it is out or where to start."""

    config: Config
    point: Point  # the configuration at one replica (or unit), loaded
    reason: str = ""  # why no fleet of it can meet the SLOs (empty: it survived)
    capacity: float = math.nan  # requests/s one replica (or unit) carries at full batch
    limited_by: str = ""  # what sets that capacity (slots, memory, compute, or the binding pool)
    min_units: int = 1  # the fewest replicas (or units) that are stable
    bounds: dict[str, float] = field(default_factory=dict)  # each limit's closed-form bound (mean over replications)

    @property
    def survived(self) -> bool:
        return not self.reason


def _never_served(point: Point, workload: WorkloadArrays) -> str:
    from simbatch.engine.cluster import rejection_reasons

    specs = replica_scenarios(point.scenario)
    pooled = point.scenario.cluster.disaggregated is not None
    for i, replica in enumerate([specs[0], specs[-1]] if pooled else specs[:1]):
        prompt, output = workload.prompt_tokens, workload.output_tokens
        if pooled and i == 0:
            output = np.ones_like(output)  # a prefill replica holds the prompt and its first token only
        reasons = rejection_reasons(replica, prompt, output)
        if reasons:
            j = next(iter(sorted(reasons)))
            why = {"never_fits": f"needs more KV blocks than the {replica.kv_cache.num_blocks:,} of "
                                 f"{replica.kv_cache.block_size} tokens the cache holds",
                   "prompt_exceeds_budget": "has a prompt above max_num_batched_tokens, and chunked prefill is off"}
            return (f"{len(reasons)} request(s) can never be served: request {j} ({int(prompt[j])} prompt + "
                    f"{int(workload.output_tokens[j])} output tokens) {why[reasons[j]]}")
    return ""


def _bound_values(point: Point, workloads: list[WorkloadArrays], limits: list[Limit]) -> dict[str, float]:
    """Each limit's closed-form bound: the mean over the replications' requests of the statistic of
    their lone-request latencies (an attainment's: the largest share that can meet the limits)."""
    scenario = point.scenario
    first = replica_scenarios(scenario)[0]
    percentiles = tuple(scenario.metrics.metric_percentiles)
    stats: dict[str, list[float]] = {}
    for workload in workloads:
        bounds = lone_request_bounds(first.device, first.batching, workload.prompt_tokens, workload.output_tokens,
                                     first.kv_cache.enable_prefix_caching)
        values = bounds.stats_ms(percentiles)
        if any(lim.key == ATTAINMENT for lim in limits):
            values[ATTAINMENT] = bounds.attainment(scenario.slo.limits_s())
        for key, value in values.items():
            stats.setdefault(key, []).append(value)
    return {lim.key: float(np.mean(stats[lim.key])) for lim in limits if lim.key in stats}


def screen(config: Config, scenario_path: Path, sets: list[str], workloads: list[WorkloadArrays], rate: float,
           limits: list[Limit], max_units: int, min_units: int = 1) -> Screen:
    """Judge ``config`` by the closed forms (module docstring) on the replications' ``workloads``."""
    point = load_point(scenario_path, sets, config.at(1))
    if point.scenario is None:
        return Screen(config, point, f"invalid: {point.error}")
    if why := _never_served(point, workloads[0]):
        return Screen(config, point, why)
    st = expected_stability(point.scenario, workloads[0])
    out = Screen(config, point, capacity=st.capacity_requests_per_s,
                 limited_by=f"{st.pool} pool" if st.pool else st.limited_by)
    out.bounds = _bound_values(point, workloads, [lim for lim in limits if lim.key != INCOMPLETE])
    for lim in limits:
        bound = out.bounds.get(lim.key)
        if bound is not None and not lim.holds(bound):
            what = "the share of requests that can meet the per-request limits" if lim.key == ATTAINMENT else lim.key
            out.reason = (f"{what} is {'at most' if lim.key == ATTAINMENT else 'at least'} {bound:.4g} for a request "
                          f"alone on its server, past {lim.text}: no fleet of these meets it")
            return out
    units = min_replicas(rate, out.capacity)
    out.min_units = max(min_units, units) if math.isfinite(units) else units
    if out.min_units > max_units:
        out.reason = (f"needs {out.min_units:g} {'units' if config.layout.prefill else 'replicas'} only to be stable "
                      f"({out.capacity:.3g} req/s each, {out.limited_by} binding), above replicas.max {max_units}")
    return out
