"""Per-replica metrics of a cluster, and how evenly its router spread the load.

Everything here is computed from the two frames, so it holds for any run, one replica or many.

- The ``replica`` column: the replica a request was routed to, 0..N-1. A request rejected at a
  replica (``queue_full``, ``never_fits``, ``prompt_exceeds_budget``) keeps the replica that
  rejected it; one turned away by the cluster cap (``cluster_full``) was never routed: -1.
- **Load** of replica r, ``L_r``: the time-average number of its requests in the system (waiting
  or running) over the run, ``L_r = (1/T) sum_i (min(finish_i, T) - arrival_i)`` over the requests
  admitted at r, T the run's duration. The sum of sojourns *is* the area under the replica's N_r(t),
  so this is an exact time average, not an estimate, and sum_r L_r is the cluster's ``L``.
- **Imbalance**: ``max_r L_r / mean_r L_r``. 1 when every replica carries the same load, N when one
  carries all of it; NaN when nothing was admitted. Over time (``simbatch.app.plots.cluster``), the
  same ratio of each replica's time-average over a window.
- Disaggregated prefill and decode: a request is in the system at its prefill replica until its
  first token and at its decode replica after (``decode_replica``), so the L_r still add up to ``L``;
  its output tokens count at its decode replica, and ``load_imbalance`` is the larger of the two
  pools' imbalances (the pools do different work: their loads are not comparable).
- ``busy_fraction`` of replica r: its busy time (steps, the one in progress at a clock stop counted
  up to the stop) / T. The cluster's ``busy_fraction`` is the mean over replicas.

The summary (:func:`cluster_summary`) adds flat keys, so it stays one level of JSON and a sweep
frame gets one column per key: ``load_imbalance`` always, and with more than one replica
``replica_{r}_output_throughput``, ``replica_{r}_busy_fraction`` and ``replica_{r}_L`` for each r.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def busy_s(iterations: pd.DataFrame, duration_s: float) -> np.ndarray:
    """Busy time of each iterations row, s: its steps, the one in progress at the clock stop counted
    up to the stop."""
    return np.minimum(iterations["end_s"].to_numpy(dtype=float), duration_s) - \
        iterations["start_s"].to_numpy(dtype=float)


def per_replica(requests: pd.DataFrame, iterations: pd.DataFrame, duration_s: float,
                num_replicas: int) -> pd.DataFrame:
    """One row per replica, from the run's two frames and its duration T.

    Columns: ``replica``; ``admitted`` and ``completed`` requests; ``output_throughput`` (output
    tokens of its completed requests / T); ``busy_fraction``; ``mean_batch_size`` (sequences per
    step, over its steps); ``L``; ``W_s`` (mean time in system of its admitted requests, up to T
    for those still in it, so that L_r = (admitted_r / T) W_r exactly).
    """
    admitted = requests[requests["status"] != "rejected"]
    replica = admitted["replica"].to_numpy(dtype=np.int64)
    done = (admitted["status"] == "finished").to_numpy()
    # Disaggregated, a request's output tokens come from its decode replica (a one-token output's from its prefill one).
    out_replica = np.where(admitted["decode_replica"] >= 0, admitted["decode_replica"], replica) \
        if "decode_replica" in admitted else replica
    sojourn_s = np.fmin(admitted["finish_s"].to_numpy(), duration_s) - admitted["arrival_s"].to_numpy()
    # An empty iterations frame has untyped columns: say the types.
    step_replica = iterations["replica"].to_numpy(dtype=np.int64)
    steps = iterations["num_steps"].to_numpy(dtype=np.int64)

    def total(keys: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(keys, weights, minlength=num_replicas)

    n_admitted, num_steps = total(replica), total(step_replica, steps)
    in_system_s = total(replica, sojourn_s)
    if "decode_replica" in admitted:
        # Disaggregated: a request counts at its prefill replica until its first token, at its decode one after.
        decode = admitted["decode_replica"].to_numpy(dtype=np.int64)
        handed = decode >= 0
        after_s = np.where(handed, sojourn_s - (admitted["first_token_s"].to_numpy() - admitted["arrival_s"].to_numpy()), 0.0)
        in_system_s = total(replica, sojourn_s - after_s) + total(np.where(handed, decode, replica), after_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame({
            "replica": np.arange(num_replicas),
            "admitted": n_admitted,
            "completed": total(replica[done]),
            "output_throughput": total(out_replica[done], admitted["output_tokens"].to_numpy()[done]) / duration_s,
            "busy_fraction": total(step_replica, busy_s(iterations, duration_s)) / duration_s,
            "mean_batch_size": np.where(num_steps > 0, total(step_replica, iterations["batch_size"].to_numpy(dtype=float)
                                                             * steps) / np.maximum(num_steps, 1), 0.0),
            "L": in_system_s / duration_s,
            "W_s": total(replica, sojourn_s) / n_admitted,
        })


def imbalance(loads: np.ndarray) -> np.ndarray | float:
    """max / mean over replicas (axis 0) of per-replica loads; NaN where they are all zero.

    One load per replica gives a number; a replicas x windows array gives one per window.
    """
    loads = np.asarray(loads, dtype=float)
    mean = loads.mean(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(mean > 0, loads.max(axis=0) / mean, math.nan)
    return float(ratio) if ratio.ndim == 0 else ratio


def cluster_summary(requests: pd.DataFrame, iterations: pd.DataFrame, duration_s: float,
                    num_replicas: int, prefill_replicas: int | None = None) -> dict[str, float]:
    """The summary's cluster keys (see the module docstring); disaggregated (``prefill_replicas`` the
    prefill pool's size), ``load_imbalance`` is the larger of the two pools' own."""
    table = per_replica(requests, iterations, duration_s, num_replicas)
    loads = table["L"].to_numpy()
    out = {"load_imbalance": imbalance(loads) if prefill_replicas is None else
           float(np.fmax(imbalance(loads[:prefill_replicas]), imbalance(loads[prefill_replicas:])))}
    if num_replicas > 1:
        for row in table.itertuples(index=False):
            out[f"replica_{row.replica}_output_throughput"] = float(row.output_throughput)
            out[f"replica_{row.replica}_busy_fraction"] = float(row.busy_fraction)
            out[f"replica_{row.replica}_L"] = float(row.L)
    return out
