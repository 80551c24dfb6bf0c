"""Plots that scale: figures of bounded size for any replica count, and no rounding noise.

How long a 1,000-replica run takes to plot (issue 16: within 5 s) is measured by `make bench`
(benchmarks/cli.py), not here: a shared machine's wall clock is no unit test's business.
"""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.image import imread

from simbatch.app import plots
from simbatch.app.plots import series
from simbatch.app.plots.cluster import SMALL_MULTIPLES, load_imbalance, replica_load
from simbatch.app.plots.timeseries import FINE_BINS
from simbatch.inputs.loading import scenario_from_dict
from simbatch.simulation import simulate


def fleet_run(replicas: int, requests: int = 1000):
    return simulate(scenario_from_dict({
        "workload": {"num_requests": requests, "arrival": {"rate": 300},
                     "output_tokens": {"dist": "uniform", "low": 8, "high": 64}},
        "cluster": {"replicas": replicas, "router": "least_outstanding"}}))


def test_a_1000_replica_run_plots_in_figures_of_bounded_size(tmp_path):
    result = fleet_run(1000)
    written = plots.save_run_plots(tmp_path, result)
    assert {p.name for p in written} >= {"replica_load.png", "load_imbalance.png"}
    for path in written:
        height, width = imread(path).shape[:2]
        assert height <= 900 and width <= 1100, path.name


def test_many_replicas_are_a_heatmap_with_one_row_each_and_bands():
    n = SMALL_MULTIPLES + 4
    result = fleet_run(n, requests=300)
    fig = replica_load(result, n)
    heat = fig.axes[0].images[0].get_array()
    assert heat.shape[0] == n
    # Each row's time average is the replica's L over the heatmap's span (exact bin means).
    assert heat.mean(axis=1).sum() == pytest.approx(result.summary["L"], rel=1e-6)
    assert len(load_imbalance(result, n).axes[0].collections) == 2  # min-max and 10-90 % bands
    few = replica_load(fleet_run(3, requests=100), 3)
    assert not any(ax.images for ax in few.axes) and len([ax for ax in few.axes if ax.get_visible()]) == 3


def test_bin_means_by_key_equal_one_key_at_a_time():
    rng = np.random.default_rng(3)
    starts = rng.uniform(0, 10, 200)
    ends, values, keys = starts + rng.uniform(0, 3, 200), rng.uniform(0, 5, 200), rng.integers(0, 7, 200)
    edges = series.grid(13.0, 50)
    by_key = series.bin_means_by(edges, keys, 8, starts, ends, values)
    for k in range(8):
        mine = keys == k
        assert np.allclose(by_key[k], series.bin_means(edges, starts[mine], ends[mine], values[mine]))
    assert (by_key[7] == 0).all()  # a key with no boxes


def test_no_panel_shows_rounding_noise():
    assert series.without_noise(np.array([1e-13, -2e-12, 0.5, 3.0])).tolist() == [0.0, 0.0, 0.5, 3.0]
    # Waiting = in system - running: where both are equal, the raw difference is rounding residue.
    result = simulate(scenario_from_dict({"workload": {"num_requests": 50, "arrival": {"rate": 2.7}}}))
    edges = series.grid(series.end_time_s(result.iterations, result.requests), FINE_BINS)
    raw = series.in_system(result.requests, edges) - series.step_mean(result.iterations,
                                                                      result.iterations["num_running"], edges)
    assert ((raw > 0) & (raw < 1e-9)).any()  # the noise is there to remove
    bottom = plots.running_waiting({"continuous": result}).axes[1]
    drawn = bottom.lines[0].get_ydata()  # the waiting panel's line
    assert drawn.max() > 0.1 and not ((drawn > 0) & (drawn < 1e-9)).any()
