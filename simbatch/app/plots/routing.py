"""Routers side by side on the same requests: what each left cached, and the tail latency it bought."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from simbatch.app.plots.figure import Frames, colors, finish_axes, new_figure


def _p99_ms(requests) -> float:
    ttft = requests.loc[requests["status"] == "finished", "ttft_s"].to_numpy(dtype=float)
    ttft = ttft[~np.isnan(ttft)]
    return float(np.percentile(ttft, 99) * 1e3) if len(ttft) else np.nan


def routing_gain(runs: Mapping[str, Frames]) -> Figure:
    """Per run (a router, on the same requests): the prompt tokens found cached (top) and p99 TTFT
    (bottom, log scale), each bar labelled with the p99 gain over the slowest run.

    A router that sends a turn where its conversation is cached prefills only the new tokens: its
    hit rate is a single replica's, and its TTFT tail stays short; a blind one recomputes each
    conversation on every replica it visits, and at high load the extra prefill is a queue.
    """
    fig, (top, bottom) = new_figure(2, height_in=6.4)
    labels = list(runs)
    palette = colors(labels)
    hits, p99 = [], []
    for label in labels:
        rq = runs[label].requests
        admitted = rq[rq["first_scheduled_s"].notna()]
        prompts = admitted["prompt_tokens"].to_numpy(dtype=float).sum()
        cached = admitted["num_cached_tokens"].to_numpy(dtype=float).sum() if "num_cached_tokens" in admitted else 0.0
        hits.append(100 * cached / prompts if prompts else np.nan)
        p99.append(_p99_ms(rq))
    x = np.arange(len(labels))
    top.bar(x, hits, color=[palette[lb] for lb in labels])
    for i, h in enumerate(hits):
        top.annotate(f"{h:.1f} %", (i, h), ha="center", va="bottom", fontsize="small")
    top.set_xticks(x, labels, fontsize="small")
    top.set_ylim(0, 105)
    top.set_title("Routers on the same requests: prompt tokens found cached, and p99 TTFT")
    finish_axes(top, "token hit rate (%)", xlabel=None, legend=False)
    bottom.bar(x, p99, color=[palette[lb] for lb in labels])
    worst = np.nanmax(p99) if np.isfinite(p99).any() else np.nan
    for i, v in enumerate(p99):
        if np.isfinite(v):
            gain = worst / v
            text = f"{v:,.0f} ms" + ((f"\n{gain:.1f}x faster" if gain < 10 else f"\n{gain:.0f}x faster") if v < worst else "")
            bottom.annotate(text, (i, v), ha="center", va="bottom", fontsize="small")
    bottom.set_xticks(x, labels, fontsize="small")
    if np.isfinite(p99).any() and np.nanmax(p99) / max(np.nanmin(p99), 1e-9) > 20:
        bottom.set_yscale("log")
    finish_axes(bottom, "p99 TTFT (ms)", xlabel=None, legend=False)
    return fig
