"""An autoscaled fleet over its run: the load, the replicas that followed it, and the latency it bought."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simbatch.app.plots.figure import finish_axes, new_figure


def autoscaling(result) -> Figure:
    """Arrivals per minute (top, with the rate curve when the workload has one), the replicas ready,
    starting and draining (middle, a step curve: what the fleet held) and TTFT p99 per window (bottom).

    Replicas lag the load by the start-up delay on the way up and by the cool-down on the way down;
    TTFT rises where the load outran the replicas that were ready.
    """
    fig, (top, middle, bottom) = new_figure(3, height_in=8.4, sharex=True)
    rq, fleet = result.requests, result.fleet
    end_s = max(float(result.summary["duration"]), 1e-9)
    window_s = max(1.0, end_s / 200)
    edges = np.arange(0.0, end_s + window_s, window_s)
    counts = np.histogram(rq["arrival_s"], bins=edges)[0]
    top.step(edges[:-1], counts / window_s, where="post", color="C0", label="arrivals (req/s)")
    curve = result.scenario.workload.arrival.rate_curve if result.scenario.workload.arrival is not None else None
    if curve is not None:
        from simbatch.workload.rate_curve import rate_function

        grid = np.linspace(0, end_s, 1000)
        top.plot(grid, rate_function(curve, result.scenario).at(grid), color="k", lw=1, label="rate curve")
    finish_axes(top, "requests/s", xlabel=None)
    top.set_title("Autoscaling: load, replicas, latency")
    t = np.append(fleet["time_s"].to_numpy(dtype=float), end_s)
    for column, color in (("billed", "0.6"), ("ready", "C2"), ("starting", "C1"), ("draining", "C3")):
        values = fleet[column].to_numpy()
        middle.step(t, np.append(values, values[-1]), where="post", color=color,
                    label={"billed": f"billed ({result.summary['gpu_hours']:.1f} GPU-h)"}.get(column, column))
    finish_axes(middle, "replicas", xlabel=None)
    done = rq[rq["status"] == "finished"]
    which = np.digitize(done["arrival_s"].to_numpy(), edges) - 1
    ttft = done["ttft_s"].to_numpy(dtype=float)
    p99 = [np.percentile(ttft[which == k], 99) if (which == k).sum() >= 5 else np.nan for k in range(len(edges) - 1)]
    bottom.step(edges[:-1], np.array(p99) * 1e3, where="post", color="C4", label="TTFT p99 per window")
    slo = result.scenario.slo.ttft_ms
    if slo is not None:
        bottom.axhline(slo, color="k", ls="--", lw=1, label=f"SLO {slo:g} ms")
    finish_axes(bottom, "TTFT p99 (ms)", xlabel="arrival time (s)")
    return fig
