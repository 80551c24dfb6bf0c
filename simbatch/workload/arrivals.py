"""Arrival processes: when requests reach the server.

Arrival times are the cumulative sum of i.i.d. gaps, so the first request arrives one gap after
t = 0, not at t = 0. The gap law is what separates traffic of the same mean rate:

- ``poisson``: exponential gaps (CV 1). Many independent users, each sending rarely; the textbook
  M/G/1 input and the default of ``vllm bench serve``.
- ``gamma``: gamma gaps with shape ``burstiness`` and mean 1/rate, so CV = 1/sqrt(burstiness),
  exactly as ``vllm bench serve --burstiness``. Below 1 requests clump into bursts with lulls
  between (queues build even at moderate load); above 1 they are smoother than Poisson.
- ``constant``: equal gaps (CV 0). A load generator on a timer; the best case for any batcher.

``rate: inf`` means "everything at once": all requests at t = 0, an offline batch job.

Everything is vectorized: a million arrivals is a handful of numpy calls.
"""

from __future__ import annotations

import math

import numpy as np

from simbatch.config import Arrival


def _random_gaps_s(arrival: Arrival, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` i.i.d. inter-arrival gaps, s, with mean 1/rate."""
    if arrival.process == "poisson":
        return rng.exponential(1.0 / arrival.rate, size=n)
    if arrival.process == "gamma":
        # shape k, scale 1/(rate k): mean k * scale = 1/rate, variance k * scale^2, so CV = 1/sqrt(k).
        return rng.gamma(arrival.burstiness, 1.0 / (arrival.rate * arrival.burstiness), size=n)
    raise ValueError(f"no random gaps for process {arrival.process!r}")


def _first_arrivals_s(arrival: Arrival, rng: np.random.Generator, n: int) -> np.ndarray:
    """The first ``n`` arrival times, s."""
    if arrival.process == "constant":
        # k / rate rather than a cumulative sum of 1/rate, so the k-th arrival carries no rounding drift.
        return np.arange(1, n + 1, dtype=np.float64) / arrival.rate
    return np.cumsum(_random_gaps_s(arrival, rng, n))


def _arrivals_until_s(arrival: Arrival, rng: np.random.Generator, duration_s: float) -> np.ndarray:
    """Arrival times up to and including the first one at or past ``duration_s``."""
    if arrival.process == "constant":
        return _first_arrivals_s(arrival, rng, math.floor(arrival.rate * duration_s) + 1)
    # Draw gaps in chunks, growing geometrically, until the last time passes the horizon. The first
    # chunk is a little above the expected count, so one draw nearly always suffices. The cumulative
    # sum always runs over the whole concatenation, and numpy draws the same numbers in chunks as in
    # one call, so these times are bit-identical to a num_requests run's first arrivals (same seed).
    chunk = max(1024, math.ceil(1.2 * arrival.rate * duration_s))
    gaps = _random_gaps_s(arrival, rng, chunk)
    times = np.cumsum(gaps)
    while times[-1] < duration_s:
        chunk *= 2
        gaps = np.concatenate([gaps, _random_gaps_s(arrival, rng, chunk)])
        times = np.cumsum(gaps)
    return times


def arrival_times(arrival: Arrival, rng: np.random.Generator, num_requests: int | None,
                  duration_s: float | None) -> np.ndarray:
    """Nondecreasing arrival times, s (float64), drawn from ``rng``.

    With ``num_requests`` there are exactly that many, then only those before ``duration_s`` if it
    is also set; with ``duration_s`` alone, every arrival before it. ``rate: inf`` gives
    ``num_requests`` zeros.
    """
    if num_requests is None and duration_s is None:
        raise ValueError("set num_requests or duration_s, or arrivals never end")
    if math.isinf(arrival.rate):
        if num_requests is None:
            raise ValueError("rate: inf sends everything at t=0, so num_requests must be set")
        return np.zeros(num_requests, dtype=np.float64)
    if num_requests is not None:
        times = _first_arrivals_s(arrival, rng, num_requests)
    else:
        times = _arrivals_until_s(arrival, rng, duration_s)
    if duration_s is not None:
        times = times[: np.searchsorted(times, duration_s, side="left")]
    return times
