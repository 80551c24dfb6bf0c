"""An autoscaled fleet against the fixed fleet of the same cost, on the same requests.

The question an autoscaler answers is whether growing and shrinking with the load buys anything over
a fixed fleet that costs as much: the fixed fleet has ``round(mean_replicas)`` replicas for the whole
run, and both are judged by the share of requests that miss the SLO (:mod:`simbatch.analysis.autoscale`)
and their p99 TTFT. It runs a second simulation, so it sits with the application, which prints it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simbatch.analysis.autoscale import slo_violation_rate
from simbatch.simulation import simulate


def equal_cost_fleet(result, workload=None) -> dict[str, float]:
    """The fixed fleet of the autoscaled run's cost (module docstring), run on the same requests:
    ``fixed_fleet_replicas``, and for both fleets ``slo_violation_rate`` and ``p99_ttft_ms``."""
    sc = result.scenario
    n = max(1, round(result.summary["mean_replicas"]))
    fixed_cluster = sc.cluster.model_copy(update={"autoscale": None, "replicas": n})
    fixed = simulate(sc.model_copy(update={"cluster": fixed_cluster}), workload=workload)

    def p99_ms(requests: pd.DataFrame) -> float:
        ttft = requests["ttft_s"].to_numpy(dtype=float)
        ttft = ttft[~np.isnan(ttft)]
        return float(np.percentile(ttft, 99) * 1e3) if len(ttft) else math.nan

    return {"fixed_fleet_replicas": n,
            "autoscaled_slo_violation_rate": slo_violation_rate(sc, result.requests),
            "fixed_fleet_slo_violation_rate": slo_violation_rate(sc, fixed.requests),
            "autoscaled_p99_ttft_ms": p99_ms(result.requests), "fixed_fleet_p99_ttft_ms": p99_ms(fixed.requests)}
