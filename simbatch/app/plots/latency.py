"""Latency as users feel it: distributions of TTFT and E2E, and latency request by request.

Only finished requests have latencies; each plot says how many it shows.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simbatch.app.plots.figure import Frames, colors, finish_axes, new_figure
from simbatch.config import SLO
from simbatch.registry import MODES


def _finished(requests: pd.DataFrame) -> pd.DataFrame:
    return requests[requests["status"] == "finished"]


def ttft_cdf(runs: Mapping[str, Frames], *, slo: SLO | None = None) -> Figure:
    """Empirical CDF of time to first token, with each run's median and p99 marked, and the TTFT
    objective of ``slo`` when it sets one.

    When runs differ by orders of magnitude (milliseconds against minutes), the time axis is
    logarithmic, or the faster run would be a vertical line at zero.
    """
    fig, ax = new_figure()
    medians, p99s = [], []
    for label, color in colors(runs).items():
        ttft = np.sort(_finished(runs[label].requests)["ttft_s"].to_numpy(dtype=float))
        if not len(ttft):
            continue
        median, p99 = np.quantile(ttft, [0.5, 0.99])
        medians.append(median)
        p99s.append(p99)
        ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", color=color,
                label=f"{label}: median {median:,.2f} s, p99 {p99:,.2f} s")
        ax.plot([median, p99], [0.5, 0.99], "o", color=color, markersize=4)
    if slo is not None and slo.ttft_ms is not None:
        ax.axvline(slo.limits_s()["ttft_s"], color="0.35", linestyle="--", label=f"TTFT SLO {slo.ttft_ms:g} ms")
    log = bool(medians) and min(medians) > 0 and max(p99s) / min(medians) > 100
    if log:
        ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_title("Time to first token (finished requests)")
    finish_axes(ax, "fraction of requests", xlabel="TTFT (s, log scale)" if log else "TTFT (s)")
    return fig


def histogram_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """``bins + 1`` edges spanning ``values``, never of zero width.

    Identical latencies (a thousand replicas each serving the same request) or ones equal up to
    rounding give numpy a range too narrow to split; the span is then widened around them to a
    thousandth of their size (or 1 s around zero), so one bar stands at the common value.
    """
    if not len(values):
        return np.linspace(0.0, 1.0, bins + 1)
    lo, hi = float(values.min()), float(values.max())
    least = 1e-3 * max(abs(hi), abs(lo)) or 1.0
    if hi - lo < least:
        middle = (lo + hi) / 2
        lo, hi = middle - least / 2, middle + least / 2
    return np.linspace(lo, hi, bins + 1)


def e2e_histogram(runs: Mapping[str, Frames], *, full_batch_latency_s: float | None = None) -> Figure:
    """Histogram of end-to-end latency; the full-batch latency W_B (no queue) shows how much of it is queueing."""
    fig, ax = new_figure()
    finished = {label: _finished(r.requests)["e2e_s"].to_numpy(dtype=float) for label, r in runs.items()}
    everything = np.concatenate([v for v in finished.values()] + [np.zeros(0)])
    bins = histogram_edges(everything, 60)
    for label, color in colors(runs).items():
        e2e = finished[label]
        if len(e2e):
            ax.hist(e2e, bins=bins, color=color, alpha=0.55 if len(runs) > 1 else 0.85,
                    label=f"{label}: mean {e2e.mean():,.2f} s ({len(e2e):,} requests)")
    if full_batch_latency_s is not None:
        ax.axvline(full_batch_latency_s, color="0.2", linestyle="--",
                   label=f"latency at a full batch W_B = {full_batch_latency_s:,.2f} s (no queueing)")
    ax.set_title("End-to-end latency")
    finish_axes(ax, "requests", xlabel="E2E latency (s)")
    return fig


def latency_by_request(runs: Mapping[str, Frames]) -> Figure:
    """TTFT (top) and E2E latency (bottom) of every finished request against its arrival time.

    Request-level batching draws TTFT as a sawtooth: requests that arrive while a batch runs all
    start together when it ends, so within one tooth TTFT falls one second per second of later
    arrival. The first of them waited for the whole batch: head-of-line blocking. Continuous
    batching admits a request at the next step, so its TTFT stays flat until slots run out.
    """
    fig, (top, bottom) = new_figure(2, height_in=6.4, sharex=True)
    for label, color in colors(runs).items():
        done = _finished(runs[label].requests)
        style = {"s": 5, "color": color, "alpha": 0.6, "linewidths": 0}
        top.scatter(done["arrival_s"], done["ttft_s"], label=f"{label}: mean TTFT {done['ttft_s'].mean():,.2f} s",
                    **style)
        bottom.scatter(done["arrival_s"], done["e2e_s"], label=f"{label}: mean E2E {done['e2e_s'].mean():,.2f} s",
                       **style)
    top.set_ylim(bottom=0)
    bottom.set_ylim(bottom=0)
    for label, color in colors(runs).items():
        if label in MODES and not MODES[label].iteration_level:  # a request-level mode's batches
            _annotate_hol(top, _finished(runs[label].requests), color)
            break
    top.set_title("Latency of each request, by arrival time")
    finish_axes(top, "TTFT (s)", xlabel=None)
    finish_axes(bottom, "E2E latency (s)", xlabel="arrival time (s)")
    return fig


def _annotate_hol(ax, done: pd.DataFrame, color: str) -> None:
    """Point at the first request of the batch whose members waited longest behind the one before."""
    batches = done.groupby("first_scheduled_s")["ttft_s"]
    sizes, spread = batches.size(), batches.max() - batches.min()
    if not len(sizes) or (sizes < 2).all():
        return
    start = spread[sizes >= 2].idxmax()
    first = done.loc[done[done["first_scheduled_s"] == start]["ttft_s"].idxmax()]
    ax.annotate("head-of-line blocking: a batch's requests all start\ntogether when the batch before "
                "it has drained;\nthe earliest arrival (here) waited longest",
                xy=(first["arrival_s"], first["ttft_s"]), xytext=_emptiest_corner(ax, done["arrival_s"], done["ttft_s"]),
                textcoords="axes fraction", ha="right", va="center", fontsize="small", color=color,
                bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85},
                arrowprops={"arrowstyle": "->", "color": color})


def _emptiest_corner(ax, x: pd.Series, y: pd.Series) -> tuple[float, float]:
    """Where on the right of ``ax`` (axes fraction) a label covers the fewest of these points."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    fx = (x.to_numpy(dtype=float) - x0) / (x1 - x0)
    fy = (y.to_numpy(dtype=float) - y0) / (y1 - y0)
    anchors = [(0.98, 0.85), (0.98, 0.5), (0.98, 0.18)]  # the legend holds the top left
    covered = [int(((fx > 0.5) & (abs(fy - cy) < 0.13)).sum()) for _, cy in anchors]
    return anchors[covered.index(min(covered))]

