"""Statistics over weighted samples: a run of ``count`` identical values is one entry.

``weighted_quantile`` equals ``numpy.quantile`` (its default, linear method) on the sample expanded
by the integer weights, without expanding it: the ITL of a million tokens costs the size of its runs.
Weights ``None`` mean one entry per value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def weighted_quantiles(values: np.ndarray, weights: np.ndarray | None, qs: Sequence[float]) -> list[float]:
    """``weighted_quantile`` at each of ``qs``, sorting the sample once for all of them.

    The expanded sample has n = sum(weights) entries, and quantile q lies at rank h = q (n - 1),
    between the entries at ranks floor(h) and floor(h) + 1. With the values sorted, the entry at
    rank r is the first value whose cumulative weight exceeds r. Tied values are interchangeable,
    so any sort, not only a stable one, puts the same value at each rank.
    """
    values = np.asarray(values, dtype=float)
    if weights is None:  # one entry per value: the cumulative weight is the position
        values = np.sort(values)
        cum = np.arange(1, len(values) + 1)
    else:
        # Entries of weight 0 stay: their cumulative weight equals the one before, so no rank picks them.
        weights = np.asarray(weights, dtype=np.int64)
        order = np.argsort(values)
        values, cum = values[order], weights[order]
        del order
        np.cumsum(cum, out=cum)  # (in place: an ITL sample is millions of rows)
    n = int(cum[-1]) if len(cum) else 0
    if n == 0:
        return [math.nan] * len(qs)

    def at_rank(rank: int) -> float:
        return values[np.searchsorted(cum, rank, side="right")]

    out = []
    for q in qs:
        h = q * (n - 1)
        lo = math.floor(h)
        x_lo, x_hi = at_rank(lo), at_rank(min(lo + 1, n - 1))
        out.append(float(x_lo + (h - lo) * (x_hi - x_lo)))
    return out


def weighted_quantile(values: np.ndarray, weights: np.ndarray | None, q: float) -> float:
    """The q-quantile of ``values`` repeated ``weights`` times; NaN when the weights sum to 0."""
    return weighted_quantiles(values, weights, [q])[0]


def weighted_mean_std(values: np.ndarray, weights: np.ndarray | None) -> tuple[float, float]:
    """Mean and population standard deviation (numpy's default ddof=0)."""
    values = np.asarray(values, dtype=float)
    # Integer weights multiply floats exactly as their float copies would (below 2**53), so no copy.
    weights = np.ones(len(values)) if weights is None else np.asarray(weights)
    total = weights.sum()
    if total == 0:
        return math.nan, math.nan
    # Shifting by one sample first makes a constant sample's spread exactly 0, not rounding noise.
    shifted = values - values[0]
    scratch = shifted * weights
    offset = float(scratch.sum() / total)
    mean = float(values[0]) + offset
    np.subtract(shifted, offset, out=scratch)  # (one scratch array, reused: the same sums, less memory)
    del shifted
    scratch **= 2
    scratch *= weights
    var = float(scratch.sum() / total)
    return mean, math.sqrt(max(var, 0.0))


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a key: 99 -> ``p99``, 99.9 -> ``p99.9``."""
    return f"p{int(p)}" if float(p) == int(p) else f"p{p:g}"


def describe_ms(prefix: str, values_s: np.ndarray, weights: np.ndarray | None = None,
                percentiles: Sequence[float] = (), own: bool = False) -> dict[str, float]:
    """``mean_/median_/std_/p90_/p99_<prefix>_ms`` of a sample given in seconds, vLLM's key names,
    and ``p<P>_<prefix>_ms`` for each extra percentile P in ``percentiles`` (0 < P < 100). ``own``:
    the caller hands ``values_s`` over (a float64 array of its own), to be scaled to ms in place."""
    values_s = np.asarray(values_s, dtype=float)
    keep = ~np.isnan(values_s)
    # (Copies only where a value is missing, and in place when the caller hands the sample over: the
    # ITL sample of a million requests is millions of rows.)
    if not keep.all():
        values_ms = values_s[keep] * 1e3
        if weights is not None:
            weights = np.asarray(weights)[keep]
    elif own:
        values_ms = values_s
        values_ms *= 1e3
    else:
        values_ms = values_s * 1e3
    del keep
    mean, std = weighted_mean_std(values_ms, weights)
    extra = [p for p in dict.fromkeys(percentiles) if p not in (90, 99)]
    median, p90, p99, *rest = weighted_quantiles(values_ms, weights, [0.5, 0.9, 0.99, *(p / 100 for p in extra)])
    return {
        f"mean_{prefix}_ms": mean,
        f"median_{prefix}_ms": median,
        f"std_{prefix}_ms": std,
        f"p90_{prefix}_ms": p90,
        f"p99_{prefix}_ms": p99,
        **{f"{percentile_word(p)}_{prefix}_ms": v for p, v in zip(extra, rest, strict=True)},
    }
