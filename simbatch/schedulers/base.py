"""What every batching mode shares: the plan of one step, and the scheduler interface.

A scheduler is plain Python with no notion of SimPy. The engine asks it ``schedule(now)`` and gets
one of three answers:

- a :class:`StepPlan`: run this step (the engine charges its cost and calls ``finish_step``);
- :class:`SleepUntil`: nothing to run before that time (a batching timer), unless a request arrives;
- :data:`IDLE`: nothing to run until a request arrives.

Tests build a scheduler, ``add`` requests, and step it by hand with ``schedule`` / ``finish_step``;
a request's counters are true whenever they are read, whichever scheduler advances it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

from simbatch.config import Scenario
from simbatch.memory.kv import KVCacheManager
from simbatch.model.request import FINISHED, RUNNING, WAITING, Request
from simbatch.schedulers.policies import WaitingQueue


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


class BaseScheduler(ABC):
    """Pools and bookkeeping common to all modes; subclasses decide what a step holds."""

    request_class: type[Request] = Request  # what the engine builds for each arrival here
    features: Sequence = ()  # the serving features it runs (simbatch.features; continuous batching only)

    def __init__(self, scenario: Scenario, kv: KVCacheManager, waiting: WaitingQueue):
        self.scenario = scenario
        self.kv = kv
        self.waiting = waiting
        self.running: list[Request] = []
        self.closed = False  # no more arrivals will come
        self.num_preemptions = 0
        self._admissions = 0

    # ---------------------------------------------------------------- the interface
    def add(self, req: Request, now: float) -> None:
        """A request arrives at this engine and joins WAITING."""
        req.status = WAITING
        req.waiting_since_s = now
        self.waiting.push(req)

    def close(self) -> None:
        """Arrivals have ended (static batching then flushes a partial batch)."""
        self.closed = True

    @abstractmethod
    def schedule(self, now: float) -> Answer:
        """Plan the next step at ``now`` (see the module docstring for the three answers)."""

    @abstractmethod
    def finish_step(self, plan: StepPlan, end_s: float, step: int) -> StepOutcome:
        """Apply ``plan``'s work, which ended at ``end_s``; ``step`` numbers the engine's steps."""

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_blocks_used(self) -> int:
        return self.kv.device.num_used

    def in_system(self) -> list[Request]:
        """Every request this engine still owes tokens (for the clock stop's ``unfinished`` rows)."""
        return [*self.running, *self.waiting]

    # ---------------------------------------------------------------- shared mechanics
    def _admit(self, req: Request, now: float) -> None:
        """WAITING -> RUNNING."""
        req.status = RUNNING
        req.waiting_s += now - req.waiting_since_s
        if math.isnan(req.first_scheduled_s):
            req.first_scheduled_s = now
        req.admitted_seq = self._admissions
        self._admissions += 1
        self.running.append(req)
        self.waiting.on_admit(req)

    def _emit_token(self, req: Request, end_s: float, step: int, outcome: StepOutcome, n: int = 1) -> None:
        """``req`` sampled ``n`` tokens at the end of ``step`` (more than one: accepted drafts), streamed
        as one chunk, which is one inter-token gap (simbatch.analysis.summary)."""
        if req.num_generated == 0:
            req.first_token_s = end_s
        elif req.last_token_step == step - 1:
            outcome.itl_tokens += 1
        else:
            outcome.stall_gaps_s.append(end_s - req.last_token_s)
        req.num_generated += n
        req.last_token_s = end_s
        req.last_token_step = step

    def _retire(self, req: Request, end_s: float) -> None:
        """``req`` is done; its blocks are released with the step's other finished requests
        (``_drop_finished``), in one order whichever engine runs."""
        req.status = FINISHED
        req.finish_s = end_s
        self.waiting.on_release(req)

    def _block_holders(self) -> list[Request]:
        return self.running

    def check_invariants(self) -> None:
        """Raise AssertionError if the pools or the block accounting are inconsistent.

        Tests run this at every step, so each check is one builtin pass (``map`` over an attribute
        getter, a set) rather than a Python loop: the same checks, at a fraction of the cost."""
        waiting, running = list(self.waiting), self.running
        ids = set(map(_request_id, waiting))
        ids.update(map(_request_id, running))
        assert len(ids) == len(waiting) + len(running), "a request is in two pools"
        assert set(map(_status, waiting)) <= {WAITING} and not any(map(len, map(_block_ids, waiting))), \
            "waiting request holds blocks"
        assert set(map(_status, running)) <= {RUNNING}, "running pool holds a non-running request"
        self.kv.check_conservation(self._block_holders(), waiting)
        assert len(self.running) <= self.scenario.batching.max_num_seqs, "more running than max_num_seqs"


_request_id, _status = attrgetter("request_id"), attrgetter("status")
_block_ids = attrgetter("block_ids")
