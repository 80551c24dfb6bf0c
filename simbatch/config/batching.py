"""``batching``: how the engine forms batches, request by request or iteration by iteration.

``max_num_seqs`` is the slot count in every mode. Continuous batching (vLLM V1's) schedules every
step afresh within a token budget (``max_num_batched_tokens``); the request-level modes, static and
dynamic, hold a batch together from its start to its last request's end (:mod:`simbatch.schedulers`).
The modes, and what each declares, are :mod:`simbatch.registry.modes`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from simbatch.config.base import ClockMs, PosInt, Registered, _Model, seconds
from simbatch.registry import MODES


class Batching(_Model):
    """How the engine forms batches. `max_num_seqs` is the slot count in every mode."""

    mode: Annotated[str, Registered(MODES)] = Field(
        default="continuous", description="The batching mode: request by request, or iteration by iteration (listed "
        "under Choices).",
    )
    max_num_seqs: PosInt = Field(default=64, description="Running slots (batch size for static/dynamic).")
    max_num_batched_tokens: PosInt = Field(
        default=2048, description="Token budget of one step (continuous)."
    )
    enable_chunked_prefill: bool = Field(default=True, description="Split prompts across steps (continuous).")
    long_prefill_token_threshold: PosInt | None = Field(
        default=None, description="Cap on one request's prefill chunk per step, tokens (continuous)."
    )
    pad_prompts: bool = Field(
        default=True, description="Pad prompts to the longest in the batch (static/dynamic)."
    )
    max_wait_ms: ClockMs | None = Field(
        default=None,
        description="static: start a partial batch once the oldest request has waited this long; "
        "null waits for a full batch (flushing when arrivals end).",
    )
    max_queue_delay_ms: ClockMs = Field(
        default=10.0, description="dynamic: dispatch once the oldest request has waited this long, ms."
    )

    @property
    def max_wait_s(self) -> float | None:
        return seconds(self.max_wait_ms)

    @property
    def max_queue_delay_s(self) -> float:
        return seconds(self.max_queue_delay_ms)

    @model_validator(mode="after")
    def _budget(self) -> Batching:
        if MODES[self.mode].iteration_level and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than max_num_seqs "
                f"({self.max_num_seqs}): running decodes could not all be served; raise the budget"
            )
        return self
