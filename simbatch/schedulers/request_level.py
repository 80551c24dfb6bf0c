"""Static and dynamic batching: request-level scheduling, one decision per batch.

A batch of up to ``max_num_seqs`` requests is formed, prefilled together, and decoded step by step
until its longest request is done; only then is the next batch formed. Membership is frozen. The two
modes, both this class, differ only in *when* a batch forms: in their declared ``batch_timer``
(:mod:`simbatch.registry.modes`):

- ``static`` waits for a full batch; with ``max_wait_ms`` it starts a partial one once the oldest
  waiting request has waited that long. Without ``max_wait_ms`` it would wait forever once arrivals
  end, so then it flushes what is left (a modelling necessity; a timer needs no such help).
- ``dynamic`` (Triton's dynamic batcher) dispatches on a full batch or once the oldest waiting request
  has waited ``max_queue_delay_ms``.

The three leaks of request-level batching show in the iteration records:

1. *tail idling*: a request that is done keeps its slot, which is still computed (``padded_tokens``,
   charged at beta each), until the longest request of the batch ends;
2. *head-of-line blocking*: an arrival waits for the whole running batch to drain (``queue_s``);
3. *padding*: with ``pad_prompts`` every prompt is padded to the batch's longest, and pad tokens cost
   like real ones.

Tokens stream as they are generated: a request's first token comes after the batch prefill, and it
finishes at its own last token; its slot and its memory stay with the batch until the batch ends.
Memory is reserved at dispatch for the padded footprint: every slot holds the longest prompt plus the
longest output, so no batch ever runs short of blocks mid-way.
"""

from __future__ import annotations

from collections import deque

from simbatch.config import Scenario
from simbatch.memory.blocks import peak_kv_tokens
from simbatch.memory.kv import KVCacheManager
from simbatch.model.request import Request, Status
from simbatch.model.step import IDLE, Answer, SleepUntil, StepOutcome, StepPlan
from simbatch.registry import MODES
from simbatch.schedulers.base import BaseScheduler
from simbatch.schedulers.policies import WaitingQueue


class RequestLevelScheduler(BaseScheduler):
    __slots__ = ("max_batch_size", "pad", "head_of_line_blocking", "max_wait_s", "batch", "_prefilled", "_rows_tokens",
                 "_arrivals")

    def __init__(self, scenario: Scenario, kv: KVCacheManager, waiting: WaitingQueue):
        super().__init__(scenario, kv, waiting)
        b = scenario.batching
        self.max_batch_size = b.max_num_seqs
        self.pad = b.pad_prompts
        self.head_of_line_blocking = scenario.scheduler.head_of_line_blocking
        # When a partial batch starts, after its oldest request has waited: the mode's timer (None: never).
        self.max_wait_s: float | None = MODES[b.mode].timer_s(b)
        self.batch: list[Request] = []  # every slot of the current batch, done or not
        self._prefilled = False
        self._rows_tokens = 0  # the batch's (padded) prompt tokens, summed over its rows
        # Arrival order of waiting requests, for the "oldest has waited" timer whatever the policy.
        self._arrivals: deque[Request] = deque()

    def add(self, req: Request, now: float) -> None:
        BaseScheduler.add(self, req, now)  # (named, not super(): this runs per request)
        self._arrivals.append(req)

    def _oldest_waiting_since(self) -> float:
        while self._arrivals[0].status is not Status.WAITING:
            self._arrivals.popleft()
        return self._arrivals[0].waiting_since_s

    def _footprint(self, prompts: list[int], outputs_max: int) -> int:
        """Blocks a batch reserves: every slot grows to its (padded) prompt plus the longest output."""
        if self.pad:
            return len(prompts) * self.kv.blocks_for(peak_kv_tokens(max(prompts), outputs_max))
        return sum(self.kv.blocks_for(peak_kv_tokens(p, outputs_max)) for p in prompts)

    # ---------------------------------------------------------------- planning
    def schedule(self, now: float) -> Answer:
        if not self.batch:
            n = len(self.waiting)
            if n == 0:
                return IDLE
            if n < self.max_batch_size:
                if self.max_wait_s is None:
                    if not self.closed:
                        return IDLE
                    # A batcher that waits for a full batch would wait forever once arrivals end.
                else:
                    due = self._oldest_waiting_since() + self.max_wait_s
                    if due > now:
                        return SleepUntil(due)
            self._form_batch(now)
        return self._next_step()

    def _form_batch(self, now: float) -> None:
        """Take requests in policy order while the padded footprint fits in free blocks; one that
        does not fit ends the batch, or, without head-of-line blocking, is passed over, as is one the
        mode does not let join (:meth:`joins`)."""
        prompts: list[int] = []
        o_max = blocks = 0
        passed_over: list[Request] = []
        while len(self.waiting) and len(self.batch) < self.max_batch_size:
            req = self.waiting.peek()
            if not self.joins(req):
                passed_over.append(self.waiting.pop())
                continue
            need = self._footprint([*prompts, req.prompt_tokens], max(o_max, req.output_tokens))
            if need > self.kv.device.num_free:
                if self.head_of_line_blocking:
                    break
                passed_over.append(self.waiting.pop())
                continue
            prompts.append(req.prompt_tokens)
            o_max = max(o_max, req.output_tokens)
            blocks = need
            self.waiting.pop()
            self._admit(req, now)
            self.batch.append(req)
        for req in passed_over:
            self.waiting.push(req)
        reserved = self.kv.reserve_batch(self.batch, blocks)
        assert reserved, "a batch was formed beyond the free blocks"
        self._prefilled = False

    def joins(self, req: Request) -> bool:
        """Whether ``req``, next in policy order, may join the batch being formed (``self.batch``, its
        members so far); one that may not is passed over and stays waiting. Every request may here: a
        mode of request-level batching that forms batches otherwise (by prompt length, by tenant)
        overrides this (docs/extending.md)."""
        return True

    def _next_step(self) -> StepPlan:
        """The batch prefill, then its decode steps.

        What a step reads (``kv_tokens``) and its prefill attention follow the batch as the GPU
        computes it: every slot, done or not, is a row of the batch, and with ``pad_prompts`` every
        row is as long as the longest prompt. So a padded prefill attends over ``p_max`` tokens in
        every row, and decode step ``t`` (from 1) reads ``p + t - 1`` cached tokens in every slot,
        ``p`` its (padded) prompt: a done slot still grows, as its reserved blocks do.
        """
        plan = StepPlan()
        batch = self.batch
        if not self._prefilled:
            plan.slices = [(req, req.prompt_tokens) for req in batch]
            plan.prefill_tokens = sum(req.prompt_tokens for req in batch)
            if self.pad:  # every row as long as the longest prompt
                p_max = max(r.prompt_tokens for r in batch)
                plan.padded_prefill_tokens = len(batch) * p_max - plan.prefill_tokens
                plan.attention_pairs_x2 = len(batch) * p_max * p_max  # c (2k + c) a row, nothing cached yet
                self._rows_tokens = len(batch) * p_max
            else:
                plan.attention_pairs_x2 = sum(req.prompt_tokens ** 2 for req in batch)
                self._rows_tokens = plan.prefill_tokens
            plan.admitted = batch.copy()  # the batch was formed for this step: every member admitted now
            return plan
        plan.slices = [(req, 1) for req in batch if req.status is Status.RUNNING]
        plan.decode_seqs = len(plan.slices)
        plan.padded_decode_seqs = len(batch) - plan.decode_seqs
        steps_since_prefill = plan.slices[0][0].num_generated - 1
        plan.kv_tokens = self._rows_tokens + len(batch) * steps_since_prefill
        return plan

    # ---------------------------------------------------------------- execution
    def finish_step(self, plan: StepPlan, end_s: float, step: int) -> StepOutcome:
        outcome = StepOutcome([], 0, [])
        self._prefilled = True
        for req, n in plan.slices:
            self.kv.computed(req, n)
            req.prefill_pending = False
        self._emit_tokens([req for req, _ in plan.slices], end_s, step, outcome)
        return self._settle(end_s, outcome)

    def _settle(self, end_s: float, outcome: StepOutcome) -> StepOutcome:
        """Done requests finish (keeping their slots); the batch ends when none is left running."""
        for req in self.running:
            if req.num_generated >= req.output_tokens:  # (done, written out: this runs per request per step)
                req.status = Status.FINISHED
                req.finish_s = end_s
                self.waiting.on_release(req)
                outcome.finished.append(req)
        if outcome.finished:
            self.running = {r: None for r in self.running if r.status is Status.RUNNING}
        if not self.running:
            self._end_batch()
        return outcome

    def _end_batch(self) -> None:
        """The longest request is done: the batch ends and its slots and memory come back."""
        self.kv.release_batch(self.batch)
        self.batch = []

    def _block_holders(self) -> list[Request]:
        return self.batch  # done requests keep their slot's memory until the batch ends


MODES.attach("static", scheduler=RequestLevelScheduler)
MODES.attach("dynamic", scheduler=RequestLevelScheduler)
