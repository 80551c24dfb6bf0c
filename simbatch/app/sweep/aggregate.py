"""Replications -> one row per point: ``summary.csv``.

Each row holds the point's parameters, then for every numeric metric of the run summary (see
:mod:`simbatch.analysis.summary`) and of the analytic stability check (``capacity_tokens_per_s``,
``capacity_requests_per_s``, ``offered_tokens_per_s``, ``offered_load``; see
:func:`simbatch.analysis.capacity.stability`) two columns:

- ``<metric>_mean``: the mean over the point's replications;
- ``<metric>_ci95``: the half-width of a 95 % confidence interval for that mean, Student-t based,
  t(0.975, R - 1) * s / sqrt(R) with s the sample standard deviation (ddof 1): replications are
  independent runs, so this is the textbook interval; it is NaN with a single replication.

A metric that is NaN in any replication (a p99 with no completed request) is NaN for the point:
averaging over the replications where it happens to exist would describe another experiment.

Then ``replications`` (runs that finished) and ``error``: empty for a good point; for a failed one
the reason (a parameter combination the scenario rejects, or an exception raised by a run).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import stdtrit

from simbatch.app.sweep.grid import format_value
from simbatch.app.sweep.runner import Point, runs_for


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its t-based 95 % confidence interval."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan
    return mean, float(stdtrit(len(x) - 1, 0.975) * x.std(ddof=1) / math.sqrt(len(x)))


def metrics_of(record: dict[str, Any]) -> dict[str, float]:
    """One run's numbers: its summary, then its stability check."""
    return {**record["summary"], **record["stability"]}


def combine(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Replications of one point -> ``<metric>_mean``, ``<metric>_ci95``, ``replications``, ``error``."""
    done = [metrics_of(r) for r in records if "error" not in r]
    names = list(dict.fromkeys(name for m in done for name in m))
    out: dict[str, Any] = {}
    for name in names:
        out[f"{name}_mean"], out[f"{name}_ci95"] = mean_ci95([m.get(name, math.nan) for m in done])
    out["replications"] = len(done)
    out["error"] = next((r["error"] for r in records if "error" in r), "")
    return out


def param_cells(values: dict[str, Any]) -> dict[str, Any]:
    """A point's parameters as table cells: a mapping or list (a whole length distribution, say) as
    the YAML text it was swept as."""
    return {k: format_value(v) if isinstance(v, dict | list) else v for k, v in values.items()}


def summary_frame(points: list[Point], replications: int, records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """``summary.csv``: one row per point, in grid order."""
    rows = []
    for point in points:
        row = param_cells(point.values)
        if point.error is None:
            row |= combine([records[run.key] for run in runs_for(point, replications)])
        else:
            row |= {"replications": 0, "error": point.error}
        rows.append(row)
    frame = pd.DataFrame(rows)
    tail = ["replications", "error"]
    return frame[[c for c in frame.columns if c not in tail] + tail]
