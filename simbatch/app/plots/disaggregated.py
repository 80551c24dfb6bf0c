"""Disaggregated prefill and decode: each pool's queue, where a request's first token and its
hand-over spend their time, and the placement search's goodput by split."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simbatch.app.plots import series
from simbatch.app.plots.figure import finish_axes, new_figure, step_line
from simbatch.app.plots.timeseries import FINE_BINS

PARTS = (("queue (prefill side)", "queue_s"), ("prefill", "prefill_s"), ("wait for a decode slot", "decode_queue_s"),
         ("KV transfer", "kv_transfer_s"))


def handover(requests: pd.DataFrame, iterations: pd.DataFrame) -> Figure:
    """Top: requests waiting in each pool over time (bin means of the steps' ``num_waiting``, summed
    over the pool's replicas): the queue of the pool that binds is the one that grows. Middle: the
    mean time of a finished request from arrival to its KV on the decode side, in four parts, by
    arrival time (windows of 1/40 of the run): queueing for the prefill pool, its prefill (to the
    first token: DistServe's TTFT is the first two), waiting for room on the decode side, the
    transfer. Bottom: the cumulative share of requests whose hand-over (wait + transfer) lasted at
    most x."""
    fig, (queues, top, bottom) = new_figure(3, height_in=9.0)
    edges = series.grid(series.end_time_s(iterations, requests), FINE_BINS)
    for pool, color in (("prefill", "tab:orange"), ("decode", "tab:green")):
        rows = iterations[iterations["pool"] == pool]
        step_line(queues, edges, series.step_mean(rows, rows["num_waiting"], edges), color=color, label=f"{pool} pool")
    queues.set_ylim(bottom=0)
    queues.set_title("Requests waiting in each pool")
    finish_axes(queues, "waiting")
    done = requests[(requests["status"] == "finished") & (requests["decode_replica"] >= 0)].sort_values("arrival_s")
    if done.empty:
        top.set_title("No request was handed over to the decode pool")
        return fig
    parts = pd.DataFrame({"queue_s": done["queue_s"], "prefill_s": done["first_token_s"] - done["first_scheduled_s"],
                          "decode_queue_s": done["decode_queue_s"], "kv_transfer_s": done["kv_transfer_s"]})
    arrival = done["arrival_s"].to_numpy()
    edges = np.linspace(arrival.min(), arrival.max() + 1e-9, 41)
    window = np.digitize(arrival, edges) - 1
    means = parts.groupby(window).mean()
    centers = (edges[:-1] + np.diff(edges) / 2)[means.index]
    top.stackplot(centers, *(1e3 * means[col] for _, col in PARTS),
                  labels=[f"{name}: mean {1e3 * parts[col].mean():.1f} ms" for name, col in PARTS], alpha=0.8)
    top.set_title("From arrival to the KV on the decode replica (finished requests)")
    finish_axes(top, "mean time (ms)", xlabel="arrival time (s)")
    waits = np.sort(1e3 * (parts["decode_queue_s"] + parts["kv_transfer_s"]).to_numpy())
    bottom.plot(waits, np.arange(1, len(waits) + 1) / len(waits) * 100, label=f"{len(waits):,} requests")
    bottom.set_ylim(0, 100)
    finish_axes(bottom, "requests (%)", xlabel="hand-over: wait for a decode slot + KV transfer (ms)")
    return fig


def placement(frame: pd.DataFrame, slo_set: bool) -> Figure:
    """Goodput (or throughput, without SLOs) of each prefill:decode split, simulated, against the
    closed-form capacity min(prefill pool, decode pool)."""
    fig, ax = new_figure(1)
    labels = [f"{p}:{d}" for p, d in zip(frame["prefill_replicas"], frame["decode_replicas"], strict=True)]
    x = np.arange(len(frame))
    ax.bar(x, frame["goodput"], color="tab:blue", alpha=0.8,
           label="simulated " + ("goodput (requests meeting every SLO /s)" if slo_set else "request throughput"))
    ax.plot(x, frame["capacity"], "o-", color="tab:red", label="closed form: min(prefill, decode capacity)")
    ax.set_xticks(x, labels)
    ax.set_title("Placement: prefill:decode replicas")
    finish_axes(ax, "requests/s", xlabel="prefill replicas : decode replicas")
    return fig
