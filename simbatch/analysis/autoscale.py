"""An autoscaled fleet's account: replicas over time, GPU-hours, cost, and the fixed fleet of the same cost.

- The **fleet frame**: one row per change (:mod:`simbatch.engine.autoscale`'s events), in time order,
  with the counts after it: ``starting``, ``ready``, ``draining`` and ``billed`` (their sum: the
  replicas holding GPUs).
- **GPU-hours**: the area under ``billed`` over the run, times the GPUs of one replica (the preset's
  tensor-parallel degree), / 3600. ``mean_replicas`` is that area / the run's duration.
- **Cost**: GPU-hours x the price of one GPU-hour: ``cluster.autoscale.usd_per_gpu_hour``, else the
  prices file of ``simbatch plan`` (``simbatch/data/gpu_prices.yaml``) for ``device.preset``'s GPU.
- **The fixed fleet of the same cost**: ``round(mean_replicas)`` replicas (at least one) for the whole
  run, the same requests and router (:func:`simbatch.app.equal_cost.equal_cost_fleet` runs it): what autoscaling buys is the
  difference in SLO violations at that cost.
- **The fluid approximation** (:func:`fluid_replicas`): replicas follow the load with the start-up
  delay, ``n(t) = clip(ceil(lambda(t - d) / c))``, ``c`` one replica's capacity at the target
  (busy_fraction target x its service rate). On a curve slow against the delay, the interval and
  the cool-down, the simulated fleet tracks it (tests/validation/test_autoscale.py).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simbatch.config import Autoscale, Scenario

STATE_AFTER = {"start": "starting", "ready": "ready", "drain": "draining", "cancel": None, "stop": None}


def fleet_frame(events: list[tuple[float, int, str]]) -> pd.DataFrame:
    """The fleet's changes (in the order they happened, which is time order) with the counts after each."""
    counts = {"starting": 0, "ready": 0, "draining": 0}
    state: dict[int, str | None] = {}
    rows = []
    for t, replica, event in events:
        if state.get(replica) is not None:
            counts[state[replica]] -= 1
        state[replica] = STATE_AFTER[event]
        if state[replica] is not None:
            counts[state[replica]] += 1
        rows.append((t, replica, event, counts["starting"], counts["ready"], counts["draining"]))
    frame = pd.DataFrame(rows, columns=["time_s", "replica", "event", "starting", "ready", "draining"])
    frame["billed"] = frame["starting"] + frame["ready"] + frame["draining"]
    return frame


def replica_seconds(fleet: pd.DataFrame, end_s: float) -> float:
    """The area under ``billed`` from 0 to ``end_s``, replica-seconds."""
    t = np.append(fleet["time_s"].to_numpy(dtype=float), end_s)
    return float(np.sum(fleet["billed"].to_numpy(dtype=float) * np.diff(np.minimum(t, end_s))))


def gpus_per_replica(scenario: Scenario) -> int:
    """One replica's GPUs: ``device.preset``'s tensor-parallel degree, 1 without a preset."""
    if scenario.device.preset is None:
        return 1
    from simbatch.hardware.preset import parse

    return parse(scenario.device.preset).tp


def usd_per_gpu_hour(scenario: Scenario) -> float | None:
    """The price of one GPU-hour: the autoscale key, else the shipped prices file's for the preset's GPU."""
    spec = scenario.cluster.autoscale
    if spec is not None and spec.usd_per_gpu_hour is not None:
        return spec.usd_per_gpu_hour
    if scenario.device.preset is None:
        return None
    from simbatch.hardware.preset import parse
    from simbatch.inputs.prices import Prices  # the prices file `simbatch plan` reads

    prices, gpu = Prices.load(None), parse(scenario.device.preset).gpu.name
    return prices.price(gpu) if prices.has(gpu) else None


def autoscale_summary(scenario: Scenario, fleet: pd.DataFrame, end_s: float) -> dict[str, float]:
    """The summary's autoscaling keys: ``mean_replicas``, ``peak_replicas``, ``scale_ups``,
    ``scale_downs``, ``gpu_hours``, and ``cost_usd`` (with ``usd_per_gpu_hour``) when a price is known."""
    area = replica_seconds(fleet, end_s)
    gpu_hours = area * gpus_per_replica(scenario) / 3600.0
    out = {"mean_replicas": area / end_s if end_s > 0 else math.nan,
           "peak_replicas": int(fleet["billed"].max()) if len(fleet) else 0,
           "scale_ups": int((fleet["event"] == "start").sum()),
           "scale_downs": int((fleet["event"] == "drain").sum()),
           "gpu_hours": gpu_hours}
    price = usd_per_gpu_hour(scenario)
    if price is not None:
        out |= {"usd_per_gpu_hour": price, "cost_usd": gpu_hours * price}
    return out


def fluid_replicas(rate_at, capacity_rps: float, spec: Autoscale, end_s: float, points: int = 20_001,
                   stabilized: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The fluid fleet on a uniform grid of ``points`` times over [0, end_s]: ``(times_s, replicas)``.

    ``stabilized=False``: replicas follow the load after the start-up delay d,
    ``n(t) = clip(ceil(lambda(t - d) / c))``, c one replica's capacity at the target. With the
    autoscaler's own lags (the default), the load is read half an evaluation interval late on
    average, ``n0(t) = clip(ceil(lambda(t - d - interval / 2) / c))``, and a scale-down waits for the
    stabilization window: ``n(t) = max of n0 over [t - cooldown, t]``. Both are the limit of a fleet
    whose every replica carries exactly its share of a deterministic load.
    """
    times = np.linspace(0.0, end_s, points)
    lag = spec.startup_delay_s + (spec.interval_s / 2 if stabilized else 0.0)
    base = np.clip(np.ceil(rate_at(np.maximum(times - lag, 0.0)) / capacity_rps - 1e-9),
                   spec.min_replicas, spec.max_replicas)
    window = int(round(spec.cooldown_s / (times[1] - times[0]))) if stabilized and points > 1 else 0
    if window == 0:
        return times, base
    padded = np.concatenate([np.full(window, base[0]), base])
    return times, np.lib.stride_tricks.sliding_window_view(padded, window + 1).max(axis=1)


def ready_at(fleet: pd.DataFrame, times_s: np.ndarray) -> np.ndarray:
    """Ready replicas at each of ``times_s`` (the count after the last change at or before it)."""
    i = np.searchsorted(fleet["time_s"].to_numpy(dtype=float), times_s, side="right") - 1
    return fleet["ready"].to_numpy()[np.maximum(i, 0)]


def slo_violation_rate(scenario: Scenario, requests: pd.DataFrame) -> float:
    """Share of the requests that missed the SLO (``slo`` limits) or were not served (rejected,
    unfinished); NaN without an SLO."""
    limits = scenario.slo.limits_s()
    if not limits or not len(requests):
        return math.nan
    ok = (requests["status"] == "finished").to_numpy().copy()
    for col, limit_s in limits.items():
        v = requests[col].to_numpy(dtype=float)
        ok &= np.isnan(v) | (v <= limit_s)
    return float(1.0 - ok.mean())
