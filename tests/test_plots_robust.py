"""Valid input must not crash the plots: zero-variance latencies, empty replicas, a single request,
nothing finished at all."""

from __future__ import annotations

import numpy as np
import pytest

from simbatch import plots
from simbatch.config import Scenario
from simbatch.plots.latency import histogram_edges
from simbatch.simulation import simulate

PNG = b"\x89PNG\r\n\x1a\n"


def _scenario(**sections) -> Scenario:
    return Scenario.model_validate({"name": "edge", "workload": {"num_requests": 1}, **sections})


@pytest.mark.parametrize("scenario", [
    # Identical requests, evenly spaced, each alone on its replica: every latency the same.
    _scenario(workload={"num_requests": 12, "arrival": {"process": "constant", "rate": 20}},
              cluster={"replicas": 3, "router": "round_robin"}),
    # One request on three replicas: two never see one; every series is a single point.
    _scenario(cluster={"replicas": 3}),
    # Nothing fits: every request rejected, no latency at all.
    _scenario(workload={"num_requests": 5}, kv_cache={"num_blocks": 2}),
], ids=["zero_variance", "empty_replicas_single_point", "nothing_finished"])
def test_every_plot_is_drawn(tmp_path, scenario):
    result = simulate(scenario)
    saved = plots.save_run_plots(tmp_path, result)
    assert saved and all(path.read_bytes().startswith(PNG) for path in saved)


def test_compare_plots_of_identical_latencies(tmp_path):
    result = simulate(_scenario(workload={"num_requests": 6, "arrival": {"process": "constant", "rate": 1}}))
    saved = plots.save_compare_plots(tmp_path, {"a": result, "b": result})
    assert saved and all(path.read_bytes().startswith(PNG) for path in saved)


@pytest.mark.parametrize("values", [[10.24, 10.24], [10.24, 10.240000000001], [0.0], [], [1e-9, 2e-9]])
def test_histogram_edges_are_never_of_zero_width(values):
    edges = histogram_edges(np.asarray(values, dtype=float), 60)
    assert len(edges) == 61 and np.all(np.diff(edges) > 0)
    if values:
        assert edges[0] <= min(values) and edges[-1] >= max(values)
    np.histogram(np.asarray(values, dtype=float), bins=edges)  # numpy accepts them
