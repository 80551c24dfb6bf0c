"""Arrival rates that change over the run, and the non-homogeneous Poisson process they drive.

A rate curve ``lambda(t)`` (``workload.arrival.rate_curve``) is one of: points, linear between them
(optionally repeated every period); a sinusoidal daily curve ``m (1 + a cos(2 pi (t - t_peak) / P))``;
or a trace's arrivals counted per window, a piecewise-constant rate. Arrivals follow a
non-homogeneous Poisson process of that intensity, drawn by thinning (Lewis and Shedler, 1979):
candidates of a homogeneous Poisson process at the curve's peak rate ``lambda*``, each kept with
probability ``lambda(t) / lambda*``. The kept times are exactly an NHPP(lambda): the candidates in
[t, t + dt) are Poisson(lambda* dt), and independent thinning makes them Poisson(lambda(t) dt).

Candidate gaps and keep-draws come from two generators spawned from the one passed in, each drawn in
chunks (numpy draws the same numbers in chunks as at once), so the arrivals depend on the seed only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simbatch.config import Scenario
from simbatch.config.workload import PiecewiseCurve, RateCurve, SinusoidalCurve
from simbatch.model.clock import MAX_ARRIVAL_S


@dataclass(frozen=True)
class RateFunction:
    """A curve as the model reads it: ``at(t)`` requests/s (vectorized), its ``peak``, and ``mean_over``.

    Points ``(times_s, rates)``, linear between them, constant before the first and after the last;
    ``period_s`` wraps time first. A sinusoid is kept as its parameters (exact, not sampled).
    """

    times_s: np.ndarray
    rates: np.ndarray
    period_s: float | None = None
    step: bool = False  # piecewise constant (a trace's windows): each rate holds until the next time
    sinusoid: tuple[float, float, float, float] | None = None  # (mean, amplitude, period_s, peak_s)

    def at(self, t_s) -> np.ndarray:
        t = np.asarray(t_s, dtype=np.float64)
        if self.sinusoid is not None:
            mean, amp, period, peak = self.sinusoid
            return mean * (1.0 + amp * np.cos(2 * math.pi * (t - peak) / period))
        if self.period_s is not None:
            t = np.mod(t, self.period_s)
        if self.step:
            i = np.searchsorted(self.times_s, t, side="right") - 1
            return self.rates[np.clip(i, 0, len(self.rates) - 1)]
        return np.interp(t, self.times_s, self.rates)

    @property
    def peak(self) -> float:
        """The highest rate the curve takes, requests/s: the thinning's candidate rate."""
        if self.sinusoid is not None:
            return self.sinusoid[0] * (1.0 + self.sinusoid[1])
        return float(self.rates.max())

    def mean_over(self, t0_s: float, t1_s: float, points: int = 4097) -> float:
        """The rate averaged over [t0, t1], requests/s (trapezoids on a fine grid; exact for the
        piecewise-linear curve when its points fall on the grid, within 1e-6 for the others)."""
        if t1_s <= t0_s:
            return float(self.at(t0_s))
        grid = np.linspace(t0_s, t1_s, points)
        return float(np.trapezoid(self.at(grid), grid) / (t1_s - t0_s))


def rate_function(curve: RateCurve, scenario: Scenario | None = None) -> RateFunction:
    """The curve's :class:`RateFunction`; a trace's curve reads the trace (``scenario`` resolves its path)."""
    if isinstance(curve, SinusoidalCurve):
        return RateFunction(np.zeros(1), np.array([curve.mean]),
                            sinusoid=(curve.mean, curve.amplitude, curve.period_s, curve.peak_s))
    if isinstance(curve, PiecewiseCurve):
        times, rates = (np.array(x, dtype=np.float64) for x in zip(*curve.points, strict=True))
        if curve.period_s is not None:  # wrap: the last point runs linearly into the first of the next period
            times = np.append(times, times[0] + curve.period_s)
            rates = np.append(rates, rates[0])
        return RateFunction(times, rates, curve.period_s)
    from simbatch.workload.trace import load_trace  # a trace's curve only: the reader is large

    arrivals = load_trace(curve.trace, scenario, None).arrival_s
    windows = max(1, math.ceil((arrivals[-1] + 1e-9) / curve.window_s)) if len(arrivals) else 1
    counts = np.bincount(np.minimum((arrivals // curve.window_s).astype(np.int64), windows - 1), minlength=windows)
    return RateFunction(np.arange(windows) * curve.window_s, counts * curve.scale / curve.window_s, step=True)


def thinned_arrivals_s(rate: RateFunction, rng: np.random.Generator, num_requests: int | None,
                       duration_s: float | None) -> np.ndarray:
    """Arrival times of the NHPP of intensity ``rate``, s: the first ``num_requests``, those before
    ``duration_s``, or (both) the first ``num_requests`` of those before ``duration_s``."""
    peak = rate.peak
    gaps_rng, keep_rng = rng.spawn(2)
    horizon = MAX_ARRIVAL_S if duration_s is None else duration_s
    # Enough candidates for the horizon, or twice the requests asked for; more chunks follow if short.
    expected = peak * duration_s if duration_s is not None else 2.0 * num_requests
    chunk = int(min(max(1024, 1.2 * expected), 1 << 22))
    kept: list[np.ndarray] = []
    count, t0 = 0, 0.0
    while True:
        candidates = t0 + np.cumsum(gaps_rng.exponential(1.0 / peak, size=chunk))
        keep = keep_rng.random(chunk) * peak < rate.at(candidates)
        times = candidates[keep & (candidates < horizon)]
        kept.append(times)
        count += len(times)
        t0 = float(candidates[-1])
        if (num_requests is not None and count >= num_requests) or t0 >= horizon:
            break
        chunk = min(chunk * 2, 1 << 22)
    times = np.concatenate(kept)
    if num_requests is not None:
        times = times[:num_requests]
    return times
