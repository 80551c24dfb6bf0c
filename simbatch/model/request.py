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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class Status(enum.IntEnum):
    """Where a request is in an engine's pools (a rejected request never enters them)."""

    WAITING = 0  # arrived, holds no device KV blocks (a swapped request holds host blocks)
    RUNNING = 1  # in the running set, owns device KV blocks
    FINISHED = 2


# The members as plain names for the schedulers' hot paths: ``Status.RUNNING`` is a lookup through
# the enum's metaclass, over ten times slower than a module global, and a status changes several
# times per request.
WAITING, RUNNING, FINISHED = Status


class Outcome(enum.IntEnum):
    """How a request's part in a run ended: the ``status`` column of the requests frame, by name."""

    UNFINISHED = 0  # still waiting or running when the clock stopped
    FINISHED = 1
    REJECTED = 2  # turned away at arrival (the ``reason`` column says why)


OUTCOMES = tuple(o.name.lower() for o in Outcome)  # the frame's category names, in code order


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
    prefill_pending: bool = True  # computing known tokens before the next sample (prompt, or a recompute)
    # What its prompt shares with others (simbatch.workload.prefix), for prefix caching.
    prefix_stream: int = -1
    shared_prefix_tokens: int = 0
    # A trace's content ids, one per hash_block_tokens of the prompt (Mooncake's hash_ids); None: none.
    block_hashes: Any = None
    hash_block_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission (either tier)
    # The host KV tier (simbatch.memory.host_tier): of those, the tokens loaded from host memory; and the
    # blocks its latest admission loaded (the KV manager's, read by the tier's feature for the step's time).
    num_host_cached_tokens: int = 0
    host_loaded_blocks: int = 0
    # Multi-LoRA (simbatch.features.lora): its adapter (-1: the base model), and the time its adapter's
    # loads added to its first steps (0 when the adapter was on the GPU already), ms.
    lora_id: int = -1
    lora_loads: int = 0  # adapter loads its admissions caused (of them, read from storage first)
    lora_storage_loads: int = 0
    lora_load_ms: float = 0.0
    # Disaggregated decode side: its prompt's KV is still on its prefill replica (simbatch.engine.disaggregated).
    remote_kv: bool = False
    num_published_blocks: int = 0  # leading blocks offered to the prefix cache (KV manager's bookkeeping)
    # Speculative decoding (simbatch.features.speculative): the source of its accepted-draft counts (made at
    # its first speculative step), and vLLM's spec_decode counters: steps that verified drafts, drafts
    # verified, drafts accepted.
    acceptance: Any = None
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Device KV blocks held, and, where their numbers are seen (prefix caching), which: both written by
    # the KV cache manager only. Without numbers, or with none held, the shared (): a million requests
    # need no million empty lists. A list, or an int64 array for one that started from a cached prefix.
    blocks: int = 0
    block_ids: Sequence[int] = ()
    host_block_ids: Sequence[int] = ()  # on the host, after a swap preemption
    admitted_seq: int = -1  # order of the latest admission into RUNNING; the newest is the LIFO victim
    num_preemptions: int = 0
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    waiting_since_s: float = math.nan
    waiting_s: float = 0.0  # total time spent in WAITING, across preemptions
    # Token accounting (module docstring), and when the last token was sampled (ITL bookkeeping).
    num_computed_tokens: int = 0  # tokens materialized in the KV cache
    num_generated: int = 0  # output tokens sampled so far
    last_token_s: float = math.nan
    last_token_step: int = -2  # the engine step that sampled the last token

    @property
    def swapped_blocks(self) -> int:
        """Host KV blocks held (swap preemption)."""
        return len(self.host_block_ids)

    @property
    def done(self) -> bool:
        return self.num_generated >= self.output_tokens
