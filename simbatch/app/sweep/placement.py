"""Placement search for disaggregated prefill and decode: how to split N GPUs between the pools.

DistServe (Zhong et al., OSDI 2024) chooses how many prefill and how many decode instances to run
for a workload and its SLOs. Here every split ``p : N - p`` (one prefill and one decode replica at
least) is simulated on the same requests, and the best is the split with the highest goodput
(``request_goodput`` with SLOs set, ``request_throughput`` otherwise), ties going to the lower p99
end-to-end latency. Beside each simulated split stand the closed-form pool capacities
(:func:`simbatch.analysis.capacity.pool_capacity`), whose best split is ``closed_form_best``: the argument of
max over p of min(p x prefill capacity of one replica, (N - p) x decode capacity of one).
"""

from __future__ import annotations

import pandas as pd

from simbatch.analysis.capacity import best_split, expected_stability
from simbatch.config import Scenario
from simbatch.workload import WorkloadArrays, generate

COLUMNS = ("prefill_replicas", "decode_replicas", "prefill_capacity", "decode_capacity", "capacity", "binding_pool",
           "request_throughput", "goodput", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms",
           "p99_e2el_ms", "completed", "unfinished")


def split(scenario: Scenario, prefill: int, gpus: int) -> Scenario:
    """``scenario`` with ``prefill`` prefill replicas and ``gpus - prefill`` decode replicas."""
    pools = scenario.cluster.disaggregated
    cluster = scenario.cluster.model_copy(update={
        "replicas": gpus,
        "disaggregated": pools.model_copy(update={"prefill": pools.prefill.model_copy(update={"count": prefill}),
                                                  "decode": pools.decode.model_copy(update={"count": gpus - prefill})})})
    return scenario.model_copy(update={"cluster": cluster})


def placement_search(scenario: Scenario, gpus: int, workload: WorkloadArrays | None = None) -> pd.DataFrame:
    """One row per split of ``gpus`` replicas (``COLUMNS``), each simulated on the same requests."""
    from simbatch.simulation import simulate

    if scenario.cluster.disaggregated is None:
        raise ValueError("placement needs cluster.disaggregated in the scenario (the pools' sections and the KV link)")
    if gpus < 2:
        raise ValueError(f"--gpus {gpus}: a split needs at least 2 (one prefill and one decode replica)")
    workload = generate(scenario) if workload is None else workload
    rows = []
    for prefill in range(1, gpus):
        sc = split(scenario, prefill, gpus)
        st = expected_stability(sc, workload)
        s = simulate(sc, workload=workload).summary
        rows.append((prefill, gpus - prefill, st.prefill_capacity_requests_per_s, st.decode_capacity_requests_per_s,
                     min(st.prefill_capacity_requests_per_s, st.decode_capacity_requests_per_s), st.pool,
                     s["request_throughput"], s.get("request_goodput", s["request_throughput"]), s["mean_ttft_ms"],
                     s["p99_ttft_ms"], s["mean_tpot_ms"], s["p99_tpot_ms"], s["p99_e2el_ms"], s["completed"],
                     s["unfinished"]))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def best(frame: pd.DataFrame) -> pd.Series:
    """The simulated split with the highest goodput; ties: the lower p99 end-to-end latency."""
    return frame.sort_values(["goodput", "p99_e2el_ms"], ascending=[False, True], kind="stable").iloc[0]


def closed_form_best(frame: pd.DataFrame) -> int:
    """The prefill replicas of the best split by the pools' closed-form capacities alone."""
    row = frame.iloc[0]
    per_prefill, per_decode = row.prefill_capacity / row.prefill_replicas, row.decode_capacity / row.decode_replicas
    return best_split(int(row.prefill_replicas + row.decode_replicas), per_prefill, per_decode)
