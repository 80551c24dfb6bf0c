"""Multi-LoRA as a user sees it: how often adapters are loaded, and what a load does to a request's TTFT."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simbatch.app.plots.figure import Frames, finish_axes, new_figure


def lora_adapters(run: Frames) -> Figure:
    """Adapter loads so far, by admission time (top), and the TTFT distribution of the requests whose
    admission loaded their adapter against those that found it on the GPU (bottom).

    Top: loads onto the GPU (``lora_loads``) and, of them, those read from storage first because host
    memory did not hold the adapter either (``lora_storage_loads``); their slope is the load rate,
    steep while the slots fill, then the rate of misses of an LRU cache of ``max_loras`` adapters.
    Bottom: a load adds its time (the adapter's bytes over the host link, and from storage) to the
    step that admits the request, so the loaded requests' curve sits to the right by about that much,
    more where the load also delayed the queue behind it.
    """
    rq = run.requests
    admitted = rq[rq["first_scheduled_s"].notna()].sort_values("first_scheduled_s")
    fig, (top, bottom) = new_figure(2, height_in=6.4)
    t = admitted["first_scheduled_s"].to_numpy(dtype=float)
    for column, name, color in (("lora_loads", "adapter loads onto the GPU", "#1f77b4"),
                                ("lora_storage_loads", "of them read from storage first", "#ff7f0e")):
        counts = np.cumsum(admitted[column].to_numpy())
        top.step(t, counts, where="post", color=color, label=f"{name}: {int(counts[-1]) if len(counts) else 0:,}")
    top.set_ylim(bottom=0)
    top.set_title("Multi-LoRA: adapter loads so far")
    finish_axes(top, "loads", xlabel="admission time (s)")

    done = admitted[(admitted["status"] == "finished") & (admitted["lora_id"] >= 0)]
    loaded = done["lora_loads"].to_numpy() > 0
    for mask, name, color in ((~loaded, "found their adapter on the GPU", "#2ca02c"),
                              (loaded, "loaded their adapter at admission", "#d62728")):
        ttft = np.sort(done["ttft_s"].to_numpy(dtype=float)[mask])
        if not len(ttft):
            continue
        extra = f", loads {done['lora_load_ms'].to_numpy()[mask].mean():.3g} ms on average" if mask is loaded else ""
        bottom.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", color=color,
                    label=f"{len(ttft):,} requests that {name}: median {1e3 * np.median(ttft):.3g} ms{extra}")
    positive = done["ttft_s"].to_numpy(dtype=float)
    positive = positive[positive > 0]
    if len(positive) and positive.max() / positive.min() > 100:
        bottom.set_xscale("log")
    bottom.set_ylim(0, 1.02)
    finish_axes(bottom, "share of requests", xlabel="TTFT (s)")
    return fig
