"""Planning maths: what no fleet of a configuration can do, what it costs, what it draws. No simulation.

``simbatch plan`` screens every configuration with these before it simulates any
(:mod:`simbatch.app.plan`). Two kinds of closed forms, both *necessary* conditions, so a configuration
they rule out is ruled out for certain and never simulated:

- **Alone on its server** (:func:`lone_request_bounds`): a request's TTFT is at least its own prefill,
  chunk by chunk, in steps that serve nobody else; every later token at least a decode step of a batch
  of one that reads its context. Sharing a step with other requests only adds to it (every term of the
  step-time law is non-negative), so TTFT_i >= bound_i for every request i, and any statistic that is
  monotone in the sample (the mean, any percentile, by the summary's own definitions,
  :func:`simbatch.analysis.stats.describe_ms`) of the simulated latencies is at least that statistic of
  the bounds. Computed on the same requests a replication simulates, the bound holds for the mean over
  replications as well: an SLO above it cannot hold with any number of replicas.
- **Stability** (:func:`min_replicas`): N replicas of capacity mu requests/s each carry lambda only if
  lambda < N mu (:func:`simbatch.analysis.capacity.fleet_stability`: capacities add); below that the
  waiting queue grows for as long as arrivals last and every percentile with it. The fewest replicas
  worth simulating is floor(lambda / mu) + 1.

Then what a fleet costs and draws, defined once:

- ``cost_per_hour`` = GPUs x price per GPU-hour; ``cost_per_million_output_tokens`` = cost_per_hour /
  (output tokens/s x 3600) x 10^6;
- the power of one GPU (:func:`gpu_watts`): linear between its idle and full-load draw in the busy
  fraction b (the share of time its engine steps, :mod:`simbatch.analysis.summary`), P = idle + (max -
  idle) b. An upper bound while stepping: a memory-bound decode step of a small batch draws less than
  the board's limit. ``kwh_per_hour`` = fleet watts / 1000 (the energy of one hour at this load);
  ``output_tokens_per_joule`` = output tokens/s / fleet watts;
- the Pareto front (:func:`pareto_front`): the points no other point beats on both axes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simbatch.analysis.stats import describe_ms
from simbatch.config import Batching, Device
from simbatch.model.cost import LinearCost


@dataclass(frozen=True)
class LoneBounds:
    """Per request, s: the least TTFT, TPOT (NaN for one-token outputs, as the summary has it) and
    end-to-end latency it can have on this device and batching; ``itl_s`` the least gap between tokens."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    itl_s: float

    def stats_ms(self, percentiles: tuple[float, ...] = ()) -> dict[str, float]:
        """The summary's statistics of the bounds, by the summary's keys (``p99_ttft_ms``, ...)."""
        return {**describe_ms("ttft", self.ttft_s, percentiles=percentiles),
                **describe_ms("tpot", self.tpot_s, percentiles=percentiles),
                **describe_ms("itl", np.array([self.itl_s]), percentiles=percentiles),
                **describe_ms("e2el", self.e2e_s, percentiles=percentiles)}

    def attainment(self, limits_s: dict[str, float]) -> float:
        """The most requests that could meet every per-request limit (``{"ttft_s": 0.5, ...}``, the
        scenario's ``slo.limits_s()``), as a share: those whose bounds meet them. A one-token output
        meets a TPOT limit, as in the summary's goodput."""
        good = np.ones(len(self.ttft_s), dtype=bool)
        for column, limit in limits_s.items():
            bound = {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s, "e2e_s": self.e2e_s}[column]
            good &= np.isnan(bound) | (bound <= limit)
        return float(good.mean()) if len(good) else math.nan


def prefill_alone_s(cost: LinearCost, prompt_tokens: np.ndarray, chunk_tokens: float) -> np.ndarray:
    """The prefill of each prompt on a server with nothing else to do, s: n = ceil(P / chunk) steps,
    chunk k of c_k tokens after h_k = k x chunk already computed costing tau0 + gamma c_k + delta h_k +
    epsilon c_k (h_k + c_k / 2). Summed: n tau0 + gamma P + delta chunk n (n - 1) / 2 + epsilon P^2 / 2
    (the attention pairs of a prompt do not depend on how it is chunked)."""
    p = np.asarray(prompt_tokens, dtype=np.float64)
    n = np.ceil(p / chunk_tokens) if math.isfinite(chunk_tokens) else np.ones_like(p)
    return cost.step_ms(0, p, 0, chunk_tokens * n * (n - 1) / 2 if math.isfinite(chunk_tokens) else 0.0,
                        p * p / 2) / 1e3 + (n - 1) * cost.tau0_ms / 1e3


def lone_request_bounds(device: Device, batching: Batching, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                        prefix_caching: bool = False) -> LoneBounds:
    """:class:`LoneBounds` of each request: its prefill alone (:func:`prefill_alone_s`, in chunks of
    ``max_num_batched_tokens``, or of ``long_prefill_token_threshold`` when that is smaller; one step
    without chunked prefill), then ``O - 1`` decode steps of a batch of one, the j-th reading at least
    ``P + j - 1`` cached tokens: tau0 + beta + delta (P + (O - 2) / 2) per token on average.

    With prefix caching a prompt may be found cached but its last token: the TTFT bound is then one
    step. With speculative decoding a step can emit up to k + 1 tokens: the per-token bound is divided
    by k + 1. A step that emits a token lasts at least tau0 + beta: the bound on every ITL gap.
    """
    cost = LinearCost.of(device)
    prompt = np.asarray(prompt_tokens, dtype=np.float64)
    output = np.asarray(output_tokens, dtype=np.float64)
    chunk = math.inf
    if batching.enable_chunked_prefill:
        chunk = min(batching.max_num_batched_tokens, batching.long_prefill_token_threshold or math.inf)
    ttft = np.full(len(prompt), cost.step_ms(0, 1) / 1e3) if prefix_caching else prefill_alone_s(cost, prompt, chunk)
    per_step = cost.step_ms(1, 0, 0, prompt + np.maximum(output - 2, 0) / 2) / 1e3
    tokens = 1 + (device.speculative.num_speculative_tokens if device.speculative else 0)
    with np.errstate(invalid="ignore"):
        tpot = np.where(output > 1, per_step / tokens, np.nan)
    return LoneBounds(ttft, tpot, ttft + np.where(output > 1, (output - 1) * per_step / tokens, 0.0),
                      cost.step_ms(1) / 1e3)


def min_replicas(arrival_rate: float, capacity_per_replica: float) -> float:
    """The fewest replicas of ``capacity_per_replica`` requests/s each that carry ``arrival_rate``:
    floor(lambda / mu) + 1, the first N with lambda < N mu (infinite when a replica carries nothing)."""
    if capacity_per_replica <= 0:
        return math.inf
    if math.isinf(capacity_per_replica):
        return 1
    return math.floor(arrival_rate / capacity_per_replica) + 1


def gpu_watts(idle_watts: float, max_watts: float, busy_fraction: float) -> float:
    """One GPU's mean draw, W: idle + (max - idle) x busy fraction (clipped to [0, 1])."""
    return idle_watts + (max_watts - idle_watts) * min(max(busy_fraction, 0.0), 1.0)


def cost_per_million_tokens(cost_per_hour: float, tokens_per_s: float) -> float:
    """Dollars per million tokens at ``tokens_per_s``: cost per hour / (tokens/s x 3600) x 10^6."""
    return math.inf if tokens_per_s <= 0 else cost_per_hour / (tokens_per_s * 3600) * 1e6


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Mask of the points no other point matches or beats on both axes with a strict gain on one
    (both maximised). Duplicates of a front point are on the front too."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    front = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        if not (math.isfinite(x[i]) and math.isfinite(y[i])):
            continue
        beaten = (x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i]))
        front[i] = not beaten.any()
    return front
