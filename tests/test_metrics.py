"""Metrics: the weighted statistics, every summary definition, and Little's law as a bookkeeping check.

The definitions under test are the ones in ``simbatch.analysis.summary``'s docstring.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from builders import make_scenario, spaced
from hypothesis import given, settings
from hypothesis import strategies as st
from registered import modes

from simbatch import simulate
from simbatch.analysis.stats import describe_ms, weighted_mean_std, weighted_quantile
from simbatch.observe import recorder

SAMPLES = st.lists(st.tuples(st.floats(-1e6, 1e6, allow_nan=False), st.integers(0, 6)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(sample=SAMPLES, q=st.floats(0.0, 1.0))
def test_weighted_quantile_is_numpy_quantile_of_the_expanded_sample(sample, q):
    values, weights = map(np.array, zip(*sample, strict=True))
    expanded = np.repeat(values, weights)
    if expanded.size == 0:
        assert math.isnan(weighted_quantile(values, weights, q))
        return
    assert weighted_quantile(values, weights, q) == pytest.approx(np.quantile(expanded, q), rel=1e-12, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(sample=SAMPLES)
def test_weighted_mean_std_is_numpy_mean_std_of_the_expanded_sample(sample):
    values, weights = map(np.array, zip(*sample, strict=True))
    expanded = np.repeat(values, weights)
    mean, std = weighted_mean_std(values, weights)
    if expanded.size == 0:
        assert math.isnan(mean) and math.isnan(std)
        return
    assert mean == pytest.approx(expanded.mean(), rel=1e-9, abs=1e-6)
    assert std == pytest.approx(expanded.std(), rel=1e-6, abs=1e-6)


def test_describe_ms_uses_vllm_key_names_converts_to_ms_and_skips_nan():
    out = describe_ms("ttft", np.array([0.010, np.nan, 0.030, 0.020]))
    assert list(out) == ["mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"]
    assert out["mean_ttft_ms"] == pytest.approx(20.0)
    assert out["median_ttft_ms"] == pytest.approx(20.0)
    assert out["std_ttft_ms"] == pytest.approx(np.std([10.0, 20.0, 30.0]))
    assert out["p90_ttft_ms"] == pytest.approx(28.0)
    assert out["p99_ttft_ms"] == pytest.approx(29.8)
    weighted = describe_ms("itl", np.array([0.001, 0.005]), np.array([3, 1]))
    assert weighted["mean_itl_ms"] == pytest.approx(2.0) and weighted["median_itl_ms"] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in describe_ms("e2el", np.array([np.nan])).values())


# --------------------------------------------------------------------------- summary definitions
def test_latencies_of_a_hand_computed_run():
    # Two lone requests: a 10.8 ms prefill (8 tokens at 0.1 ms + 10 ms), then 3 decodes of 11 ms.
    s = simulate(spaced(2, 10.0, prompt=8, output=4)).summary
    assert s["mean_ttft_ms"] == pytest.approx(10.8)
    assert s["mean_tpot_ms"] == pytest.approx(11.0)  # (E2E - TTFT) / (output - 1) = 33 / 3
    assert s["mean_itl_ms"] == pytest.approx(11.0) and s["std_itl_ms"] == pytest.approx(0.0, abs=1e-9)
    assert s["mean_e2el_ms"] == pytest.approx(43.8)
    assert s["duration"] == pytest.approx(20.0438)  # t=0 to the last completion
    assert s["request_throughput"] == pytest.approx(2 / 20.0438)
    assert s["output_throughput"] == pytest.approx(8 / 20.0438)
    assert s["total_token_throughput"] == pytest.approx(24 / 20.0438)
    assert s["mean_batch_size"] == pytest.approx(1.0)
    assert s["busy_fraction"] == pytest.approx(2 * 0.0438 / 20.0438)
    # Blocks of 4 in use: 2 during the prefill, 3 during each decode (tokens 9-11), out of 64.
    assert s["mean_kv_usage"] == pytest.approx((2 * 0.0108 + 3 * 3 * 0.011) / 0.0438 / 64)
    assert (s["L"], s["Lq"], s["Wq_s"]) == pytest.approx((2 * 0.0438 / 20.0438, 0.0, 0.0))


def test_request_frame_derives_ttft_tpot_e2e_from_timestamps():
    sc = make_scenario(workload__num_requests=40, workload__arrival__rate=30.0,
                       workload__prompt_tokens={"dist": "uniform", "low": 1, "high": 40},
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 30}, kv_cache__num_blocks=40)
    rq = simulate(sc).requests
    done = rq[rq["status"] == "finished"]
    assert np.allclose(done["ttft_s"], done["first_token_s"] - done["arrival_s"])
    assert np.allclose(done["e2e_s"], done["finish_s"] - done["arrival_s"])
    many = done["output_tokens"] > 1
    assert np.allclose(done.loc[many, "tpot_s"],
                       (done.loc[many, "e2e_s"] - done.loc[many, "ttft_s"]) / (done.loc[many, "output_tokens"] - 1))
    assert done.loc[~many, "tpot_s"].isna().all() and (~many).any()


def test_the_iterations_frame_is_the_same_however_its_rows_were_packed(monkeypatch):
    """The recorder packs closed runs into typed columns a block of rows at a time: blocks of three
    rows (a remainder at the end) give the frame that one block gives, column for column and dtype."""
    sc = make_scenario(workload__num_requests=40, workload__arrival__rate=30.0,
                       workload__prompt_tokens={"dist": "uniform", "low": 1, "high": 40},
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 30}, kv_cache__num_blocks=40)
    whole = simulate(sc).iterations
    monkeypatch.setattr(recorder, "_PACK_VALUES", 3 * len(recorder.RUN_COLUMNS))
    packed = simulate(sc).iterations
    assert len(whole) > 10 and len(whole) % 3
    pd.testing.assert_frame_equal(packed, whole, check_exact=True)


def test_itl_covers_every_token_gap_including_stalls():
    # Memory tight enough to preempt: gaps across a preemption are stalls, counted one by one.
    sc = make_scenario(workload__num_requests=30, workload__arrival__rate=50.0,
                       workload__prompt_tokens={"dist": "uniform", "low": 4, "high": 24},
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 40}, kv_cache__num_blocks=24)
    result = simulate(sc)
    rq, it, s = result.requests, result.iterations, result.summary
    assert s["num_preemptions"] > 0 and len(result.stall_gaps_s) > 0
    assert (rq["status"] == "finished").all()
    n_gaps = (it["itl_tokens"] * it["num_steps"]).sum() + len(result.stall_gaps_s)
    assert n_gaps == (rq["output_tokens"] - 1).sum()
    # Gaps of one request telescope: their sum is its last token minus its first.
    total_gap_s = (it["itl_tokens"] * it["num_steps"] * it["duration_s"]).sum() + sum(result.stall_gaps_s)
    assert total_gap_s == pytest.approx((rq["finish_s"] - rq["first_token_s"]).sum(), rel=1e-9)
    assert s["mean_itl_ms"] == pytest.approx(total_gap_s / n_gaps * 1e3, rel=1e-9)


def test_goodput_counts_requests_meeting_every_slo():
    sc = spaced(2, 10.0, prompt=8, output=4)
    assert "request_goodput" not in simulate(sc).summary
    duration = 20.0438
    met = simulate(sc.model_copy(update={"slo": sc.slo.model_copy(update={"ttft_ms": 11.0})})).summary
    assert met["request_goodput"] == pytest.approx(2 / duration)
    missed = sc.slo.model_copy(update={"ttft_ms": 11.0, "tpot_ms": 10.0})
    assert simulate(sc.model_copy(update={"slo": missed})).summary["request_goodput"] == 0.0


# --------------------------------------------------------------------------- Little's law
SCENARIOS = st.fixed_dictionaries({
    "mode": modes(),
    "rate": st.sampled_from([20.0, 100.0, 1000.0]),
    "num_blocks": st.integers(12, 64),
    "seed": st.integers(0, 10_000),
    "max_time_s": st.sampled_from([None, 1.0]),  # first arrival by then: all but e^-20 sure
    "max_waiting": st.sampled_from([None, 3]),
})


@settings(max_examples=30, deadline=None)
@given(p=SCENARIOS)
def test_littles_law_holds_on_every_sample_path(p):
    sc = make_scenario(seed=p["seed"], workload__num_requests=25, workload__arrival__rate=p["rate"],
                       workload__prompt_tokens={"dist": "uniform", "low": 1, "high": 20},
                       workload__output_tokens={"dist": "uniform", "low": 1, "high": 30},
                       kv_cache__num_blocks=p["num_blocks"], batching__mode=p["mode"],
                       scheduler__max_waiting=p["max_waiting"], sim__max_time_s=p["max_time_s"])
    s = simulate(sc).summary
    # L = lambda W with L integrated from the engine's state and W from the request rows.
    assert s["littles_law_rel_error"] < 1e-9
    assert s["L"] == pytest.approx(s["arrival_rate"] * s["W_s"], rel=1e-9)
    # The same identity for the waiting room alone: Lq = lambda Wq.
    assert s["Lq"] == pytest.approx(s["arrival_rate"] * s["Wq_s"], rel=1e-9, abs=1e-12)
