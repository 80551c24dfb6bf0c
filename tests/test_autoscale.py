"""Rate curves and the autoscaler: the thinning's counts, HPA's rule by hand, and a fleet's invariants.

A fleet that starts and stops replicas must still account for every request, route none to a replica
that is starting, draining or stopped, release a draining replica exactly at its last completion, and
bill exactly the area under its replica count.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simbatch.analysis.autoscale import fleet_frame, fluid_replicas, ready_at, replica_seconds
from simbatch.config import Autoscale, Scenario
from simbatch.engine.autoscale import desired_replicas
from simbatch.simulation import simulate
from simbatch.workload import generate
from simbatch.workload.rate_curve import rate_function, thinned_arrivals_s


def curve_scenario(curve: dict, **workload) -> Scenario:
    return Scenario.model_validate({"seed": 7, "workload": {"arrival": {"rate_curve": curve}, **workload}})


def test_a_piecewise_curve_is_linear_between_points_held_after_and_repeated_with_a_period():
    held = rate_function(curve_scenario({"kind": "piecewise", "points": [[10, 2], [20, 6]]},
                                        duration_s=5).workload.arrival.rate_curve)
    assert held.at([0, 10, 15, 20, 99]).tolist() == [2, 2, 4, 6, 6]
    daily = rate_function(curve_scenario({"kind": "piecewise", "points": [[0, 2], [50, 6]], "period_s": 100},
                                         duration_s=5).workload.arrival.rate_curve)
    assert daily.at([25, 75, 125, 150]).tolist() == [4, 4, 4, 6]  # 75: half-way from 6 back down to 2
    assert daily.peak == 6


def test_a_sinusoidal_curve_peaks_at_its_peak_time():
    f = rate_function(curve_scenario({"kind": "sinusoidal", "mean": 4, "amplitude": 0.5, "period_s": 100,
                                      "peak_s": 30}, duration_s=5).workload.arrival.rate_curve)
    assert f.at(30) == pytest.approx(6) and f.at(80) == pytest.approx(2) and f.peak == 6
    assert f.mean_over(0, 100) == pytest.approx(4, rel=1e-6)


def test_thinning_gives_the_curves_integral_in_every_window():
    """Counts per window are Poisson with mean the integral of the rate over it: within 4.5 sigma."""
    f = rate_function(curve_scenario({"kind": "piecewise", "points": [[0, 0], [500, 200], [1000, 20]]},
                                     duration_s=5).workload.arrival.rate_curve)
    times = thinned_arrivals_s(f, np.random.default_rng(3), None, 1000.0)
    assert np.all(np.diff(times) >= 0) and times[-1] < 1000
    counts = np.histogram(times, bins=10, range=(0, 1000))[0]
    expected = np.array([f.mean_over(100 * k, 100 * (k + 1)) * 100 for k in range(10)])
    assert np.all(np.abs(counts - expected) <= 4.5 * np.sqrt(expected))


def test_thinning_is_seeded_and_stops_at_num_requests():
    f = rate_function(curve_scenario({"kind": "sinusoidal", "mean": 5, "period_s": 60},
                                     duration_s=5).workload.arrival.rate_curve)
    a = thinned_arrivals_s(f, np.random.default_rng(1), 5000, None)
    b = thinned_arrivals_s(f, np.random.default_rng(1), 5000, None)
    assert len(a) == 5000 and np.array_equal(a, b)
    assert not np.array_equal(a, thinned_arrivals_s(f, np.random.default_rng(2), 5000, None))


def test_a_traces_rate_per_window_is_its_count_over_the_window(tmp_path):
    trace = tmp_path / "t.csv"
    rows = [0.0, 1.0, 2.0, 3.0, 10.5, 11.0]  # 4 in [0, 10), 2 in [10, 20)
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{t},10,5\n" for t in rows))
    sc = curve_scenario({"kind": "trace", "trace": {"path": str(trace)}, "window_s": 10, "scale": 2}, duration_s=5)
    f = rate_function(sc.workload.arrival.rate_curve, sc)
    assert f.at([0, 9.9, 10, 19]).tolist() == [0.8, 0.8, 0.4, 0.4]


SPEC = Autoscale(metric="queue_per_replica", target=4, min_replicas=1, max_replicas=10)


@pytest.mark.parametrize(("ready", "metric", "expected"), [
    (2, 4.0, 2),    # on target
    (2, 4.3, 2),    # within the 10 % tolerance
    (2, 5.0, 3),    # ceil(2 x 5/4) = ceil(2.5)
    (3, 1.0, 1),    # ceil(3 x 1/4) = 1
    (3, 0.0, 1),    # never below min_replicas
    (5, 40.0, 10),  # never above max_replicas
])
def test_hpas_rule_by_hand(ready, metric, expected):
    assert desired_replicas(SPEC, ready, metric) == expected


def test_fleet_frame_counts_and_bills_by_hand():
    events = [(0.0, 0, "ready"), (10.0, 1, "start"), (40.0, 1, "ready"), (50.0, 2, "start"), (55.0, 2, "cancel"),
              (70.0, 1, "drain"), (80.0, 1, "stop")]
    fleet = fleet_frame(events)
    assert fleet[["starting", "ready", "draining", "billed"]].values.tolist() == [
        [0, 1, 0, 1], [1, 1, 0, 2], [0, 2, 0, 2], [1, 2, 0, 3], [0, 2, 0, 2], [0, 1, 1, 2], [0, 1, 0, 1]]
    # 1 x 10 + 2 x 40 + 3 x 5 + 2 x 25 + 1 x 20 (to the end at 100)
    assert replica_seconds(fleet, 100.0) == 10 + 80 + 15 + 50 + 20
    assert ready_at(fleet, np.array([5.0, 40.0, 75.0])).tolist() == [1, 2, 1]


def test_the_fluid_fleet_follows_the_lagged_rate_and_holds_through_the_cooldown():
    spec = Autoscale(metric="busy_fraction", target=0.5, min_replicas=2, max_replicas=6, startup_delay_s=10,
                     interval_s=4, cooldown_s=20)
    ramp = lambda t: np.where(np.asarray(t) < 60, np.asarray(t) / 10.0, 0.0)  # noqa: E731  up to 6, then 0
    times, plain = fluid_replicas(ramp, 1.0, spec, 100.0, points=101, stabilized=False)
    assert plain[[0, 40, 60, 69, 70, 99]].tolist() == [2, 3, 5, 6, 2, 2]  # rate at t - 10: 3, 5, 5.9, then 0
    _, held = fluid_replicas(ramp, 1.0, spec, 100.0, points=101)
    # read 12 s late (t = 71 reads 5.9), and the last call for 6 (t = 71) held for the 20 s cool-down
    assert held[[40, 62, 71, 91, 92]].tolist() == [3, 5, 6, 6, 2]


def autoscaled(seed: int = 2, fast_forward: bool = True, metric: str = "queue_per_replica") -> dict:
    return {"seed": seed,
            "workload": {"duration_s": 600, "arrival": {"rate_curve": {
                "kind": "piecewise", "points": [[0, 2], [150, 40], [300, 2]], "period_s": 400}},
                "prompt_tokens": {"dist": "exponential", "mean": 100, "max": 500},
                "output_tokens": {"dist": "exponential", "mean": 40, "max": 300}},
            "device": {"tau0_ms": 10, "beta_ms": 0.3, "prefill_ms_per_token": 0.1},
            "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 512},
            "slo": {"ttft_ms": 500},
            "cluster": {"replicas": 1, "router": "least_outstanding", "autoscale": {
                "metric": metric, "target": 3 if metric == "queue_per_replica" else 0.5, "max_replicas": 8,
                "startup_delay_s": 20, "interval_s": 5, "cooldown_s": 30}},
            "sim": {"fast_forward": fast_forward}}


@pytest.mark.parametrize("metric", ["queue_per_replica", "busy_fraction"])
def test_an_autoscaled_fleet_routes_only_to_ready_replicas_and_releases_them_at_their_last_completion(metric):
    result = simulate(Scenario.model_validate(autoscaled(metric=metric)), check_invariants=True)
    rq, fleet = result.requests, result.fleet
    assert (rq["status"] == "finished").all()
    assert result.summary["scale_ups"] > 0 and result.summary["scale_downs"] > 0
    assert fleet["billed"].max() <= 8 and (fleet["ready"] >= 1).all()
    arrival = rq["arrival_s"].to_numpy()
    for replica, events in fleet.groupby("replica"):
        mine = rq[rq["replica"] == replica]
        times = events["time_s"].tolist()
        kinds = events["event"].tolist()
        # Between a ready and the next drain (or the end), and only then, the replica takes requests.
        windows, open_at = [], None
        for t, kind in zip(times, kinds, strict=True):
            if kind == "ready":
                open_at = t
            elif kind == "drain":
                windows.append((open_at, t))
                open_at = None
        if open_at is not None:
            windows.append((open_at, math.inf))
        at = arrival[rq["replica"].to_numpy() == replica]
        assert all(any(lo <= a <= hi for lo, hi in windows) for a in at), replica
        # A stop is at the last completion of the requests it took before its drain.
        for k, kind in enumerate(kinds):
            if kind == "stop":
                drained_at = times[k - 1]
                served = mine[(mine["arrival_s"] <= drained_at)]
                last = served["finish_s"][served["arrival_s"] >= [lo for lo, hi in windows if hi == drained_at][0]]
                assert times[k] == pytest.approx(max(last.max(), drained_at), abs=1e-9)
    assert result.summary["gpu_hours"] == pytest.approx(replica_seconds(fleet, result.summary["duration"]) / 3600)


def test_a_scenario_without_autoscale_has_no_fleet_frame():
    result = simulate(Scenario.model_validate({"workload": {"num_requests": 5}}))
    assert result.fleet is None and "gpu_hours" not in result.summary


def test_a_price_gives_the_cost():
    spec = autoscaled()
    spec["cluster"]["autoscale"]["usd_per_gpu_hour"] = 2.0
    s = simulate(Scenario.model_validate(spec)).summary
    assert s["cost_usd"] == pytest.approx(2.0 * s["gpu_hours"]) and s["usd_per_gpu_hour"] == 2.0


def test_the_workload_of_a_rate_curve_is_drawn_up_front_like_any_other():
    sc = Scenario.model_validate(autoscaled())
    a, b = generate(sc), generate(sc)
    assert len(a) > 1000 and np.array_equal(a.arrival_s, b.arrival_s)
    assert pd.Series(a.arrival_s).is_monotonic_increasing


def test_a_result_folders_scenario_reloads_with_its_rate_curve(tmp_path):
    """The effective scenario spells out every default but the curve's rate, which it replaces; a
    trace's curve names its file absolutely, and the file is hashed in run.json."""
    from simbatch.app.scenario_file import scenario_yaml
    from simbatch.inputs.loading import load_scenario

    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n1.5,10,5\n")
    given = tmp_path / "s.yaml"
    given.write_text("workload:\n  duration_s: 20\n  arrival:\n    rate_curve: {kind: trace, trace: {path: t.csv}, "
                     "window_s: 1}\n")
    scenario = load_scenario(given)
    assert scenario.data_files() == {"workload.arrival.rate_curve.trace.path": Path("t.csv")}
    (tmp_path / "out").mkdir()
    effective = tmp_path / "out" / "scenario.yaml"
    effective.write_text(scenario_yaml(scenario))
    again = load_scenario(effective)
    assert str(again.workload.arrival.rate_curve.trace.path) == str(trace.resolve())
    assert np.array_equal(generate(again).arrival_s, generate(scenario).arrival_s)
