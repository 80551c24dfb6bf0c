"""Continuous batching, accelerated: the decodes advance in lockstep, and runs of identical steps in one go.

:class:`LockstepScheduler` plans exactly the steps :class:`~simbatch.schedulers.continuous.ContinuousScheduler`
plans (the tests hold them to it, frame for frame), at a cost that follows the requests that change in
a step rather than the batch size.

Lockstep decodes. Between events, every decoding request computes one token and samples one per
step, so the scheduler does not touch them one by one: they form a *group* that advances with a
clock. A member's counters are not touched as it advances: a :class:`LockstepRequest` reads them
through the clock (stored values plus the steps since it joined), so they are always true and cost
nothing per step. A decoding request joins the group at the first plan after a step in which it
sampled a token, and leaves it when something unusual happens to it. The blocks the group needs each step follow from each member's position
within its block, counted per residue of the clock (``_phase``, stored twice over so that any ``block_size``
consecutive steps are one slice of it); the next completion is the top of a heap. A step then costs
the requests that change in it, not the batch size, and a run of identical steps costs O(block_size).
Anything unusual (a block shortage, a preemption) takes the member out of the group, and the
one-request-at-a-time rules apply unchanged.

Fast-forward. A plan of lockstep decodes alone repeats, step after step, until a member finishes, the
next block cannot be had, or (prefix caching, a request waiting for a slot) a block taken would evict a
cached one (``repeatable_steps``); the engine takes such a run as one timeout.

Speculative decoding declines both: a speculating decode emits a random number of tokens each step,
so no two steps are alike. Its requests never join the group, every step is planned by the model's
rules one request at a time, and ``repeatable_steps`` is 1 (a plan without a group).

Most plans are of the group alone (every running request a member): the twin makes those itself,
the group's blocks taken at once and the model's admission rule called as written, and hands the
others to the model's plan. The twin overrides the model's own steps (rule 1, putting the plan
together, preemption, applying a step), never hooks the model keeps for it; the blocks its members
take in bulk are a reservation the KV manager makes (:meth:`~simbatch.memory.kv.KVCacheManager.take_bulk`)
until each member leaves with its own.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter, mul

from simbatch.config import Scenario
from simbatch.memory.blocks import blocks_for
from simbatch.memory.kv import KVCacheManager
from simbatch.model.request import RUNNING, Request
from simbatch.model.step import IDLE, Idle, StepOutcome, StepPlan
from simbatch.registry import MODES, POLICIES
from simbatch.schedulers.continuous import ContinuousScheduler
from simbatch.schedulers.policies import WaitingQueue


@dataclass(slots=True, eq=False)
class LockstepRequest(Request):
    """A request of the accelerated engine. Out of a lockstep group it is a plain request (its counters
    plain attributes); in one it is a :class:`LockstepMember` (``join_lockstep``), whose counters read
    through the group's clock.

    A dataclass, as :class:`Request` is: one generated ``__init__`` per arrival, not a second call."""

    lockstep: LockstepScheduler | None = None
    # Its counters as they stood when it joined its group (set then: never read out of one).
    _computed: int = field(init=False, repr=False)
    _generated: int = field(init=False, repr=False)
    _last_token_s: float = field(init=False, repr=False)
    _last_token_step: int = field(init=False, repr=False)

    def join_lockstep(self, group: LockstepScheduler) -> None:
        """Into ``group``: its counters stored as they stand, read from now on through the group's clock."""
        self._computed, self._generated = self.num_computed_tokens, self.num_generated
        self._last_token_s, self._last_token_step = self.last_token_s, self.last_token_step
        self.lockstep = group
        self.__class__ = LockstepMember


class LockstepMember(LockstepRequest):
    """A request in a lockstep group: its stored counters are those of the step it joined, and reading
    them adds the steps since, so that it always reads true (the module docstring). Its class while it
    is a member, so that a request out of a group reads plain attributes, not properties."""

    __slots__ = ()

    @property
    def num_computed_tokens(self) -> int:
        return self._computed + self.lockstep.steps_since(self)

    @property
    def num_generated(self) -> int:
        return self._generated + self.lockstep.steps_since(self)

    @property
    def blocks(self) -> int:
        return self.lockstep.member_blocks(self)

    @property
    def last_token_s(self) -> float:
        g = self.lockstep
        return g.last_end_s if g.steps_since(self) else self._last_token_s

    @property
    def last_token_step(self) -> int:
        g = self.lockstep
        return g.clock - 1 if g.steps_since(self) else self._last_token_step

    def leave_lockstep(self, steps: int, last_token_s: float, last_token_step: int) -> None:
        """Out of its lockstep group after ``steps`` steps in it, the last ending at ``last_token_s``
        (step ``last_token_step``): its counters stored as they read, plain attributes again."""
        self.__class__ = LockstepRequest
        self.lockstep = None
        if steps:  # (else its plain counters are still those it joined with)
            self.num_computed_tokens = self._computed + steps
            self.num_generated = self._generated + steps
            self.last_token_s = last_token_s
            self.last_token_step = last_token_step


class LockstepScheduler(ContinuousScheduler):
    request_class = LockstepRequest
    __slots__ = ("_arrival_order", "_waiting_at_plan", "_group", "_members", "_group_context", "_group_reserved",
                 "_members_planned", "clock", "last_end_s", "_phase", "_block_size", "_phase_members", "_granted_all",
                 "_granted", "_done", "_plan_used", "_applied_alone")

    def __init__(self, scenario: Scenario, kv: KVCacheManager, waiting: WaitingQueue):
        super().__init__(scenario, kv, waiting)
        self._arrival_order = POLICIES[scenario.scheduler.policy].arrival_order
        self._waiting_at_plan = 0
        # The lockstep group (module docstring).
        self._group: dict[Request, int] = {}  # member -> the clock when it joined
        self._members: tuple[Request, ...] | None = ()  # the group's members in order (None: to be made again)
        # Sum over members of (computed tokens - clock) at joining: the group's cached context at
        # clock t is this plus len(group) * t, since each member computes one token a step.
        self._group_context = 0
        self._group_reserved = False  # the group holds its blocks for the step being planned
        self._members_planned = 0  # members in the plan made last (the first of its decodes)
        self.clock = 0  # steps executed: the number of the next step
        self.last_end_s = 0.0
        # Members needing a new block in step t: _phase[t % block_size], which _phase[t % block_size
        # + block_size] repeats, so that steps t .. t + block_size - 1 are _phase[t % block_size:][:block_size].
        self._phase = [0] * (2 * kv.block_size)
        self._block_size = kv.block_size  # (the KV manager's, read once: most plans need it)
        self._phase_members: list[dict[Request, None]] = [{} for _ in range(kv.block_size)]
        self._granted_all = False  # every member that needed a block this step has it ...
        self._granted: set[Request] = set()  # ... or only these (blocks were short)
        self._done: list[tuple[int, int, Request]] = []  # (clock after a member's last token, id, member)
        self._plan_used = 0  # blocks in use during the first step of the run planned last
        self._applied_alone: list[Request] = []  # the requests the last step applied one by one

    # ---------------------------------------------------------------- planning
    def _plan(self, now: float, admit: bool = True) -> StepPlan | Idle:
        group, num_running = self._group, len(self.running)
        if self.repeatable and not self._delivered:
            if num_running > len(group) + len(self._prefilling):
                self._join_sampled(self._lone_decodes())
            waiting = len(self.waiting)
            # Most plans: every running request a member. The model's rules come down to the group's
            # decodes, when the blocks its members cross into are free (else they go one by one), then
            # admission (which, evicting nobody, leaves the group as it is).
            if num_running == len(group) and group and \
                    (not waiting or (admit and not self.evicts_at_admission)) and self._reserve_group():
                self._budget = self.token_budget - num_running
                self._sched = {}
                plan = StepPlan()
                if waiting:
                    self._admit_waiting(now, plan)
                    self._assemble(plan)
                else:
                    self._plan_members(plan)  # (_assemble's plan, with nothing scheduled one by one)
                device = self.kv.device
                self._plan_used = device.num_blocks - device.num_free
                return plan
        self._group_reserved = False
        plan = ContinuousScheduler._plan(self, now, admit)
        if plan is not IDLE:
            device = self.kv.device
            self._plan_used = device.num_blocks - device.num_free
        return plan

    def _schedule_decodes(self, now: float, plan: StepPlan) -> None:
        if not self.repeatable:  # a feature's steps are never alike (speculative decoding): the model's rules
            super()._schedule_decodes(now, plan)
            return
        group = self._group
        lone = self._lone_decodes() if len(self.running) > len(group) + len(self._prefilling) else ()
        if lone and self._join_sampled(lone):
            lone = [r for r in lone if r.lockstep is None]
        if not lone:  # the group alone (as _reserve_decodes would take it)
            if self._reserve_group():
                self._budget -= len(group)
                return
        elif self._reserve_decodes(lone):
            return
        self._reserve_decodes_one_by_one(lone, now, plan)

    def _reserve_group(self) -> bool:
        """The blocks the members crossing into a new block this step need, taken at once; False (and no
        change) if blocks are short, and then they go one by one (_reserve_decodes_one_by_one)."""
        n = self._phase[self.clock % self._block_size]
        if n and not self.kv.take_bulk(n):
            return False
        self._group_reserved = self._granted_all = True
        return True

    def _lone_decodes(self) -> list[Request]:
        """The decodes out of the group, in running (admission) order. Most are those the last step
        applied one by one (a prefill that caught up, a decode that went alone): when as many of those
        decode out of the group as there are such decodes, they are all of them, found without a pass
        over the running set."""
        group = self._group
        num_lone = len(self.running) - len(group) - len(self._prefilling)
        lone = [r for r in self._applied_alone if r.status is RUNNING and not r.prefill_pending
                and r.lockstep is None]
        if len(lone) != num_lone:
            lone = [r for r in self.running if not r.prefill_pending and r not in group]
        elif num_lone > 1:
            lone.sort(key=_admission_order)
        return lone

    def _join_sampled(self, lone: list[Request]) -> bool:
        """Of the ``lone`` decodes, those that sampled a token in the last step decode in lockstep from
        here on (the others, a first decode after a stall, go one step alone, their token's gap recorded
        as a pause); whether any joined. Done as a plan begins, and again for the requests a transfer
        delivered (they join the running set within the plan)."""
        last, joined = self.clock - 1, False
        for req in lone:
            if req.last_token_step == last:
                self._join(req)
                joined = True
        return joined

    def _assemble(self, plan: StepPlan) -> bool:
        """The model's plan of the requests scheduled one by one, with the group's members first."""
        # (The model's, named: super() costs more than the call, and this runs per plan.)
        scheduled = ContinuousScheduler._assemble(self, plan) if self._sched else False
        group = self._group
        if not (self._group_reserved and group):
            self._members_planned = 0
            return scheduled
        if not scheduled:
            self._plan_members(plan)
            return True
        members = self._members or self._members_now()
        n = self._members_planned = len(members)
        # (With no decode scheduled one by one, the members' own tuple, not a copy of it.)
        plan.decodes = (*members, *plan.decodes) if plan.decodes else members
        plan.decode_seqs += n
        plan.kv_tokens += self._group_context + n * self.clock
        return True

    def _plan_members(self, plan: StepPlan) -> None:
        """The group's members are the plan's decodes, and all it computes."""
        members = self._members or self._members_now()
        n = self._members_planned = len(members)
        plan.decodes, plan.decode_seqs, plan.kv_tokens = members, n, self._group_context + n * self.clock

    def _members_now(self) -> tuple[Request, ...]:
        """The members in order, kept until one joins or leaves (most plans are of the same group)."""
        self._members = tuple(self._group)
        return self._members

    def _preempt(self, victim: Request, now: float, plan: StepPlan) -> None:
        if victim in self._group:
            self._leave(victim)
            if self._group_reserved:
                self._budget += 1
        super()._preempt(victim, now, plan)

    def _reserve_decodes(self, lone: list[Request]) -> bool:
        """Every decode's next block at once, if free blocks cover them all (the common case), the
        ``lone`` decodes' and the group's (the group alone takes its blocks in _schedule_decodes).

        When they do, reserving one request at a time would succeed for each without preempting
        anyone, so the outcome is the same; when they do not, nothing is taken and the caller goes
        one request at a time.
        """
        bs = self.kv.block_size
        if not self.kv.allocate_together([(r, 1) for r in lone], self._phase[self.clock % bs]):
            return False
        for req in lone:
            self._sched[req] = 1
        self._group_reserved, self._granted_all = len(self._group) > 0, True
        self._budget -= len(self._group) + len(lone)
        return True

    def _reserve_decodes_one_by_one(self, lone: list[Request], now: float, plan: StepPlan) -> None:
        """Blocks are short: the decodes that cross a block boundary, in running order, each take a
        block, preempting others as needed (rule 1 of the module docstring). The other decodes need
        nothing this step, so they are scheduled unless chosen as victims."""
        bs = self.kv.block_size
        self._group_reserved, self._granted_all, self._granted = bool(self._group), False, set()
        self._budget -= len(self._group)
        needers = list(self._phase_members[self.clock % bs])
        for req in lone:
            self._take(req, 1)
            if (req.num_computed_tokens + bs) // bs > req.blocks:
                needers.append(req)
        needers.sort(key=_admission_order)
        for req in needers:
            if req.status is not RUNNING:
                continue  # preempted earlier in this loop
            if req not in self._group:
                if not self._reserve(req, 1, now, plan):
                    self._budget += self._sched.pop(req)  # stalls, keeping its blocks
                continue
            while not self.kv.take_bulk(1):
                victim = self._pick_victim(exclude=req)
                if victim is None:
                    self._leave(req)  # stalls: out of the lockstep until it samples again
                    self._budget += 1
                    break
                self._preempt(victim, now, plan)
            else:
                self._granted.add(req)

    # ---------------------------------------------------------------- the lockstep group
    def _join(self, req: LockstepRequest) -> None:
        """``req`` sampled a token in the last step and goes on decoding: from now on it advances with the clock."""
        bs, clock, computed, phase = self._block_size, self.clock, req.num_computed_tokens, self._phase
        p = (clock - computed) % bs
        phase[p] += 1
        phase[p + bs] += 1
        self._phase_members[p][req] = None
        heapq.heappush(self._done, (clock + req.output_tokens - req.num_generated, req.request_id, req))
        self._group_context += computed - clock
        self._group[req] = clock
        self._members = None
        req.join_lockstep(self)  # from here its counters read through the clock (steps_since)

    def _leave(self, req: Request) -> None:
        """Out of the lockstep, its counters stored as they stand (its heap entry goes stale: see
        _retire_done)."""
        bs, clock, joined, phase = self._block_size, self.clock, self._group[req], self._phase
        computed = req._computed + clock - joined  # num_computed_tokens, read through the clock
        p = (clock - computed) % bs
        phase[p] -= 1
        phase[p + bs] -= 1
        del self._phase_members[p][req]
        planned = self._group_reserved and (self._granted_all or req in self._granted)
        self._group_context -= computed - clock
        del self._group[req]
        self._members = None
        req.leave_lockstep(clock - joined, self.last_end_s, clock - 1)
        # Its count is its own blocks again, those it joined with: the ones taken in bulk for it join them.
        own = -(-(computed + planned) // bs) - req.blocks  # blocks_for(...), written out: per request
        if own:
            self.kv.assign_bulk(req, own)

    def steps_since(self, req: Request) -> int:
        """Steps a member has advanced since it joined (its stored counters are those of then)."""
        return self.clock - self._group[req]

    def member_blocks(self, req: Request) -> int:
        """Blocks a member holds: those of its computed tokens, and the one reserved for the step planned."""
        planned = self._group_reserved and (self._granted_all or req in self._granted)
        return blocks_for(req.num_computed_tokens + planned, self.kv.block_size)

    def check_invariants(self) -> None:
        super().check_invariants()
        group = self._group
        assert group.keys() <= set(self.running) and not any(map(_prefill_pending, group)), "lockstep group drifted"
        assert not any(getattr(r, "lockstep", None) for r in self.waiting), \
            "a waiting request reads its counters through a group"
        assert self._group_context + len(group) * self.clock == sum(map(_num_computed_tokens, group)), \
            "lockstep group context drifted"

    def _drop_stale(self) -> None:
        done, group = self._done, self._group
        while done:
            t, _, req = done[0]
            joined = group.get(req)
            if joined is not None and t == joined + req.output_tokens - req._generated:
                return  # (its stored count is of its joining: the entry pushed then is live)
            heapq.heappop(done)

    def _group_blocks(self, t0: int, t1: int) -> int:
        """Blocks the group takes in steps t0 .. t1 - 1: every member one per ``block_size`` steps."""
        bs = self._block_size
        cycles, rest = divmod(t1 - t0, bs)
        a = t0 % bs
        return cycles * len(self._group) + sum(self._phase[a:a + rest])

    def _retire_done(self, end_s: float, outcome: StepOutcome) -> None:
        """Retire the members whose last token came at the end of this step, then drop the finished."""
        done, group, finished, clock = self._done, self._group, outcome.finished, self.clock
        while done and done[0][0] <= clock:
            t, _, req = heapq.heappop(done)
            joined = group.get(req)
            if joined is None or t != joined + req.output_tokens - req._generated:
                continue  # left the lockstep since (preempted or stalled)
            self._leave(req)
            self._retire(req, end_s)
            finished.append(req)
        if finished:
            self._drop_finished(finished)

    # ---------------------------------------------------------------- fast-forward
    def repeatable_steps(self, plan: StepPlan, step: int) -> int:
        """A plan of lockstep decodes alone repeats until one finishes or the next block cannot be had.

        Nothing else can change it. Any other running request got nothing (a prefill short of blocks
        or budget, a decode short of a block, with no victim to take one from) and stays so, as does
        admission, impossible at this plan: the running set is fixed, free blocks only shrink, the
        budget left is constant, policy keys are static. Only an arrival can change WAITING, and the
        engine cuts the run when one comes. With prefix caching, what a waiting request finds cached
        changes too when a block the run takes evicts one, and a request that finds less may need
        fewer free blocks (its chunk is counted from a lower start): while a request waits for a
        free slot, the run ends before the step whose blocks would evict a cached one.
        """
        # (An admission is scheduled, a slice or a decode, and a swap moves blocks for an admission or a
        # preemption: so a plan of members alone that preempted nobody admitted and swapped nothing.)
        members = self._members_planned
        if not members or len(plan.decodes) > members or plan.slices or plan.preempted:
            return 1
        if self._unseen or self._done_held:
            return 1  # async scheduling: the next plan sees these arrivals, or has these requests' room
        t, _, req = self._done[0]
        joined = self._group.get(req)
        if joined is None or t != joined + req.output_tokens - req._generated:
            self._drop_stale()  # (the head is stale: _drop_stale's test, written out for the common case)
            t = self._done[0][0]
        k = t - step  # the first completion happens in the k-th step of the run
        if k <= 1:
            return 1
        waiting = self._waiting_at_plan = len(self.waiting)
        # Steps 2 .. j of the run take _group_blocks(step + 1, step + j) more blocks.
        free, size, bs = self.kv.device.num_free, len(self._group), self._block_size
        if waiting and self.kv.caching and self._seats_taken() < self.max_num_seqs:
            free = self.kv.device.num_before_eviction(free)
        if free >= -(-(k - 1) // bs) * size:
            return k  # enough for the most steps 2 .. k could take: one block per member per block_size steps
        cycles = min((k - 1) // bs, free // size)
        j, free = 1 + cycles * bs, free - cycles * size
        t, phase = step + j, self._phase
        while j < k and phase[t % bs] <= free:
            free -= phase[t % bs]
            j, t = j + 1, t + 1
        return j

    def plan_survives_arrivals(self) -> bool:
        """New arrivals cannot be admitted mid-run when every slot is taken, or, under a policy in
        arrival order (``arrival_order``: FCFS) with head-of-line blocking, when an older request
        already waits at the head (it could not be admitted and, with blocks only shrinking, still
        cannot; a newcomer may not overtake it), unless a feature's rule may have skipped the head
        (``admits``: then a newcomer may pass it). A policy that evicts at admission (priority) may evict
        for a newcomer, so it always replans, as does a decode replica that a transfer has just
        delivered to (the newcomer decodes from the next step)."""
        if self.evicts_at_admission or self._delivered or self.async_scheduling:
            return False  # (async scheduling: the arrival is seen a plan later, which must be made)
        if len(self.running) >= self.max_num_seqs:
            return True
        # A feature's admission rule (max_loras) skips the head for reasons a newcomer may not share.
        return self._arrival_order and self.head_of_line_blocking and self._waiting_at_plan > 0 and not self._admits

    def kv_blocks_during(self, i: int) -> int:
        return self._plan_used + self._group_blocks(self.clock + 1, self.clock + i)

    def kv_blocks_sum(self, n: int) -> int:
        # With s the clock, sum_{i=1..n} used(i) = n used(1) + sum over steps s < t < s + n of
        # phase(t) (s + n - t): the blocks taken in step t count in every later step of the n.
        # Written u = t - s - 1 = q block_size + v, the full cycles q < c sum in closed form.
        if n <= 1:
            return n * self._plan_used
        bs, phase, size = self._block_size, self._phase, len(self._group)
        a = (self.clock + 1) % bs
        cycles, rest = divmod(n - 1, bs)
        total = n * self._plan_used + sum(map(mul, phase[a:a + rest], range(rest, 0, -1)))
        if cycles:
            v = sum(map(mul, phase[a:a + bs], range(bs)))
            total += cycles * ((n - 1) * size - v) - bs * size * cycles * (cycles - 1) // 2
        return total

    def finish_steps(self, plan: StepPlan, n: int, end_s: float, step: int) -> StepOutcome:
        if n == 1:
            return self.finish_step(plan, end_s, step)
        blocks = self._group_blocks(step + 1, step + n)
        if blocks:
            taken = self.kv.take_bulk(blocks)
            assert taken, "a run of steps took blocks that were not free"
        self._group_reserved = False
        self.clock, self.last_end_s = step + n, end_s
        outcome = StepOutcome([], n * self._members_planned, [])
        self._applied_alone = []
        if self._done and self._done[0][0] <= self.clock:
            self._retire_done(end_s, outcome)
        return outcome

    # ---------------------------------------------------------------- execution
    def finish_step(self, plan: StepPlan, end_s: float, step: int) -> StepOutcome:
        self._group_reserved = False
        self.clock, self.last_end_s = step + 1, end_s
        members = self._members_planned
        outcome = StepOutcome([], members, [])  # members emitted last step too: regular gaps
        alone = plan.decodes[members:] if members else plan.decodes
        if alone:
            self._apply_decodes(alone, end_s, step, outcome)
        if plan.slices:
            self._apply_slices(plan, end_s, step, outcome)
            alone = [*alone, *map(_first, plan.slices)]
        self._applied_alone = alone
        if self._done and self._done[0][0] <= self.clock:
            self._retire_done(end_s, outcome)
        elif outcome.finished:
            self._drop_finished(outcome.finished)
        return outcome


_prefill_pending, _num_computed_tokens = attrgetter("prefill_pending"), attrgetter("num_computed_tokens")
_admission_order = attrgetter("admitted_seq")
_first = itemgetter(0)

MODES.attach("continuous", twin=LockstepScheduler)
