"""Continuous batching: iteration-level scheduling, one token budget per step.

Every step the running set is chosen afresh (Orca), and each request gets a slice of one budget of
``max_num_batched_tokens`` (vLLM V1):

1. **Decodes first.** Every running request that is decoding gets its one token, and one more KV
   block if it crosses a block boundary, in running (admission) order. If blocks are short, a victim
   is preempted and the allocation retried. Victims rank below the requester
   (:mod:`simbatch.schedulers.policies`: the newest admitted, or the worst priority), so never the request
   itself, and never one that outranks it: two requests short of memory cannot take turns evicting
   each other, the higher-ranked one always progresses. With no such victim the request stalls this
   step, keeping its blocks.
2. **Prefill chunks** of running requests fill what remains of the budget.
3. **Admissions**: waiting requests, in policy order, while the budget, ``max_num_seqs`` and free
   blocks allow; the first that does not fit stops admission (no overtaking), or, with
   ``scheduler.head_of_line_blocking: false``, is passed over so that later ones may fit (first-fit
   backfilling). No admissions happen in a step that preempted (the victim would be re-admitted at
   once, its work discarded), unless the preemptions left nothing running. Under a policy that
   declares ``evicts_at_admission`` (``priority``) a waiting request may evict a running one of
   strictly worse level.

Finished requests retire at the end of the step, releasing their blocks in running (admission)
order; the blocks are free for the very next step.

Serving features (:mod:`simbatch.features`) act at the points where vLLM's scheduler lets its KV
cache manager and its KV connector act, through hooks called only when an enabled feature defines
them:

- rule 1: a decode's tokens beyond its own (``decode_tokens``: speculative decoding's drafts, with
  blocks for all of them; at the end of the step ``applied`` says how many it keeps);
- rule 3, the head of WAITING: a request whose KV comes from elsewhere (``receives``: a
  disaggregated decode replica's) is held when a slot and the blocks of its KV are free, with no
  budget (it computes nothing yet), its transfer started (``receiving``); when it is delivered it
  joins the running set at the next plan, as a decode, its slot counted from the hold on;
- rule 3, a request with nothing computed: the tokens it starts from, computed already (``lookup``,
  then ``take_cached`` if it fits: prefix caching's hits);
- the end of a step: a prefill chunk computed (``prefill_computed``: its full blocks join the prefix
  cache); a first token sampled with more to come (``hands_off``: a prefill replica's request leaves,
  its blocks kept until its KV has been sent).

Chunking: with ``enable_chunked_prefill`` a prompt is split into slices of at most the remaining
budget (and ``long_prefill_token_threshold``). Without it a prompt must fit whole into what is left
of the budget (prompts larger than the budget are rejected at arrival); a recompute after preemption,
which can exceed the budget, is still split so a preempted request can always return.

This class is the model: it schedules every request one at a time, exactly as written above, and the
reference engine (``sim.fast_forward: false``) runs it. :class:`~simbatch.engine.accel.lockstep.LockstepScheduler`
is its accelerated twin, which must plan the very same steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from simbatch.config import Scenario
from simbatch.features import defining, features_for, hooks
from simbatch.memory.blocks import blocks_for
from simbatch.memory.kv import KVCacheManager
from simbatch.model.request import FINISHED, RUNNING, WAITING, Request
from simbatch.model.step import IDLE, Idle, StepOutcome, StepPlan
from simbatch.registry import MODES, POLICIES
from simbatch.schedulers.base import BaseScheduler
from simbatch.schedulers.policies import WaitingQueue, victim_key, waiting_key


def _admission_order(req: Request) -> int:
    return req.admitted_seq


def _arrival_order(req: Request) -> int:
    return req.request_id


class ContinuousScheduler(BaseScheduler):
    # (And a dict: ``schedule`` and ``add`` may be bound per instance, see __init__.)
    __slots__ = ("token_budget", "max_num_seqs", "chunked", "chunk_cap", "swap", "max_preemptions",
                 "evicts_at_admission", "victims_by_admission", "head_of_line_blocking", "_victim_key",
                 "_waiting_key", "features", "repeatable", "_decode_tokens", "_applied", "_admits", "_admitted",
                 "_left", "_receives", "_receiving", "_prefill_computed", "_hands_off", "_cache", "_sched", "_budget",
                 "_prefilling", "_sending", "_incoming", "_delivered", "async_scheduling", "_arrived", "_unseen",
                 "_done_last_step", "_done_held", "_stepping", "__dict__")

    def __init__(self, scenario: Scenario, kv: KVCacheManager, waiting: WaitingQueue):
        super().__init__(scenario, kv, waiting)
        b, s = scenario.batching, scenario.scheduler
        self.token_budget = b.max_num_batched_tokens
        self.max_num_seqs = b.max_num_seqs
        self.chunked = b.enable_chunked_prefill
        # No threshold: a chunk is capped by the budget alone, which never exceeds this.
        self.chunk_cap = b.long_prefill_token_threshold or b.max_num_batched_tokens
        self.swap = s.preemption == "swap"
        self.max_preemptions = s.max_preemptions
        # What the queue policy declares (simbatch.registry.policies), read once.
        policy = POLICIES[s.policy]
        self.evicts_at_admission = policy.evicts_at_admission
        self.victims_by_admission = policy.victim_key is None
        self.head_of_line_blocking = s.head_of_line_blocking
        self._victim_key = victim_key(s)
        self._waiting_key = waiting_key(s)
        # The serving features this replica runs (simbatch.features), and the hooks they define.
        self.features = features_for(scenario)
        self.repeatable = all(f.repeatable for f in self.features)
        for f in self.features:
            f.kv = kv
        self._decode_tokens = hooks(self.features, "decode_tokens")
        self._applied = hooks(self.features, "applied")
        self._admits = hooks(self.features, "admits")
        self._admitted = hooks(self.features, "admitted")
        self._left = hooks(self.features, "left")
        self._receives = hooks(self.features, "receives")
        self._receiving = hooks(self.features, "receiving")
        self._prefill_computed = hooks(self.features, "prefill_computed")
        self._hands_off = hooks(self.features, "hands_off")
        # The feature that gives requests computed tokens at admission (lookup, take_cached), if any.
        cache = defining(self.features, "lookup")
        if len(cache) > 1:
            raise ValueError(f"features {', '.join(f.name for f in cache)} all give requests cached tokens "
                             "at admission (lookup): turn on one of them")
        self._cache = cache[0] if cache else None
        # Planning state of the step being built.
        self._sched: dict[Request, int] = {}
        self._budget = 0
        # Running requests with a prefill pending, in running (admission) order.
        self._prefilling: dict[Request, None] = {}
        # KV that moves between replicas (a feature's receives and hands_off: disaggregated pools).
        # Requests that left at their first token, their blocks kept until their KV has been sent
        # (``_sending``); requests held while their KV comes (``_incoming``), and those whose KV has
        # come, which join the running set at the next plan (``_delivered``).
        self._sending: dict[Request, None] = {}
        self._incoming: dict[Request, None] = {}
        self._delivered: list[Request] = []
        # Async scheduling (scheduler.async_scheduling; see schedule): requests that arrived since the
        # last plan, and during the step before it (the next plan is the first to see them); requests
        # that finished at the end of the last step, and of the step before (slots and blocks held
        # through this plan); whether a step has been in flight since the last plan (not after idling).
        self.async_scheduling = s.async_scheduling
        self._arrived: list[Request] = []
        self._unseen: list[Request] = []
        self._done_last_step: list[Request] = []
        self._done_held: list[Request] = []
        self._stepping = False
        if not self.async_scheduling:
            # What schedule and add come down to, without a call per plan and per arrival in between.
            self.schedule = self._plan
            self.add = super().add

    # ---------------------------------------------------------------- the engine's cadence
    def add(self, req: Request, now: float) -> None:
        if not self.async_scheduling:
            super().add(req, now)
            return
        req.status = WAITING  # in the server, not yet seen by the scheduler (schedule)
        req.waiting_since_s = now
        self._arrived.append(req)

    def schedule(self, now: float) -> StepPlan | Idle:
        """Plan the next step.

        With async scheduling (vLLM's default) the engine plans step k+1 as soon as step k is launched,
        before step k ends: this plan, made here at the end of step k, is the one vLLM made at its start.
        So it does not see the requests that arrived during step k (they wait for the next plan, and
        run in step k+2), and the requests that finished in step k still hold their slots and blocks
        (vLLM frees them when step k's outputs come back, after planning step k+1). An engine with
        nothing to run launches nothing and plans again when the outputs are in: so when this plan
        would be empty, or the engine was idle, the scheduler catches up and plans on everything.
        """
        if not self.async_scheduling:
            return self._plan(now)
        if self._stepping:
            self._release_done(self._done_held)
            self._done_held, self._done_last_step = self._done_last_step, []
            for req in self._unseen:
                self.waiting.push(req)
            self._unseen, self._arrived = self._arrived, []
            plan = self._plan(now)
            if plan is IDLE and (self._unseen or self._done_held):
                self._catch_up()
                plan = self._plan(now)
        else:
            self._catch_up()
            plan = self._plan(now)
        self._stepping = plan is not IDLE
        return plan

    def _catch_up(self) -> None:
        """Async scheduling: see every arrival and free every finished request now."""
        self._release_done(self._done_held)
        self._release_done(self._done_last_step)
        self._done_held, self._done_last_step = [], []
        for req in (*self._unseen, *self._arrived):
            self.waiting.push(req)
        self._unseen, self._arrived = [], []

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self._arrived) + len(self._unseen)

    # ---------------------------------------------------------------- planning
    def _plan(self, now: float, admit: bool = True) -> StepPlan | Idle:
        """Plan the next step on the requests the scheduler sees; ``admit=False`` plans it without
        admissions (see ``_replan``)."""
        if self._delivered:
            self._join_delivered()
        running, prefilling = self.running, self._prefilling
        if not running and not len(self.waiting):
            return IDLE
        plan = StepPlan()
        self._sched, self._budget = {}, self.token_budget
        if len(running) > len(prefilling):
            self._schedule_decodes(now, plan)
        if prefilling:
            for req in list(prefilling):  # a snapshot: victims leave mid-loop
                if req in prefilling:
                    n = self._chunk(req)
                    if n and self._reserve(req, n, now, plan):
                        self._take(req, n)
        if admit and not plan.preempted and len(self.waiting):
            self._admit_waiting(now, plan)

        if not self._assemble(plan):
            if not running:
                return IDLE  # nothing admissible; the arrival checks make this unreachable with an idle engine
            # Every running request stalled on memory with every victim protected by max_preemptions:
            # the cap yields to progress, or the engine would wait forever.
            self._preempt(max(running, key=self._victim_key), now, plan)
            return self._replan(now, plan)
        return plan

    def _assemble(self, plan: StepPlan) -> bool:
        """Put what the rules scheduled into ``plan``, with the work it costs; False if nothing was.

        One-token decodes go in ``plan.decodes``, in scheduling order; prefill chunks and speculative
        decodes (a token and its drafts) in ``plan.slices``.
        """
        sched = self._sched
        if not sched:
            return False
        decodes, slices, extended, kv_tokens = [], [], 0, 0
        for req, n in sched.items():
            k = req.num_computed_tokens  # the cached context this slice reads
            kv_tokens += k
            if req.prefill_pending:
                slices.append((req, n))
                plan.prefill_tokens += n
                plan.attention_pairs_x2 += n * (2 * k + n)
            elif n == 1:
                decodes.append(req)
            else:  # a decode and n - 1 extra tokens (speculative decoding's drafts)
                slices.append((req, n))
                plan.draft_tokens += n - 1
                extended += 1
        plan.decodes, plan.slices = decodes, slices
        plan.decode_seqs = len(decodes) + extended
        plan.kv_tokens += kv_tokens
        return True

    def _schedule_decodes(self, now: float, plan: StepPlan) -> None:
        """Rule 1: each decoding request, in running order, its token and the block it may need.

        A feature may give it tokens beyond its own (``decode_tokens``: speculative decoding's drafts),
        always leaving one token of the budget for each decode after it."""
        extra = self._decode_tokens
        after = len(self.running) - len(self._prefilling) if extra else 0  # decodes not yet planned
        sched, allocate_slots = self._sched, self.kv.allocate_slots
        for req in list(self.running):  # a snapshot: victims leave mid-loop
            if req.status is not RUNNING or req.prefill_pending:
                continue  # preempted earlier in this loop, or prefilling (rule 2)
            n = 1
            if after:
                after -= 1
                for more in extra:
                    n += more(req, self._budget - n - after)
            sched[req] = n  # (_take and _reserve written out: this runs per decode per step)
            self._budget -= n
            if allocate_slots(req, n) is None and not self._reserve(req, n, now, plan):
                self._budget += sched.pop(req)  # stalls, keeping its blocks

    def _replan(self, now: float, carried: StepPlan) -> StepPlan | Idle:
        """Plan again after a forced preemption. The step preempted, so it admits nobody (its victim
        would come straight back, its work discarded), unless nothing is left running: an engine with
        work waiting must not idle."""
        plan = self._plan(now, admit=not self.running)
        if plan is not IDLE:
            # Its preemptions came first; it admitted nobody (it scheduled nothing), so the order holds.
            plan.preempted = [*carried.preempted, *plan.preempted]
            plan.swap_blocks += carried.swap_blocks
        return plan

    def _take(self, req: Request, n: int) -> None:
        self._sched[req] = n
        self._budget -= n

    def _chunk(self, req: Request, cached_tokens: int = 0) -> int:
        """Tokens ``req`` may compute this step, given what is left of the budget (and, for a request
        about to be admitted on a prefix-cache hit, the ``cached_tokens`` it will not compute)."""
        if not req.prefill_pending:
            return 1 if self._budget >= 1 else 0
        # Its known tokens not yet in the KV cache, and not among the cached ones.
        remaining = req.prompt_tokens + req.num_generated - req.num_computed_tokens - cached_tokens
        budget = self._budget
        if self.chunked or req.num_generated > 0:  # recompute is always splittable
            n = remaining if remaining < budget else budget  # min(remaining, budget, chunk_cap), written out
            return n if n < self.chunk_cap else self.chunk_cap
        return remaining if remaining <= budget else 0

    def _reserve(self, req: Request, n: int, now: float, plan: StepPlan) -> bool:
        """Blocks for ``req`` to compute ``n`` more tokens, preempting others if needed."""
        while self.kv.allocate_slots(req, n) is None:
            victim = self._pick_victim(exclude=req)
            if victim is None:
                return False
            self._preempt(victim, now, plan)
        return True

    def _eligible(self, req: Request) -> bool:
        return self.max_preemptions is None or req.num_preemptions < self.max_preemptions

    def _pick_victim(self, exclude: Request) -> Request | None:
        """The lowest-ranked running request below ``exclude`` (the requester), if any."""
        if self.victims_by_admission:
            # Ranked by admission, and RUNNING is kept in admission order: look from the end.
            for r in reversed(self.running):
                if r.admitted_seq <= exclude.admitted_seq:
                    return None
                if self._eligible(r):
                    return r
            return None
        rank = self._victim_key(exclude)
        candidates = [r for r in self.running if self._victim_key(r) > rank and self._eligible(r)]
        return max(candidates, key=self._victim_key) if candidates else None

    def _preempt(self, victim: Request, now: float, plan: StepPlan) -> None:
        """RUNNING -> WAITING, with its KV swapped to the host if possible, else dropped for recompute."""
        del self.running[victim]
        self._prefilling.pop(victim, None)
        for hook in self._left:
            hook(victim)
        if victim in self._sched:
            self._budget += self._sched.pop(victim)
        self.waiting.on_release(victim)
        held, computed = victim.blocks, victim.num_computed_tokens
        swapped = self.swap and self.kv.swap_out(victim)
        if swapped:
            plan.swap_blocks += victim.swapped_blocks
        else:
            self.kv.recompute(victim)
            victim.prefill_pending = True
        victim.num_preemptions += 1
        self.num_preemptions += 1
        plan.preempt(victim, swapped, held, computed)
        victim.status = WAITING
        victim.waiting_since_s = now
        self.waiting.push(victim)

    def _admit_waiting(self, now: float, plan: StepPlan) -> None:
        """Rule 3: admit waiting requests in policy order while they fit.

        A request that does not fit (no slot, too few blocks, or, unchunked, too little budget for its
        prompt) stops admission; without head-of-line blocking it is passed over instead, and the
        scan goes on while a slot, a free block and some budget remain.
        """
        waiting, kv, cache = self.waiting, self.kv, self._cache
        passed_over: list[Request] | None = None
        seats = self._seats_taken()  # counted on as this loop takes them, and again if it evicts
        while self._budget > 0:
            req = waiting.peek()
            if req is None:
                break
            full = seats >= self.max_num_seqs
            if self._receives and self._remote(req):
                # Its KV comes whole from elsewhere: it needs the blocks and a slot, no budget.
                # First come, first served: the head waits for room, and nobody overtakes it.
                if full or blocks_for(req.num_computed_tokens, kv.block_size) > kv.device.num_free:
                    break
                self._hold(waiting.pop(), now)
                seats += 1
                continue
            if self._admits and not full and not all(ok(req) for ok in self._admits):
                # A feature's rule refuses it this step (max_loras): vLLM skips it, whatever the policy.
                if passed_over is None:
                    passed_over = []
                passed_over.append(waiting.pop())
                continue
            # A request with nothing computed may start from tokens a feature has (prefix caching's hits).
            cached = cache.lookup(req) if cache is not None and not req.num_computed_tokens and \
                not req.host_block_ids else 0
            n = self._chunk(req, cached)
            if n == 0 or full or not (
                    cache.take_cached(req, n) if cached else
                    -(-(req.num_computed_tokens + n) // kv.block_size) <= kv.device.num_free):  # blocks_for(...)
                if n and self.evicts_at_admission and self._evict_for(req, now, plan):
                    seats = self._seats_taken()
                    continue
                if self.head_of_line_blocking or full or not kv.device.num_free:
                    break
                if passed_over is None:
                    passed_over = []
                passed_over.append(waiting.pop())
                continue
            waiting.pop()
            if req.host_block_ids:  # (swapped out: swapped_blocks, read without the property's call)
                plan.swap_blocks += req.swapped_blocks
                # Cannot fail: the swapped blocks hold its computed tokens, fewer than the check counted.
                swapped_in = kv.swap_in(req)
                assert swapped_in, "a swapped request was admitted without room for its blocks"
            kv.allocate_slots(req, n)
            self._admit(req, now)
            if req.prefill_pending:
                self._prefilling[req] = None
            plan.admit(req)
            self._sched[req] = n  # (_take, written out: this runs per admission)
            self._budget -= n
            seats += 1
            for hook in self._admitted:
                hook(req)
        if passed_over:
            for req in passed_over:  # back in their places: their keys are unchanged
                waiting.push(req)

    # ---------------------------------------------------------------- KV that moves between replicas
    def _seats_taken(self) -> int:
        """Running requests, those whose KV is on its way here (each has its slot reserved), and, with
        async scheduling, those that finished in the last step (their slots are freed after this plan)."""
        seats = len(self.running)
        if self._incoming or self._delivered or self._done_held or self._done_last_step:  # (most runs: none)
            seats += len(self._incoming) + len(self._delivered) + len(self._done_held) + len(self._done_last_step)
        return seats

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self._incoming) + len(self._delivered)

    def in_system(self) -> list[Request]:
        return [*self.running, *self.waiting, *self._incoming, *self._delivered, *self._arrived, *self._unseen]

    def _remote(self, req: Request) -> bool:
        return any(receives(req) for receives in self._receives)

    def _hold(self, req: Request, now: float) -> None:
        """Reserve the blocks of ``req``'s remote KV, and tell the features: its transfer starts now."""
        self.kv.allocate_slots(req, 0)
        req.status = RUNNING  # it holds device blocks, though it computes nothing until delivered
        req.waiting_s += now - req.waiting_since_s
        self.waiting.on_admit(req)
        self._incoming[req] = None
        for receiving in self._receiving:
            receiving(req)

    def deliver(self, req: Request) -> None:
        """``req``'s KV has arrived (vLLM: the connector's ``finished_recving``): it decodes from the
        next step on."""
        del self._incoming[req]
        req.remote_kv = False
        self._delivered.append(req)

    def _join_delivered(self) -> None:
        """The requests delivered since the last plan join the running set, by arrival order."""
        for req in sorted(self._delivered, key=_arrival_order):
            req.admitted_seq = self._admissions
            self._admissions += 1
            self.running[req] = None
        self._delivered = []

    def _send(self, req: Request) -> None:
        """``req`` is handed off at its first token: it leaves, its blocks held for the transfer."""
        req.status = FINISHED
        self.waiting.on_release(req)
        del self.running[req]
        self._sending[req] = None
        for hook in self._left:
            hook(req)

    def release_sent(self, req: Request) -> None:
        """``req``'s KV has left for good (vLLM: the connector's ``finished_sending``): free its blocks here."""
        del self._sending[req]
        self.kv.release(req)

    def _block_holders(self) -> list[Request]:
        return [*self.running, *self._sending, *self._incoming, *self._delivered, *self._done_held,
                *self._done_last_step]

    def _evict_for(self, req: Request, now: float, plan: StepPlan) -> bool:
        """Eviction at admission (priority's teeth): preempt the worst running request if its level is
        strictly worse.

        Keys end with the arrival tie-breaker, which is left out here: two requests of equal
        (aged) priority must not evict each other, or they would take turns forever.
        """
        level = self._waiting_key(req)[:-1]
        worse = [r for r in self.running if self._waiting_key(r)[:-1] > level and self._eligible(r)]
        if not worse:
            return False
        self._preempt(max(worse, key=self._victim_key), now, plan)
        return True

    # ---------------------------------------------------------------- execution
    def finish_step(self, plan: StepPlan, end_s: float, step: int) -> StepOutcome:
        outcome = StepOutcome([], 0, [])
        self._apply_decodes(plan.decodes, end_s, step, outcome)
        if plan.slices:
            self._apply_slices(plan, end_s, step, outcome)
        if outcome.finished:
            self._drop_finished(outcome.finished)
        return outcome

    def _apply_decodes(self, decodes: Sequence[Request], end_s: float, step: int, outcome: StepOutcome) -> None:
        """Each one-token decode computes its token and samples the next."""
        self.kv.computed_each(decodes)
        self._emit_tokens(decodes, end_s, step, outcome)
        self._after_sampling(decodes, end_s, outcome)

    def _apply_slices(self, plan: StepPlan, end_s: float, step: int, outcome: StepOutcome) -> None:
        """Each prefill chunk and speculative decode computes its tokens; one that caught up samples."""
        prefill_computed = self._prefill_computed
        for req, n in plan.slices:
            emitted = 1
            if not req.prefill_pending:  # a decode and n - 1 extra tokens: the features say what it keeps
                for keep in self._applied:
                    n = keep(req, n)
                emitted = n
            self.kv.computed(req, n)
            if prefill_computed and req.prefill_pending:
                for hook in prefill_computed:
                    hook(req)
            if req.num_computed_tokens < req.prompt_tokens + req.num_generated:
                continue  # a prefill chunk with more to come
            if req.prefill_pending:
                req.prefill_pending = False
                del self._prefilling[req]
            self._emit_tokens((req,), end_s, step, outcome, emitted)
            self._after_sampling((req,), end_s, outcome)

    def _after_sampling(self, reqs: Sequence[Request], end_s: float, outcome: StepOutcome) -> None:
        """Requests that caught up and sampled: each is done, handed off, or decodes on (rule 4)."""
        finished, hands_off = outcome.finished, self._hands_off
        for req in reqs:
            if req.num_generated >= req.output_tokens:
                self._retire(req, end_s)
                finished.append(req)
            elif hands_off and req.num_generated == 1 and self._handed_off(req):
                self._send(req)  # decoded elsewhere

    def _handed_off(self, req: Request) -> bool:
        return any(hands_off(req) for hands_off in self._hands_off)

    def _retire(self, req: Request, end_s: float) -> None:
        BaseScheduler._retire(self, req, end_s)  # (named, not super(): this runs per request)
        for hook in self._left:
            hook(req)

    def _drop_finished(self, finished: list[Request]) -> None:
        """Take the step's finished requests out of the running set and release them (with async
        scheduling, after the next plan: see ``schedule``)."""
        if self.async_scheduling:
            self._done_last_step += finished
        else:
            self._release_done(finished)
        running = self.running
        for req in finished:
            del running[req]

    def _release_done(self, finished: list[Request]) -> None:
        """Free the blocks of one step's finished requests, in running (admission) order as vLLM frees them:
        with prefix caching the order their blocks join the free queue decides what is evicted first
        (without it, which blocks are reused is seen nowhere, and the order is left as it comes)."""
        release = self.kv.release
        for req in sorted(finished, key=_admission_order) if len(finished) > 1 and self.kv.caching else finished:
            release(req)

    def check_invariants(self) -> None:
        super().check_invariants()
        assert list(self._prefilling) == [r for r in self.running if r.prefill_pending], "prefilling set drifted"
        unseen = [*self._arrived, *self._unseen]
        assert all(r.status is WAITING and not r.blocks for r in unseen), "an unseen arrival is not plainly waiting"
        assert not {r.request_id for r in unseen} & {r.request_id for r in (*self.running, *self.waiting)}, \
            "a request is in two pools"
        assert all(r.status is FINISHED for r in (*self._done_held, *self._done_last_step)), \
            "a request held after finishing is not finished"


MODES.attach("continuous", scheduler=ContinuousScheduler)
