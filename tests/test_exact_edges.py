"""Edge cases where a result is decided exactly: ties, clock stops, and rules that must hold to the letter.

Each test is the reproduction of a defect found by reading the engine against vLLM V1 and by runs on
integer-time traces; each failed before its fix.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd
import pytest
from builders import Driver, fixed, make_scenario, req, tokens

from simbatch import simulate
from simbatch.analysis.fleet import per_replica
from simbatch.config import Scenario
from simbatch.engine import Engine
from simbatch.model.clock import NS_PER_S
from simbatch.workload import generate


def both_modes(scenario: dict) -> tuple:
    return tuple(simulate(Scenario.model_validate({**scenario, "sim": {**scenario.get("sim", {}), "fast_forward": ff}}),
                          check_invariants=True) for ff in (False, True))


# ----------------------------------------------------------------------------- 1. exact ties
TIE = {"workload": {"num_requests": 2, "arrival": {"process": "constant", "rate": 2},
                    "prompt_tokens": fixed(8), "output_tokens": fixed(10)},
       "device": {"tau0_ms": 125, "beta_ms": 0}}


def test_an_arrival_on_a_step_boundary_is_seen_by_the_next_plan_in_both_modes():
    # Request 0 arrives at 0.5 and steps every 0.125 s; request 1 arrives at 1.0, exactly when
    # request 0's fourth step ends: the fifth step's plan admits it.
    stepped, fast = both_modes(TIE)
    for result in (stepped, fast):
        rq = result.requests
        assert rq["first_scheduled_s"].tolist() == [0.5, 1.0]
        assert rq["first_token_s"].tolist() == [0.625, 1.125]
    pd.testing.assert_frame_equal(stepped.iterations, fast.iterations, check_exact=True)


def test_a_router_reading_at_a_step_boundary_sees_the_step_that_ends_there():
    # Two replicas; request 1 arrives exactly at the end of a step of replica 0's decode run. The KV
    # count the router reads must be that step's, in a run taken in one go as when stepping.
    scenario = {"workload": {"num_requests": 3, "arrival": {"process": "constant", "rate": 2},
                             "prompt_tokens": fixed(3), "output_tokens": fixed(40)},
                "device": {"tau0_ms": 125, "beta_ms": 0},
                "kv_cache": {"block_size": 1, "num_blocks": 400},
                "cluster": {"replicas": 2, "router": "least_kv"}}
    seen = {}
    for ff in (False, True):
        sc = Scenario.model_validate({**scenario, "sim": {"fast_forward": ff}})
        engine = Engine(sc, generate(sc))
        route = engine.router.route
        engine.router.route = lambda i, reps, route=route, ff=ff: (
            seen.setdefault(ff, []).append([r.kv_blocks_used for r in reps]), route(i, reps))[1]
        engine.run()
    # At t = 1.0 replica 0 ends the 4th step of its request (arrived at 0.5): the 3 prompt tokens
    # of step 1 and the decode tokens of steps 2 to 4, one block each: 6 blocks, not the 5th step's 7.
    assert seen[False] == seen[True]
    assert seen[False][1] == [6, 0]


# ----------------------------------------------------------------------------- 2. swap under priority
def test_swapping_out_a_request_mid_chunk_moves_only_its_computed_blocks():
    scenario = {"seed": 3988,
                "workload": {"num_requests": 8, "arrival": {"rate": 184.79},
                             "prompt_tokens": {"dist": "uniform", "low": 1, "high": 30},
                             "output_tokens": {"dist": "uniform", "low": 1, "high": 12},
                             "classes": [{"name": "hi", "priority": 0}, {"name": "lo", "priority": 1}]},
                "kv_cache": {"block_size": 4, "num_blocks": 12, "swap_blocks": 100},
                "batching": {"max_num_seqs": 3, "max_num_batched_tokens": 11},
                "scheduler": {"policy": "priority", "preemption": "swap"}}
    stepped, fast = both_modes(scenario)  # check_invariants: host and device blocks conserved
    assert stepped.summary["num_preemptions"] > 0 and stepped.iterations["swap_blocks"].sum() > 0
    assert (stepped.requests["status"] == "finished").all()


def test_a_swapped_out_prefill_keeps_blocks_for_its_computed_tokens_only():
    d = Driver(make_scenario(kv_cache__num_blocks=2, kv_cache__swap_blocks=8, scheduler__preemption="swap",
                             scheduler__policy="priority", batching__long_prefill_token_threshold=4))
    low = req(0, 12, 4, priority=1)
    d.add(low)
    d.run()  # low computes 4 of its 12 prompt tokens: 1 block
    assert (low.num_computed_tokens, low.blocks) == (4, 1)
    high = req(1, 12, 4, priority=0)
    d.add(high)
    # low reserves 1 more block for its next chunk, then high's admission evicts it: the block of
    # its 4 computed tokens goes to the host, the reserved one is freed.
    plan = d.plan()
    assert plan.num_preempted == 1 and tokens(plan) == {1: 4}
    assert (low.swapped_blocks, low.blocks, d.sched.kv.host.num_free) == (1, 0, 7)


# ----------------------------------------------------------------------------- 3. forced preemption
def test_a_forced_preemption_does_not_readmit_its_victim_in_the_same_step():
    # a and b both run out of memory; b is protected by max_preemptions and outranked by a, so
    # nobody can be evicted by the normal rules. The cap yields: b is preempted, a decodes, and b,
    # whose recompute chunk would fit in what is left, must wait for the next step.
    d = Driver(make_scenario(kv_cache__num_blocks=4, batching__long_prefill_token_threshold=4,
                             scheduler__max_preemptions=1))
    a, b = req(0, 4, 10), req(1, 12, 10)
    b.num_preemptions = 1
    d.add(a, b)
    for _ in range(5):
        d.run()
    assert (a.num_computed_tokens, b.num_computed_tokens, d.sched.kv.device.num_free) == (8, 8, 0)
    plan = d.plan()
    assert tokens(plan) == {0: 1}
    assert (plan.num_preempted, plan.num_admitted) == (1, 0)
    assert b.status.name == "WAITING" and d.sched.kv.device.num_free == 1
    d.finish(plan)
    plan = d.plan()
    assert plan.num_admitted == 1 and 1 in tokens(plan)  # the next step takes it back


# ----------------------------------------------------------------------------- 4. delayed signals
def test_every_arrival_consumes_its_own_snapshot_even_when_the_cluster_cap_rejects_it():
    sc = Scenario.model_validate({
        "workload": {"num_requests": 40, "arrival": {"rate": 60.0}, "output_tokens": fixed(30)},
        "cluster": {"replicas": 2, "router": "least_outstanding", "signal_delay_ms": 30, "max_in_flight": 3},
    })
    workload = generate(sc)
    engine = Engine(sc, workload)
    taken_at: deque[int] = deque()  # when each snapshot in the queue was taken, in queue order

    class Tagged(deque):
        def append(self, view):
            taken_at.append(engine.env.now)
            super().append(view)

        def popleft(self):
            popped.append(taken_at.popleft())
            return super().popleft()

    popped: list[int] = []
    routed_on: dict[int, int] = {}
    engine._views = Tagged()
    route = engine.router.route
    engine.router.route = lambda i, view: (routed_on.__setitem__(i, popped[-1]), route(i, view))[1]
    engine.run()
    rejected = engine.recorder.reason == "cluster_full"
    assert rejected.sum() > 0, "the scenario should hit the cluster cap"
    delay_ns = 30 * 1_000_000
    arrival_ns = np.rint(workload.arrival_s * NS_PER_S).astype(np.int64)
    assert routed_on, "requests should be routed"
    for i, t in routed_on.items():
        assert t == max(0, arrival_ns[i] - delay_ns), f"request {i} was routed on another request's snapshot"


# ----------------------------------------------------------------------------- 5. per-replica utilization
def test_per_replica_utilization_stops_at_the_clock_like_the_cluster_one():
    sc = make_scenario(workload__num_requests=20, workload__arrival__rate=1000.0,
                       workload__prompt_tokens=fixed(8), workload__output_tokens=fixed(500),
                       cluster__replicas=2, sim__max_time_s=0.1)
    result = simulate(sc)
    table = per_replica(result.requests, result.iterations, result.summary["duration"], 2)
    assert (table["busy_fraction"] <= 1.0 + 1e-12).all()
    assert table["busy_fraction"].mean() == pytest.approx(result.summary["busy_fraction"], rel=1e-12)
    assert result.summary["replica_0_busy_fraction"] == pytest.approx(table["busy_fraction"][0], rel=1e-12)


# ----------------------------------------------------------------------------- 6. duration
def test_duration_runs_to_the_last_rejection_of_a_run_that_served_nobody():
    sc = make_scenario(workload__num_requests=5, workload__arrival__process="constant",
                       workload__arrival__rate=1.0, workload__prompt_tokens=fixed(400),
                       kv_cache__num_blocks=10, sim__max_time_s=5.5)
    summary = simulate(sc).summary
    assert summary["rejected"] == 5
    # The last rejection, at t = 5 (constant gaps of 1 s from t = 1); the clock stop cut nothing.
    assert summary["duration"] == 5.0
    assert summary["request_throughput"] == 0.0


def test_duration_is_the_clock_stop_when_arrivals_were_still_to_come():
    sc = make_scenario(workload__num_requests=10, workload__arrival__process="constant",
                       workload__arrival__rate=1.0, workload__output_tokens=fixed(2), sim__max_time_s=4.5)
    summary = simulate(sc).summary
    assert summary["completed"] == 4 and summary["unfinished"] == 0
    assert summary["duration"] == 4.5


# ----------------------------------------------------------------------------- 7. queue time
def test_queue_time_is_the_first_wait_and_waiting_time_adds_the_waits_after_preemption():
    sc = make_scenario(workload__num_requests=12, workload__arrival__rate=float("inf"),
                       workload__prompt_tokens=fixed(6), workload__output_tokens=fixed(30),
                       kv_cache__num_blocks=20)
    rq = simulate(sc, check_invariants=True).requests
    preempted = rq[rq["num_preemptions"] > 0]
    assert len(preempted) > 0, "the scenario should preempt"
    assert np.allclose(rq["queue_s"], rq["first_scheduled_s"] - rq["arrival_s"])
    assert (preempted["waiting_s"] > preempted["queue_s"]).all()
    never = rq[rq["num_preemptions"] == 0]
    assert np.allclose(never["waiting_s"], never["queue_s"])


# ----------------------------------------------------------------------------- head-of-line blocking
def test_head_of_line_blocking_stops_admission_at_the_first_request_that_does_not_fit():
    # 6 blocks of 4 tokens. A 20-token prompt needs 5 blocks, but 2 are held by a running request:
    # with head-of-line blocking the 4-token prompt behind it waits too; without, it is admitted.
    for blocking, admitted in ((True, {0: 1}), (False, {0: 1, 2: 4})):
        d = Driver(make_scenario(kv_cache__num_blocks=6, batching__enable_chunked_prefill=False,
                                 batching__max_num_batched_tokens=32, scheduler__head_of_line_blocking=blocking))
        d.add(req(0, 5, 20))
        d.run()  # request 0 holds 2 blocks (5 prompt tokens, the 6th reserved next)
        d.add(req(1, 20, 4), req(2, 4, 4))
        plan = d.plan()
        assert tokens(plan) == admitted
        # The passed-over request keeps its place at the head.
        assert d.sched.waiting.peek().request_id == 1


def test_backfilling_can_starve_a_large_request_behind_a_stream_of_small_ones():
    # A large prompt needs 15 of the 20 blocks; small requests keep arriving. With head-of-line
    # blocking it is served once the small ones ahead of it drain; with backfilling the small ones
    # that arrive after it keep overtaking it, and it waits for the stream to end. Backfilling buys
    # a lower mean TTFT over all requests: the trade-off is real.
    scenario = {"workload": {"num_requests": 200, "arrival": {"process": "constant", "rate": 8.0},
                             "classes": [{"name": "big", "share": 1, "prompt_tokens": fixed(200)},
                                         {"name": "small", "share": 99, "prompt_tokens": fixed(16)}],
                             "output_tokens": fixed(40)},
                "kv_cache": {"block_size": 16, "num_blocks": 20},
                "batching": {"max_num_seqs": 16, "max_num_batched_tokens": 256}}
    runs = {}
    for blocking in (True, False):
        sc = Scenario.model_validate({**scenario, "scheduler": {"head_of_line_blocking": blocking}})
        runs[blocking] = simulate(sc, check_invariants=True).requests
    big = {k: rq[rq["tenant"] == "big"] for k, rq in runs.items()}
    assert len(big[True]) == 4  # at 14.6, 19.5, 21.5 and 22.1 s
    assert big[True]["ttft_s"].max() < 2.0
    last_small_arrival = runs[False].loc[runs[False]["tenant"] == "small", "arrival_s"].max()
    assert (big[False]["first_scheduled_s"] > last_small_arrival).all()
    assert big[False]["ttft_s"].min() > 5.0
    assert runs[False]["ttft_s"].mean() < runs[True]["ttft_s"].mean()
