"""The lessons' sliders run without a browser: the callback they are bound to, called directly."""

from __future__ import annotations

import math

import matplotlib
import pytest

matplotlib.use("Agg")  # no display in CI; the callback's plt.show() is then a no-op

import matplotlib.pyplot as plt  # noqa: E402

from simbatch.app.teaching import widgets  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_default_setting_matches_the_birth_death_chain():
    """stable.yaml's load with exponential answers: rho 0.77, and the measured mean near the chain's."""
    e = widgets.explore()
    assert e.offered_load == pytest.approx(0.77, abs=0.01)
    measured = e.result.requests["e2e_s"].mean()
    assert e.predicted_latency_s == pytest.approx(14.46, abs=0.01)
    assert abs(measured / e.predicted_latency_s - 1) < 0.15  # 60 s of arrivals: a noisy, warm-up-biased mean
    assert [ax.get_xlabel() for ax in e.figure.axes] == ["simulated time (s)", "E2E latency (s)"]


def test_overload_has_no_prediction_and_shows_the_queue():
    e = widgets.explore(rate=40.0)
    assert e.offered_load > 1 and e.predicted_latency_s is None
    waiting = e.figure.axes[0].get_lines()[1].get_ydata()
    assert max(waiting) > 1000  # 40 req/s against ~3.9: the queue grows by the thousands


@pytest.mark.parametrize("router", widgets.ROUTERS)
@pytest.mark.parametrize("policy", widgets.POLICIES)
def test_every_menu_choice_runs_through_the_callback(router, policy):
    widgets.show(**{**widgets.DEFAULTS, "rate": 10.0, "replicas": 3, "router": router, "policy": policy})


def test_slider_extremes_run():
    lowest = {"rate": 0.1, "mean_output_tokens": 20, "max_num_seqs": 1, "tau0_ms": 1.0, "beta_ms": 0.0, "replicas": 1}
    highest = {"rate": 40.0, "mean_output_tokens": 1000, "max_num_seqs": 256, "tau0_ms": 50.0, "beta_ms": 1.0,
               "replicas": 8}
    for corner in (lowest, highest):
        e = widgets.explore(**corner)
        assert len(e.result.requests) > 0 and math.isfinite(e.offered_load)


def test_sliders_are_bound_to_the_callback_and_cover_the_defaults(monkeypatch):
    import ipywidgets  # a dev dependency, as the notebook runner is
    monkeypatch.delenv(widgets.HEADLESS_ENV, raising=False)
    panel = widgets.sliders(rate=2.0)
    assert isinstance(panel, ipywidgets.interactive) and panel.f is widgets.show
    controls = {c.description: c for c in panel.children[:-1]}
    assert set(panel.kwargs) == set(widgets.DEFAULTS)
    assert controls["λ (requests/s)"].value == 2.0
    for c in controls.values():
        if hasattr(c, "min"):
            assert c.min <= c.value <= c.max and c.continuous_update is False
    panel.update()  # what a slider release does: the callback, with the controls' current values
