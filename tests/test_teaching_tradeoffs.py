"""The lessons' trade-off figures and their sliders, called without a browser."""

from __future__ import annotations

import math

import matplotlib
import pytest

matplotlib.use("Agg")  # no display in CI

import matplotlib.pyplot as plt  # noqa: E402

from simbatch.app.teaching import tradeoffs, widgets  # noqa: E402
from simbatch.config import Scenario  # noqa: E402
from simbatch.simulation import simulate  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_throughput_curve_is_lesson_03s_closed_form():
    """tau0 = 20 ms, beta = 0.2 ms, 64 slots: 1,951 tokens/s, 39 % of the roofline, knee 3.90 req/s,
    W_B 16.4 s, and the batch's share of a full step 0.39 (correction 6 of issue 32)."""
    c = tradeoffs.throughput_curve(tau0_ms=20, beta_ms=0.2, max_num_seqs=64)
    assert c.throughput_at_cap == pytest.approx(64 / 0.0328)
    assert c.roofline == pytest.approx(5000)
    assert c.knee_requests_per_s == pytest.approx(64 / 0.0328 / 500)
    assert c.full_batch_latency_s == pytest.approx(16.4)
    assert c.batch_share_at_cap == pytest.approx(12.8 / 32.8)


def additive(decodes, prompt_tokens):
    return 20 + 0.2 * decodes + 0.05 * prompt_tokens


def roofline(decodes, prompt_tokens):
    return max(20 + 0.2 * decodes, 0.05 * (decodes + prompt_tokens))


def test_chunk_tradeoff_counts_each_chunk_step():
    """Lesson 05's numbers: 4,000 tokens into 48 streams in 512-token chunks, 8 steps."""
    c = tradeoffs.chunk_tradeoff({"additive": additive, "roofline": roofline}, chunk_tokens=512)
    assert c.max_itl_ms["additive"] == pytest.approx(55.2)
    assert c.ttft_ms["additive"] == pytest.approx(8 * 29.6 + 200)
    assert c.max_itl_ms["roofline"] == pytest.approx(29.6)  # a 512-token chunk rides free on the decodes
    assert c.ttft_ms["roofline"] / roofline(48, 4000) == pytest.approx(236.8 / 202.4)
    assert tradeoffs.chunked(additive, 4000, 48, 4000) == (pytest.approx(229.6), pytest.approx(229.6))


def _runs():
    def at(rate):
        return simulate(Scenario.model_validate({
            "seed": 0, "workload": {"duration_s": 20, "arrival": {"rate": rate}},
            "device": {"tau0_ms": 20, "beta_ms": 0.2}, "slo": {"ttft_ms": 500, "tpot_ms": 30}}))
    return {rate: at(rate) for rate in (1.0, 4.0)}


def test_goodput_recount_is_the_summarys_goodput_and_moves_with_the_objective():
    runs = _runs()
    same = tradeoffs.goodput_curve(runs, ttft_ms=500, tpot_ms=30)
    for rate, r in runs.items():
        assert same.by_rate[rate] == pytest.approx(r.summary["request_goodput"])
    loose = tradeoffs.goodput_curve(runs, ttft_ms=1e9, tpot_ms=1e9)
    assert all(loose.by_rate[r] == pytest.approx(runs[r].summary["request_throughput"]) for r in runs)
    tight = tradeoffs.goodput_curve(runs, ttft_ms=1.0, tpot_ms=1.0)
    assert all(v == 0 for v in tight.by_rate.values())


def _fleet(router, signal_delay_ms):
    return Scenario.model_validate({
        "seed": 0, "workload": {"duration_s": 15, "arrival": {"rate": 16},
                                "output_tokens": {"dist": "fixed", "value": 10}},
        "device": {"tau0_ms": 20, "beta_ms": 0.2}, "batching": {"max_num_seqs": 1},
        "cluster": {"replicas": 4, "router": router, "signal_delay_ms": signal_delay_ms}})


def test_staleness_runs_the_lessons_scenario_and_draws_every_replica():
    s = tradeoffs.staleness(_fleet, "least_outstanding", 1000, warmup_s=5, window_s=10)
    assert s.result.scenario.cluster.signal_delay_ms == 1000
    assert len(s.figure.axes[0].get_lines()) == 4
    assert math.isfinite(s.mean_wait_s) and s.mean_wait_s > 0


def test_every_slider_panel_is_none_headless_and_bound_otherwise(monkeypatch):
    laws = {"additive": additive}
    runs = _runs()
    panels = (lambda: tradeoffs.throughput_sliders(), lambda: tradeoffs.chunk_sliders(laws),
              lambda: tradeoffs.goodput_sliders(runs), lambda: tradeoffs.staleness_sliders(_fleet, widgets.ROUTERS))
    monkeypatch.setenv(widgets.HEADLESS_ENV, "1")
    assert all(make() is None for make in panels)
    import ipywidgets
    monkeypatch.delenv(widgets.HEADLESS_ENV)
    for make in panels:
        panel = make()
        assert isinstance(panel, ipywidgets.interactive)
        for control in panel.children[:-1]:
            if hasattr(control, "min"):
                assert control.min <= control.value <= control.max and control.continuous_update is False
        panel.update()  # what a slider release does: the figure drawn again with the controls' values
