"""What the engine was doing over time: throughput, pools, memory, batch size.

Each function takes ``runs``, a mapping from a label (usually the batching mode) to a simulation's
frames, and draws one line per run, so the same plot serves a single run and a comparison.
Bin means are exact time averages (see :mod:`simbatch.app.plots.series`); an idle engine counts as 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from simbatch.app.plots import series
from simbatch.app.plots.figure import Frames, colors, finish_axes, new_figure, step_band, step_line

FINE_BINS = 600  # pools and batch sizes: fine enough to show one static batch draining step by step
COARSE_BINS = 120
_LABEL_BOX = {"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "none", "alpha": 0.85}  # throughput: a rate needs a few steps per bin to be readable


def _edges(runs: Mapping[str, Frames], bins: int) -> np.ndarray:
    return series.grid(max(series.end_time_s(r.iterations, r.requests) for r in runs.values()), bins)


def _shade_arrivals(ax, runs: Mapping[str, Frames]) -> None:
    """Grey band while requests keep arriving: after it, queues can only drain."""
    last = max(float(r.requests["arrival_s"].max()) if len(r.requests) else 0.0 for r in runs.values())
    if last > 0:
        ax.axvspan(0, last, color="0.5", alpha=0.08, linewidth=0, label="requests arriving")


def _hline(ax, y: float | None, text: str, color: str = "0.35") -> None:
    if y is not None and np.isfinite(y):
        ax.axhline(y, color=color, linestyle="--", linewidth=1.2, label=text)


def output_throughput(runs: Mapping[str, Frames], *, capacity_tokens_per_s: float | None = None,
                      offered_tokens_per_s: float | None = None, bins: int = COARSE_BINS) -> Figure:
    """Output tokens per second over time, against the device's capacity and the offered load."""
    edges = _edges(runs, bins)
    fig, ax = new_figure()
    for label, color in colors(runs).items():
        r = runs[label]
        step_line(ax, edges, series.output_tokens_per_s(r.iterations, r.requests, edges), color=color, label=label)
    _shade_arrivals(ax, runs)
    _hline(ax, offered_tokens_per_s, f"offered load λ·E[out] = {offered_tokens_per_s or 0:,.0f} tok/s", "#9467bd")
    _hline(ax, capacity_tokens_per_s, f"capacity B/τ(B) at full batch = {capacity_tokens_per_s or 0:,.0f} tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Output token throughput")
    finish_axes(ax, "output tokens / s")
    return fig


def cumulative_output_tokens(runs: Mapping[str, Frames]) -> Figure:
    """Output tokens delivered so far: the steeper curve is the faster server; where it ends, the run ends."""
    edges = _edges(runs, FINE_BINS)
    fig, ax = new_figure()
    for label, color in colors(runs).items():
        r = runs[label]
        end = series.end_time_s(r.iterations, r.requests)
        t = edges[edges <= end]
        total = series.cumulative_output_tokens(r.iterations, r.requests, t)
        ax.plot(t, total, color=color, label=f"{label}: {total[-1]:,.0f} tokens by t = {end:,.1f} s")
        ax.plot([end], [total[-1]], "o", color=color)
    ax.set_ylim(bottom=0)
    ax.set_title("Cumulative output tokens (same requests in every run)")
    finish_axes(ax, "output tokens")
    return fig


def running_waiting(runs: Mapping[str, Frames], *, slots: int | None = None) -> Figure:
    """Requests running (top) and waiting (bottom) over time.

    Running comes from the engine's steps; waiting is the number in the system (from the request
    rows) minus running, so it also counts requests that wait while the engine idles (a static
    batch filling up).
    """
    edges = _edges(runs, FINE_BINS)
    fig, (top, bottom) = new_figure(2, height_in=6.0, sharex=True)
    for label, color in colors(runs).items():
        r = runs[label]
        running = series.step_mean(r.iterations, r.iterations["num_running"], edges)
        waiting = series.without_noise(np.maximum(series.in_system(r.requests, edges) - running, 0.0))
        step_line(top, edges, running, color=color, label=label)
        step_line(bottom, edges, waiting, color=color, label=label)
        step_band(bottom, edges, 0.0, waiting, color=color, alpha=0.12)
    _hline(top, slots, f"slots available = {slots}")
    for ax in (top, bottom):
        _shade_arrivals(ax, runs)
    top.set_ylim(bottom=0)
    bottom.set_ylim(0, max(1.0, bottom.get_ylim()[1]))  # nobody waiting: a 0..1 axis, not a zoom on nothing
    top.set_title("Requests running (in the batch) and waiting (queued)")
    finish_axes(top, "running", xlabel=None)
    finish_axes(bottom, "waiting")
    return fig


def kv_usage(runs: Mapping[str, Frames], *, num_blocks: int) -> Figure:
    """Share of device KV blocks in use over time; ticks mark steps that preempted a request.

    The iterations frame keeps one mean per run of identical steps, so within a long run (a steady
    decode batch) usage shows as that run's mean, flat, though the blocks grew during it.
    """
    edges = _edges(runs, FINE_BINS)
    fig, ax = new_figure()
    for label, color in colors(runs).items():
        it = runs[label].iterations
        usage = 100 * series.step_mean(it, it["kv_blocks_used"], edges) / num_blocks
        step_line(ax, edges, usage, color=color, label=label)
        preempting = it[it["num_preempted"] > 0]
        if len(preempting):
            ax.plot(preempting["start_s"], np.full(len(preempting), 101.0), "|", color=color, markersize=9,
                    label=f"{label}: preemption ({int((preempting['num_preempted'] * preempting['num_steps']).sum())})")
    ax.axhline(100, color="0.35", linestyle="--", linewidth=1.2, label=f"all {num_blocks:,} blocks")
    ax.set_ylim(0, 105)
    ax.set_title("KV cache usage (each run of identical steps at its mean)")
    finish_axes(ax, "device KV blocks used (%)")
    return fig


def batch_size(runs: Mapping[str, Frames], *, max_num_seqs: int | None = None) -> Figure:
    """Sequences computed per step over time, one panel per run, idle slots hatched above them.

    Continuous batching refills a finished request's slot on the next step, so its batch holds
    whatever work there is, up to the slots available. A static batch drains: each finished request
    leaves an idle slot that is still computed until the batch's longest request ends, so the line
    falls in a staircase down to the last straggler while the hatched band (paid, wasted) grows.
    """
    edges = _edges(runs, FINE_BINS)
    fig, axes = new_figure(len(runs), height_in=1.2 + 2.3 * len(runs), sharex=True, sharey=True, squeeze=False)
    for ax, (label, color) in zip(axes[:, 0], colors(runs).items(), strict=True):
        it = runs[label].iterations
        useful = series.step_mean(it, it["batch_size"], edges)
        idle = series.step_mean(it, series.idle_slots(it), edges)
        step_line(ax, edges, useful, color=color)
        if idle.max(initial=0) > 0:
            step_band(ax, edges, useful, useful + idle, facecolor="none", edgecolor=color, hatch="///", linewidth=0,
                      alpha=0.5)
            _annotate_tail(ax, edges, useful, idle, color)
        if max_num_seqs is not None:
            ax.axhline(max_num_seqs, color="0.35", linestyle="--", linewidth=1.2)
        _mark_end(ax, series.end_time_s(it, runs[label].requests), color)
        finish_axes(ax, f"{label}\nsequences per step", xlabel=None, legend=False)
        ax.yaxis.label.set_color(color)
    top = axes[0, 0]
    top.set_ylim(0, (max_num_seqs or top.get_ylim()[1]) * 1.3)
    # One legend for every panel, in neutral colours: each panel's colour is its mode's.
    handles, labels = [Line2D([], [], color="0.2")], ["sequences generating"]
    if any(series.idle_slots(r.iterations).any() for r in runs.values()):
        handles.append(Patch(facecolor="none", edgecolor="0.2", hatch="///", linewidth=0))
        labels.append("idle slots still computed (finished, waiting for their batch to end)")
    if max_num_seqs is not None:
        handles.append(Line2D([], [], color="0.35", linestyle="--"))
        labels.append(f"max_num_seqs = {max_num_seqs}")
    fig.legend(handles, labels, loc="outside lower center", fontsize="small", ncols=len(handles), frameon=False)
    fig.suptitle("Batch size: continuous refills a slot at once; a static batch drains to its stragglers")
    axes[-1, 0].set_xlabel("simulated time (s)")
    return fig


def _annotate_tail(ax, edges: np.ndarray, useful: np.ndarray, idle: np.ndarray, color: str) -> None:
    """Point at a bin where the most slots are computed for the fewest generating sequences."""
    held = useful + idle
    k = int(np.argmax(idle - 2 * useful))
    x = (edges[k] + edges[k + 1]) / 2
    right = x > (edges[0] + edges[-1]) / 2
    ax.annotate(f"tail idling: {held[k]:.0f} slots computed, {useful[k]:.0f} generating",
                xy=(x, max(useful[k], 0.5)), xytext=(-20 if right else 20, 42), textcoords="offset points",
                ha="right" if right else "left", fontsize="small", color=color, bbox=_LABEL_BOX,
                arrowprops={"arrowstyle": "->", "color": color})


def _mark_end(ax, end_s: float, color: str) -> None:
    """A dotted line where this run's last request finished: the earlier, the higher the throughput."""
    ax.axvline(end_s, color=color, linestyle=":", linewidth=1.2)
    ax.annotate(f"all done at {end_s:,.0f} s", xy=(end_s, 1.0), xycoords=("data", "axes fraction"),
                xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize="small",
                color=color, bbox=_LABEL_BOX)
