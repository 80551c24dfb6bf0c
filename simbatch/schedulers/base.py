"""What every batching mode shares: the scheduler interface and its pools.

A scheduler is plain Python with no notion of SimPy. The engine asks it ``schedule(now)`` and gets
one of the answers of :mod:`simbatch.model.step` (a :class:`~simbatch.model.step.StepPlan`,
``SleepUntil`` or ``IDLE``), runs the step and calls ``finish_step``.

Tests build a scheduler, ``add`` requests, and step it by hand with ``schedule`` / ``finish_step``;
a request's counters are true whenever they are read, whichever scheduler advances it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from operator import attrgetter

from simbatch.config import Scenario
from simbatch.memory.kv import KVCacheManager
from simbatch.model.request import FINISHED, RUNNING, WAITING, Request
from simbatch.model.step import Answer, StepOutcome, StepPlan
from simbatch.schedulers.policies import WaitingQueue


class BaseScheduler(ABC):
    """Pools and bookkeeping common to all modes; subclasses decide what a step holds."""

    request_class: type[Request] = Request  # what the engine builds for each arrival here
    features: Sequence = ()  # the serving features it runs (simbatch.features; continuous batching only)
    # Slots, in every class of the schedulers: a scheduler has dozens of attributes, read many times a
    # plan, and CPython reads an attribute of an instance dict of more than 30 keys about half again
    # as slowly. (A scheduler of one's own that declares none has a dict, as any class.)
    __slots__ = ("scenario", "kv", "waiting", "running", "closed", "num_preemptions", "_admissions")

    def __init__(self, scenario: Scenario, kv: KVCacheManager, waiting: WaitingQueue):
        self.scenario = scenario
        self.kv = kv
        self.waiting = waiting
        # RUNNING in admission order: a dict as an ordered set, so that a request leaves it in O(1) (a
        # list's remove compares it with those before it: microseconds a request at 256 running).
        self.running: dict[Request, None] = {}
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
        self.running[req] = None
        self.waiting.on_admit(req)

    def _emit_tokens(self, reqs: Iterable[Request], end_s: float, step: int, outcome: StepOutcome,
                     n: int = 1) -> None:
        """Each of ``reqs`` sampled ``n`` tokens at the end of ``step`` (more than one: accepted drafts),
        streamed as one chunk, which is one inter-token gap (simbatch.analysis.summary)."""
        itl, last, gaps = 0, step - 1, outcome.stall_gaps_s
        for req in reqs:
            if req.num_generated == 0:
                req.first_token_s = end_s
            elif req.last_token_step == last:
                itl += 1
            else:
                gaps.append(end_s - req.last_token_s)
            req.num_generated += n
            req.last_token_s = end_s
            req.last_token_step = step
        outcome.itl_tokens += itl

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
        assert set(map(_status, waiting)) <= {WAITING} and not any(map(_blocks, waiting)) and \
            not any(map(len, map(_block_ids, waiting))), "waiting request holds blocks"
        assert set(map(_status, running)) <= {RUNNING}, "running pool holds a non-running request"
        self.kv.check_conservation(self._block_holders(), waiting)
        assert len(self.running) <= self.scenario.batching.max_num_seqs, "more running than max_num_seqs"


_request_id, _status = attrgetter("request_id"), attrgetter("status")
_blocks, _block_ids = attrgetter("blocks"), attrgetter("block_ids")
