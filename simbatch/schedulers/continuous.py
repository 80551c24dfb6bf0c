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

import numpy as np

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
        # Fast-forward: tokens each running request can still add before it needs another block.
        self._slack = np.zeros(0, dtype=np.int64)
        self._fifo = s.policy == "fcfs"
        self._waiting_at_plan = 0

    # ---------------------------------------------------------------- planning
    def schedule(self, now: float) -> StepPlan | None:
        if not self.running and not len(self.waiting):
            return None
        plan = StepPlan()
        self._sched, self._budget = {}, self.token_budget
        running = self.running
        decoding = [r for r in running if not r.prefill_pending]
        if decoding and not self._reserve_decodes(decoding):
            for req in decoding:  # blocks are short: one at a time, preempting as needed
                if req.status is Status.RUNNING and self._reserve(req, 1, now, plan):
                    self._take(req, 1)
        if len(decoding) < len(running):
            for req in list(running):  # a snapshot: victims leave self.running mid-loop
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

        if not self._sched:
            return None  # nothing admissible; the arrival checks make this unreachable with an idle engine
        plan.scheduled = list(self._sched.items())
        for req, n in plan.scheduled:
            if req.prefill_pending:
                plan.prefill_tokens += n
            else:
                plan.decode_seqs += 1
        return plan

    def _reserve_decodes(self, decoding: list[Request]) -> bool:
        """Every decode's next block at once, if free blocks cover them all (the common case).

        When they do, reserving one request at a time would succeed for each without preempting
        anyone, so the outcome is the same; when they do not, nothing is taken and the caller goes
        one request at a time.
        """
        bs = self.kv.block_size
        extra = [(r.num_computed_tokens + bs) // bs - r.blocks for r in decoding]
        if not self.kv.device.allocate(sum(e for e in extra if e > 0)):
            return False
        for req, e in zip(decoding, extra, strict=True):
            if e > 0:
                req.blocks += e
        self._sched = dict.fromkeys(decoding, 1)
        self._budget -= len(decoding)
        return True

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
        """Priority's teeth: preempt the worst running request if its priority is strictly worse.

        Keys end with the arrival tie-breaker, which is left out here: two requests of equal
        (aged) priority must not evict each other, or they would take turns forever.
        """
        level = self._waiting_key(req)[:-1]
        worse = [r for r in self.running if self._waiting_key(r)[:-1] > level and self._eligible(r)]
        if not worse:
            return False
        self._preempt(max(worse, key=self._victim_key), now, plan)
        return True

    # ---------------------------------------------------------------- fast-forward
    def repeatable_steps(self, plan: StepPlan, step: int) -> int:
        """A pure-decode plan repeats until a request finishes or the next block cannot be had.

        Nothing else can change it: admission was impossible at this plan and stays so (the running
        set is fixed, free blocks only shrink, the budget left is constant, policy keys are static);
        only an arrival can change WAITING, and the engine cuts the run when one comes.
        """
        running = self.running
        if (plan.prefill_tokens or plan.num_admitted or plan.num_preempted or plan.swap_blocks
                or plan.decode_seqs != len(running)):
            return 1
        previous = step - 1
        k = running[0].output_tokens
        for r in running:
            if r.last_token_step != previous:
                return 1
            left = r.output_tokens - r.num_generated
            if left < k:
                k = left
        if k <= 1:
            return 1
        self._waiting_at_plan = len(self.waiting)
        bs = self.kv.block_size
        # Step j of the run computes token c + j; the reserved blocks hold `slack` of them.
        self._slack = np.array([r.blocks * bs - r.num_computed_tokens for r in running], dtype=np.int64)
        free = self.kv.device.num_free
        if self._extra_blocks(k) <= free:
            return k
        lo, hi = 1, k  # step lo is feasible, step hi is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._extra_blocks(mid) <= free else (lo, mid)
        return lo

    def plan_survives_arrivals(self) -> bool:
        """New arrivals cannot be admitted mid-run when every slot is taken, or, under FCFS, when an
        older request already waits at the head (it could not be admitted and, with blocks only
        shrinking, still cannot). Priority may evict for a newcomer, so it always replans."""
        if self.evicts_for_priority:
            return False
        return len(self.running) >= self.max_num_seqs or (self._fifo and self._waiting_at_plan > 0)

    def _extra_blocks(self, j: int) -> int:
        """Blocks beyond the current reservation that the running set holds during step j of the run."""
        return int(np.maximum(0, -((self._slack - j) // self.kv.block_size)).sum())

    def kv_blocks_during(self, i: int) -> int:
        return self.kv.device.num_used + self._extra_blocks(i)

    def kv_blocks_sum(self, n: int) -> int:
        # sum_{i=1..n} ceil(max(0, i - s) / bs) = G(n - s) with G(x) = sum_{i=1..x} ceil(i / bs).
        if n == 0:
            return 0
        bs = self.kv.block_size
        x = n - self._slack
        np.maximum(x, 0, out=x)
        q = x // bs
        extra = int((bs * q * (q + 1) // 2 + (x - q * bs) * (q + 1)).sum())
        return n * self.kv.device.num_used + extra

    def finish_steps(self, plan: StepPlan, n: int, end_s: float, step: int) -> StepOutcome:
        if n == 1:
            return self.finish_step(plan, end_s, step)
        outcome = StepOutcome([], n * plan.decode_seqs, [])
        last, bs = step + n - 1, self.kv.block_size
        grown = 0  # blocks taken during the run: repeatable_steps checked that they were free
        for req in self.running:
            req.num_computed_tokens += n
            req.num_generated += n
            req.last_token_s = end_s
            req.last_token_step = last
            blocks = (req.num_computed_tokens + bs - 1) // bs
            grown += blocks - req.blocks
            req.blocks = blocks
        taken = self.kv.device.allocate(grown)
        assert taken, "a run of steps took blocks that were not free"
        for req in self.running:
            if req.num_generated >= req.output_tokens:
                self._retire(req, end_s)
                outcome.finished.append(req)
        if outcome.finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        return outcome

    # ---------------------------------------------------------------- execution
    def finish_step(self, plan: StepPlan, end_s: float, step: int) -> StepOutcome:
        outcome = StepOutcome([], 0, [])
        for req, n in plan.scheduled:
            req.num_computed_tokens += n
            if req.num_computed_tokens < req.prompt_tokens + req.num_generated:
                continue  # a prefill chunk with more to come
            req.prefill_pending = False
            self._emit_token(req, end_s, step, outcome)
            if req.num_generated >= req.output_tokens:
                self._retire(req, end_s)
                outcome.finished.append(req)
        if outcome.finished:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        return outcome
