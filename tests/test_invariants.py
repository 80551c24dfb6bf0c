"""Invariants over random small scenarios: what must hold whatever the mode, policy or memory.

Each example is a scenario small enough to run in milliseconds but tight enough to exercise the
rare paths: few KV blocks (preemption, stalls, ``never_fits``), a swap pool (swap and its fallback to
recompute), protected requests (``max_preemptions``), a queue cap, priorities and tenants, two
replicas, a clock that stops mid-run. ``check_invariants`` re-checks the pools and block
conservation inside every step; the frames are checked afterwards.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from builders import Driver, make_scenario, req
from hypothesis import given, settings
from hypothesis import strategies as st
from registered import modes, policies, registered

from simbatch import simulate
from simbatch.config import Scenario
from simbatch.model.cost import step_time_s
from simbatch.registry import MODES, POLICIES
from simbatch.workload import generate

TIME_TOL_S = 1e-9  # a run's end_s is start + n * step; stepping adds the step n times
LIVELOCK_FACTOR = 2.0  # runs that drain end well inside horizon_s (measured: at most 0.98 of it)
PROMPT_MAX, OUTPUT_MAX = 40, 40  # every length distribution below stays within these


def lengths(low: int, high: int):
    return st.one_of(
        st.builds(lambda v: {"dist": "fixed", "value": v}, st.integers(low, high)),
        st.builds(lambda a, b: {"dist": "uniform", "low": min(a, b), "high": max(a, b)},
                  st.integers(low, high), st.integers(low, high)),
        st.builds(lambda m: {"dist": "exponential", "mean": m, "max": high}, st.floats(low, high)),
    )


@st.composite
def scenarios(draw, pressure: bool = False, priority_swap: bool = False) -> Scenario:
    """A random small scenario; with ``pressure``, continuous batching short of memory under a burst,
    so that preemption, swapping, stalls and the ``max_preemptions`` fallback are the common case;
    with ``priority_swap`` as well, always the priority policy (eviction at admission), swap
    preemption and a ``max_preemptions`` cap, whose paths meet only there."""
    pressure = pressure or priority_swap
    mode = draw(modes(iteration_level=True) if pressure else st.one_of(modes(iteration_level=True), modes()))
    max_num_seqs = draw(st.sampled_from([4, 6] if pressure else [1, 2, 4, 6]))
    policy = draw(registered(POLICIES, lambda p: p.evicts_at_admission) if priority_swap else policies())
    swap = priority_swap or draw(st.booleans())
    block_size = draw(st.sampled_from([1, 4, 16]))
    # Memory in units of the largest request's peak: below 1 some requests never fit, just above 1
    # requests preempt each other, at 3 a few run side by side.
    largest = -(-(PROMPT_MAX + OUTPUT_MAX - 1) // block_size)
    factors = [1.0, 1.3, 2.0] if pressure else [0.7, 1.0, 1.3, 1.3, 2.0, 3.0]
    num_blocks = max(1, round(largest * draw(st.sampled_from(factors))))
    overrides = {
        "seed": draw(st.integers(0, 2**16)),
        "workload__num_requests": draw(st.integers(8, 24) if pressure else st.integers(1, 30)),
        "workload__arrival__process": draw(st.sampled_from(["poisson", "gamma", "constant"])),
        "workload__arrival__rate": draw(st.sampled_from([500.0, math.inf] if pressure
                                                        else [5.0, 50.0, 500.0, math.inf, math.inf])),
        "workload__arrival__burstiness": draw(st.sampled_from([0.3, 1.0, 3.0])),
        "workload__prompt_tokens": draw(lengths(1, PROMPT_MAX)),
        "workload__output_tokens": draw(lengths(1, OUTPUT_MAX)),
        "workload__classes": draw(st.sampled_from([
            None,
            [{"name": "interactive", "priority": 0, "share": 1.0},
             {"name": "batch", "priority": 2, "share": 2.0, "output_tokens": {"dist": "fixed", "value": 25}}],
        ])),
        "device__beta_ms": draw(st.sampled_from([0.0, 1.0])),
        "kv_cache__block_size": block_size,
        "kv_cache__num_blocks": num_blocks,
        "kv_cache__swap_blocks": draw(st.integers(0, largest)) if swap else 0,
        "kv_cache__swap_ms_per_block": 0.2 if swap else 0.0,
        "batching__mode": mode,
        "batching__max_num_seqs": max_num_seqs,
        "batching__max_num_batched_tokens": draw(st.sampled_from([8, 16, 48])),
        "batching__enable_chunked_prefill": pressure or draw(st.booleans()),
        "batching__long_prefill_token_threshold": draw(st.sampled_from([None, 3, 8])),
        "batching__pad_prompts": draw(st.booleans()),
        "batching__max_wait_ms": draw(st.sampled_from([None, 0.0, 15.0])),
        "batching__max_queue_delay_ms": draw(st.sampled_from([0.0, 5.0, 50.0])),
        "scheduler__policy": policy,
        "scheduler__aging_s": draw(st.sampled_from([None, 0.05])) if "aging_s" in POLICIES[policy].reads else None,
        "scheduler__sjf_key": draw(st.sampled_from(["prompt", "output"])),
        "scheduler__tenant_weights": {"batch": 2.0} if "tenant_weights" in POLICIES[policy].reads else {},
        "scheduler__preemption": "swap" if swap else "recompute",
        "scheduler__max_preemptions": draw(st.sampled_from([1, 2] if priority_swap else [None, 1, 3])),
        "scheduler__max_waiting": None if pressure else draw(st.sampled_from([None, None, 2, 8])),
        "scheduler__head_of_line_blocking": draw(st.booleans()),
        "cluster__replicas": draw(st.sampled_from([1, 1, 2])),
        "sim__max_time_s": None if pressure else draw(st.sampled_from([None, None, 0.4])),
        "sim__fast_forward": draw(st.booleans()),
    }
    return make_scenario(**overrides)


def check_requests(sc: Scenario, rq: pd.DataFrame, drained: bool) -> None:
    # One row per arrived request, each with exactly one final status.
    ids = rq["request_id"].to_numpy()
    assert len(np.unique(ids)) == len(ids)
    if drained:
        assert sorted(ids) == list(range(sc.workload.num_requests))
    assert set(rq["status"].astype(str)) <= {"finished", "rejected", "unfinished"}

    done = rq[rq["status"] == "finished"]
    rejected = rq[rq["status"] == "rejected"]
    unfinished = rq[rq["status"] == "unfinished"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert (unfinished["generated_tokens"] < unfinished["output_tokens"]).all()
    assert (rejected["generated_tokens"] == 0).all()
    assert rejected[["first_scheduled_s", "first_token_s", "finish_s"]].isna().all().all()
    assert (rejected["reason"] != "").all() and (rq.loc[rq["status"] != "rejected", "reason"] == "").all()
    assert done[["first_scheduled_s", "first_token_s", "finish_s"]].notna().all().all()
    assert unfinished["finish_s"].isna().all()

    # Time moves forward through each request's life.
    assert (done["arrival_s"] <= done["first_scheduled_s"]).all()
    assert (done["first_scheduled_s"] <= done["first_token_s"]).all()
    assert (done["first_token_s"] <= done["finish_s"]).all()
    assert (done["ttft_s"] <= done["e2e_s"]).all()
    assert (done["waiting_s"] >= done["queue_s"] - TIME_TOL_S).all()  # the first wait is part of the total
    assert (done["waiting_s"] <= done["e2e_s"] + TIME_TOL_S).all()
    started = unfinished["first_scheduled_s"].notna()
    assert (unfinished.loc[started, "arrival_s"] <= unfinished.loc[started, "first_scheduled_s"]).all()
    if not MODES[sc.batching.mode].iteration_level:  # request-level batches reserve their peak: nothing to preempt
        assert (rq["num_preemptions"] == 0).all()


def check_iterations(sc: Scenario, it: pd.DataFrame, duration_s: float) -> None:
    b = sc.batching
    assert (it["num_steps"] >= 1).all() and (it["duration_s"] > 0).all()
    assert (it["batch_size"] <= b.max_num_seqs).all() and (it["num_running"] <= b.max_num_seqs).all()
    assert (it["kv_blocks_used"] <= sc.kv_cache.num_blocks).all()
    if MODES[b.mode].iteration_level:
        assert (it["decode_tokens"] + it["prefill_tokens"] <= b.max_num_batched_tokens).all()
        assert (it["padded_tokens"] == 0).all()
    else:
        assert (it["num_preempted"] == 0).all() and (it["swap_blocks"] == 0).all()
    if sc.scheduler.preemption == "recompute":
        assert (it["swap_blocks"] == 0).all()
    # Every step began within the run; a step in progress when sim.max_time_s stopped the clock is
    # the last row of its replica, with no tokens, and may end after the stop.
    assert (it["start_s"] < duration_s + TIME_TOL_S).all()
    late = it[it["end_s"] > duration_s + TIME_TOL_S]
    assert (late["itl_tokens"] == 0).all() and late["replica"].is_unique
    for _, rows in it.groupby("replica"):
        start, end = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        assert (np.diff(start) >= 0).all(), "time went back"
        assert (end[:-1] <= start[1:] + TIME_TOL_S).all(), "two runs of one replica overlap"


def horizon_s(sc: Scenario) -> float:
    """A clock limit no run that makes progress comes near: the last arrival, then every request
    served alone, one token per step at the slowest step the scenario can take, after a full
    batching timer of its own.

    A drained run finishes at the same time with or without this limit, so it changes nothing; a
    livelock (requests preempting each other forever) becomes unfinished requests at the limit, a
    failure, instead of a test that never returns.
    """
    wl, b, kv = generate(sc), sc.batching, sc.kv_cache
    prefill = max(b.max_num_batched_tokens, int(wl.prompt_tokens.max()) * b.max_num_seqs)
    slowest_step_s = step_time_s(sc.device, b.max_num_seqs, prefill) + 2 * kv.num_blocks * kv.swap_ms_per_block / 1e3
    timer_s = MODES[b.mode].timer_s(b) or 0.0
    per_request_s = (wl.prompt_tokens + wl.output_tokens) * slowest_step_s + timer_s
    return float(wl.arrival_s.max() + per_request_s.sum())


def check_run(sc: Scenario) -> None:
    drains = sc.sim.max_time_s is None
    if drains:
        sc = sc.model_copy(update={"sim": sc.sim.model_copy(update={"max_time_s": LIVELOCK_FACTOR * horizon_s(sc)})})
    result = simulate(sc, check_invariants=True)
    rq, it, s = result.requests, result.iterations, result.summary
    if drains:
        assert s["unfinished"] == 0, f"livelock: {s['unfinished']} requests still in the system at {s['duration']:.1f} s"
    check_requests(sc, rq, drains)
    check_iterations(sc, it, s["duration"])
    assert s["completed"] + s["rejected"] + s["unfinished"] == s["num_requests"] == len(rq)
    assert s["num_preemptions"] == rq["num_preemptions"].sum() == (it["num_preempted"] * it["num_steps"]).sum()
    if s["L"] > 0:
        assert s["littles_law_rel_error"] < 1e-9

    again = simulate(sc)
    pd.testing.assert_frame_equal(rq, again.requests)
    pd.testing.assert_frame_equal(it, again.iterations)


@settings(max_examples=60, deadline=None)
@given(sc=scenarios())
def test_invariants_hold_on_random_small_scenarios(sc):
    check_run(sc)


@settings(max_examples=40, deadline=None)
@given(sc=scenarios(pressure=True))
def test_invariants_hold_under_memory_pressure(sc):
    check_run(sc)


@settings(max_examples=40, deadline=None)
@given(sc=scenarios(priority_swap=True))
def test_invariants_hold_under_priority_eviction_with_swap_and_a_preemption_cap(sc):
    check_run(sc)


def _two_decoding_one_waiting(fast_forward: bool):
    """Two requests decoding in the two slots (a lockstep group when fast-forwarded), a third waiting."""
    d = Driver(make_scenario(batching__max_num_seqs=2, kv_cache__swap_blocks=8, sim__fast_forward=fast_forward))
    d.add(req(0, 6, 20), req(1, 6, 20), req(2, 6, 20))
    for _ in range(3):
        d.run()
    running, (waiting,) = list(d.sched.running), list(d.sched.waiting)
    assert len(running) == 2 and all(r.num_generated > 1 for r in running)
    return d.sched, running, waiting


def _corruptions(fast_forward: bool) -> list:
    """Ways to break a scheduler's pools or blocks, each with the complaint it must raise."""
    def two_pools(s, running, waiting):
        s.waiting.push(running[0])

    def waiting_holds_a_block(s, running, waiting):
        s.kv.allocate_slots(waiting, 1)

    def running_not_running(s, running, waiting):
        running[0].status = waiting.status

    def leaked_block(s, running, waiting):
        s.kv.device.take(1)  # taken behind the manager's back: held by nobody

    def host_block_from_nowhere(s, running, waiting):
        waiting.host_block_ids = [0]

    cases = [(two_pools, "a request is in two pools"), (waiting_holds_a_block, "waiting request holds blocks"),
             (running_not_running, "running pool holds a non-running request"),
             (leaked_block, "device blocks not conserved"), (host_block_from_nowhere, "host blocks not conserved")]
    if fast_forward:
        def group_context(s, running, waiting):
            s._group_context += 1

        def group_holds_an_extra_block(s, running, waiting):
            assert s.kv.take_bulk(1)

        def waiting_in_the_group(s, running, waiting):
            waiting.lockstep = s  # its counters would read through the group

        cases += [(group_context, "lockstep group context drifted"),
                  (group_holds_an_extra_block, "device blocks not conserved"),
                  (waiting_in_the_group, "a waiting request reads its counters through a group")]
    else:
        def prefilling(s, running, waiting):
            s._prefilling[running[0]] = None

        cases.append((prefilling, "prefilling set drifted"))
    return cases


@pytest.mark.parametrize("fast_forward", [False, True], ids=["stepped", "lockstep"])
def test_the_step_checks_catch_each_broken_invariant(fast_forward):
    """check_invariants runs at every step of the tests above: each corruption it exists to catch,
    made on purpose, raises its own complaint (and the untouched state passes)."""
    for corrupt, complaint in _corruptions(fast_forward):
        sched, running, waiting = _two_decoding_one_waiting(fast_forward)
        sched.check_invariants()
        corrupt(sched, running, waiting)
        with pytest.raises(AssertionError, match=complaint):
            sched.check_invariants()
