"""Prefix caching as a user sees it: how much of each prompt was found cached, and what it did to TTFT."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.figure import Figure

from simbatch.app.plots.figure import Frames, colors, finish_axes, new_figure


def prefix_cache(runs: Mapping[str, Frames]) -> Figure:
    """The token hit rate so far, by arrival time (top), and each finished request's TTFT against the
    share of its prompt found cached (bottom).

    The rate climbs as conversations and the system prompt fill the cache, then holds, or sags when
    evictions outrun reuse. A request whose prompt was mostly cached prefills only the rest: its TTFT
    sits low, unless it queued first.
    """
    fig, (top, bottom) = new_figure(2, height_in=6.4)
    ttfts = []
    for label, color in colors(runs).items():
        rq = runs[label].requests
        admitted = rq[rq["first_scheduled_s"].notna()].sort_values("arrival_s")
        if admitted.empty:
            continue
        prompts = admitted["prompt_tokens"].to_numpy(dtype=float)
        cached = admitted["num_cached_tokens"].to_numpy(dtype=float)
        rate = np.cumsum(cached) / np.cumsum(prompts)
        top.plot(admitted["arrival_s"], 100 * rate, color=color,
                 label=f"{label}: {100 * cached.sum() / prompts.sum():.1f} % of prompt tokens found cached")
        done = admitted[admitted["status"] == "finished"]
        ttfts.append(done["ttft_s"].to_numpy(dtype=float))
        bottom.scatter(100 * done["num_cached_tokens"] / done["prompt_tokens"], done["ttft_s"], s=5, color=color,
                       alpha=0.6, linewidths=0, label=f"{label}: {len(done):,} finished requests")
    top.set_ylim(0, 100)
    top.set_title("Prefix cache: prompt tokens found cached, so far")
    finish_axes(top, "token hit rate so far (%)", xlabel="arrival time (s)")
    bottom.set_xlim(-2, 102)
    ttft = np.concatenate([np.zeros(0), *ttfts])
    ttft = ttft[ttft > 0]
    if len(ttft) and ttft.max() / ttft.min() > 100:  # a run without a cache that queued for minutes
        bottom.set_yscale("log")
    else:
        bottom.set_ylim(bottom=0)
    finish_axes(bottom, "TTFT (s)", xlabel="share of the prompt found cached (%)")
    return fig
