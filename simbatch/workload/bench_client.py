"""The requests a ``vllm bench serve`` run sent, rebuilt from its result file, and the times it sent them.

What a result file holds decides what can be replayed exactly:

- **Lengths and order.** With per-request arrays (``--save-detailed``, or any 2024 file), each
  request's prompt and output length in send order. An output of 0 tokens (a request that streamed
  nothing: an end of sequence at once) is replayed as 1 token: the server still prefilled it and
  sampled once. Without them, every request has the file's mean lengths (exact for the ``random``
  dataset at ``--random-range-ratio 0``), or the lengths a scenario gives.
- **Send times.** ``start_times`` (vLLM 0.19 on, with ``--save-detailed``) are the sends as they
  happened: replayed as offsets from the first. Otherwise arrivals are drawn again, the way that
  client drew them (:func:`client_arrivals`), from the file's ``request_rate`` and ``burstiness``
  with a seed of simbatch's: the same law, not the same draws. With ``max_concurrency`` the
  recorded sends are the real server's pacing, so the schedule is drawn again and the client cap
  decides the sends, as it did in the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simbatch.workload.bench_result import BenchResult


def client_arrivals(rate: float, burstiness: float, n: int, rng: np.random.Generator, rescaled: bool) -> np.ndarray:
    """``n`` send times, s, as vLLM's benchmark client schedules them.

    Gaps are gamma with shape ``burstiness`` and mean 1/rate (``burstiness`` inf: constant gaps).
    ``vllm bench serve`` (``rescaled``) draws all n delays up front, the first one included, and
    scales their cumulative sums so that the last request is sent at exactly n / rate; the older
    ``benchmark_serving.py`` sent the first request at once and slept a fresh gap after each, without
    rescaling. ``rate`` inf sends everything at t = 0.
    """
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    draws = n if rescaled else n - 1
    if math.isinf(burstiness):
        gaps = np.full(draws, 1.0 / rate)
    else:
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=draws)
    if not rescaled:
        return np.concatenate([[0.0], np.cumsum(gaps)])
    times = np.cumsum(gaps)
    return times * (n / rate / times[-1]) if times[-1] > 0 else times


@dataclass(frozen=True)
class BenchRequests:
    """The requests of a run, in send order, and a sentence on where each column came from."""

    prompt_tokens: np.ndarray | None  # None: the file has no lengths (the scenario must give them)
    output_tokens: np.ndarray | None
    arrival_s: np.ndarray
    lengths_from: str
    arrivals_from: str
    measured: np.ndarray | None  # per request: its measurement counts (it streamed a token); None: no arrays


def requests_of(result: BenchResult, rng: np.random.Generator, num_requests: int | None = None) -> BenchRequests:
    """The run's requests, rebuilt (module docstring); ``num_requests`` when the file cannot say how many."""
    rq = result.requests
    measured = None
    if rq is not None:
        n = len(rq)
        prompt, output = np.maximum(rq.input_lens, 1), np.maximum(rq.output_lens, 1)
        silent = int(((rq.output_lens == 0) | (rq.input_lens == 0)).sum())
        lengths = f"the file's {n} requests in send order (input_lens, output_lens)"
        if silent:
            lengths += f"; {silent} with 0 tokens replayed with 1"
        measured = rq.streamed
    else:
        completed, n = result.summary.get("completed"), result.num_prompts or result.summary.get("completed")
        n = n or num_requests
        if not n:
            raise ValueError(f"{result.path}: the file says neither num_prompts nor completed; give "
                             "workload.num_requests")
        have = completed and "total_input_tokens" in result.summary and "total_output_tokens" in result.summary
        if have:
            mean_in = max(round(result.summary["total_input_tokens"] / completed), 1)
            mean_out = max(round(result.summary["total_output_tokens"] / completed), 1)
            prompt, output = np.full(n, mean_in, np.int64), np.full(n, mean_out, np.int64)
            lengths = (f"{n} requests of the file's mean lengths, {mean_in} in / {mean_out} out (no per-request "
                       "lengths in the file)")
        else:
            prompt = output = None
            lengths = f"{n} requests, lengths from the scenario (the file has none)"
    rate = result.request_rate if result.request_rate is not None else math.inf
    burstiness = result.burstiness if result.burstiness is not None else 1.0
    if rq is not None and rq.start_s is not None and result.max_concurrency is None:
        arrival = rq.start_s - rq.start_s.min()
        how = "send times as recorded (start_times), from the first"
    else:
        rescaled = result.client != "benchmark_serving.py"
        arrival = client_arrivals(rate, burstiness, n, rng, rescaled)
        if math.isinf(rate):
            how = "all sent at t = 0 (request_rate inf)"
        else:
            law = "Poisson" if burstiness == 1 else f"gamma gaps of shape {burstiness:g}"
            way = (f"rescaled so the last is sent at N/rate = {n / rate:,.1f} s (vllm bench serve's way)" if rescaled
                   else "the first at t = 0, unrescaled (benchmark_serving.py's way)")
            how = f"redrawn at {rate:g} req/s, {law}, {way}"
        if rq is not None and rq.start_s is not None:
            how += "; start_times not used: with max_concurrency they are the real server's pacing"
    return BenchRequests(prompt, output, arrival, lengths, how, measured)
