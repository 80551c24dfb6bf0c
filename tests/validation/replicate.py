"""Independent replications and the confidence interval every statistical check uses.

A check runs R replications of one scenario, replication r with ``seed = r``, and reduces each to
one number (a mean wait, a slope, a share). The R numbers are independent and identically
distributed, so their mean has standard error SE = s / sqrt(R), with s the sample standard deviation,
and Student's t gives the interval

    mean +- t_{R-1, 0.999} * SE

(two-sided 99.8%). A check passes when the theoretical value lies inside. The tolerance is thus
derived from the replications themselves, never chosen by hand: more replications or longer runs
make it tighter, and a simulator that is off by more than its own noise fails. Finite-horizon
bias is not covered by the interval, so each check removes it by design (deletion of a warm-up
period, runs that drain, or an exact identity) and says how in its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.999  # the t quantile: a two-sided 99.8% interval
EXACT_REL = 1e-9  # rounding: exact identities hold to this; it is far below any bug


@dataclass(frozen=True)
class Estimate:
    """The replication mean of a quantity and its Student-t half-width."""

    mean: float
    se: float
    replications: int

    @classmethod
    def of(cls, samples: Iterable[float]) -> Estimate:
        x = np.asarray(list(samples), dtype=float)
        if len(x) < 2:
            raise ValueError(f"a confidence interval needs at least 2 replications, got {len(x)}")
        return cls(float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x))), len(x))

    @property
    def half_width(self) -> float:
        return float(stats.t.ppf(CONFIDENCE, self.replications - 1)) * self.se

    def contains(self, value: float) -> bool:
        """Within the half-width, or equal to rounding (a quantity with no variance has none)."""
        return abs(value - self.mean) <= max(self.half_width, EXACT_REL * abs(value))


def seeds_label(seeds: Iterable[int]) -> str:
    """``0-29`` for a contiguous range, else the list; ``-`` for none (no simulation)."""
    s = sorted(seeds)
    if not s:
        return "-"
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ", ".join(map(str, s))


def ols_slope(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Least-squares slope of y on x (optionally weighted)."""
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=float)
    xm, ym = np.average(x, weights=w), np.average(y, weights=w)
    return float(np.sum(w * (x - xm) * (y - ym)) / np.sum(w * (x - xm) ** 2))
