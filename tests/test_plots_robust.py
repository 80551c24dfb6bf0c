"""Valid input must not crash the plots: zero-variance latencies, empty replicas, a single request,
nothing finished at all."""

from __future__ import annotations

import numpy as np
import pytest

from simbatch.app import plots
from simbatch.app.plots.latency import histogram_edges
from simbatch.config import Scenario
from simbatch.simulation import simulate

PNG = b"\x89PNG\r\n\x1a\n"


def _scenario(**sections) -> Scenario:
    return Scenario.model_validate({"name": "edge", "workload": {"num_requests": 1}, **sections})


def test_latencies_equal_up_to_rounding(tmp_path, monkeypatch):
    # 30 identical requests, each alone on its replica: latencies differ by 1e-15 s, a range numpy's
    # own bin edges cannot split. (The per-replica plots are left out: 30 replicas take seconds.)
    monkeypatch.setattr(plots, "replica_load", lambda *args, **kwargs: plots.e2e_histogram({}))
    monkeypatch.setattr(plots, "load_imbalance", lambda *args, **kwargs: plots.e2e_histogram({}))
    result = simulate(_scenario(workload={"num_requests": 30, "arrival": {"process": "constant", "rate": 10}},
                                cluster={"replicas": 30}))
    e2e = result.requests["e2e_s"].to_numpy()
    assert 0 < np.ptp(e2e) < 1e-12
    saved = plots.save_run_plots(tmp_path, result)
    assert saved and all(path.read_bytes().startswith(PNG) for path in saved)


@pytest.mark.parametrize("scenario", [
    # One request on three replicas: two never see one; every series is a single point.
    _scenario(cluster={"replicas": 3}),
    # Nothing fits: every request rejected, no latency at all.
    _scenario(workload={"num_requests": 5}, kv_cache={"num_blocks": 2}),
], ids=["empty_replicas_single_point", "nothing_finished"])
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


CHAT = {"num_requests": 120, "arrival": {"rate": 4.0}, "num_sessions": 10,
        "prompt_tokens": {"dist": "uniform", "low": 50, "high": 300}, "output_tokens": {"dist": "fixed", "value": 20},
        "prefix": {"multi_turn": True}}
TIER = {"enable_prefix_caching": True, "num_blocks": 200, "host_blocks": 2000, "host_link_gb_s": 25.0,
        "kv_bytes_per_token": 131072}
LORA = {"max_loras": 2, "max_cpu_loras": 4, "host_link_gb_s": 25.0, "adapter_bytes": 8.4e7}


@pytest.mark.parametrize(("plot", "on", "off"), [
    ("host_kv_tier", {"workload": CHAT, "kv_cache": TIER},
     {"workload": CHAT, "kv_cache": {**TIER, "host_blocks": 0}}),
    ("lora_adapters", {"workload": {**CHAT, "adapters": {"count": 6}}, "lora": LORA}, {"workload": CHAT}),
])
def test_a_feature_s_plot_is_drawn_when_it_is_on_and_only_then(tmp_path, plot, on, off, monkeypatch):
    (tmp_path / "on").mkdir()
    drawn = {p.name for p in plots.save_run_plots(tmp_path / "on", simulate(_scenario(**on)))}
    assert f"{plot}.png" in drawn and (tmp_path / "on" / f"{plot}.png").read_bytes().startswith(PNG)
    # Off, only the names count: the figures are made but not drawn (a draw is most of a plot's cost).
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: path)
    assert f"{plot}.png" not in {p.name for p in plots.save_run_plots(tmp_path / "off", simulate(_scenario(**off)))}
