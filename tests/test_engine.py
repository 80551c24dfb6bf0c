"""The SimPy engine end to end through ``simulate``: when it runs, what it charges, whom it turns away.

Step costs come from ``conftest.BASE``: 10 ms + 1 ms per decoding sequence + 0.1 ms per prefill token.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from builders import at_once, fixed, make_scenario, spaced

from simbatch import simulate
from simbatch.model.cost import decode_throughput


def test_an_idle_engine_sleeps_without_ticking_and_starts_on_arrival():
    result = simulate(spaced(2, 10.0, prompt=8, output=4))
    it, rq = result.iterations, result.requests
    # Each request: one 10.8 ms prefill, then 3 decodes of 11 ms (one run), nothing in the 10 s gaps.
    assert it["start_s"].tolist() == pytest.approx([10.0, 10.0108, 20.0, 20.0108])
    assert it["num_steps"].tolist() == [1, 3, 1, 3]
    assert it["duration_s"].tolist() == pytest.approx([0.0108, 0.011, 0.0108, 0.011])
    assert (rq["first_scheduled_s"] == rq["arrival_s"]).all()
    assert rq["finish_s"].tolist() == pytest.approx([10.0438, 20.0438])
    busy = (it["num_steps"] * it["duration_s"]).sum()
    assert result.summary["num_steps"] == 8
    assert result.summary["busy_fraction"] == pytest.approx(busy / 20.0438)


def test_step_durations_follow_the_cost_model_including_swap_transfers():
    sc = at_once(12, {"dist": "uniform", "low": 4, "high": 30}, {"dist": "uniform", "low": 5, "high": 60},
                 kv_cache__num_blocks=40, kv_cache__swap_blocks=16, kv_cache__swap_ms_per_block=0.5,
                 scheduler__preemption="swap")
    it = simulate(sc, check_invariants=True).iterations
    assert it["swap_blocks"].sum() > 0, "the scenario should swap"
    expected_ms = 10 + 1.0 * it["decode_tokens"] + 0.1 * it["prefill_tokens"] + 0.5 * it["swap_blocks"]
    assert np.allclose(it["duration_s"], expected_ms / 1e3, rtol=0, atol=1e-12)


def test_static_padding_and_idle_slots_are_charged():
    sc = at_once(3, {"dist": "choice", "values": [2, 6]}, {"dist": "choice", "values": [1, 3]},
                 batching__mode="static", batching__max_num_seqs=3, seed=3)
    result = simulate(sc)
    it, rq = result.iterations, result.requests
    prompts, outputs = rq["prompt_tokens"].to_numpy(), rq["output_tokens"].to_numpy()
    assert len(set(prompts)) > 1 and len(set(outputs)) > 1, "pick a seed with mixed lengths"
    prefill = it.iloc[0]
    assert prefill["prefill_tokens"] == prompts.sum()
    assert prefill["padded_tokens"] == (prompts.max() - prompts).sum()
    assert prefill["duration_s"] == pytest.approx((10 + 0.1 * 3 * prompts.max()) / 1e3)
    decodes = it.iloc[1:]
    # Every decode step computes all 3 slots, done or not: 13 ms, for max(output) - 1 steps.
    assert ((decodes["decode_tokens"] + decodes["padded_tokens"]) == 3).all()
    assert np.allclose(decodes["duration_s"], 0.013)
    assert decodes["num_steps"].sum() == outputs.max() - 1
    assert (decodes["padded_tokens"] * decodes["num_steps"]).sum() == (outputs.max() - outputs).sum()


def test_dynamic_batching_waits_the_queue_delay_on_the_engine_clock():
    sc = spaced(2, 10.0, prompt=4, output=2, batching__mode="dynamic", batching__max_queue_delay_ms=5.0)
    rq = simulate(sc).requests
    assert rq.loc[0, "first_scheduled_s"] == pytest.approx(10.005)
    assert rq.loc[0, "queue_s"] == pytest.approx(0.005)


def test_static_max_wait_starts_a_partial_batch_on_the_engine_clock():
    sc = spaced(2, 10.0, prompt=4, output=2, batching__mode="static", batching__max_wait_ms=7.0)
    rq = simulate(sc).requests
    assert rq.loc[0, "first_scheduled_s"] == pytest.approx(10.007)


def test_static_flushes_a_partial_batch_when_arrivals_end():
    sc = spaced(5, 1.0, prompt=4, output=2, batching__mode="static", batching__max_num_seqs=2)
    rq = simulate(sc).requests
    assert (rq["status"] == "finished").all()
    # Requests 0 and 1 form a batch at t=2; 2 and 3 at t=4; 4 alone, flushed on arrival at t=5.
    assert rq["first_scheduled_s"].tolist() == pytest.approx([2, 2, 4, 4, 5])


def test_rejections_at_arrival_carry_their_reason():
    classes = [{"name": "ok", "share": 3.0, "prompt_tokens": fixed(8)},
               {"name": "huge", "share": 1.0, "prompt_tokens": fixed(300)}]
    sc = spaced(40, 0.5, prompt=8, output=4, workload__classes=classes)
    rq = simulate(sc).requests
    huge = rq["tenant"] == "huge"
    assert huge.any() and (~huge).any()
    assert (rq.loc[huge, "status"] == "rejected").all() and (rq.loc[huge, "reason"] == "never_fits").all()
    assert rq.loc[huge, ["first_scheduled_s", "first_token_s", "finish_s"]].isna().all().all()
    assert (rq.loc[~huge, "status"] == "finished").all() and (rq.loc[~huge, "reason"] == "").all()

    classes = [{"name": "ok", "prompt_tokens": fixed(16)}, {"name": "long", "prompt_tokens": fixed(17)}]
    sc = spaced(20, 1.0, prompt=8, output=2, batching__enable_chunked_prefill=False, workload__classes=classes)
    rq = simulate(sc).requests
    long = rq["tenant"] == "long"
    assert long.any() and (~long).any()
    assert (rq.loc[long, "reason"] == "prompt_exceeds_budget").all()
    assert (rq.loc[~long, "status"] == "finished").all()


def test_a_run_where_every_request_is_rejected_still_summarizes():
    result = simulate(spaced(3, 1.0, prompt=300, output=2))
    assert (result.requests["reason"] == "never_fits").all()
    assert len(result.iterations) == 0
    s = result.summary
    assert (s["completed"], s["rejected"], s["num_steps"]) == (0, 3, 0)


def test_queue_full_rejects_beyond_max_waiting():
    result = simulate(at_once(5, 4, 3, scheduler__max_waiting=2))
    rq = result.requests
    # All five arrive at t=0 before the engine runs: two wait, three are turned away (HTTP 429).
    assert rq["status"].tolist() == ["finished"] * 2 + ["rejected"] * 3
    assert (rq["reason"].iloc[2:] == "queue_full").all()
    assert (result.summary["completed"], result.summary["rejected"]) == (2, 3)


def test_max_time_leaves_unfinished_requests_and_the_numbers_add_up():
    sc = at_once(12, 8, 200, sim__max_time_s=0.5)
    result = simulate(sc, check_invariants=True)
    rq, it, s = result.requests, result.iterations, result.summary
    unfinished = rq["status"] == "unfinished"
    assert unfinished.sum() > 0
    assert s["duration"] == 0.5
    assert s["completed"] + s["rejected"] + s["unfinished"] == s["num_requests"] == 12
    assert rq.loc[unfinished, "finish_s"].isna().all()
    assert (rq.loc[unfinished, "generated_tokens"] < rq.loc[unfinished, "output_tokens"]).all()
    # Every step began before the stop; only the one in progress at the stop (no tokens) ends after it.
    assert (it["start_s"] < 0.5).all()
    assert (it["end_s"].iloc[:-1] <= 0.5 + 1e-12).all() and it["itl_tokens"].iloc[-1] == 0
    assert 0 < s["busy_fraction"] <= 1
    assert s["littles_law_rel_error"] < 1e-9


def test_a_step_cut_by_the_clock_counts_its_preemptions_in_both_frames():
    # Step 1 starts at 11.2 ms: b's decode needs a block and c is preempted while planning it; the
    # step would end at 23.2 ms, after the clock stops at 20 ms. c's row counts the preemption (it
    # happened: c is back in WAITING without its blocks), so the iterations must count it too.
    result = simulate(at_once(3, 4, 10, kv_cache__num_blocks=4, sim__max_time_s=0.02))
    rq, it = result.requests, result.iterations
    assert rq["num_preemptions"].tolist() == [0, 0, 1]
    assert (it["num_preempted"] * it["num_steps"]).sum() == result.summary["num_preemptions"] == 1


def test_same_seed_same_frames_and_another_seed_differs():
    sc = make_scenario(workload__num_requests=30, workload__arrival__rate=20.0,
                       workload__prompt_tokens={"dist": "uniform", "low": 2, "high": 40},
                       workload__output_tokens={"dist": "exponential", "mean": 20.0, "max": 80},
                       kv_cache__num_blocks=48)
    a, b = simulate(sc), simulate(sc)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert a.summary == pytest.approx(b.summary, nan_ok=True)
    c = simulate(sc.model_copy(update={"seed": 1}))
    assert not c.requests["arrival_s"].equals(a.requests["arrival_s"])
    assert not c.iterations.equals(a.iterations)


def test_round_robin_spreads_requests_over_replicas():
    result = simulate(spaced(6, 0.001, prompt=4, output=30, cluster__replicas=3), check_invariants=True)
    rq, it = result.requests, result.iterations
    assert rq["replica"].tolist() == [0, 1, 2, 0, 1, 2]
    assert set(it["replica"]) == {0, 1, 2}
    assert (rq["status"] == "finished").all()


@pytest.mark.parametrize("paths", [
    {},  # a lone replica takes its arrivals itself as its clock passes them (the feed)
    {"sim__fast_forward": False},  # the arrival process, one SimPy event an arrival
    {"cluster__replicas": 2},  # routed
    {"workload__max_concurrency": 4},  # a client sends them
    {"workload__max_concurrency": 4, "frontend__request_latency_ms": 20.0},  # ... received 20 ms after it sends
], ids=["feed", "stepped", "routed", "client", "client_with_latency"])
def test_progress_is_told_every_1024th_arrival_on_every_arrival_path(paths):
    told = []
    result = simulate(spaced(2_500, 0.01, prompt=4, output=2, **paths), on_progress=lambda t, i: told.append((t, i)))
    arrived = result.requests.set_index("request_id")["arrival_s"]
    assert [i for _, i in told] == [0, 1_024, 2_048]
    # Told as each one reaches the engine: at its arrival, or its send plus the latency.
    latency_s = paths.get("frontend__request_latency_ms", 0.0) / 1e3
    assert all(t >= arrived[i] + latency_s - 1e-9 for t, i in told) and told == sorted(told)


# --------------------------------------------------------------------------- the "must show"
def test_chapter_device_saturated_decodes_at_64_over_tau():
    # tau0 = 20 ms, beta = 0.2 ms, 64 running, enough KV, long outputs, free prefill: 64 / 0.0328 s.
    sc = at_once(64, 16, 1000, device__tau0_ms=20.0, device__beta_ms=0.2, device__prefill_ms_per_token=0.0,
                 kv_cache__num_blocks=64 * 256, batching__max_num_seqs=64, batching__max_num_batched_tokens=1024)
    result = simulate(sc)
    expected = decode_throughput(sc.device, 64)
    assert expected == pytest.approx(1951.2, abs=0.1)
    assert result.summary["output_throughput"] == pytest.approx(expected, rel=0.01)
    assert result.summary["mean_batch_size"] == pytest.approx(64)


def test_continuous_beats_static_by_far_on_heavy_tailed_outputs():
    common = {"device__tau0_ms": 20.0, "device__beta_ms": 0.2, "device__prefill_ms_per_token": 0.0,
              "kv_cache__num_blocks": 4096, "batching__max_num_seqs": 32, "batching__max_num_batched_tokens": 2048}
    output = {"dist": "exponential", "mean": 100.0, "max": 2000}
    cont = simulate(at_once(256, 32, output, batching__mode="continuous", **common))
    stat = simulate(at_once(256, 32, output, batching__mode="static", **common))
    # Same seeded workload for both (common random numbers), so the ratio is the mode's doing.
    pd.testing.assert_series_equal(cont.requests["output_tokens"], stat.requests["output_tokens"])
    ratio = cont.summary["output_throughput"] / stat.summary["output_throughput"]
    assert ratio >= 1.8
