"""``scheduler``: which waiting request goes first, who is preempted, and who is turned away.

The policies themselves are :mod:`simbatch.registry.policies` (their keys and what they declare);
this section names one and sets its knobs, with vLLM's meaning where vLLM has the knob (``head_of_line_blocking: true`` is V1's
no-overtaking admission).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from simbatch.config.base import ClockS, PosFloat, PosInt, Registered, _Model
from simbatch.registry import POLICIES


class Scheduler(_Model):
    """Queue order, preemption and admission control."""

    policy: Annotated[str, Registered(POLICIES)] = Field(
        default="fcfs", description="The queue policy: the order of WAITING and who is preempted (listed under Choices).",
    )
    sjf_key: Literal["prompt", "output"] = Field(
        default="prompt",
        description="sjf orders by prompt length, or by true output length (an oracle: an upper bound).",
    )
    aging_s: ClockS | None = Field(
        default=None, description="priority: a waiting request gains one priority level per aging_s."
    )
    tenant_weights: dict[str, PosFloat] = Field(
        default_factory=dict, description="fair: weight per tenant (1 when not listed)."
    )
    preemption: Literal["recompute", "swap"] = Field(
        default="recompute", description="What happens to a preempted request's KV blocks."
    )
    max_preemptions: PosInt | None = Field(
        default=None,
        description="A request preempted this many times is not chosen as a victim again, unless every "
        "running request is stalled on memory: then the lowest-ranked one goes all the same (the newest "
        "admitted; under `priority`, the worst priority, then the newest), or the engine would wait forever.",
    )
    head_of_line_blocking: bool = Field(
        default=True,
        description="true: admission stops at the first waiting request (in policy order) that does not fit "
        "(vLLM V1: no overtaking). false: it is passed over and later ones may be admitted in the same step "
        "(first-fit backfilling, as the chapter's toy does); a large request can then starve behind "
        "a stream of small ones.",
    )
    max_waiting: PosInt | None = Field(
        default=None, description="Waiting-queue cap per replica; arrivals beyond it are rejected (429)."
    )
    async_scheduling: bool = Field(
        default=False,
        description="vLLM's --async-scheduling (on by default in vLLM V1): the engine plans step k+1 while step k "
        "runs, so a request arriving during step k is first scheduled in step k+2, and a request finishing in "
        "step k keeps its slot and blocks through the plan of step k+1; an engine with nothing to run plans at "
        "once (continuous batching only; docs/concepts.md).",
    )
