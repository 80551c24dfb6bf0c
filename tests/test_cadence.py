"""vLLM's engine cadence and its frontend: async scheduling, and the API server's latencies.

With async scheduling (``scheduler.async_scheduling``) the engine plans step k+1 while step k runs: a
request that arrives during step k is first scheduled in step k+2, and one that finishes in step k
keeps its slot and blocks through the plan of step k+1; an engine with nothing to run plans at once.
The frontend (``frontend.request_latency_ms``, ``response_latency_ms``) adds fixed latencies on the
way in and out, seen in TTFT and E2E latency, not in TPOT or ITL.

The scheduler cases are stepped by hand (``builders.Driver``: 1 s steps, 4-token blocks, 4 slots, a
16-token budget), on the model's own scheduler and on its accelerated twin.
"""

from __future__ import annotations

import math

import pytest
from builders import Driver, make_scenario, req, tokens

from simbatch.config import Scenario
from simbatch.model.step import IDLE
from simbatch.simulation import simulate

ENGINES = pytest.mark.parametrize("fast_forward", [False, True], ids=["reference", "accelerated"])


def driver(fast_forward: bool, **overrides) -> Driver:
    return Driver(make_scenario(scheduler__async_scheduling=True, sim__fast_forward=fast_forward, **overrides))


@ENGINES
def test_arrivals_during_a_step_wait_for_the_plan_after_next(fast_forward):
    d = driver(fast_forward)
    a, b = req(0, 4, 10), req(1, 4, 10)
    d.add(a)
    plan1 = d.plan()
    d.add(b)  # arrives while step 1 runs
    d.finish(plan1)
    plan2 = d.plan()
    assert tokens(plan2) == {0: 1}, "step 2 was planned when step 1 began, before b arrived"
    assert d.sched.num_waiting == 1 and math.isnan(b.first_scheduled_s)
    d.finish(plan2)
    plan3 = d.plan()
    assert tokens(plan3) == {0: 1, 1: 4}
    assert b.first_scheduled_s == 2.0 and b.waiting_s == 2.0  # in the server, waiting, since t = 0
    d.finish(plan3)
    assert b.first_token_s == 3.0  # arrived during step 1 (t in (0, 1]), its prefill is step 3


@ENGINES
def test_without_async_scheduling_the_next_plan_sees_the_arrival(fast_forward):
    d = Driver(make_scenario(sim__fast_forward=fast_forward))
    a, b = req(0, 4, 10), req(1, 4, 10)
    d.add(a)
    plan1 = d.plan()
    d.add(b)
    d.finish(plan1)
    assert tokens(d.plan()) == {0: 1, 1: 4}


@ENGINES
def test_a_finished_request_keeps_its_slot_through_the_next_plan(fast_forward):
    d = driver(fast_forward, batching__max_num_seqs=2)
    short, long_, waiting = req(0, 4, 2), req(1, 4, 10), req(2, 4, 10)
    d.add(short, long_, waiting)
    assert tokens(d.run()[0]) == {0: 4, 1: 4}  # two slots: the third waits
    plan, out = d.run()
    assert tokens(plan) == {0: 1, 1: 1} and out.finished == [short]
    assert short.finish_s == 2.0 and short.blocks == 2, "its blocks are freed after the next plan"
    plan = d.plan()
    assert tokens(plan) == {1: 1}, "planned before step 2's outputs came back: the slot is still taken"
    d.finish(plan)
    plan = d.plan()
    assert tokens(plan) == {1: 1, 2: 4} and short.blocks == 0


@ENGINES
def test_an_engine_with_nothing_else_to_run_plans_at_once_on_everything(fast_forward):
    # One slot: when its request finishes, the plan that holds its slot would run nothing, so the engine
    # launches nothing and plans again with the outputs in hand, as vLLM does.
    d = driver(fast_forward, batching__max_num_seqs=1)
    a, b = req(0, 4, 2), req(1, 4, 3)
    d.add(a, b)
    d.run()
    _, out = d.run()
    assert out.finished == [a]
    plan = d.plan()
    assert tokens(plan) == {1: 4} and a.blocks == 0
    d.finish(plan)
    d.run(), d.run()
    assert b.status.name == "FINISHED"
    assert d.sched.schedule(d.now) is IDLE and d.sched.kv.device.num_free == 64


def two_requests(trace, **sections) -> Scenario:
    """The trace's two requests (8 prompt and 100 output tokens at t = 0, then 32 and 4 at 0.25 s);
    steps of 100 ms + 10 ms per sequence + 1 ms per prompt token."""
    return Scenario.model_validate({
        "workload": {"trace": {"path": str(trace)}, **sections.pop("workload", {})},
        "device": {"tau0_ms": 100.0, "beta_ms": 10.0, "prefill_ms_per_token": 1.0},
        "kv_cache": {"block_size": 16, "num_blocks": 1000},
        "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 512},
        **sections,
    })


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,8,100\n0.25,32,4\n")
    return path


@pytest.mark.parametrize("fast_forward", [False, True])
def test_ttft_on_a_busy_engine_is_the_rest_of_the_step_one_more_step_and_the_prefill(trace, fast_forward):
    sim = {"fast_forward": fast_forward}
    sync = simulate(two_requests(trace, sim=sim)).requests.set_index("request_id")
    async_ = simulate(two_requests(trace, sim=sim, scheduler={"async_scheduling": True})) \
        .requests.set_index("request_id")
    # The first request's prefill is step [0, 0.108]; decodes of one sequence take 110 ms. The second
    # arrives at 0.25 during the decode step [0.218, 0.328]: without async scheduling its prefill (with
    # the first's decode: 100 + 10 + 32 ms) starts at 0.328; with it, a step later, at 0.438.
    assert sync.loc[1, "first_scheduled_s"] == pytest.approx(0.328)
    assert sync.loc[1, "ttft_s"] == pytest.approx(0.328 + 0.142 - 0.25)
    assert async_.loc[1, "first_scheduled_s"] == pytest.approx(0.438)
    assert async_.loc[1, "ttft_s"] == pytest.approx(0.438 + 0.142 - 0.25)
    # The first request, alone at an idle engine, is planned at once either way.
    assert async_.loc[0, "ttft_s"] == sync.loc[0, "ttft_s"] == pytest.approx(0.108)


@pytest.mark.parametrize("fast_forward", [False, True])
def test_frontend_latencies_add_to_ttft_and_e2e_and_leave_tpot_and_littles_law(trace, fast_forward):
    sim = {"fast_forward": fast_forward}
    plain = simulate(two_requests(trace, sim=sim))
    front = simulate(two_requests(trace, sim=sim,
                                    frontend={"request_latency_ms": 3.0, "response_latency_ms": 2.0}))
    p, f = plain.requests.set_index("request_id"), front.requests.set_index("request_id")
    # The first request reaches an idle engine 3 ms later: its whole life shifts by 3 ms, and the
    # client sees each token 2 ms after its step.
    assert f.loc[0, "ttft_s"] == pytest.approx(p.loc[0, "ttft_s"] + 0.005)
    assert f.loc[0, "e2e_s"] == pytest.approx(p.loc[0, "e2e_s"] + 0.005)
    assert f.loc[0, "tpot_s"] == pytest.approx(p.loc[0, "tpot_s"])
    assert f.loc[0, "queue_s"] == pytest.approx(p.loc[0, "queue_s"])  # the server's queue, after the hand-off
    assert (f["arrival_s"] == p["arrival_s"]).all()  # the client's send times
    for result in (plain, front):
        assert result.summary["littles_law_rel_error"] < 1e-9
    assert front.summary["mean_itl_ms"] == pytest.approx(plain.summary["mean_itl_ms"])


@pytest.mark.parametrize("fast_forward", [False, True])
def test_a_capped_client_sends_when_it_has_the_response(trace, fast_forward):
    # One request in flight: the second is sent when the client has the first one's last token.
    scenario = two_requests(trace, sim={"fast_forward": fast_forward},
                              workload={"max_concurrency": 1},
                              frontend={"request_latency_ms": 3.0, "response_latency_ms": 2.0})
    frame = simulate(scenario).requests.set_index("request_id")
    assert frame.loc[1, "arrival_s"] == pytest.approx(frame.loc[0, "finish_s"])
    assert frame.loc[1, "client_wait_s"] == pytest.approx(frame.loc[0, "finish_s"] - 0.25)
