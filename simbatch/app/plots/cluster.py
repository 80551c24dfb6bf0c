"""A cluster's replicas over time: what each one held, and how evenly the router spread the load.

Both plots take one run's frames (a :class:`~simbatch.simulation.Result` qualifies) and the number
of replicas. Bin means are exact time averages (see :mod:`simbatch.app.plots.series`).

Up to ``SMALL_MULTIPLES`` replicas each gets its own panel or line. Beyond, a panel or line per
replica would be unreadable (and slow to draw: 128 panels took 18 s), so the views aggregate: a
heatmap with one row per replica, and percentile bands over replicas. Drawing then costs the same
for 10 replicas as for 10,000.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simbatch.analysis.fleet import imbalance
from simbatch.app.plots import series
from simbatch.app.plots.figure import Frames, finish_axes, new_figure, step_band, step_line
from simbatch.app.plots.timeseries import COARSE_BINS, FINE_BINS

RUNNING, WAITING = "#1f77b4", "#d62728"
SMALL_MULTIPLES = 8  # replicas drawn one by one; more are drawn as a heatmap and bands
HEATMAP_BINS = 300


def _per_replica(run: Frames, num_replicas: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running and in-system bin means, one row per replica."""
    it, rq = run.iterations, run.requests
    running = series.bin_means_by(edges, it["replica"], num_replicas, it["start_s"], it["end_s"], it["num_running"])
    admitted = rq[rq["status"] != "rejected"]
    ends = np.fmin(admitted["finish_s"].to_numpy(dtype=float), edges[-1])
    in_system = series.bin_means_by(edges, admitted["replica"], num_replicas, admitted["arrival_s"], ends,
                                    np.ones(len(admitted)))
    return running, in_system


def replica_load(run: Frames, num_replicas: int, *, slots: int | None = None, bins: int = FINE_BINS) -> Figure:
    """Requests on each replica over time: small multiples, or a heatmap above ``SMALL_MULTIPLES`` replicas.

    Running comes from the replica's steps; waiting is its number in system (from the request rows)
    minus running, as in :func:`simbatch.app.plots.timeseries.running_waiting`.
    """
    if num_replicas > SMALL_MULTIPLES:
        return _load_heatmap(run, num_replicas, slots)
    edges = series.grid(series.end_time_s(run.iterations, run.requests), bins)
    running, in_system = _per_replica(run, num_replicas, edges)
    waiting = series.without_noise(np.maximum(in_system - running, 0.0))
    ncols = 1 if num_replicas <= 4 else 2
    nrows = math.ceil(num_replicas / ncols)
    fig = Figure(figsize=(9.0 if ncols == 1 else 12.0, 1.2 + 1.5 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)).ravel()
    for r, ax in enumerate(axes):
        if r >= num_replicas:
            ax.set_visible(False)
            continue
        step_band(ax, edges, 0.0, running[r], color=RUNNING, alpha=0.5, label="running")
        step_band(ax, edges, running[r], running[r] + waiting[r], color=WAITING, alpha=0.5, label="waiting")
        if slots is not None:
            ax.axhline(slots, color="0.35", linestyle="--", linewidth=1, label=f"slots = {slots}")
        ax.set_title(f"replica {r}", fontsize="small", loc="left")
        last_row = r >= num_replicas - ncols
        if last_row:
            ax.tick_params(labelbottom=True)  # above an empty panel, the shared axis must show its ticks
        finish_axes(ax, "requests" if r % ncols == 0 else "", xlabel="simulated time (s)" if last_row else None,
                    legend=r == 0)
    axes[0].set_ylim(bottom=0)
    fig.suptitle("Requests on each replica: running (in the batch) and waiting (queued)")
    return fig


def _load_heatmap(run: Frames, num_replicas: int, slots: int | None) -> Figure:
    """One row per replica, colour = its time-average number in system per bin; the fleet's spread below."""
    end_s = series.end_time_s(run.iterations, run.requests)
    edges = series.grid(end_s, HEATMAP_BINS)
    running, in_system = _per_replica(run, num_replicas, edges)
    fig, (top, bottom) = new_figure(2, height_in=7.0, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    image = top.imshow(in_system, aspect="auto", interpolation="nearest", origin="lower", cmap="viridis",
                       extent=(edges[0], edges[-1], -0.5, num_replicas - 0.5), vmin=0)
    fig.colorbar(image, ax=top, label="requests in system (running + waiting)")
    top.set_ylabel("replica")
    top.set_title(f"Requests on each of {num_replicas:,} replicas (one row each)")
    _bands(bottom, edges, in_system, "in system")
    _bands(bottom, edges, running, "running", color=RUNNING, spread=False)
    if slots is not None and slots <= 1.5 * in_system.max(initial=0):  # else it would squash the bands flat
        bottom.axhline(slots, color="0.35", linestyle="--", linewidth=1, label=f"slots per replica = {slots}")
    bottom.set_ylim(bottom=0)
    finish_axes(bottom, "requests per replica")
    return fig


def _bands(ax, edges: np.ndarray, per_replica: np.ndarray, what: str, color: str = WAITING,
           spread: bool = True) -> None:
    """The median over replicas per bin, with the 10-90 % band and the min-max envelope when ``spread``."""
    low, p10, median, p90, high = np.percentile(per_replica, [0, 10, 50, 90, 100], axis=0)
    if spread:
        step_band(ax, edges, low, high, color=color, alpha=0.12, linewidth=0, label=f"{what}: min-max over replicas")
        step_band(ax, edges, p10, p90, color=color, alpha=0.3, linewidth=0, label=f"{what}: 10-90 % of replicas")
    step_line(ax, edges, series.without_noise(median), color=color, linewidth=1.5, label=f"{what}: median replica")


def load_imbalance(run: Frames, num_replicas: int, *, bins: int = COARSE_BINS) -> Figure:
    """Each replica's number in system over time (top), and max/mean over replicas per bin (bottom).

    A ratio of 1 is a perfectly even spread; N means one replica held everything. The dashed line
    is the whole run's ``load_imbalance`` (the same ratio of whole-run time averages). Above
    ``SMALL_MULTIPLES`` replicas the top panel shows percentile bands over replicas instead of a line each.
    """
    edges = series.grid(series.end_time_s(run.iterations, run.requests), bins)
    _, in_system = _per_replica(run, num_replicas, edges)
    fig, (top, bottom) = new_figure(2, height_in=6.0, sharex=True)
    if num_replicas > SMALL_MULTIPLES:
        _bands(top, edges, in_system, "in system", color="#1f77b4")
    else:
        for r in range(num_replicas):
            step_line(top, edges, in_system[r], linewidth=0.8, alpha=0.7, label=f"replica {r}")
    step_line(top, edges, in_system.mean(axis=0), color="k", linewidth=1.8, label="mean over replicas")
    top.set_ylim(bottom=0)
    top.set_title("Load per replica (time-average number in system per bin) and its imbalance")
    finish_axes(top, "requests in system", xlabel=None)
    step_line(bottom, edges, imbalance(in_system), color="#9467bd", label="max / mean per bin")
    whole = imbalance(_per_replica(run, num_replicas, edges[[0, -1]])[1])[0]
    if np.isfinite(whole):
        bottom.axhline(whole, color="0.35", linestyle="--", linewidth=1.2, label=f"whole run: {whole:.3f}")
    bottom.axhline(1.0, color="0.6", linewidth=0.8)
    bottom.set_ylim(bottom=0.9)
    finish_axes(bottom, "load imbalance (max / mean)")
    return fig
