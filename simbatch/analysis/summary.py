"""Frames and the summary: every metric simbatch reports, defined once, here.

Per request (the ``requests`` frame; times in seconds from the start of the run):

- ``ttft_s``  time to first token = first_token_s - arrival_s.
- ``e2e_s``   end-to-end latency   = finish_s - arrival_s.
- ``tpot_s``  time per output token after the first = (e2e_s - ttft_s) / (output_tokens - 1),
  undefined (NaN) for one-token outputs.
- ``queue_s``  time from arrival to first scheduled = first_scheduled_s - arrival_s (vLLM's
  ``vllm:request_queue_time_seconds``); NaN for a request never scheduled.
- ``waiting_s`` total time spent in WAITING: the first queueing plus every wait after a preemption
  (up to the end of the run for a request still waiting then). Its mean is ``Wq_s``.
- ``num_cached_tokens`` prompt tokens found in the prefix cache at the request's first admission
  (``kv_cache.enable_prefix_caching``; 0 without it): prefill it skipped.
- ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens`` with speculative decoding
  (``device.speculative``; 0 without it): the decode steps in which the request verified drafts,
  the drafts it verified, and those accepted.
- ``client_wait_s`` time the client held the request back before sending it (``workload.max_concurrency``;
  0 otherwise). ``arrival_s`` is when the server received it, the send, so TTFT and E2E count from
  the send as ``vllm bench serve`` measures them; the intended arrival is arrival_s - client_wait_s.
- Disaggregated prefill and decode (``cluster.disaggregated``): ``replica`` is the prefill replica,
  ``decode_replica`` the decode one (-1 for a one-token output, which never leaves its prefill
  replica); ``decode_queue_s`` the wait from the first token until a decode replica reserved the
  request's blocks (a wait in the decode replica's queue, so ``waiting_s`` counts it too),
  ``kv_transfer_s`` the transfer then (NaN when there was none). ``ttft_s``
  follows DistServe: the first token is the prefill replica's, at the end of its prefill, and the
  hand-over is in the gap to the second token (an ITL stall gap). A server that streams the first
  token from the decode side (vLLM's disaggregation proxy) shows a TTFT of ttft_s + decode_queue_s +
  kv_transfer_s + its first decode step.

Per engine step (the ``iterations`` frame): one row per run of consecutive steps of one shape (the
same pools, batch and token counts), ``duration_s`` their mean duration. Such steps last alike unless
the step time grows with the context they read (``device.kv_read_ms_per_1k_tokens``); then each
step of a run of decodes lasts a little longer than the last. When ``sim.max_time_s`` stops the
clock mid-step, that step is a last row with ``itl_tokens`` 0: it began (its admissions and
preemptions happened) but its tokens never came.

Per token: ``itl`` (inter-token latency) is the gap between two consecutive tokens of one request,
over every token after a request's first. With speculative decoding a step may emit several tokens
of a request at once; they are streamed as one chunk, and, as ``vllm bench serve`` measures ITL
between chunks, they are one gap, the step's duration (so ITL stays the step time while TPOT falls
to the step time over the tokens per step). A decoding request emits every step, so most
gaps equal one step's duration (a row's mean, for the ITL percentiles: with a context-aware cost
they smooth the slow growth of the steps within a row; the mean ITL is exact); gaps across a
preemption or a stall are recorded one by one (``stall_gaps``: a result folder keeps them in
``stall_gaps.csv``, so that its ITL percentiles can be recomputed from its files alone).

The summary uses ``vllm bench serve``'s key names:

- ``duration`` (s): the simulated span, from t=0 to the last event of a run that drained (a
  completion, a rejection or an arrival), or to ``sim.max_time_s`` when the clock stop cut the run
  short (requests still in the system or still to arrive).
- ``completed``, ``rejected``, ``unfinished``, ``num_requests``.
- ``total_input_tokens``, ``total_output_tokens``: prompt and output tokens of completed requests.
- ``request_throughput`` = completed / duration; ``output_throughput`` = output tokens of completed
  requests / duration; ``total_token_throughput`` adds their prompt tokens.
- ``request_goodput`` = completed requests meeting every set SLO / duration (only when SLOs are set):
  a request meets an SLO when its own TTFT, TPOT or E2E latency is at most the limit (a one-token
  output has no TPOT and meets a TPOT limit), as ``vllm bench serve --goodput``.
- ``{mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms``: over completed requests (ITL: over every
  token gap generated during the run). Percentiles interpolate linearly between order statistics
  (numpy's default, as vLLM). ``p<P>_<metric>_ms`` is added for each P of ``metrics.metric_percentiles``
  and each metric of ``metrics.percentile_metrics``, with vLLM's spelling (``p95_ttft_ms``, ``p99.9_itl_ms``).
- ``{mean,median,std,p90,p99}_client_wait_ms``: with ``workload.max_concurrency``, the client-side
  wait of every request sent.

Queueing quantities, over admitted requests (arrived and not rejected):

- ``L``, ``Lq``: time-averaged number in system / waiting, integrated from the simulator's state.
- ``arrival_rate`` (lambda) = admitted requests / duration.
- ``W_s``, ``Wq_s``: mean time in system / waiting, from the request rows; requests still in the
  system at the end count up to the end. Then L = lambda W holds on every sample path, so
  ``littles_law_rel_error`` = |L - lambda W| / L measures the bookkeeping, not the statistics.
- ``busy_fraction``: busy time / (duration x replicas): the share of time the engines are stepping.
  Not a utilization: a batching engine steps whenever any request runs, so it is near 1 at any load
  that keeps a request in flight (like nvidia-smi's GPU-Util); the offered load is the stability
  check's rho.
- ``num_steps``: engine steps over the run (a run of identical steps counts each of them).
- ``mean_batch_size``: sequences per step, averaged over steps.
- ``mean_kv_usage``: used / total device blocks, averaged over busy time.
- ``num_preemptions``: total over the run.
- Disaggregated: ``prefill_`` and ``decode_`` + ``busy_fraction``, ``num_steps``, ``mean_batch_size``,
  ``mean_kv_usage``: the keys above over each pool's replicas; ``prefill_token_throughput`` (prompt
  tokens prefilled per second, recomputes included), ``decode_token_throughput`` (decode tokens per
  second); ``{mean,median,std,p90,p99}_decode_queue_ms`` and ``..._kv_transfer_ms`` over completed
  requests handed over.
- ``prefix_cache_queries``, ``prefix_cache_hits`` (tokens) and ``prefix_cache_hit_rate`` = hits /
  queries, with prefix caching: the prompt tokens of every request admitted at least once, and
  those of them found cached at its first admission (vLLM's ``vllm:prefix_cache_queries`` and
  ``vllm:prefix_cache_hits``, which also count the lookups of re-admissions after a preemption).
- ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens``, with
  speculative decoding: over every request, the steps that verified drafts, the drafts verified and
  those accepted (the differences of vLLM's counters ``vllm:spec_decode_num_drafts``,
  ``..._num_draft_tokens``, ``..._num_accepted_tokens`` over the run, as ``vllm bench serve`` writes
  them); ``spec_decode_acceptance_rate`` = 100 accepted / draft tokens, in percent as vLLM writes it,
  and ``spec_decode_acceptance_length`` = 1 + accepted / drafts, the tokens a speculating step emits
  on average (vLLM's mean acceptance length). The acceptance rate is not the per-token alpha:
  a draft after a rejected one counts as rejected, so with k drafts it is
  alpha (1 - alpha^k) / ((1 - alpha) k); a request's last steps propose fewer (simbatch.features.speculative).

Tenants (with more than one, see :func:`tenant_summary`): ``tenant_<name>_request_throughput``,
``tenant_<name>_mean_ttft_ms``, ``tenant_<name>_p99_ttft_ms``, ``tenant_<name>_mean_e2el_ms``.

Cluster (definitions in :mod:`simbatch.analysis.fleet`): ``load_imbalance`` = max / mean over
replicas of each replica's time-average number in system L_r; with more than one replica,
``replica_{r}_output_throughput``, ``replica_{r}_busy_fraction`` and ``replica_{r}_L`` for each r.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simbatch.analysis.fleet import busy_s, cluster_summary
from simbatch.analysis.stats import describe_ms
from simbatch.config import Scenario, replica_scenarios
from simbatch.features import feature_classes
from simbatch.model.request import OUTCOMES, Outcome
from simbatch.observe.recorder import Recorder
from simbatch.workload import WorkloadArrays


def requests_frame(wl: WorkloadArrays, rec: Recorder) -> pd.DataFrame:
    arrived = rec.arrived
    idx = np.flatnonzero(arrived)
    # The recorder's own columns as they are when every request arrived (they are written no more, and
    # copies would stand beside them: at a million requests ~45 MB); the workload's are copied.
    own = (lambda column: column) if len(idx) == len(arrived) else (lambda column: column[idx])
    arrival = wl.arrival_s[idx]
    # With a client, a request reaches the server when it is sent, not when it was meant to arrive.
    sent = rec.sent_s[idx]
    arrival = np.where(np.isnan(sent), arrival, sent)
    first_token, finish = rec.first_token_s[idx], rec.finish_s[idx]
    # The client's clock: a request reaches the engine frontend.request_latency_ms after its send, and
    # each token the client response_latency_ms after the step that sampled it (adding 0 changes nothing).
    request_latency_s, response_latency_s = rec.request_latency_s, rec.response_latency_s
    if response_latency_s:
        first_token, finish = first_token + response_latency_s, finish + response_latency_s
    output = wl.output_tokens[idx]
    ttft = first_token - arrival
    e2e = finish - arrival
    if (ttft < 0).any() or (e2e < 0).any():  # NaN (never reached) compares False
        bad = int(idx[np.flatnonzero((ttft < 0) | (e2e < 0))[0]])
        raise RuntimeError(f"request {bad} has a negative latency (arrival {wl.arrival_s[bad]!r} s): a wrapped "
                           "clock or a bug; the frames would report a wrong result, so there are none")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (e2e - ttft) / (output - 1), np.nan)
    # Every column is an array made just above, so the frame keeps each as it is (copy=False) instead
    # of copying them all into one 2-D block per dtype: at 1M requests, ~0.1 s and a copy of the frame.
    frame = pd.DataFrame({
        "request_id": idx,
        "replica": own(rec.replica),
        "tenant": pd.Categorical.from_codes(wl.tenant[idx], categories=list(wl.tenant_names)),
        "priority": wl.priority[idx],
        "session": wl.session[idx],
        "arrival_s": arrival,
        "first_scheduled_s": own(rec.first_scheduled_s),
        "first_token_s": first_token,
        "finish_s": finish,
        "prompt_tokens": wl.prompt_tokens[idx],
        "output_tokens": output,
        "generated_tokens": own(rec.generated_tokens),
        "num_preemptions": own(rec.num_preemptions),
        "num_cached_tokens": own(rec.num_cached_tokens),
        "status": pd.Categorical.from_codes(rec.status[idx], categories=list(OUTCOMES)),
        # Through a Series: the same column as numpy's ``astype(str)``, several times faster.
        "reason": pd.Series(rec.reason[idx]).astype(str),
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "queue_s": rec.first_scheduled_s[idx] - (arrival + request_latency_s if request_latency_s else arrival),
        "waiting_s": own(rec.waiting_s),
        "client_wait_s": own(rec.client_wait_s),
    }, copy=False)
    at = frame.columns.get_loc("num_cached_tokens") + 1
    for offset, (name, column) in enumerate(rec.columns.items()):  # the features' (simbatch.features)
        frame.insert(at + offset, name, column[idx])
    if rec.disaggregated:
        frame["decode_replica"] = rec.decode_replica[idx]
        frame["decode_queue_s"] = rec.decode_queue_s[idx]
        frame["kv_transfer_s"] = rec.kv_transfer_s[idx]
    return frame


def iterations_frame(rec: Recorder, prefill_replicas: int | None = None) -> pd.DataFrame:
    """The iterations frame; disaggregated (``prefill_replicas`` the prefill pool's size), with a
    ``pool`` column, ``prefill`` or ``decode``."""
    runs = rec.take_runs()  # arrays made for this call, so the frame can keep them (see requests_frame)
    # Per replica, in time order: each replica's runs close in time order, so a stable sort by replica
    # alone orders them (and a lone replica's are in order already).
    replica = runs["replica"]
    if len(replica) and replica.min() != replica.max():
        order = np.argsort(replica, kind="stable")
        runs = {name: column[order] for name, column in runs.items()}
    frame = pd.DataFrame(runs, copy=False)
    frame["kv_blocks_used"] = frame.pop("kv_blocks_sum") / frame["num_steps"]
    frame["end_s"] = frame["start_s"] + frame["num_steps"] * frame["duration_s"]
    if prefill_replicas is not None:
        frame["pool"] = pd.Categorical.from_codes((frame["replica"].to_numpy() >= prefill_replicas).astype(np.int8),
                                                  categories=list(POOLS))
    return frame


POOLS = ("prefill", "decode")


def itl_sample(iterations: pd.DataFrame, stall_gaps_s) -> tuple[np.ndarray, np.ndarray]:
    """Every inter-token gap of the run, as (values, weights): each iterations row's step duration,
    weighted by its regular gaps (``itl_tokens`` x ``num_steps``), then each stall gap once.

    Stall gaps are a multiset, recorded in whatever order the replicas' steps interleave: sorted, every
    sum over them is the same however the engine reached them.
    """
    stalls = np.sort(np.asarray(stall_gaps_s, dtype=np.float64))
    values = np.concatenate([iterations["duration_s"].to_numpy(dtype=np.float64), stalls])
    weights = np.concatenate([(iterations["itl_tokens"] * iterations["num_steps"]).to_numpy(dtype=np.int64),
                              np.ones(len(stalls), dtype=np.int64)])
    return values, weights


def summarize(scenario: Scenario, requests: pd.DataFrame, iterations: pd.DataFrame, rec: Recorder,
              end_s: float) -> dict:
    duration = end_s
    # Compared as a categorical Series: a look-up of codes, not a million string comparisons.
    finished = (requests["status"] == OUTCOMES[Outcome.FINISHED]).to_numpy()
    rejected = (requests["status"] == OUTCOMES[Outcome.REJECTED]).to_numpy()
    done, admitted = _Selected(requests, finished), _Selected(requests, ~rejected)
    n_done = len(done)
    out: dict[str, float | int] = {
        "duration": duration,
        "num_requests": len(requests),
        "completed": n_done,
        "rejected": int(rejected.sum()),
        "unfinished": len(admitted) - n_done,
        "total_input_tokens": int(done["prompt_tokens"].sum()),
        "total_output_tokens": int(done["output_tokens"].sum()),
    }
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    out["request_throughput"] = per_s(n_done)
    out["output_throughput"] = per_s(out["total_output_tokens"])
    out["total_token_throughput"] = per_s(out["total_input_tokens"] + out["total_output_tokens"])
    slo = scenario.slo
    if limits := slo.limits_s():
        ok = np.ones(n_done, dtype=bool)
        for col, limit_s in limits.items():
            v = done[col].to_numpy()
            ok &= np.isnan(v) | (v <= limit_s)
        out["request_goodput"] = per_s(int(ok.sum()))
    chosen = scenario.metrics.percentile_metrics

    def extra(metric: str) -> list[float]:
        return scenario.metrics.metric_percentiles if metric in chosen else []

    out |= describe_ms("ttft", done["ttft_s"].to_numpy(), percentiles=extra("ttft"))
    out |= describe_ms("tpot", done["tpot_s"].to_numpy(), percentiles=extra("tpot"))
    out |= describe_ms("itl", *itl_sample(iterations, rec.stall_gaps_s), percentiles=extra("itl"), own=True)
    out |= describe_ms("e2el", done["e2e_s"].to_numpy(), percentiles=extra("e2el"))
    if scenario.workload.max_concurrency is not None:
        out |= describe_ms("client_wait", requests["client_wait_s"].to_numpy())

    # Queueing: time averages from the state, means from the rows.
    # fmin ignores NaN: a request still in the system counts up to the end.
    # In the server: from the engine's receipt to its last token (the client's times less the frontend's).
    frontend = scenario.frontend
    sojourn = np.fmin(admitted["finish_s"].to_numpy() - frontend.response_latency_s, end_s) - \
        (admitted["arrival_s"].to_numpy() + frontend.request_latency_s)
    lam = per_s(len(admitted))
    L = rec.area_system / duration if duration > 0 else math.nan
    W = float(sojourn.mean()) if len(admitted) else math.nan
    out |= {
        "L": L,
        "Lq": rec.area_waiting / duration if duration > 0 else math.nan,
        "W_s": W,
        "Wq_s": float(admitted["waiting_s"].mean()) if len(admitted) else math.nan,
        "arrival_rate": lam,
        "littles_law_rel_error": abs(L - lam * W) / L if L > 0 else 0.0,
    }
    replicas = scenario.cluster.fleet_size
    out |= engine_stats(scenario, iterations, end_s, range(replicas))
    out["num_preemptions"] = int(requests["num_preemptions"].sum())
    if scenario.cluster.disaggregated is not None:
        out |= pool_summary(scenario, done, iterations, end_s)
    for feature in feature_classes(replica_scenarios(scenario)):
        out |= feature.summary(requests)
    pools = scenario.cluster.disaggregated
    out |= cluster_summary(requests, iterations, duration, replicas, None if pools is None else pools.prefill.count)
    out |= tenant_summary(requests, duration)
    return out


class _Selected:
    """The rows of ``frame`` where ``mask`` holds, a column at a time: ``selected[column]`` is
    ``frame[mask][column]``, without copying the whole frame to read a few columns (at a million
    requests each copy of the requests frame is ~180 MB)."""

    __slots__ = ("_frame", "_mask", "_len")

    def __init__(self, frame: pd.DataFrame, mask: np.ndarray):
        self._frame, self._mask, self._len = frame, mask, int(mask.sum())

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, column: str) -> pd.Series:
        return self._frame[column][self._mask]


def engine_stats(scenario: Scenario, iterations: pd.DataFrame, end_s: float, replicas: range) -> dict[str, float]:
    """``busy_fraction``, ``num_steps``, ``mean_batch_size`` and ``mean_kv_usage`` over ``replicas``."""
    duration = end_s
    rows = iterations[iterations["replica"].isin(replicas)] if len(replicas) < scenario.cluster.fleet_size else iterations
    steps = rows["num_steps"].to_numpy()
    busy = busy_s(rows, end_s)
    kv_total = np.array([s.kv_cache.num_blocks for s in replica_scenarios(scenario)])[rows["replica"]]
    return {
        "busy_fraction": float(busy.sum() / (duration * len(replicas))) if duration > 0 else math.nan,
        "num_steps": int(steps.sum()),
        "mean_batch_size": float((rows["batch_size"] * steps).sum() / steps.sum()) if steps.sum() else 0.0,
        "mean_kv_usage": float((rows["kv_blocks_used"] / kv_total * busy).sum() / busy.sum()) if busy.sum() else 0.0,
    }


def pool_summary(scenario: Scenario, done: _Selected, iterations: pd.DataFrame, end_s: float) -> dict[str, float]:
    """Disaggregated prefill and decode: each pool's engine keys, prefixed ``prefill_`` / ``decode_``,
    what each pool computes per second (``prefill_token_throughput``: prompt tokens prefilled,
    recomputes included; ``decode_token_throughput``: decode tokens), and the hand-over's two waits
    over completed requests (``{mean,median,std,p90,p99}_decode_queue_ms``, ``..._kv_transfer_ms``)."""
    n_prefill = scenario.cluster.disaggregated.prefill.count
    out: dict[str, float] = {}
    for pool, ids, column in (("prefill", range(n_prefill), "prefill_tokens"),
                              ("decode", range(n_prefill, scenario.cluster.replicas), "decode_tokens")):
        out |= {f"{pool}_{key}": value for key, value in engine_stats(scenario, iterations, end_s, ids).items()}
        rows = iterations[iterations["replica"].isin(ids)]
        tokens = float((rows[column] * rows["num_steps"]).sum())
        out[f"{pool}_token_throughput"] = tokens / end_s if end_s > 0 else math.nan
    out |= describe_ms("decode_queue", done["decode_queue_s"].to_numpy())
    out |= describe_ms("kv_transfer", done["kv_transfer_s"].to_numpy())
    return out


def tenant_summary(requests: pd.DataFrame, duration_s: float) -> dict[str, float]:
    """With more than one tenant, ``tenant_<name>_{request_throughput,mean_ttft_ms,p99_ttft_ms,mean_e2el_ms}``.

    Over each tenant's completed requests, as the whole run's keys are; flat keys, so a sweep's
    summary.csv and a comparison keep one column or row per tenant.
    """
    tenants = requests["tenant"].cat.categories
    if len(tenants) < 2:
        return {}
    out: dict[str, float] = {}
    done = (requests["status"] == OUTCOMES[Outcome.FINISHED]).to_numpy()
    # Arrays, not sub-frames: a filtered copy of every column per tenant cost more than the statistics.
    tenant_of, ttft_s, e2e_s = (requests[c].to_numpy()[done] for c in ("tenant", "ttft_s", "e2e_s"))
    for tenant in tenants:
        mine = tenant_of == tenant
        ttft, e2el = describe_ms("ttft", ttft_s[mine]), describe_ms("e2el", e2e_s[mine])
        out[f"tenant_{tenant}_request_throughput"] = int(mine.sum()) / duration_s if duration_s > 0 else math.nan
        out[f"tenant_{tenant}_mean_ttft_ms"] = ttft["mean_ttft_ms"]
        out[f"tenant_{tenant}_p99_ttft_ms"] = ttft["p99_ttft_ms"]
        out[f"tenant_{tenant}_mean_e2el_ms"] = e2el["mean_e2el_ms"]
    return out
