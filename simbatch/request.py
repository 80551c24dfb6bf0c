"""A request's mutable state as it moves through an engine's pools.

Token accounting follows vLLM's unified view: a request *knows* ``prompt + generated`` tokens and
has *computed* (materialized in the KV cache) ``num_computed_tokens`` of them. Each step hands it a
slice of the token budget; when the computed count catches up with the known count, the step
samples one new token. A prefill is the case of many known-but-uncomputed tokens, a decode the case
of exactly one (the token sampled last step). Chunked prefill and recompute after preemption are
then the same rule: compute what is known, a slice at a time.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class Status(enum.IntEnum):
    WAITING = 0  # arrived, holds no device KV blocks (a swapped request holds host blocks)
    RUNNING = 1  # in the running set, owns device KV blocks
    FINISHED = 2
    REJECTED = 3


# The members as plain names for the schedulers' hot paths: ``Status.RUNNING`` is a lookup through
# the enum's metaclass, over ten times slower than a module global, and a status changes several
# times per request.
WAITING, RUNNING, FINISHED, REJECTED = Status


@dataclass(slots=True, eq=False)
class Request:
    request_id: int  # arrival sequence number: unique, and the tie-breaker everywhere
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: int = 0
    priority: int = 0
    replica: int = -1
    status: Status = Status.WAITING
    num_computed_tokens: int = 0
    num_generated: int = 0
    prefill_pending: bool = True  # computing known tokens before the next sample (prompt, or a recompute)
    blocks: int = 0  # device KV blocks held
    swapped_blocks: int = 0  # host KV blocks held (swap preemption)
    admitted_seq: int = -1  # order of the latest admission into RUNNING; the newest is the LIFO victim
    num_preemptions: int = 0
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    last_token_s: float = math.nan
    last_token_step: int = -2  # engine step that sampled the last token (ITL bookkeeping)
    mark: int = 0  # scheduler clock at which a lockstep decode's counters were last brought up to date
    waiting_since_s: float = math.nan
    waiting_s: float = 0.0  # total time spent in WAITING, across preemptions

    @property
    def remaining_tokens(self) -> int:
        """Known tokens not yet in the KV cache; 1 for a decoding request."""
        return self.prompt_tokens + self.num_generated - self.num_computed_tokens

    @property
    def done(self) -> bool:
        return self.num_generated >= self.output_tokens
