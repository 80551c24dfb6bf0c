"""Continuous batching: iteration-level scheduling, one token budget per step.

Every step the running set is chosen afresh (Orca), and each request gets a slice of one budget of
``max_num_batched_tokens`` (vLLM V1):

1. **Decodes first.** Every running request that is decoding gets its one token, and one more KV
   block if it crosses a block boundary. If blocks are short, a victim is preempted and the
   allocation retried; the victim is never the request itself. With no eligible victim left the
   request stalls this step, keeping its blocks.
2. **Prefill chunks** of running requests fill what remains of the budget.
3. **Admissions**: waiting requests, in policy order, while the budget, ``max_num_seqs`` and free
   blocks allow; the first that does not fit stops admission (no overtaking). No admissions happen in
   a step that preempted (the victim would be re-admitted at once: thrashing). Under the ``priority``
   policy a waiting request may evict a running one of strictly worse priority.

Finished requests retire at the end of the step; their blocks are free for the very next one.

Chunking: with ``enable_chunked_prefill`` a prompt is split into slices of at most the remaining
budget (and ``long_prefill_token_threshold``). Without it a prompt must fit whole into what is left
of the budget (prompts larger than the budget are rejected at arrival); a recompute after preemption,
which can exceed the budget, is still split so a preempted request can always return.
"""

from __future__ import annotations

import math

from simbatch.config import Scenario
from simbatch.kv import KVCacheManager
from simbatch.policies import WaitingQueue, victim_key, waiting_key
from simbatch.request import Request, Status
from simbatch.schedulers.base import BaseScheduler, StepOutcome, StepPlan


class ContinuousScheduler(BaseScheduler):
    def __init__(self, scenario: Scenario, kv: KVCacheManager, waiting: WaitingQueue):
        super().__init__(scenario, kv, waiting)
        b, s = scenario.batching, scenario.scheduler
        self.token_budget = b.max_num_batched_tokens
        self.max_num_seqs = b.max_num_seqs
        self.chunked = b.enable_chunked_prefill
        self.chunk_cap = b.long_prefill_token_threshold or math.inf
        self.swap = s.preemption == "swap"
        self.max_preemptions = s.max_preemptions
        self.evicts_for_priority = s.policy == "priority"
        self._victim_key = victim_key(s)
        self._waiting_key = waiting_key(s)
        # Planning state of the step being built.
        self._sched: dict[Request, int] = {}
        self._budget = 0

    # ---------------------------------------------------------------- planning
    def schedule(self, now: float) -> StepPlan | None:
        if not self.running and not len(self.waiting):
            return None
        plan = StepPlan()
        self._sched, self._budget = {}, self.token_budget

        for req in list(self.running):  # a snapshot: victims leave self.running mid-loop
            if req.status is Status.RUNNING and not req.prefill_pending and self._reserve(req, 1, now, plan):
                self._take(req, 1)
        for req in list(self.running):
            if req.status is Status.RUNNING and req.prefill_pending and req not in self._sched:
                n = self._chunk(req)
                if n and self._reserve(req, n, now, plan):
                    self._take(req, n)
        if not plan.num_preempted:
            self._admit_waiting(now, plan)

        if not self._sched and self.running:
            # Every running request stalled on memory with every victim protected by max_preemptions:
            # the cap yields to progress, or the engine would wait forever.
            self._preempt(max(self.running, key=self._victim_key), now, plan)
            return self._replan(now, plan)

        for req, n in self._sched.items():
            plan.scheduled.append((req, n))
            if req.prefill_pending:
                plan.prefill_tokens += n
            else:
                plan.decode_seqs += 1
        return plan

    def _replan(self, now: float, carried: StepPlan) -> StepPlan | None:
        plan = self.schedule(now)
        if plan is not None:
            plan.num_preempted += carried.num_preempted
            plan.swap_blocks += carried.swap_blocks
        return plan

    def _take(self, req: Request, n: int) -> None:
        self._sched[req] = n
        self._budget -= n

    def _chunk(self, req: Request) -> int:
        """Tokens ``req`` may compute this step, given what is left of the budget."""
        remaining = req.remaining_tokens
        if not req.prefill_pending:
            return 1 if self._budget >= 1 else 0
        if self.chunked or req.num_generated > 0:  # recompute is always splittable
            return int(min(remaining, self._budget, self.chunk_cap))
        return remaining if remaining <= self._budget else 0

    def _reserve(self, req: Request, n: int, now: float, plan: StepPlan) -> bool:
        """Blocks for ``req`` to compute ``n`` more tokens, preempting others if needed."""
        target = req.num_computed_tokens + n
        while not self.kv.grow(req, target):
            victim = self._pick_victim(exclude=req)
            if victim is None:
                return False
            self._preempt(victim, now, plan)
        return True

    def _eligible(self, req: Request) -> bool:
        return self.max_preemptions is None or req.num_preemptions < self.max_preemptions

    def _pick_victim(self, exclude: Request) -> Request | None:
        candidates = [r for r in self.running if r is not exclude and self._eligible(r)]
        return max(candidates, key=self._victim_key) if candidates else None

    def _preempt(self, victim: Request, now: float, plan: StepPlan) -> None:
        """RUNNING -> WAITING, with its KV swapped to the host if possible, else dropped for recompute."""
        self.running.remove(victim)
        if victim in self._sched:
            self._budget += self._sched.pop(victim)
        self.waiting.on_release(victim)
        if self.swap and self.kv.swap_out(victim):
            plan.swap_blocks += victim.swapped_blocks
        else:
            self.kv.release(victim)
            victim.num_computed_tokens = 0
            victim.prefill_pending = True
        victim.num_preemptions += 1
        self.num_preemptions += 1
        plan.num_preempted += 1
        victim.status = Status.WAITING
        victim.waiting_since_s = now
        self.waiting.push(victim)

    def _admit_waiting(self, now: float, plan: StepPlan) -> None:
        while len(self.waiting) and self._budget > 0:
            req = self.waiting.peek()
            n = self._chunk(req)
            if n == 0:
                return
            need = self.kv.blocks_for(req.num_computed_tokens + n)
            if len(self.running) >= self.max_num_seqs or need > self.kv.device.num_free:
                if self.evicts_for_priority and self._evict_for(req, now, plan):
                    continue
                return
            self.waiting.pop()
            if req.swapped_blocks:
                plan.swap_blocks += req.swapped_blocks
                self.kv.swap_in(req)
            self.kv.grow(req, req.num_computed_tokens + n)
            self._admit(req, now)
            plan.num_admitted += 1
            self._take(req, n)

    def _evict_for(self, req: Request, now: float, plan: StepPlan) -> bool:
        """Priority's teeth: preempt the worst running request if it is strictly worse than ``req``."""
        key = self._waiting_key(req)
        worse = [r for r in self.running if self._waiting_key(r) > key and self._eligible(r)]
        if not worse:
            return False
        self._preempt(max(worse, key=self._victim_key), now, plan)
        return True

    # ---------------------------------------------------------------- execution
    def finish_step(self, plan: StepPlan, end_s: float, step: int) -> StepOutcome:
        outcome = StepOutcome([], 0, [])
        for req, n in plan.scheduled:
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                req.prefill_pending = False
                self._emit_token(req, end_s, step, outcome)
                if req.done:
                    self._retire(req, end_s)
                    outcome.finished.append(req)
        if outcome.finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        return outcome
