"""One engine, plainly: the loop that *is* the model.

    plan = scheduler.schedule(now)      # who computes how many tokens this step
    duration = step time of the plan    # the cost model
    hold the GPU for duration           # one SimPy timeout
    outcome = scheduler.finish_step()   # tokens sampled, requests retired
    record the step and the outcome     # the recorder

With nothing to do the loop sleeps, without ticking, until a request arrives (``submit`` wakes it)
or a batching timer falls due. Every step is one SimPy event, and the scheduler plans every request
one at a time: this is the reference engine (``sim.fast_forward: false``), which the accelerated one
(:mod:`simbatch.engine.accel.runs`) must match frame for frame.

Times cross into the scheduler and the recorder in seconds; the loop itself counts whole
nanoseconds (:mod:`simbatch.model.clock`).
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from simbatch.config import Scenario
from simbatch.engine.accel.lockstep import LockstepScheduler
from simbatch.model.clock import NS_PER_S, Late, ceil_ns
from simbatch.model.cost import LinearCost
from simbatch.model.request import Request
from simbatch.observe.observers import Observer
from simbatch.observe.recorder import Recorder, StepShape, replaced
from simbatch.schedulers import IDLE, BaseScheduler, Idle, SleepUntil, StepPlan, make_scheduler


def scheduler_for(scenario: Scenario, tenant_names: tuple[str, ...] = ("default",)) -> BaseScheduler:
    """The scheduler an engine of ``scenario`` runs: continuous batching's accelerated twin, the lockstep
    scheduler, under ``sim.fast_forward``; the model's own otherwise."""
    accelerated = scenario.sim.fast_forward and scenario.batching.mode == "continuous"
    return make_scheduler(scenario, tenant_names, LockstepScheduler if accelerated else None)


class Replica:
    """One engine: a scheduler, its KV cache, and the SimPy process that steps it."""

    def __init__(self, env: simpy.Environment, index: int, scenario: Scenario, recorder: Recorder,
                 tenant_names: tuple[str, ...], check_invariants: bool = False,
                 observers: Sequence[Observer] = ()):
        self.env = env
        self.index = index
        self.device = scenario.device
        self.cost = LinearCost.of(scenario.device, scenario.kv_cache.swap_ms_per_block)
        self.scheduler: BaseScheduler = scheduler_for(scenario, tenant_names)
        self.recorder = recorder
        self.observers = tuple(observers)
        # Told of every step: only those that listen (the recorder keeps rows, not memberships).
        self.step_observers = tuple(o for o in observers if type(o).steps is not Observer.steps)
        self.check = check_invariants
        self.step = 0
        self._wake: simpy.Event | None = None  # set while sleeping
        self._step_ctx: tuple | None = None  # the step in progress, to record if the clock stops
        # With a client, requests are also sent at completion instants: the loop plans only after them.
        self.plans_after_sends = False
        # In a disaggregated cluster: "prefill" or "decode", and the dispatcher between the pools.
        self.pool: str | None = None
        self.dispatcher = None
        self.process = env.process(self._run())

    # ---------------------------------------------------------------- what the router sees
    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def kv_blocks_used(self) -> int:
        return self.scheduler.kv_blocks_used

    @property
    def kv_blocks_total(self) -> int:
        """Device KV blocks of this replica (a heterogeneous fleet's replicas differ)."""
        return self.scheduler.kv.device.num_blocks

    # ---------------------------------------------------------------- inputs
    def submit(self, req: Request, now_s: float) -> None:
        req.replica = self.index
        self.scheduler.add(req, now_s)
        self._poke()

    def close(self) -> None:
        self.scheduler.close()
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---------------------------------------------------------------- the loop
    def step_duration_ns(self, plan: StepPlan) -> int:
        """The cost model's duration of the plan, on the clock's grid."""
        return self.cost.plan_ns(plan)

    def _sleep(self, answer: SleepUntil | Idle):
        """Wait for an arrival, or until the scheduler's timer falls due."""
        self._wake = self.env.event()
        # A timer due at a time the grid rounds below ``now`` still waits one tick: time advances.
        yield self._wake if answer is IDLE else \
            (self._wake | self.env.timeout(max(1, ceil_ns(answer.time_s) - self.env.now)))
        self._wake = None

    def _hand_over(self, plan, now_ns: int) -> None:
        """Tell the dispatcher what this plan starts (simbatch.engine.disaggregated): the KV transfers
        a decode replica's admissions began, and the first tokens a prefill step will produce, at its end."""
        sched = self.scheduler
        if sched.transfers_started:
            self.recorder.waiting_change(now_ns / NS_PER_S, -len(sched.transfers_started))
            for req in sched.transfers_started:
                self.dispatcher.start_transfer(req, now_ns)
            sched.transfers_started = []
        if sched.hands_off and plan.__class__ is StepPlan:
            firsts = [req for req, n in plan.slices if req.prefill_pending and req.output_tokens > 1
                      and req.num_computed_tokens + n >= req.prompt_tokens + req.num_generated]
            if firsts:
                self.dispatcher.first_tokens(firsts, now_ns + self.step_duration_ns(plan))

    def _planned(self, plan: StepPlan, now_s: float) -> StepShape:
        """What every step does once planned: check, count the waiting change, and shape its row."""
        sched = self.scheduler
        if self.check:
            sched.check_invariants()
        if plan.num_preempted or plan.num_admitted:
            self.recorder.waiting_change(now_s, plan.num_preempted - plan.num_admitted)
        # itl_tokens: every decode is one step after its previous token, until finish_step says otherwise.
        # Built as the tuple it is: StepShape's generated __new__ is a Python call, and this runs per plan.
        return tuple.__new__(StepShape, (len(sched.running), len(sched.waiting), plan.batch_size,
                                         plan.decode_seqs + plan.draft_tokens, plan.prefill_tokens,
                                         plan.padded_tokens, plan.decode_seqs, plan.num_preempted, plan.swap_blocks))

    def _observed(self, start_s: float, step_s: float, count: int, plan: StepPlan, done: bool = True) -> None:
        for o in self.step_observers:
            o.steps(self.index, start_s, step_s, count, plan, done)

    def _finished(self, outcome, end_s: float) -> None:
        if outcome.stall_gaps_s:
            self.recorder.stall_gaps_s.extend(outcome.stall_gaps_s)
        if outcome.finished:
            for o in self.observers:
                o.completion(end_s, outcome.finished)

    def _run(self):
        env, sched, rec = self.env, self.scheduler, self.recorder
        contiguous = False
        while True:
            if self.plans_after_sends:
                yield Late(env)  # sends at this instant, caused by completions at it, come first
            now = env.now
            now_s = now / NS_PER_S
            plan = sched.schedule(now_s)
            if self.pool is not None:
                self._hand_over(plan, now)
            if plan.__class__ is not StepPlan:
                yield from self._sleep(plan)
                contiguous = False
                continue
            duration = self.step_duration_ns(plan)
            shape = self._planned(plan, now_s)
            kv_blocks = sched.kv_blocks_used
            self._step_ctx = (now, duration, shape, kv_blocks, contiguous, plan)
            yield env.timeout(duration)
            self._step_ctx = None
            end_s = env.now / NS_PER_S
            outcome = sched.finish_step(plan, end_s, self.step)
            self.step += 1
            if outcome.itl_tokens != plan.decode_seqs:  # a token after a pause, or a first token
                shape = replaced(shape, "itl_tokens", outcome.itl_tokens)
            rec.record_steps(self.index, now_s, 1, shape, kv_blocks, contiguous, duration)
            if self.step_observers:
                self._observed(now_s, duration / NS_PER_S, 1, plan)
            self._finished(outcome, end_s)
            contiguous = True

    def stop(self, at_ns: int) -> None:
        """The clock stopped at ``at_ns``: record the step in progress, as begun but never done.

        It began, so its admissions and preemptions happened; its tokens never came (``itl_tokens``
        0), and it is not applied. A step ending at the stop instant is such a step: nothing happens
        at the stop.
        """
        if self._step_ctx is not None:
            start, duration, shape, kv_blocks, contiguous, plan = self._step_ctx
            self.recorder.record_steps(self.index, start / NS_PER_S, 1, replaced(shape, "itl_tokens", 0), kv_blocks,
                                       contiguous, duration)
            self._observed(start / NS_PER_S, duration / NS_PER_S, 1, plan, done=False)
            self._step_ctx = None
