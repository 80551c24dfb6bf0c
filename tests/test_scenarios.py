"""The scenario library: every shipped file runs through the CLI, and each tells the story it claims.

The CLI runs are cut short with ``--set workload.num_requests=...``; the story checks simulate
directly (no plots) at the sizes the scenario's comments talk about, or as small as still shows it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from test_cli import RUN_FILES, SCENARIOS, invoke

from simbatch.analysis.capacity import expected_stability
from simbatch.inputs.loading import load_scenario
from simbatch.simulation import simulate
from simbatch.workload import generate

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
NAMES = [p.stem for p in SHIPPED]


def test_the_library_is_complete():
    assert {"oversubscribed", "oversubscribed_shed", "stable", "heavy_tail", "long_prompts", "memory_pressure",
            "priority_tiers", "bursty", "trace_replay"} <= set(NAMES)


# Scenarios whose folders draw figures the others do not (a fleet's, the prefix cache's, the hand-over's,
# an SLO line): their runs draw the plots; the rest skip them, which every other run here would draw alike.
PLOTTED = {"oversubscribed", "oversubscribed_fleet", "prefix_caching", "disaggregated", "stable", "autoscale_day"}


@pytest.mark.parametrize("path", SHIPPED, ids=NAMES)
def test_every_scenario_runs_through_the_cli(tmp_path, path):
    out = tmp_path / "out"
    plots = () if path.stem in PLOTTED else ("--no-plots",)
    result = invoke("run", path, "--set", "workload.num_requests=40", *plots, "--out", out)
    assert result.exit_code == 0, result.stderr
    assert "Stability check" in result.stdout and "Serving Benchmark Result" in result.stdout
    fleet = {"fleet.csv"} if load_scenario(path).cluster.autoscale is not None else set()
    assert {p.name for p in out.iterdir()} == (RUN_FILES if not plots else RUN_FILES - {"plots", "report.html"}) | fleet
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] + summary["rejected"] + summary["unfinished"] == summary["num_requests"] > 0
    if path.stem == "disaggregated":  # its own columns and plot
        assert {"decode_replica", "kv_transfer_s"} <= set((out / "requests.csv").read_text().split("\n")[0].split(","))
        assert (out / "plots" / "handover.png").is_file()
    if fleet:  # replicas over time, and the fixed fleet of the same cost
        assert (out / "plots" / "autoscaling.png").is_file() and "Autoscaled fleet:" in result.stdout
        assert summary["fixed_fleet_replicas"] >= 1 and summary["gpu_hours"] > 0
    assert summary["littles_law_rel_error"] < 1e-6
    # Results land under the scenario's own name; a lesson names its file.
    assert load_scenario(path).name == path.stem


@pytest.mark.parametrize("path", SHIPPED, ids=NAMES)
def test_every_scenario_is_a_commented_lesson(path):
    text = path.read_text(encoding="utf-8")
    comments = [ln for ln in text.splitlines() if ln.lstrip().startswith("#")]
    assert len(comments) >= 10


def run(name: str, *overrides: str):
    return simulate(load_scenario(SCENARIOS / f"{name}.yaml", list(overrides)))


def test_oversubscribed_shed_rejects_instead_of_queueing():
    shed = run("oversubscribed_shed", "workload.num_requests=400")
    rejected = shed.requests[shed.requests["status"] == "rejected"]
    assert len(rejected) > 100 and set(rejected["reason"]) == {"queue_full"}
    # The wait is bounded by the cap: 64 waiting, served at the device's ~3.9 requests/s.
    assert shed.summary["p99_ttft_ms"] / 1e3 < 64 / shed.stability.capacity_requests_per_s * 1.2
    assert shed.iterations["num_waiting"].max() <= 64


def test_stable_and_bursty_same_load_different_tails():
    stable, bursty = run("stable"), run("bursty")
    assert stable.stability.stable and bursty.stability.stable
    assert bursty.stability.offered_load == pytest.approx(stable.stability.offered_load, rel=0.15)
    assert stable.summary["p99_ttft_ms"] < 2 * stable.summary["median_ttft_ms"]
    assert bursty.summary["p99_ttft_ms"] > 20 * stable.summary["p99_ttft_ms"]


def test_autoscale_day_beats_a_fixed_fleet_of_the_same_cost():
    """The lesson's figures: ~3.2 replicas on average, and a fixed fleet of that cost misses the SLO far more."""
    from simbatch.app.equal_cost import equal_cost_fleet

    result = run("autoscale_day")
    compared = equal_cost_fleet(result)
    assert 2.5 < result.summary["mean_replicas"] < 4.0 and result.summary["peak_replicas"] <= 12
    assert compared["fixed_fleet_slo_violation_rate"] > 3 * compared["autoscaled_slo_violation_rate"]
    assert result.summary["cost_usd"] == pytest.approx(result.summary["gpu_hours"] * 0.8936)


def test_cache_routing_keeps_conversations_where_they_are_cached():
    """The lesson's figures: prefix_affinity ~89 % of prompt tokens cached against round robin's ~56 %,
    and a p99 TTFT tens of times shorter."""
    aware, blind = run("cache_routing").summary, run("cache_routing", "cluster.router=round_robin").summary
    assert aware["prefix_cache_hit_rate"] > 0.85 > 0.6 > blind["prefix_cache_hit_rate"]
    assert blind["p99_ttft_ms"] > 20 * aware["p99_ttft_ms"]


def test_long_prompts_chunking_removes_the_itl_stutter():
    chunked = run("long_prompts", "workload.num_requests=120")
    whole = run("long_prompts", "workload.num_requests=120", "batching.enable_chunked_prefill=false",
                "batching.max_num_batched_tokens=8192")
    assert whole.summary["rejected"] == chunked.summary["rejected"] == 0
    assert whole.summary["p99_itl_ms"] > 3 * chunked.summary["p99_itl_ms"]
    assert whole.summary["mean_ttft_ms"] < chunked.summary["mean_ttft_ms"]  # chunking's price


@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_memory_pressure_preempts_and_memory_sets_the_batch(preemption):
    result = run("memory_pressure", "workload.num_requests=150", f"scheduler.preemption={preemption}")
    assert result.summary["num_preemptions"] > 20
    assert result.summary["mean_batch_size"] < result.scenario.batching.max_num_seqs / 2
    swapped = (result.iterations["swap_blocks"] * result.iterations["num_steps"]).sum()
    assert (swapped > 0) == (preemption == "swap")


def test_priority_tiers_starve_without_aging_and_share_with_it():
    def ttft_s(result, tenant):
        r = result.requests
        return r[(r["tenant"] == tenant) & (r["status"] == "finished")]["ttft_s"]

    strict, aged = run("priority_tiers"), run("priority_tiers", "scheduler.aging_s=5")
    assert ttft_s(strict, "interactive").mean() < 0.2 < 2 < ttft_s(strict, "batch").mean()
    assert ttft_s(aged, "batch").max() < ttft_s(strict, "batch").max() * 0.75
    assert ttft_s(aged, "interactive").mean() > 5 * ttft_s(strict, "interactive").mean()


def _finished_ttft_s(result, tenant=None):
    r = result.requests
    keep = (r["status"] == "finished") & ((r["tenant"] == tenant) if tenant else True)
    return r[keep]["ttft_s"]


def test_priority_tiers_aging_bounds_the_gap_between_tiers_not_the_growth():
    """The comment's figures: with aging_s = 5 the batch tier's longest TTFT is ~10 s over 60 s and
    ~22 s over 240 s (it keeps growing: ρ ≈ 1.07), while the tiers' longest waits differ by ~aging_s."""
    short, long = (run("priority_tiers", "scheduler.aging_s=5", f"workload.duration_s={d}") for d in (60, 240))
    assert short.stability.offered_load == pytest.approx(1.06, abs=0.01)
    assert long.stability.offered_load == pytest.approx(1.07, abs=0.01)
    assert _finished_ttft_s(short, "batch").max() == pytest.approx(10.2, abs=0.1)
    assert _finished_ttft_s(long, "batch").max() == pytest.approx(21.6, abs=0.1)
    for result in (short, long):
        gap = _finished_ttft_s(result, "batch").max() - _finished_ttft_s(result, "interactive").max()
        assert gap == pytest.approx(5, abs=0.5)


def test_long_prompts_stutter_shows_in_itl_not_tpot():
    """The comment's figures, at the file's own size: p99 ITL 245 vs 48 ms, p99 TPOT 49 vs 46 ms, TTFT 2.2x."""
    chunked = run("long_prompts").summary
    whole = run("long_prompts", "batching.enable_chunked_prefill=false", "batching.max_num_batched_tokens=8192").summary
    assert (round(whole["p99_itl_ms"]), round(chunked["p99_itl_ms"])) == (245, 48)
    assert (round(whole["p99_tpot_ms"]), round(chunked["p99_tpot_ms"])) == (49, 46)
    assert (round(chunked["mean_ttft_ms"]), round(whole["mean_ttft_ms"])) == (494, 225)
    assert round(chunked["mean_ttft_ms"] / whole["mean_ttft_ms"], 1) == 2.2


def test_heavy_tail_figures():
    """P(out > 1000) of the lognormal (mean 200, sigma 1.2) is ~2.6 %, and the offered load is ~0.31."""
    scenario = load_scenario(SCENARIOS / "heavy_tail.yaml")
    out = scenario.workload.output_tokens
    mu = math.log(out.mean) - out.sigma**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    tail = 0.5 * math.erfc((math.log(1000) - mu) / (out.sigma * math.sqrt(2)))
    assert round(100 * tail, 1) == 2.6 and round(1 / tail) == 38
    assert round(math.exp(mu), -1) == 100  # the median
    assert round(simulate(scenario).stability.offered_load, 2) == 0.31


def test_oversubscribed_shed_cap_over_mu_is_the_mean_wait_not_the_worst():
    """max_waiting = 8: mean TTFT ≈ 8/μ ≈ 2 s, the longest ≈ 12.5 s (slots free in waves)."""
    shed = run("oversubscribed_shed", "scheduler.max_waiting=8")
    ttft = _finished_ttft_s(shed)
    assert round(8 / shed.stability.capacity_requests_per_s) == 2
    assert ttft.mean() == pytest.approx(8 / shed.stability.capacity_requests_per_s, rel=0.15)
    assert round(ttft.max(), 1) == 12.5
    assert load_scenario(SCENARIOS / "oversubscribed_shed.yaml", ["scheduler.max_waiting=1"]).scheduler.max_waiting == 1


def test_trace_replay_replays_the_shipped_trace():
    result = run("trace_replay")
    trace = Path(result.scenario.resolve(result.scenario.workload.trace.path))
    assert trace.name == "sample_trace.csv" and trace.is_file()
    assert result.summary["num_requests"] == len(trace.read_text().splitlines()) - 1
    assert result.stability.stable
    assert not run("trace_replay", "workload.trace.time_scale=0.25").stability.stable


def test_heavy_tail_shows_static_capacity_not_the_multiplier():
    """README: continuous carries the offered 2 req/s; static manages about 1 req/s; the ratio ~2x is capacity."""
    by_mode = {m: run("heavy_tail", f"batching.mode={m}").summary for m in ("static", "continuous")}
    assert round(by_mode["static"]["request_throughput"]) == 1
    assert by_mode["continuous"]["request_throughput"] == pytest.approx(2, rel=0.05)
    assert round(by_mode["continuous"]["output_throughput"] / by_mode["static"]["output_throughput"]) == 2
    assert by_mode["static"]["mean_ttft_ms"] > 60e3 > 100 * by_mode["continuous"]["mean_ttft_ms"]


def test_busy_fraction_is_near_one_at_any_real_load():
    """concepts.md: the busy fraction is no load gauge; on stable.yaml's traffic it is 97 %, 99 % and 99.6 %
    at offered loads 0.26, 0.77 and 1.28, and only a trickle (rho 0.03) leaves the engine idle half the time."""
    quoted = {0.1: (0.03, 54), 1: (0.26, 97), 3: (0.77, 99), 5: (1.28, 99.6)}
    for rate, (rho, busy_percent) in quoted.items():
        result = run("stable", f"workload.arrival.rate={rate}")
        assert round(result.stability.offered_load, 2) == rho
        digits = 1 if busy_percent % 1 else 0
        assert round(100 * result.summary["busy_fraction"], digits) == busy_percent


def test_prefix_caching_figures():
    """The figures prefix_caching.yaml quotes."""
    cached, uncached = run("prefix_caching"), run("prefix_caching", "kv_cache.enable_prefix_caching=false")
    assert round(100 * cached.summary["prefix_cache_hit_rate"]) == 92
    assert (round(cached.stability.offered_load, 2), round(uncached.stability.offered_load, 2)) == (0.65, 1.42)
    assert round(cached.summary["p99_ttft_ms"]) == 107 and uncached.summary["p99_ttft_ms"] > 60_000
    cramped = run("prefix_caching", "kv_cache.num_blocks=3000")
    assert round(100 * cramped.summary["prefix_cache_hit_rate"]) == 45
    fleet = ("workload.arrival.rate=20", "cluster.replicas=4")
    affinity = run("prefix_caching", *fleet, "cluster.router=session_affinity")
    scattered = run("prefix_caching", *fleet, "cluster.router=round_robin")
    assert round(100 * affinity.summary["prefix_cache_hit_rate"]) == 96 and round(affinity.summary["p99_ttft_ms"]) == 113
    assert round(100 * scattered.summary["prefix_cache_hit_rate"]) == 53 and scattered.summary["p99_ttft_ms"] > 100_000
    assert round(scattered.stability.offered_load, 2) == 0.54


def test_llama3_8b_h100_figures():
    """The figures llama3_8b_h100.yaml quotes: on its preset, 30 req/s at an offered load of 0.61 with
    p99 TTFT 74 ms, compute binding; 48 req/s still stable (0.96), 52 oversubscribed."""
    at_30 = run("llama3_8b_h100")
    assert round(at_30.stability.offered_load, 2) == 0.61 and at_30.stability.limited_by == "compute"
    assert round(at_30.summary["p99_ttft_ms"]) == 74
    for rate, load in ((48, 0.96), (52, 1.04)):
        scenario = load_scenario(SCENARIOS / "llama3_8b_h100.yaml", [f"workload.arrival.rate={rate}"])
        assert round(expected_stability(scenario, generate(scenario)).offered_load, 2) == load


def test_disaggregated_figures():
    """The figures disaggregated.yaml quotes: 2 : 2 against the same four GPUs collocated, the hand-over's
    two waits, and the placement search over 1 : 3, 2 : 2, 3 : 1."""
    from simbatch.app.sweep.placement import best, closed_form_best, placement_search

    split = run("disaggregated")
    s = split.summary
    assert (round(s["p99_tpot_ms"], 1), round(s["request_goodput"], 2), round(s["request_throughput"], 2)) == \
        (9.3, 9.7, 9.7)
    assert (round(s["mean_decode_queue_ms"]), round(s["mean_kv_transfer_ms"])) == (13, 6)
    together = run("disaggregated", "cluster.disaggregated=null", "cluster.replicas=4").summary
    assert (round(together["p99_tpot_ms"], 1), round(together["request_goodput"], 2)) == (11.4, 8.53)
    assert abs(together["request_throughput"] - s["request_throughput"]) < 0.02
    frame = placement_search(load_scenario(SCENARIOS / "disaggregated.yaml"), 4)
    assert round(frame["p99_ttft_ms"].iloc[0]) == 434
    assert (round(frame["p99_tpot_ms"].iloc[2], 1), round(frame["goodput"].iloc[2], 2)) == (11.2, 6.17)
    assert int(best(frame).prefill_replicas) == closed_form_best(frame) == 2


def test_speculative_figures():
    """The figures speculative.yaml quotes."""
    from simbatch.features.speculative import speedup
    from simbatch.model.cost import LinearCost

    spec, plain = run("speculative"), run("speculative", "device.speculative=null")
    s = spec.summary
    assert (round(s["mean_tpot_ms"], 2), round(plain.summary["mean_tpot_ms"], 2)) == (4.10, 7.63)
    assert (round(s["mean_itl_ms"], 1), round(plain.summary["mean_itl_ms"], 1)) == (10.9, 7.7)
    assert round(s["spec_decode_acceptance_length"], 2) == 2.78 and round(s["spec_decode_acceptance_rate"]) == 45
    busy = run("speculative", "workload.arrival.rate=20")
    assert round(busy.summary["mean_tpot_ms"], 2) == 5.70
    assert round(run("speculative", "workload.arrival.rate=20", "device.speculative=null").summary["mean_tpot_ms"], 2) == 9.12
    loads = [expected_stability(sc, generate(sc)).offered_load for sc in
             (load_scenario(SCENARIOS / "speculative.yaml", ["workload.arrival.rate=45", *extra])
              for extra in ([], ["device.speculative=null"]))]
    assert [round(x, 2) for x in loads] == [0.91, 0.91]
    sc = spec.scenario
    cost, context = LinearCost.of(sc.device), spec.stability.mean_context_tokens
    assert [round(speedup(cost, sc.device.speculative, b, context), 2) for b in (1, 64)] == [1.96, 1.28]
    assert speedup(cost, sc.device.speculative, 214, context) >= 1 > speedup(cost, sc.device.speculative, 215, context)
