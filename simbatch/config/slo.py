"""``slo``: the service-level objectives a request must meet to count towards goodput.

Limits are in ms, as ``vllm bench serve --goodput ttft:300 tpot:50`` gives them; a request meets
the SLO when it meets every limit that is set (:mod:`simbatch.analysis.summary` counts them).
"""

from __future__ import annotations

from pydantic import Field

from simbatch.config.base import PosFloat, _Model, seconds


class SLO(_Model):
    """Service-level objectives, for goodput (a request counts when it meets every one that is set)."""

    ttft_ms: PosFloat | None = Field(default=None, description="Time to first token at most this, ms.")
    tpot_ms: PosFloat | None = Field(default=None, description="Time per output token at most this, ms.")
    e2el_ms: PosFloat | None = Field(default=None, description="End-to-end latency at most this, ms.")

    def limits_s(self) -> dict[str, float]:
        """The objectives that are set, in seconds, by the requests frame's column they bound."""
        limits = {"ttft_s": self.ttft_ms, "tpot_s": self.tpot_ms, "e2e_s": self.e2el_ms}
        return {col: seconds(ms) for col, ms in limits.items() if ms is not None}
