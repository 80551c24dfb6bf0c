"""``frontend``: the API server between the client and the engine, and what a request spends in it.

Nothing here runs on the GPU: the latencies shift when the engine first sees a request and when the
client sees each token, so they are in TTFT and E2E latency as ``vllm bench serve`` measures them,
and not in TPOT, ITL or the engine's queue (:mod:`simbatch.engine.client` applies them).
"""

from __future__ import annotations

from pydantic import Field

from simbatch.config.base import MAX_FRONTEND_MS, NonNegFloat, _Model, seconds


class Frontend(_Model):
    """The API server between the client and the engine: what a request spends outside the GPU steps.

    vLLM's OpenAI-compatible server parses the request, tokenises the prompt (batching prompts for up
    to 2 ms) and hands it to the engine core process; each step's tokens come back the other way,
    detokenised and streamed as one server-sent event. ``vllm bench serve`` times a request from before
    its POST, so both latencies are in its TTFT and E2E latency; TPOT and ITL, differences between
    tokens, are not changed by them.
    """

    request_latency_ms: NonNegFloat = Field(
        default=0.0, le=MAX_FRONTEND_MS,
        description="From the client's send to the engine's waiting queue (HTTP, tokenisation, hand-off), ms.")
    response_latency_ms: NonNegFloat = Field(
        default=0.0, le=MAX_FRONTEND_MS,
        description="From the end of the step that sampled a token to the client receiving it (detokenisation, "
        "streaming), ms.")

    @property
    def request_latency_s(self) -> float:
        return seconds(self.request_latency_ms)

    @property
    def response_latency_s(self) -> float:
        return seconds(self.response_latency_ms)
