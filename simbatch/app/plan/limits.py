"""What a fleet must do to be chosen: the SLOs, as limits on the replications' means.

Three kinds, all judged as ``capacity-search`` judges an SLO (the mean over the replications of each
run's statistic, the estimate ``summary.csv`` reports):

- ``--slo ttft_p99_ms=500``: a statistic of one latency at most its limit
  (:func:`simbatch.app.sweep.capacity.parse_slo`);
- ``--goodput "ttft:500 tpot:50"`` (vLLM's syntax): per-request limits, met by a request when each of its
  own latencies is within them, as ``vllm bench serve`` counts goodput. A fleet meets them when the
  share of completed requests that do, ``slo_attainment`` = request_goodput / request_throughput, is
  at least ``--attainment`` (0.99 unless given);
- always: every request completes, ``incomplete_requests`` (rejected + unfinished) = 0. A fleet that
  turns requests away (a request that never fits the KV cache, a full waiting queue) does not
  serve the traffic, whatever the latencies of those it kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simbatch.app.text import mean_ci

ATTAINMENT = "slo_attainment"
INCOMPLETE = "incomplete_requests"


@dataclass(frozen=True)
class Limit:
    """``key`` (a metric of the combined replications, its ``_mean`` read) at most (or at least) ``bound``."""

    key: str
    bound: float
    at_most: bool = True

    def holds(self, value: float) -> bool:
        """NaN (no request completed) holds nothing."""
        return value <= self.bound if self.at_most else value >= self.bound

    def excess(self, value: float) -> float:
        """How far past the limit ``value`` is, as a ratio (above 1 when it fails; inf for NaN)."""
        if math.isnan(value):
            return math.inf
        if self.at_most:
            if self.bound == 0:
                return 0.0 if value <= 0 else math.inf
            return value / self.bound
        return self.bound / value if value > 0 else math.inf

    @property
    def text(self) -> str:
        if self.key == INCOMPLETE:
            return "every request served"
        return f"{self.key} {'<=' if self.at_most else '>='} {self.bound:g}"

    def failure(self, mean: float, ci95: float = math.nan) -> str:
        """``p99_ttft_ms 812 ± 40 > 500``: the replications' mean, its 95 % half-width, the limit."""
        shown = "no completed request" if math.isnan(mean) else mean_ci(mean, ci95, 2)
        return f"{self.key} {shown} {'>' if self.at_most else '<'} {self.bound:g}"


def completion() -> Limit:
    return Limit(INCOMPLETE, 0.0)


def with_derived(record: dict[str, Any]) -> dict[str, Any]:
    """A run's record with ``slo_attainment`` and ``incomplete_requests`` added to its summary."""
    if "error" in record:
        return record
    summary = dict(record["summary"])
    throughput, goodput = summary.get("request_throughput", math.nan), summary.get("request_goodput")
    if goodput is not None:
        summary[ATTAINMENT] = goodput / throughput if throughput > 0 else math.nan
    summary[INCOMPLETE] = summary.get("rejected", 0) + summary.get("unfinished", 0)
    return {**record, "summary": summary}


def failures(limits: list[Limit], combined: dict[str, Any]) -> list[str]:
    """Each limit the combined replications miss, as :meth:`Limit.failure` words; [] when all hold."""
    if combined.get("replications", 0) == 0:
        return [f"the runs failed: {combined.get('error', '')}"]
    out = []
    for limit in limits:
        mean = combined.get(f"{limit.key}_mean", math.nan)
        if not limit.holds(mean):
            if limit.key == INCOMPLETE:
                out.append(f"{mean:.3g} requests per run rejected or unfinished (of "
                           f"{combined.get('num_requests_mean', math.nan):.4g})")
            else:
                out.append(limit.failure(mean, combined.get(f"{limit.key}_ci95", math.nan)))
    return out


def binding(limits: list[Limit], combined: dict[str, Any]) -> str:
    """The limit furthest past (or nearest to) its bound in ``combined``: the one that binds."""
    if combined.get("replications", 0) == 0:
        return "failed runs"
    return max(limits, key=lambda lim: lim.excess(combined.get(f"{lim.key}_mean", math.nan))).key
