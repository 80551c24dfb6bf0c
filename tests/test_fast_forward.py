"""Fast-forward must be invisible: the same frames and summary as stepping one iteration at a time.

Every count and event identical; every time equal to within floating-point rounding (relative 1e-9):
a run of n steps ends at start + n * step, where stepping adds the step n times. Small differences
of large times (a 1 ms TTFT at t = 60 s) keep only absolute precision, hence ATOL_S = 1 ns.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simbatch.config import Scenario
from simbatch.engine import Engine
from simbatch.metrics.summary import iterations_frame, requests_frame, summarize
from simbatch.simulation import simulate
from simbatch.workload import generate

RTOL = 1e-9
ATOL_S = 1e-9


def assert_same_run(scenario: dict) -> None:
    def run(fast_forward: bool):
        sim = {**scenario.get("sim", {}), "fast_forward": fast_forward}
        return simulate(Scenario.model_validate({**scenario, "sim": sim}), check_invariants=True)

    reference, fast = run(False), run(True)
    pd.testing.assert_frame_equal(reference.requests, fast.requests, rtol=RTOL, atol=ATOL_S)
    pd.testing.assert_frame_equal(reference.iterations, fast.iterations, rtol=RTOL, atol=ATOL_S)
    assert reference.stall_gaps_s == pytest.approx(fast.stall_gaps_s, rel=RTOL, abs=ATOL_S)
    for key, ref in reference.summary.items():
        got = fast.summary[key]
        # Summary times are in ms: 1e-6 ms is the same 1 ns slack.
        assert (math.isnan(ref) and math.isnan(got)) or math.isclose(ref, got, rel_tol=RTOL, abs_tol=1e-6), key


lengths = st.one_of(
    st.builds(lambda v: {"dist": "fixed", "value": v}, st.integers(1, 300)),
    st.builds(lambda m: {"dist": "exponential", "mean": m, "max": 800}, st.floats(2, 200)),
    st.builds(lambda lo, span: {"dist": "uniform", "low": lo, "high": lo + span}, st.integers(1, 200),
              st.integers(0, 300)),
)


@st.composite
def scenarios(draw) -> dict:
    mode = draw(st.sampled_from(["continuous", "static", "dynamic"]))
    max_num_seqs = draw(st.integers(1, 24))
    policy = draw(st.sampled_from(["fcfs", "priority", "sjf", "fair"]))
    return {
        "seed": draw(st.integers(0, 10_000)),
        "workload": {
            "num_requests": draw(st.integers(1, 120)),
            "arrival": {"process": draw(st.sampled_from(["poisson", "gamma"])),
                        "rate": draw(st.floats(0.5, 60)), "burstiness": draw(st.floats(0.3, 3))},
            "prompt_tokens": draw(lengths),
            "output_tokens": draw(lengths),
            "classes": [{"name": "interactive", "priority": 0, "share": 1},
                        {"name": "batch", "priority": 2, "share": draw(st.floats(0.1, 3))}],
        },
        "device": {"tau0_ms": draw(st.floats(1, 30)), "beta_ms": draw(st.floats(0, 1)),
                   "prefill_ms_per_token": draw(st.floats(0, 0.1))},
        "kv_cache": {"block_size": draw(st.sampled_from([1, 4, 16])), "num_blocks": draw(st.integers(40, 3000)),
                     "swap_blocks": draw(st.integers(0, 400)), "swap_ms_per_block": draw(st.floats(0, 0.5))},
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
                      "tenant_weights": {"interactive": 2.0}},
        "cluster": {"replicas": draw(st.integers(1, 3)), "router": draw(st.sampled_from(["round_robin", "random"]))},
        "sim": {"max_time_s": draw(st.one_of(st.none(), st.floats(1, 60)))},
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_stepping(scenario):
    assert_same_run(scenario)


def run_lone_replica(scenario: Scenario, run_ahead: bool) -> tuple:
    workload = generate(scenario)
    engine = Engine(scenario, workload)
    engine.replicas[0].run_ahead = run_ahead
    end_s = engine.run()
    rec = engine.recorder
    requests, iterations = requests_frame(workload, rec), iterations_frame(rec)
    return requests, iterations, summarize(scenario, requests, iterations, rec, end_s), rec.stall_gaps_s


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.booleans())
def test_running_ahead_of_simpy_is_invisible(scenario, fast_forward):
    """A lone replica that applies the steps ending before the next arrival at once, without SimPy
    events (engine module docstring), records exactly what yielding for every step records."""
    scenario = Scenario.model_validate({**scenario, "cluster": {"replicas": 1},
                                        "sim": {**scenario["sim"], "fast_forward": fast_forward}})
    ahead, stepped = run_lone_replica(scenario, True), run_lone_replica(scenario, False)
    pd.testing.assert_frame_equal(ahead[0], stepped[0], check_exact=True)
    pd.testing.assert_frame_equal(ahead[1], stepped[1], check_exact=True)
    assert ahead[3] == stepped[3]
    assert ahead[2].keys() == stepped[2].keys()
    for key, value in stepped[2].items():
        assert (math.isnan(value) and math.isnan(ahead[2][key])) or ahead[2][key] == value, key


def test_a_lone_replica_runs_ahead_instead_of_yielding_every_step():
    scenario = Scenario.model_validate({"workload": {"num_requests": 300, "arrival": {"rate": 2.0}},
                                        "sim": {"fast_forward": False}})

    def timeouts(run_ahead: bool) -> int:
        engine = Engine(scenario, generate(scenario))
        engine.replicas[0].run_ahead = run_ahead
        made = []
        timeout = engine.env.timeout
        engine.env.timeout = lambda delay=0, value=None: made.append(delay) or timeout(delay, value)
        engine.run()
        return len(made)

    # Stepping: one timeout per step and per arrival. Running ahead: the replica yields only for
    # the step in progress at each arrival.
    stepping, ahead = timeouts(False), timeouts(True)
    assert ahead <= 2 * 300 < stepping


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
