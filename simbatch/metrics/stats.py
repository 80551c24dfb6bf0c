"""Statistics over weighted samples: a run of ``count`` identical values is one entry.

``weighted_quantile`` equals ``numpy.quantile`` (its default, linear method) on the sample expanded
by the integer weights, without expanding it: the ITL of a million tokens costs the size of its runs.
"""

from __future__ import annotations

import math

import numpy as np


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    n = int(weights.sum())
    if n == 0:
        return math.nan
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    h = q * (n - 1)
    lo = math.floor(h)
    x_lo = values[np.searchsorted(cum, lo, side="right")]
    x_hi = values[np.searchsorted(cum, min(lo + 1, n - 1), side="right")]
    return float(x_lo + (h - lo) * (x_hi - x_lo))


def weighted_mean_std(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """Mean and population standard deviation (numpy's default ddof=0)."""
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights, dtype=float)
    total = weights.sum()
    if total == 0:
        return math.nan, math.nan
    # Shifting by one sample first makes a constant sample's spread exactly 0, not rounding noise.
    shifted = values - values[0]
    offset = float((shifted * weights).sum() / total)
    mean = float(values[0]) + offset
    var = float((weights * (shifted - offset) ** 2).sum() / total)
    return mean, math.sqrt(max(var, 0.0))


def describe_ms(prefix: str, values_s: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """``mean_/median_/std_/p90_/p99_<prefix>_ms`` of a sample given in seconds, vLLM's key names."""
    values_s = np.asarray(values_s, dtype=float)
    if weights is None:
        weights = np.ones(len(values_s), dtype=np.int64)
    keep = ~np.isnan(values_s)
    values_ms, weights = values_s[keep] * 1e3, np.asarray(weights)[keep]
    mean, std = weighted_mean_std(values_ms, weights)
    return {
        f"mean_{prefix}_ms": mean,
        f"median_{prefix}_ms": weighted_quantile(values_ms, weights, 0.5),
        f"std_{prefix}_ms": std,
        f"p90_{prefix}_ms": weighted_quantile(values_ms, weights, 0.9),
        f"p99_{prefix}_ms": weighted_quantile(values_ms, weights, 0.99),
    }
