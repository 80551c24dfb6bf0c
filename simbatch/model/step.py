"""One engine step as the scheduler and the engine exchange it.

The engine asks a scheduler ``schedule(now)`` and gets one of three answers:

- a :class:`StepPlan`: run this step (the engine charges its cost, :mod:`simbatch.model.cost`, and
  hands the scheduler back a :class:`StepOutcome`);
- :class:`SleepUntil`: nothing to run before that time (a batching timer), unless a request arrives;
- :data:`IDLE`: nothing to run until a request arrives.

These are the model's entities, kept apart from the schedulers that make them
(:mod:`simbatch.schedulers`) and the engines, features and observers that read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from simbatch.model.request import Request


class Preemption(NamedTuple):
    """A request sent back to WAITING while a step was planned, and what it held until then."""

    request: Request
    swapped: bool  # its KV moved to the host (scheduler.preemption: swap, with room there); else dropped
    kv_blocks: int  # device KV blocks it held: moved to the host, or freed
    computed_tokens: int  # tokens its KV held: kept by a swap, to be computed again after a drop
    admitted_before: int  # admissions of the same plan made before it (StepPlan.admitted[:admitted_before])


@dataclass(slots=True)
class StepPlan:
    """One engine step: who computes how many tokens, and what it costs.

    ``decodes`` are the requests that compute one decode token each; ``slices`` the others, as
    (request, tokens): prefill chunks, a speculative decode's token and its drafts, a request-level
    batch's rows.

    ``admitted`` and ``preempted`` are who moved between the pools while the step was planned, each
    in the order the scheduler moved them, and, through ``Preemption.admitted_before``, in one order
    together (the observers' events, :mod:`simbatch.observe.observers`). Empty tuples until a request
    moves: most plans move nobody, and a plan is made per step.
    """

    slices: list[tuple[Request, int]] | tuple = ()
    decodes: Sequence[Request] = ()
    decode_seqs: int = 0  # sequences computing their one decode token (costed at beta)
    prefill_tokens: int = 0  # prompt / recompute tokens (costed at gamma)
    padded_decode_seqs: int = 0  # idle slots still computed (static batching)
    padded_prefill_tokens: int = 0  # pad tokens of a padded prefill (static batching)
    # The context the step reads (costed at delta): every scheduled request's cached tokens, padded
    # slots included; and 2A, twice its prefill attention pairs (costed at epsilon), sum c (2k + c)
    # over chunks of c tokens after k cached. Doubled so that it is an integer.
    kv_tokens: int = 0
    attention_pairs_x2: int = 0
    # Tokens a step verifies beyond each decode's own (speculative decoding's drafts: costed at gamma).
    draft_tokens: int = 0
    admitted: list[Request] | tuple = ()  # requests that left WAITING for RUNNING for this step
    preempted: list[Preemption] | tuple = ()  # requests sent back to WAITING while planning this step
    swap_blocks: int = 0  # blocks moved between device and host while planning this step

    def admit(self, req: Request) -> None:
        """Note that ``req`` left WAITING for this step."""
        if self.admitted:
            self.admitted.append(req)
        else:
            self.admitted = [req]

    def preempt(self, req: Request, swapped: bool, kv_blocks: int, computed_tokens: int) -> None:
        """Note that ``req`` was sent back to WAITING, holding ``kv_blocks`` and ``computed_tokens`` until then."""
        # (int(): counts derived from the free blocks can be NumPy integers when the prefix cache keeps them.)
        record = Preemption(req, swapped, int(kv_blocks), int(computed_tokens), len(self.admitted))
        if self.preempted:
            self.preempted.append(record)
        else:
            self.preempted = [record]

    @property
    def num_admitted(self) -> int:
        return len(self.admitted)

    @property
    def num_preempted(self) -> int:
        return len(self.preempted)

    @property
    def scheduled(self) -> list[tuple[Request, int]]:
        """Every (request, tokens) of the step, one-token decodes first."""
        return [*((r, 1) for r in self.decodes), *self.slices]

    @property
    def batch_size(self) -> int:
        return len(self.decodes) + len(self.slices)

    @property
    def padded_tokens(self) -> int:
        return self.padded_decode_seqs + self.padded_prefill_tokens


@dataclass(frozen=True, slots=True)
class SleepUntil:
    """Nothing to run before ``time_s`` (a batching timer falls due then), unless a request arrives."""

    time_s: float


class Idle:
    """Nothing to run until a request arrives."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IDLE"


IDLE = Idle()

Answer = StepPlan | SleepUntil | Idle


@dataclass(slots=True)
class StepOutcome:
    """What a finished step produced, for the recorders."""

    finished: list[Request]
    itl_tokens: int  # tokens whose inter-token gap is exactly this step's duration
    stall_gaps_s: list[float]  # gaps of tokens that came after a pause (preemption, stall)
