"""A host KV tier as a user sees it: where each prompt's tokens were found, and what loading them cost."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simbatch.app.plots.figure import Frames, finish_axes, new_figure

TIERS = (("found on the device (prefix cache)", "#2ca02c"), ("found in the host tier, loaded", "#1f77b4"),
         ("computed (prefill)", "#d62728"))
WINDOWS = 60


def host_kv_tier(run: Frames, ms_per_block: float, block_size: int) -> Figure:
    """Prompt tokens by where they were found, by arrival time (top), and each finished request's TTFT
    against the tokens it loaded from the host, beside what their transfer takes (bottom).

    Top: each window's admitted prompt tokens split into those the device's prefix cache held, those the
    host tier held (``num_host_cached_tokens``: loaded back over the host link instead of computed), and
    those computed. Bottom: a load costs ``ms_per_block`` per block over the link, the line; with
    ``host_load_overlap`` the step hides it under its compute, so a request's TTFT exceeds its load time
    by its queueing and its prefill. The legend says what share of the TTFT of the requests that loaded
    their transfers would be if none were hidden (an upper bound on what the tier added to them).
    """
    rq = run.requests
    admitted = rq[rq["first_scheduled_s"].notna()].sort_values("arrival_s")
    fig, (top, bottom) = new_figure(2, height_in=6.4)
    host = admitted["num_host_cached_tokens"].to_numpy(dtype=float)
    device = admitted["num_cached_tokens"].to_numpy(dtype=float) - host
    computed = admitted["prompt_tokens"].to_numpy(dtype=float) - device - host
    if len(admitted):
        t = admitted["arrival_s"].to_numpy(dtype=float)
        edges = np.linspace(t[0], max(t[-1], t[0] + 1e-9), WINDOWS + 1)
        window = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, WINDOWS - 1)
        sums = [np.bincount(window, weights=x, minlength=WINDOWS) for x in (device, host, computed)]
        total = np.maximum(sum(sums), 1e-300)
        mids = (edges[:-1] + edges[1:]) / 2
        every = device.sum() + host.sum() + computed.sum()
        labels = [f"{name}: {100 * x.sum() / every:.1f} %" for (name, _), x in zip(TIERS, (device, host, computed),
                                                                                 strict=True)]
        top.stackplot(mids, *(100 * s / total for s in sums), colors=[c for _, c in TIERS], labels=labels,
                      alpha=0.85)
    top.set_ylim(0, 100)
    top.set_title("Host KV tier: where each prompt's tokens were found")
    finish_axes(top, "share of prompt tokens (%)", xlabel="arrival time (s)")

    done = admitted[admitted["status"] == "finished"]
    loaded = done["num_host_cached_tokens"].to_numpy(dtype=float)
    ttft = done["ttft_s"].to_numpy(dtype=float)
    load_s = loaded / block_size * ms_per_block / 1e3
    some = loaded > 0
    share = load_s[some].sum() / ttft[some].sum() if some.any() and ttft[some].sum() > 0 else 0.0
    bottom.scatter(loaded[~some], ttft[~some], s=5, color=TIERS[2][1], alpha=0.5, linewidths=0,
                   label=f"{int((~some).sum()):,} requests that loaded nothing")
    bottom.scatter(loaded[some], ttft[some], s=5, color=TIERS[1][1], alpha=0.6, linewidths=0,
                   label=f"{int(some.sum()):,} that loaded from the host: transfers {100 * share:.2g} % of their TTFT")
    if some.any():
        x = np.array([0.0, loaded.max()])
        bottom.plot(x, x / block_size * ms_per_block / 1e3, color="black", linewidth=1,
                    label=f"transfer time: {ms_per_block:.3g} ms a block of {block_size} tokens")
    positive = ttft[ttft > 0]
    if len(positive) and positive.max() / positive.min() > 100:
        bottom.set_yscale("log")
    else:
        bottom.set_ylim(bottom=0)
    finish_axes(bottom, "TTFT (s)", xlabel="prompt tokens loaded from the host tier")
    return fig
