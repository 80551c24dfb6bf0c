"""Plots of a simulation's frames, for a result folder or a notebook.

Every plot is a function from frames to a matplotlib ``Figure`` (no pyplot state; see
:mod:`simbatch.app.plots.figure`), taking a mapping ``label -> frames`` so that one run and a
comparison of modes are drawn by the same code. ``save_run_plots`` and ``save_compare_plots`` write
the standard sets as PNG files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from simbatch.app.plots.autoscale import autoscaling
from simbatch.app.plots.cluster import load_imbalance, replica_load
from simbatch.app.plots.disaggregated import handover
from simbatch.app.plots.figure import Frames, Run, save_figure
from simbatch.app.plots.host_tier import host_kv_tier
from simbatch.app.plots.latency import e2e_histogram, latency_by_request, ttft_cdf
from simbatch.app.plots.lora import lora_adapters
from simbatch.app.plots.prefix import prefix_cache
from simbatch.app.plots.routing import routing_gain
from simbatch.app.plots.speculative import speculative_decoding
from simbatch.app.plots.timeseries import (
    batch_size,
    cumulative_output_tokens,
    kv_usage,
    output_throughput,
    running_waiting,
)
from simbatch.config import Scenario, replica_scenarios
from simbatch.features.host_tier import load_ms_per_block
from simbatch.simulation import Result

__all__ = ["Frames", "Run", "batch_size", "load_imbalance", "replica_load", "cumulative_output_tokens", "e2e_histogram", "handover", "host_kv_tier",
           "kv_usage", "latency_by_request", "lora_adapters", "output_throughput", "prefix_cache", "running_waiting", "save_compare_plots", "save_figure",
           "save_run_plots", "speculative_decoding", "ttft_cdf"]


def _fleet(scenario: Scenario) -> tuple[int, int]:
    """(running slots, device KV blocks), summed over every replica of the fleet."""
    fleet = replica_scenarios(scenario)
    return sum(s.batching.max_num_seqs for s in fleet), sum(s.kv_cache.num_blocks for s in fleet)


def save_run_plots(folder: Path, result: Result) -> list[Path]:
    """The six plots of one run, as ``folder/<name>.png``, and the per-replica two for a fleet."""
    sc, st = result.scenario, result.stability
    runs = {sc.batching.mode: result}
    slots, blocks = _fleet(sc)
    figures = {
        "output_throughput": output_throughput(runs, capacity_tokens_per_s=st.capacity_tokens_per_s,
                                               offered_tokens_per_s=st.offered_tokens_per_s),
        "running_waiting": running_waiting(runs, slots=slots),
        "kv_usage": kv_usage(runs, num_blocks=blocks),
        "batch_size": batch_size(runs, max_num_seqs=slots),
        "ttft_cdf": ttft_cdf(runs, slo=sc.slo),
        "e2e_histogram": e2e_histogram(runs, full_batch_latency_s=st.full_batch_latency_s),
    }
    if "prefix_cache_hit_rate" in result.summary:
        figures["prefix_cache"] = prefix_cache(runs)
    if "num_host_cached_tokens" in result.requests:  # the host KV tier is on (simbatch.features.host_tier)
        tiered = next((s for s in replica_scenarios(sc) if s.kv_cache.host_blocks), sc)
        figures["host_kv_tier"] = host_kv_tier(result, load_ms_per_block(tiered), tiered.kv_cache.block_size)
    if "lora_id" in result.requests:  # multi-LoRA is on (simbatch.features.lora)
        figures["lora_adapters"] = lora_adapters(result)
    if sc.cluster.disaggregated is not None:
        figures["handover"] = handover(result.requests, result.iterations)
    if "spec_decode_acceptance_rate" in result.summary:
        figures["speculative_decoding"] = speculative_decoding(result, sc)
    if result.fleet is not None:
        figures["autoscaling"] = autoscaling(result)
    n = sc.cluster.fleet_size
    if n > 1:
        figures["replica_load"] = replica_load(result, n, slots=slots // n if not sc.cluster.groups() else None)
        figures["load_imbalance"] = load_imbalance(result, n)
    return [save_figure(fig, folder / f"{name}.png") for name, fig in figures.items()]


def save_compare_plots(folder: Path, results: Mapping[str, Frames]) -> list[Path]:
    """The overlay plots of several runs, as ``folder/<name>.png``.

    A run without frames (a vLLM result file has neither steps nor, mostly, requests) appears only
    in the plots its data allows: the TTFT CDF when it has TTFTs, nothing else.
    """
    with_steps = {label: r for label, r in results.items() if getattr(r, "iterations", None) is not None}
    with_ttft = {label: r for label, r in results.items() if getattr(r, "requests", None) is not None}
    scenarios = [r.scenario for r in results.values() if getattr(r, "scenario", None) is not None]
    slots = _fleet(scenarios[0])[0] if scenarios else None
    slo = scenarios[0].slo if scenarios else None
    figures = {}
    if with_steps:
        figures |= {
            "batch_size": batch_size(with_steps, max_num_seqs=slots),
            "cumulative_output_tokens": cumulative_output_tokens(with_steps),
            "running_waiting": running_waiting(with_steps, slots=slots),
        }
    if with_ttft:
        figures["ttft_cdf"] = ttft_cdf(with_ttft, slo=slo)
    if with_steps:
        figures["latency_by_request"] = latency_by_request(with_steps)
    caching = {label: r for label, r in with_ttft.items() if "num_cached_tokens" in r.requests
               and r.requests["num_cached_tokens"].any()}
    if caching:
        figures["prefix_cache"] = prefix_cache(with_ttft)  # every run, those without a cache at 0 %
    if len({s.cluster.router for s in scenarios}) > 1 and len(scenarios) == len(with_ttft):
        figures["routing_gain"] = routing_gain(with_ttft)  # routers compared on the same requests
    return [save_figure(fig, folder / f"{name}.png") for name, fig in figures.items()]
