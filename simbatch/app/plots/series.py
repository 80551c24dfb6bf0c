"""Time series from the frames: what was on the engine, second by second.

The iterations frame stores *runs* of identical steps, each a constant value (batch size, running
requests, KV blocks, tokens per step) held from ``start_s`` to ``end_s``; the requests frame stores
intervals (a request is in the system from arrival to finish). Both are sums of boxes, so their
integral up to any time t is piecewise linear in t, and its knots are the box edges. Every series
here is that integral evaluated on a grid and differenced:

- a *bin mean* is (I(b) - I(a)) / (b - a): the time-weighted average over the bin, exact however
  the runs fall across bin edges, and 0 while the engine is idle;
- a *cumulative* curve is I(t) itself.

So the area under any plotted curve equals the total in the frames, whatever the bin width.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def integral_at(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The integral from 0 to t of sum_i values_i * [starts_i <= s < ends_i] ds, at each t of ``times``."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    values = np.asarray(values, dtype=float)
    if len(starts) == 0:
        return np.zeros(len(times))
    knots = np.concatenate([starts, ends])
    order = np.argsort(knots, kind="stable")
    knots = knots[order]
    # The slope of the integral changes by +value at a box's start and -value at its end.
    slope = np.cumsum(np.concatenate([values, -values])[order])
    area = np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(knots))])
    return np.interp(times, knots, area, left=0.0)


def bin_means(edges: np.ndarray, starts: np.ndarray, ends: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Time-weighted mean of the boxes' sum over each bin ``[edges[k], edges[k+1])``."""
    return np.diff(integral_at(edges, starts, ends, values)) / np.diff(edges)


def bin_means_by(edges: np.ndarray, keys: np.ndarray, num_keys: int, starts: np.ndarray, ends: np.ndarray,
                 values: np.ndarray) -> np.ndarray:
    """:func:`bin_means` of each key's boxes apart: a ``num_keys`` x bins array (a replica per row, say).

    The boxes are sorted by key once and each key's slice integrated on its own, so the cost is
    that of one pass over the boxes plus one small call per key, however many keys there are.
    """
    keys = np.asarray(keys, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(num_keys + 1))
    starts, ends = np.asarray(starts, dtype=float)[order], np.asarray(ends, dtype=float)[order]
    values = np.asarray(values, dtype=float)[order]
    out = np.zeros((num_keys, len(edges) - 1))
    for k in np.flatnonzero(np.diff(bounds)):
        mine = slice(bounds[k], bounds[k + 1])
        out[k] = bin_means(edges, starts[mine], ends[mine], values[mine])
    return out


def without_noise(values: np.ndarray) -> np.ndarray:
    """``values`` with rounding residue set to 0: a difference of two equal integrals is 0, not 1e-13.

    Bin means are differences of cumulative sums, so a quantity that is exactly zero over a bin
    comes out as a few ulps of the integrals' size; left alone, an axis would autoscale to show it.
    """
    values = np.asarray(values, dtype=float)
    scale = max(1.0, float(np.abs(values).max(initial=0.0)))
    return np.where(np.abs(values) < 1e-9 * scale, 0.0, values)


def end_time_s(iterations: pd.DataFrame, requests: pd.DataFrame) -> float:
    """When the last thing in the frames happened: the right edge of every time axis."""
    candidates = [iterations["end_s"].max() if len(iterations) else 0.0,
                  requests["finish_s"].max() if len(requests) else 0.0,
                  requests["arrival_s"].max() if len(requests) else 0.0]
    return float(np.nanmax([0.0, *candidates]))


def grid(end_s: float, bins: int) -> np.ndarray:
    """``bins + 1`` equally spaced edges over [0, end_s] (a unit span if nothing happened)."""
    return np.linspace(0.0, end_s if end_s > 0 else 1.0, bins + 1)


def step_mean(iterations: pd.DataFrame, values: np.ndarray | pd.Series, edges: np.ndarray) -> np.ndarray:
    """Bin means of a per-step quantity held over each run (summed over replicas)."""
    return bin_means(edges, iterations["start_s"], iterations["end_s"], values)


def idle_slots(iterations: pd.DataFrame) -> np.ndarray:
    """Per run, slots computed for requests that are already done (static batching's tail idling).

    ``padded_tokens`` counts idle decode slots in a decode step and prompt padding in a prefill
    step; only the former are idle slots, and decode steps are those without prefill tokens.
    """
    return np.where(iterations["prefill_tokens"].to_numpy() == 0, iterations["padded_tokens"].to_numpy(), 0)


def in_system(requests: pd.DataFrame, edges: np.ndarray) -> np.ndarray:
    """Mean number of admitted requests in the system over each bin (running plus waiting).

    Rebuilt from the request rows; averaged over the whole run it is Little's L.
    """
    admitted = requests[requests["status"] != "rejected"]
    ends = np.fmin(admitted["finish_s"].to_numpy(dtype=float), edges[-1])
    return bin_means(edges, admitted["arrival_s"], ends, np.ones(len(admitted)))


def cumulative_output_tokens(iterations: pd.DataFrame, requests: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Output tokens produced by each time: one per decoding sequence per step, plus first tokens.

    A decode step's tokens are spread evenly over its run. A first token is counted at its request's
    ``first_token_s``. A token sampled at the end of a recompute after preemption is a prefill
    step's and is not counted (at most one per recompute preemption).
    """
    busy = iterations[(iterations["duration_s"] > 0) & (iterations["decode_tokens"] > 0)]
    decode = integral_at(times, busy["start_s"], busy["end_s"], busy["decode_tokens"] / busy["duration_s"])
    firsts = np.sort(requests["first_token_s"].dropna().to_numpy(dtype=float))
    return decode + np.searchsorted(firsts, times, side="right")


def output_tokens_per_s(iterations: pd.DataFrame, requests: pd.DataFrame, edges: np.ndarray) -> np.ndarray:
    """Output token throughput over each bin, tokens/s."""
    return np.diff(cumulative_output_tokens(iterations, requests, edges)) / np.diff(edges)
