"""Fast-forward must be invisible: the same frames and summary as stepping one iteration at a time.

Equal means equal to the bit: every count, event and time. The clock counts whole nanoseconds
(:mod:`simbatch.model.clock`), so a run of n steps taken in one go ends exactly where n steps one at a time
do, and an arrival on a step boundary is a tie both modes decide by the same rule.

Two families of scenarios: random floats (rates, step times), where ties are rare, and *exact ties*:
constant rates and integer-time traces (simultaneous arrivals included) against step times that are
multiples of 1/8 s or 1/64 s, and clock stops on step boundaries. ``SIMBATCH_EQUIVALENCE_EXAMPLES``
raises the number of examples of each (a long run before a release: 2,000).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from registered import client_safe, features, iteration_level, modes, policies, routers
from test_observers import EventLog, RunLog

from simbatch.analysis.summary import iterations_frame, requests_frame, summarize
from simbatch.config import Scenario
from simbatch.engine import Engine
from simbatch.registry import ROUTERS
from simbatch.simulation import simulate
from simbatch.workload import generate

EXAMPLES = int(os.environ.get("SIMBATCH_EQUIVALENCE_EXAMPLES", "0"))


def examples(default: int) -> int:
    return EXAMPLES or default


def assert_same_run(scenario: dict) -> None:
    """The same frames and summary on both engines, and the same events told to observers: every
    admission, preemption and step (its membership, request by request, and its exact times) of each
    replica, in order, whether the accelerated engine's runs of steps are expanded by the engine or
    by an observer that takes them whole (tests/test_observers.py)."""
    def run(fast_forward: bool, *observers):
        sim = {**scenario.get("sim", {}), "fast_forward": fast_forward}
        return simulate(Scenario.model_validate({**scenario, "sim": sim}), check_invariants=True, observers=observers)

    ref_log, log, runs = EventLog(), EventLog(), RunLog()
    reference, fast = run(False, ref_log), run(True, log, runs)
    assert dict(ref_log.events) == dict(log.events) == dict(runs.events)
    assert sorted(ref_log.completions) == sorted(log.completions) == sorted(runs.completions)
    pd.testing.assert_frame_equal(reference.requests, fast.requests, check_exact=True)
    pd.testing.assert_frame_equal(reference.iterations, fast.iterations, check_exact=True)
    assert sorted(reference.stall_gaps_s) == sorted(fast.stall_gaps_s)  # a multiset: replicas interleave
    if reference.fleet is not None:  # an autoscaled fleet starts and stops its replicas alike
        pd.testing.assert_frame_equal(reference.fleet, fast.fleet, check_exact=True)
    for key, ref in reference.summary.items():
        got = fast.summary[key]
        assert (math.isnan(ref) and math.isnan(got)) or ref == got, key


lengths = st.one_of(
    st.builds(lambda v: {"dist": "fixed", "value": v}, st.integers(1, 300)),
    st.builds(lambda m: {"dist": "exponential", "mean": m, "max": 800}, st.floats(2, 200)),
    st.builds(lambda lo, span: {"dist": "uniform", "low": lo, "high": lo + span}, st.integers(1, 200),
              st.integers(0, 300)),
)


@st.composite
def scenarios(draw) -> dict:
    mode = draw(modes())
    per_step = iteration_level(mode)
    max_num_seqs = draw(st.integers(1, 24))
    policy = draw(policies())
    # The serving features, from the registry (iteration-level modes only): prefix caching on a
    # shared system prompt, conversations, or both, in caches from cramped (evicting all the time) to
    # ample; speculative decoding, whose random acceptances must come out alike whichever engine
    # draws them; a feature of one's own.
    switched = draw(features(mode))
    caching = switched["kv_cache.enable_prefix_caching"]
    prefix = draw(st.one_of(st.none(), st.fixed_dictionaries({
        "shared_tokens": st.integers(0, 300), "share": st.sampled_from([0.0, 0.5, 1.0]),
        "multi_turn": st.booleans(), "max_context_tokens": st.integers(50, 3000)})))
    scenario = {
        "seed": draw(st.integers(0, 10_000)),
        "workload": {
            "num_requests": draw(st.integers(1, 120)),
            "arrival": {"process": draw(st.sampled_from(["poisson", "gamma"])),
                        "rate": draw(st.floats(0.5, 60)), "burstiness": draw(st.floats(0.3, 3))},
            "prompt_tokens": draw(lengths),
            "output_tokens": draw(lengths),
            "classes": [{"name": "interactive", "priority": 0, "share": 1},
                        {"name": "batch", "priority": 2, "share": draw(st.floats(0.1, 3))}],
            "prefix": prefix,
            "num_sessions": draw(st.integers(1, 12)) if prefix and prefix["multi_turn"] else None,
        },
        "device": {"tau0_ms": draw(st.floats(1, 30)), "beta_ms": draw(st.floats(0, 1)),
                   "prefill_ms_per_token": draw(st.floats(0, 0.1)),
                   # Half the examples read their context: runs of decodes then grow step by step.
                   "kv_read_ms_per_1k_tokens": draw(st.one_of(st.just(0.0), st.floats(0, 2))),
                   "prefill_attention_ms_per_1m_pairs": draw(st.one_of(st.just(0.0), st.floats(0, 20))),
                   # A third under the decode roofline, where a run switches branch once as its context
                   # grows past the decode matmuls; some with a mixture of experts' reads besides.
                   "weights_ms": draw(st.one_of(st.none(), st.none(), st.floats(0, 10))),
                   "moe": draw(st.one_of(st.none(), st.builds(
                       lambda e, k, ms, dp: {"num_experts": e, "experts_per_token": min(k, e), "local_experts": e,
                                             "expert_read_ms": ms, "data_parallel_size": dp},
                       st.integers(2, 64), st.integers(1, 8), st.floats(0, 0.5), st.integers(1, 4)))),
                   "speculative": switched["device.speculative"]},
        "kv_cache": {"block_size": draw(st.sampled_from([1, 4, 16])), "num_blocks": draw(st.integers(40, 3000)),
                     "swap_blocks": draw(st.integers(0, 400)), "swap_ms_per_block": draw(st.floats(0, 0.5)),
                     "enable_prefix_caching": caching},
        "batching": {"mode": mode, "max_num_seqs": max_num_seqs,
                     "max_num_batched_tokens": draw(st.integers(max_num_seqs, 1024)),
                     "enable_chunked_prefill": draw(st.booleans()),
                     "long_prefill_token_threshold": draw(st.one_of(st.none(), st.integers(1, 256))),
                     "pad_prompts": draw(st.booleans()),
                     "max_wait_ms": draw(st.one_of(st.none(), st.floats(0, 500))),
                     "max_queue_delay_ms": draw(st.floats(0, 100))},
        "scheduler": {"policy": policy, "preemption": draw(st.sampled_from(["recompute", "swap"])),
                      "aging_s": draw(st.one_of(st.none(), st.floats(0.1, 10))),
                      "max_preemptions": draw(st.one_of(st.none(), st.integers(1, 3))),
                      "max_waiting": draw(st.one_of(st.none(), st.integers(1, 50))),
                      "head_of_line_blocking": draw(st.booleans()),
                      "tenant_weights": {"interactive": 2.0},
                      # vLLM's cadence: arrivals seen, and finished requests' room freed, a plan late.
                      "async_scheduling": per_step and draw(st.booleans())},
        "cluster": {"replicas": draw(st.integers(1, 3)), "router": draw(routers())},
        "features": switched["features"],
        # The API server's latencies on the way in and out (half the examples have none).
        "frontend": draw(st.one_of(st.just({}), st.fixed_dictionaries({
            "request_latency_ms": st.floats(0, 50), "response_latency_ms": st.floats(0, 50)}))),
        "sim": {"max_time_s": draw(st.one_of(st.none(), st.floats(1, 60)))},
    }
    # A host KV tier behind the prefix cache (its switch drawn above; it needs the cache), and multi-LoRA.
    if caching and switched["kv_cache.host_blocks"]:
        scenario["kv_cache"] |= switched["kv_cache.host_blocks"]
    if switched["lora"]:
        scenario["lora"] = {k: v for k, v in switched["lora"].items() if k != "adapters"}
        scenario["workload"]["adapters"] = switched["lora"]["adapters"]
    return scenario


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_stepping(scenario):
    assert_same_run(scenario)


@st.composite
def autoscaled(draw, base) -> dict:
    """A scenario on an autoscaled fleet under a rate curve: replicas start, become ready and drain
    between and inside runs of steps, at evaluation instants that may tie with arrivals and step ends."""
    scenario = draw(base)
    workload = dict(scenario["workload"])
    period = draw(st.floats(5, 60))
    workload["arrival"] = {"rate_curve": draw(st.one_of(
        st.fixed_dictionaries({"kind": st.just("sinusoidal"), "mean": st.floats(0.5, 40),
                               "amplitude": st.floats(0, 1), "period_s": st.just(period), "peak_s": st.floats(0, 60)}),
        st.builds(lambda a, b, c: {"kind": "piecewise", "points": [[0, a], [period / 3, b], [2 * period / 3, c]],
                                   "period_s": period}, st.floats(0, 40), st.floats(0.1, 60), st.floats(0, 40))))}
    metric = draw(st.sampled_from(["queue_per_replica", "busy_fraction"]))
    top = draw(st.integers(1, 4))
    autoscale = {"metric": metric, "target": draw(st.floats(0.5, 6) if metric == "queue_per_replica" else
                                                  st.floats(0.1, 1)),
                 "min_replicas": 1, "max_replicas": top, "startup_delay_s": draw(st.sampled_from([0.0, 0.5, 2.0])),
                 "cooldown_s": draw(st.sampled_from([0.0, 1.0, 5.0])),
                 "interval_s": draw(st.sampled_from([0.125, 0.25, 1.0, 0.37])),
                 "tolerance": draw(st.sampled_from([0.0, 0.1]))}
    cluster = {"replicas": draw(st.integers(1, top)), "autoscale": autoscale,
               "router": draw(st.sampled_from(["round_robin", "random", "least_outstanding", "least_kv",
                                               "power_of_two", "session_affinity", "session", "prefix_affinity"]))}
    return {**scenario, "workload": workload, "cluster": cluster}


@st.composite
def cache_routed(draw, base) -> dict:
    """Conversations with a system prompt on a fleet routed by what each replica holds cached: the
    routers read the prefix caches at arrival instants, inside runs of steps, with caches from cramped
    (evicting all the time) to ample."""
    scenario = draw(base)
    workload = {**scenario["workload"], "num_sessions": draw(st.integers(1, 12)),
                "prefix": {"shared_tokens": draw(st.integers(0, 300)), "share": draw(st.sampled_from([0.5, 1.0])),
                           "multi_turn": True, "max_context_tokens": draw(st.integers(200, 3000))}}
    router = draw(st.sampled_from(["session", "prefix_affinity"]))
    cluster = {"replicas": draw(st.integers(2, 3)), "router": router}
    if router == "prefix_affinity":
        cluster["prefix_affinity"] = draw(st.fixed_dictionaries({
            "prefix_weight": st.sampled_from([0.0, 1.0, 3.0]), "queue_weight": st.sampled_from([1.0, 2.0]),
            "cache_threshold": st.sampled_from([0.0, 0.3]),
            "balance_abs_threshold": st.sampled_from([None, 0, 4])}))
    batching = {**scenario["batching"], "mode": "continuous"}
    kv_cache = {**scenario["kv_cache"], "enable_prefix_caching": True}
    device = {**scenario["device"], "speculative": None}
    return {**scenario, "workload": workload, "cluster": cluster, "batching": batching, "kv_cache": kv_cache,
            "device": device}


# Found by the test below: a decode inside a run of steps evicts the cached prefix of a waiting
# request, which then needs fewer free blocks (its chunk counted from 0, not from its hit) and is
# admitted at once when stepping; a run of steps must end before such an eviction.
EVICTION_ADMITS = {
    "seed": 592,
    "workload": {
        "num_requests": 60,
        "arrival": {"process": "gamma", "rate": 3.1319242445599556, "burstiness": 1.0957138793943386},
        "prompt_tokens": {"dist": "fixed", "value": 79}, "output_tokens": {"dist": "fixed", "value": 80},
        "classes": [{"name": "interactive", "priority": 0, "share": 1},
                    {"name": "batch", "priority": 2, "share": 2.4118089092841943}],
        "prefix": {"shared_tokens": 87, "share": 1.0, "multi_turn": True, "max_context_tokens": 577},
        "num_sessions": 10, "adapters": {"count": 7, "popularity": "zipf", "base_share": 0.3}},
    "device": {
        "tau0_ms": 15.270754781746097, "beta_ms": 0.020980167455423086,
        "prefill_ms_per_token": 0.004189116321124798, "kv_read_ms_per_1k_tokens": 0.0,
        "prefill_attention_ms_per_1m_pairs": 0.0, "weights_ms": 6.684977769553507, "moe": None,
        "speculative": None},
    "kv_cache": {
        "block_size": 4, "num_blocks": 124, "swap_blocks": 377, "swap_ms_per_block": 0.07322546932850839,
        "enable_prefix_caching": True},
    "batching": {
        "mode": "continuous", "max_num_seqs": 19, "max_num_batched_tokens": 470,
        "enable_chunked_prefill": True, "long_prefill_token_threshold": 231, "pad_prompts": False,
        "max_wait_ms": None, "max_queue_delay_ms": 0.0},
    "scheduler": {
        "policy": "fair", "preemption": "swap", "aging_s": None, "max_preemptions": None, "max_waiting": None,
        "head_of_line_blocking": False, "tenant_weights": {"interactive": 2.0}, "async_scheduling": True},
    "cluster": {"replicas": 2, "router": "session"},
    "features": {},
    "frontend": {},
    "sim": {"max_time_s": None},
    "lora": {
        "max_loras": 1, "max_cpu_loras": 1, "host_link_gb_s": 57.43843909250338, "adapter_bytes": 84000000.0},
}


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cache_routed(scenarios()))
@example(scenario=EVICTION_ADMITS)
def test_fast_forward_equals_stepping_routed_by_cache(scenario):
    assert_same_run(scenario)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(autoscaled(scenarios()))
def test_fast_forward_equals_stepping_autoscaled(scenario):
    assert_same_run(scenario)


@st.composite
def with_clients(draw, base) -> dict:
    """A scenario whose requests a client sends: capped at N in flight, or N closed-loop users."""
    scenario = draw(base)
    workload = dict(scenario["workload"])
    if "trace" in workload or draw(st.booleans()):
        workload["max_concurrency"] = draw(st.integers(1, 8))
    else:
        workload["arrival"] = None
        workload["closed_loop"] = {"concurrency": draw(st.integers(1, 8)),
                                   "think_time_s": draw(st.sampled_from([0.0, 0.125, 0.3]))}
    batching = client_safe(scenario["batching"])
    cluster = {**scenario["cluster"], "signal_delay_ms": 0.0}  # delayed snapshots need arrivals known in advance
    return {**scenario, "workload": workload, "batching": batching, "cluster": cluster}


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(with_clients(scenarios()))
def test_fast_forward_equals_stepping_with_a_client(scenario):
    assert_same_run(scenario)


@st.composite
def tie_scenarios(draw, trace_dir) -> dict:
    """A scenario where arrivals, step ends and the clock stop fall on the same instants.

    Steps last multiples of 1/64 s (tau0 a multiple of 1/8 s; beta 0 or 1/64 s; gamma 0 or 1/8 ms per
    token; delta 0 or 1/64 s per cached token read; epsilon 0 or 1/8 ms per attention pair), or, with
    delta at half a nanosecond per token, steps whose context time rounds half up, arrivals come at constant gaps of 1/8 s to 2 s, all at t = 0, or at integer seconds from a
    trace with repeated timestamps (simultaneous arrivals), and the clock stops at a multiple of 1/8 s.
    """
    scenario = draw(scenarios())
    kind = draw(st.sampled_from(["constant", "at_once", "trace"]))
    workload = scenario["workload"]
    if kind == "trace":
        times = sorted(draw(st.lists(st.integers(0, 20), min_size=1, max_size=60)))
        prompts = draw(st.lists(st.integers(1, 200), min_size=len(times), max_size=len(times)))
        outputs = draw(st.lists(st.integers(1, 200), min_size=len(times), max_size=len(times)))
        path = trace_dir / f"ties_{abs(hash((tuple(times), tuple(prompts), tuple(outputs))))}.csv"
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" +
                        "".join(f"{t},{p},{o}\n" for t, p, o in zip(times, prompts, outputs, strict=True)))
        workload = {"trace": {"path": str(path)}, "classes": workload["classes"]}  # a trace has no prefixes
    else:
        rate = math.inf if kind == "at_once" else draw(st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0]))
        workload = {**workload, "arrival": {"process": "constant", "rate": rate},
                    "num_requests": min(workload["num_requests"], 60)}
    replicas = draw(st.integers(1, 3))
    router = draw(routers())
    # A signal delay applies to routers that read load, but not to those that read the caches live.
    delayed = replicas > 1 and ROUTERS[router].reads_load and not ROUTERS[router].reads_cache
    return {
        **scenario,
        "workload": workload,
        "device": {"tau0_ms": 125.0 * draw(st.integers(1, 8)), "beta_ms": draw(st.sampled_from([0.0, 15.625])),
                   "prefill_ms_per_token": draw(st.sampled_from([0.0, 0.125])),
                   "kv_read_ms_per_1k_tokens": draw(st.sampled_from([0.0, 0.0005, 15_625.0])),
                   "prefill_attention_ms_per_1m_pairs": draw(st.sampled_from([0.0, 125_000.0])),
                   # Drafter passes of 1/8 s, or a binary fraction of a decode step: steps still on 1/64 s.
                   "speculative": None if scenario["device"]["speculative"] is None else {
                       **scenario["device"]["speculative"], "draft_cost_ms": None,
                       **draw(st.one_of(st.builds(lambda m: {"draft_cost_ms": m}, st.sampled_from([0.0, 125.0])),
                                        st.builds(lambda f: {"draft_cost_fraction": f},
                                                  st.sampled_from([0.25, 0.5]))))}},
        "kv_cache": {**scenario["kv_cache"], "swap_ms_per_block": draw(st.sampled_from([0.0, 0.125]))},
        "batching": {**scenario["batching"],
                     "max_wait_ms": draw(st.one_of(st.none(), st.sampled_from([125.0, 1000.0]))),
                     "max_queue_delay_ms": draw(st.sampled_from([0.0, 125.0, 500.0]))},
        "cluster": {"replicas": replicas, "router": router,
                    "signal_delay_ms": draw(st.sampled_from([0.0, 125.0, 1000.0])) if delayed else 0.0,
                    "max_in_flight": draw(st.one_of(st.none(), st.integers(1, 12)))},
        # Latencies on the 1/8 s grid: requests reach the engine, and tokens the client, on step boundaries.
        "frontend": {"request_latency_ms": draw(st.sampled_from([0.0, 125.0, 1000.0])),
                     "response_latency_ms": draw(st.sampled_from([0.0, 125.0]))},
        "sim": {"max_time_s": draw(st.one_of(st.none(), st.integers(1, 320).map(lambda k: k / 8)))},
    }


@settings(max_examples=examples(70), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_forward_equals_stepping_on_exact_ties(data, tmp_path_factory):
    assert_same_run(data.draw(tie_scenarios(tmp_path_factory.getbasetemp())))


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_forward_equals_stepping_on_exact_ties_with_a_client(data, tmp_path_factory):
    """Completions and the sends they free coincide with step ends all the time here."""
    assert_same_run(data.draw(with_clients(tie_scenarios(tmp_path_factory.getbasetemp()))))


def run_lone_replica(scenario: Scenario, run_ahead: bool) -> tuple:
    workload = generate(scenario)
    engine = Engine(scenario, workload)
    engine.replicas[0].run_ahead = run_ahead
    end_s = engine.run()
    rec = engine.recorder
    requests, iterations = requests_frame(workload, rec), iterations_frame(rec)
    return requests, iterations, summarize(scenario, requests, iterations, rec, end_s), rec.stall_gaps_s


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_running_ahead_of_simpy_is_invisible(scenario):
    """A lone accelerated replica that applies the steps ending before the next arrival at once,
    without SimPy events (:mod:`simbatch.engine.replica`), records exactly what yielding for every
    step or run records."""
    scenario = Scenario.model_validate({**scenario, "cluster": {"replicas": 1},
                                        "sim": {**scenario["sim"], "fast_forward": True}})
    ahead, stepped = run_lone_replica(scenario, True), run_lone_replica(scenario, False)
    pd.testing.assert_frame_equal(ahead[0], stepped[0], check_exact=True)
    pd.testing.assert_frame_equal(ahead[1], stepped[1], check_exact=True)
    assert ahead[3] == stepped[3]
    assert ahead[2].keys() == stepped[2].keys()
    for key, value in stepped[2].items():
        assert (math.isnan(value) and math.isnan(ahead[2][key])) or ahead[2][key] == value, key


def test_the_accelerated_engine_saves_events():
    """The reference engine yields once per step; the accelerated one, running ahead, only to sleep
    until the next arrival, which it takes itself (and for runs, not steps, without running ahead)."""

    def timeouts(fast_forward: bool, run_ahead: bool = True) -> int:
        scenario = Scenario.model_validate({"workload": {"num_requests": 300, "arrival": {"rate": 2.0}},
                                            "sim": {"fast_forward": fast_forward}})
        engine = Engine(scenario, generate(scenario))
        engine.replicas[0].run_ahead = run_ahead
        made = []
        timeout = engine.env.timeout
        engine.env.timeout = lambda delay=0, value=None: made.append(delay) or timeout(delay, value)
        engine.run()
        return len(made)

    reference, runs, ahead = timeouts(False), timeouts(True, run_ahead=False), timeouts(True)
    assert ahead <= 300 < runs < reference
    assert reference == simulate(Scenario.model_validate(
        {"workload": {"num_requests": 300, "arrival": {"rate": 2.0}}})).summary["num_steps"]


def test_fast_forward_skips_steps_on_a_long_decode():
    """A saturated decode is one run per batch membership, not one row per token."""
    scenario = {"workload": {"num_requests": 64, "arrival": {"rate": float("inf")},
                             "prompt_tokens": {"dist": "fixed", "value": 16},
                             "output_tokens": {"dist": "fixed", "value": 2000}}}
    assert_same_run(scenario)
    result = simulate(Scenario.model_validate(scenario))
    assert result.summary["num_steps"] == 2000  # one prefill step, 1999 decode steps
    assert len(result.iterations) == 2


def test_fast_forward_under_memory_pressure_and_overload():
    """Block shortages and preemptions cut runs exactly where stepping would have preempted."""
    assert_same_run({
        "workload": {"num_requests": 400, "arrival": {"rate": 30},
                     "prompt_tokens": {"dist": "uniform", "low": 20, "high": 300},
                     "output_tokens": {"dist": "exponential", "mean": 150, "max": 900}},
        "kv_cache": {"num_blocks": 120, "block_size": 16, "swap_blocks": 60, "swap_ms_per_block": 0.05},
        "batching": {"max_num_seqs": 32, "max_num_batched_tokens": 512},
        "scheduler": {"preemption": "swap"},
        "device": {"prefill_ms_per_token": 0.01},
    })


def test_the_gemm_tile_switch_runs_alike_stepped_or_accelerated():
    """Steps whose batch crosses the GEMM tile switch (17 to 64 tokens here) cost more; a decode run's
    repeats keep one membership, so one charge each, and the runs still sum exactly, context read included."""
    scenario = {"workload": {"num_requests": 200, "arrival": {"rate": 40.0},
                             "prompt_tokens": {"dist": "uniform", "low": 4, "high": 120},
                             "output_tokens": {"dist": "exponential", "mean": 80, "max": 400}},
                "device": {"tau0_ms": 19.5, "beta_ms": 0.12, "prefill_ms_per_token": 0.13,
                           "kv_read_ms_per_1k_tokens": 0.035, "gemm_tier_tokens": [16, 64], "gemm_tier_ms": 7.0}}
    assert_same_run(scenario)
    charged = simulate(Scenario.model_validate(scenario)).summary["mean_itl_ms"]
    free = simulate(Scenario.model_validate({**scenario, "device": {**scenario["device"], "gemm_tier_ms": 0.0}}))
    assert charged > free.summary["mean_itl_ms"]


def test_speculative_decoding_runs_alike_stepped_or_accelerated():
    """Speculating decodes emit a random count each step: the accelerated engine plans them one at a
    time, with the same acceptances, through preemptions and arrivals on step boundaries."""
    scenario = {"workload": {"num_requests": 60, "arrival": {"process": "constant", "rate": 8.0},
                             "prompt_tokens": {"dist": "uniform", "low": 8, "high": 200},
                             "output_tokens": {"dist": "exponential", "mean": 60, "max": 300}},
                "device": {"tau0_ms": 125.0, "beta_ms": 15.625, "prefill_ms_per_token": 0.125,
                           "speculative": {"num_speculative_tokens": 4, "acceptance_rate": 0.75,
                                           "draft_cost_fraction": 0.25}},
                "kv_cache": {"block_size": 4, "num_blocks": 300},
                "sim": {"max_time_s": 30.0}}
    assert_same_run(scenario)
    result = simulate(Scenario.model_validate(scenario))
    assert result.summary["num_preemptions"] > 0 and result.summary["spec_decode_accepted_tokens"] > 0


def test_a_clock_stop_in_the_middle_of_a_run_applies_the_steps_already_done():
    """sim.max_time_s can fall inside a run of steps: the steps that ended before it count."""
    scenario = {"workload": {"num_requests": 3, "arrival": {"rate": 10},
                             "prompt_tokens": {"dist": "fixed", "value": 10},
                             "output_tokens": {"dist": "fixed", "value": 1000}},
                "sim": {"max_time_s": 5.0}}
    assert_same_run(scenario)
    result = simulate(Scenario.model_validate(scenario))
    assert (result.requests["status"] == "unfinished").all()
    # Each request decodes every step from its prefill to the stop, 20.6 ms a step.
    assert result.requests["generated_tokens"].between(200, 240).all()
    # The step in progress at the stop is the last row: begun before it, no tokens recorded.
    *done, last = result.iterations.itertuples()
    assert all(r.end_s <= 5.0 for r in done)
    assert last.start_s < 5.0 < last.end_s and last.num_steps == 1 and last.itl_tokens == 0


def test_the_chapters_integer_time_workload_runs_alike_stepped_or_fast_forwarded():
    """The chapter's toy workload: arrivals at whole iterations, steps of exactly one iteration, so
    arrivals and step ends coincide all the time (before the clock had whole nanoseconds and one tie
    rule, over a hundred of its 200 requests were scheduled a step later when fast-forwarded)."""
    scenarios_dir = Path(__file__).resolve().parents[1] / "scenarios"
    toy = yaml.safe_load((scenarios_dir / "chapter_toy.yaml").read_text(encoding="utf-8"))
    toy["workload"]["trace"]["path"] = str(scenarios_dir / toy["workload"]["trace"]["path"])
    for blocking in (True, False):
        assert_same_run({**toy, "scheduler": {**toy["scheduler"], "head_of_line_blocking": blocking}})


LIBRARY = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.stem)
def test_the_scenario_library_runs_alike_on_both_engines(path):
    scenario = yaml.safe_load(path.read_text(encoding="utf-8"))
    workload = scenario["workload"]
    if "trace" in workload:
        workload["trace"]["path"] = str(path.parent / workload["trace"]["path"])
    workload["num_requests"] = min(workload.get("num_requests") or 150, 150)
    assert_same_run(scenario)


@pytest.mark.parametrize("name", ["B1", "B3", "B4", "B5", "B7", "B8", "B9"])
def test_the_benchmark_workloads_run_alike_on_both_engines(name):
    from benchmarks.cases import CASES  # the benchmarks' own scenarios, at a test's size

    scenario = CASES[name][1]().model_dump(mode="json", exclude_unset=True)
    scenario["workload"]["num_requests"] = 800
    assert_same_run(scenario)


@st.composite
def disaggregated(draw, base, exact: bool) -> dict:
    """``base`` with disaggregated prefill and decode: one or two replicas a pool, the decode pool with
    its own slots and (often fewer) blocks, so that requests queue for room there, and a KV link whose
    transfers last, when ``exact``, a multiple of 1/64 s (on step boundaries, as the steps of
    :func:`tie_scenarios` are) or the 125 ms latency alone."""
    scenario = draw(base)
    # Multi-LoRA is refused on disaggregated pools; a decode replica has no prefix cache, hence no host tier.
    scenario.pop("lora", None)
    scenario["workload"] = {k: v for k, v in scenario["workload"].items() if k != "adapters"}
    batching = {**scenario["batching"], "mode": draw(modes(iteration_level=True))}
    shape = draw(features(batching["mode"], cluster=True))["cluster.disaggregated"]  # the registry's draw
    decode_kv = {**{k: v for k, v in scenario["kv_cache"].items() if not k.startswith("host_")},
                 "enable_prefix_caching": False, "num_blocks": shape["decode_num_blocks"]}
    decode_batching = {**batching, "max_num_seqs": min(shape["decode_seqs"], batching["max_num_batched_tokens"])}
    if exact:
        bytes_per_token, gb_per_s = draw(st.sampled_from([(15_625_000, 1.0), (1, 1000.0)]))
        latency_ms = draw(st.sampled_from([0.0, 125.0]))
    else:
        bytes_per_token, gb_per_s = draw(st.floats(1e3, 1e6)), draw(st.floats(0.1, 100))
        latency_ms = draw(st.floats(0, 50))
    pools = {"prefill": {"count": shape["prefill"]},
             "decode": {"count": shape["decode"], "kv_cache": decode_kv, "batching": decode_batching},
             "kv_transfer": {"bandwidth_gb_s": gb_per_s, "latency_ms": latency_ms},
             "kv_bytes_per_token": bytes_per_token,
             "decode_router": shape["decode_router"]}
    cluster = {"router": scenario["cluster"]["router"], "disaggregated": pools}
    return {**scenario, "batching": batching, "cluster": cluster}


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(disaggregated(scenarios(), exact=False))
def test_fast_forward_equals_stepping_disaggregated(scenario):
    """Hand-overs and transfer deliveries reach decode replicas mid-run: they cut it as arrivals do."""
    assert_same_run(scenario)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_forward_equals_stepping_disaggregated_on_exact_ties(data, tmp_path_factory):
    """First tokens, transfer ends, arrivals and step ends on the same instants."""
    assert_same_run(data.draw(disaggregated(tie_scenarios(tmp_path_factory.getbasetemp()), exact=True)))
