"""``metrics``: which latency percentiles the summary and the result table add.

vLLM's ``--percentile-metrics`` and ``--metric-percentiles``, with its key spelling (``p99_ttft_ms``).
The metrics themselves are defined once, in :mod:`simbatch.analysis.summary`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from simbatch.config.base import _Model

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


class Metrics(_Model):
    """Which latency percentiles the summary adds, as ``vllm bench serve --percentile-metrics/--metric-percentiles``.

    The summary always holds mean, median, std, p90 and p99 of every latency; these add
    ``p<P>_<metric>_ms`` (vLLM's spelling: ``p95_ttft_ms``, ``p99.9_itl_ms``) and choose what the table shows.
    """

    percentile_metrics: list[Literal["ttft", "tpot", "itl", "e2el"]] = Field(
        default_factory=lambda: list(LATENCY_METRICS), min_length=1,
        description="Latencies printed in the result table and given the extra percentiles.")
    metric_percentiles: list[Annotated[float, Field(gt=0, lt=100)]] = Field(
        default_factory=lambda: [99.0], min_length=1,
        description="Percentiles (0 < P < 100) printed per latency, and added to the summary as p<P>_<metric>_ms.")
