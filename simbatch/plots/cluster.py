"""A cluster's replicas over time: what each one held, and how evenly the router spread the load.

Both plots take one run's frames (a :class:`~simbatch.simulation.Result` qualifies) and the number
of replicas. Bin means are exact time averages (see :mod:`simbatch.plots.series`).
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simbatch.metrics.cluster import imbalance
from simbatch.plots import series
from simbatch.plots.figure import Frames, finish_axes, new_figure
from simbatch.plots.timeseries import COARSE_BINS, FINE_BINS

RUNNING, WAITING = "#1f77b4", "#d62728"


def _per_replica(run: Frames, num_replicas: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Running and in-system bin means, one row per replica."""
    it, rq = run.iterations, run.requests
    running = np.array([series.step_mean(it[mine], it["num_running"][mine], edges)
                        for mine in (it["replica"].to_numpy() == r for r in range(num_replicas))])
    in_system = np.array([series.in_system(rq[rq["replica"].to_numpy() == r], edges) for r in range(num_replicas)])
    return running, in_system


def replica_load(run: Frames, num_replicas: int, *, slots: int | None = None, bins: int = FINE_BINS) -> Figure:
    """Small multiples, one panel per replica on shared axes: requests running and waiting.

    Running comes from the replica's steps; waiting is its number in system (from the request rows)
    minus running, as in :func:`simbatch.plots.timeseries.running_waiting`.
    """
    edges = series.grid(series.end_time_s(run.iterations, run.requests), bins)
    running, in_system = _per_replica(run, num_replicas, edges)
    waiting = np.maximum(in_system - running, 0.0)
    ncols = 1 if num_replicas <= 4 else 2 if num_replicas <= 16 else 4
    nrows = math.ceil(num_replicas / ncols)
    fig = Figure(figsize=(9.0 if ncols == 1 else 12.0, 1.2 + 1.5 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)).ravel()
    for r, ax in enumerate(axes):
        if r >= num_replicas:
            ax.set_visible(False)
            continue
        ax.stairs(running[r], edges, baseline=0, fill=True, color=RUNNING, alpha=0.5, label="running")
        ax.stairs(running[r] + waiting[r], edges, baseline=running[r], fill=True, color=WAITING, alpha=0.5,
                  label="waiting")
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


def load_imbalance(run: Frames, num_replicas: int, *, bins: int = COARSE_BINS) -> Figure:
    """Each replica's number in system over time (top), and max/mean over replicas per bin (bottom).

    A ratio of 1 is a perfectly even spread; N means one replica held everything. The dashed line
    is the whole run's ``load_imbalance`` (the same ratio of whole-run time averages).
    """
    edges = series.grid(series.end_time_s(run.iterations, run.requests), bins)
    _, in_system = _per_replica(run, num_replicas, edges)
    fig, (top, bottom) = new_figure(2, height_in=6.0, sharex=True)
    for r in range(num_replicas):
        top.stairs(in_system[r], edges, baseline=None, linewidth=0.8, alpha=0.7,
                   label=f"replica {r}" if num_replicas <= 8 else None)
    top.stairs(in_system.mean(axis=0), edges, baseline=None, color="k", linewidth=1.8, label="mean over replicas")
    top.set_ylim(bottom=0)
    top.set_title("Load per replica (time-average number in system per bin) and its imbalance")
    finish_axes(top, "requests in system", xlabel=None)
    bottom.stairs(imbalance(in_system), edges, baseline=None, color="#9467bd", label="max / mean per bin")
    whole = imbalance(_per_replica(run, num_replicas, edges[[0, -1]])[1])[0]
    if np.isfinite(whole):
        bottom.axhline(whole, color="0.35", linestyle="--", linewidth=1.2, label=f"whole run: {whole:.3f}")
    bottom.axhline(1.0, color="0.6", linewidth=0.8)
    bottom.set_ylim(bottom=0.9)
    finish_axes(bottom, "load imbalance (max / mean)")
    return fig
