"""One engine: the loop that *is* the model.

    plan = scheduler.schedule(now)      # who computes how many tokens this step
    duration = step time of the plan    # the cost model
    hold the GPU for duration           # one SimPy timeout
    outcome = scheduler.finish_step()   # tokens sampled, requests retired
    record the step and the outcome     # the recorder

With nothing to do the loop sleeps, without ticking, until a request arrives (``submit`` wakes it)
or a batching timer falls due.

There is one loop for both engines. The reference engine (``sim.fast_forward: false``) holds the null
accelerator (:mod:`simbatch.engine.accel`): every plan is one step, one SimPy event. The accelerated
engine's accelerator may say that a plan repeats ``k`` times if nothing arrives; the loop then takes
the run as one timeout, its durations summed exactly by the cost model (:class:`~simbatch.model.cost.StepRun`).
An arrival at this replica during the run cuts it at the end of the step in progress, which is exactly
when a step-by-step engine would first see the arrival; the run goes on if the plan survives the
arrival. A lone replica is also told when the next request arrives (``next_arrival_ns``), and a run
ends there by itself instead of being woken. Unless something outside reads its state (delayed
snapshots), it runs ahead of SimPy's clock: a step or run that ends before the clock stop cannot be
affected by anything outside the replica, so it is applied at once on the replica's own clock, and
the replica takes its requests itself (``feed``, :class:`simbatch.engine.cluster.Feed`) at the end of
the step during which they arrive, before applying it, where the arrival process's urgent events
would have put them. It yields to SimPy only to sleep, and for the step the clock stops in.

Times cross into the scheduler and the recorder in seconds; the loop itself counts whole
nanoseconds (:mod:`simbatch.model.clock`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import simpy

from simbatch.config import Scenario
from simbatch.engine.accel import engine_scheduler
from simbatch.features import hooks
from simbatch.memory.kv import content_of, lookup_blocks
from simbatch.model.clock import NS_PER_S, Late, ceil_ns
from simbatch.model.cost import LinearCost, StepRun
from simbatch.model.request import Request
from simbatch.model.step import IDLE, Idle, SleepUntil, StepPlan
from simbatch.observe.observers import Observer, Run
from simbatch.observe.recorder import Recorder, StepShape, replaced
from simbatch.schedulers import BaseScheduler


def scheduler_for(scenario: Scenario, tenant_names: tuple[str, ...] = ("default",)) -> BaseScheduler:
    """The scheduler an engine of ``scenario`` runs (the accelerated twin under ``sim.fast_forward``)."""
    return engine_scheduler(scenario, tenant_names)[0]


class Replica:
    """One engine: a scheduler, its KV cache, its accelerator, and the SimPy process that steps it."""

    # Slots: the loop reads its replica's attributes every plan, and an instance dict of 30 keys or more
    # is read about half again as slowly (a fleet's replicas are smaller, too).
    __slots__ = ("env", "index", "device", "cost", "scheduler", "accel", "_feature_ms", "recorder", "observers",
                 "step_observers", "run_observers", "single_step_observers", "move_observers", "check", "step",
                 "_wake", "_step_ctx", "_run_start_ns", "_run_durations", "_run_offset", "_run_ctx",
                 "plans_after_sends", "next_arrival_ns", "knows_arrivals", "run_ahead", "stop_at_ns", "pool",
                 "dispatcher", "process", "group", "feed")

    def __init__(self, env: simpy.Environment, index: int, scenario: Scenario, recorder: Recorder,
                 tenant_names: tuple[str, ...], check_invariants: bool = False,
                 observers: Sequence[Observer] = ()):
        self.env = env
        # Set on a rank of a data-parallel MoE engine, whose group steps it (simbatch.engine.dp_group), not _run.
        self.group = None
        # Set by the cluster on a lone replica running ahead (simbatch.engine.cluster.Feed): it receives its
        # requests itself, as its clock passes them, and no SimPy process sends them.
        self.feed = None
        self.index = index
        self.device = scenario.device
        self.cost = LinearCost.of(scenario.device, scenario.kv_cache.swap_ms_per_block)
        self.scheduler, self.accel = engine_scheduler(scenario, tenant_names)
        # Time the scheduler's features add to a step (simbatch.features: Feature.step_ms).
        self._feature_ms = hooks(self.scheduler.features, "step_ms")
        self.recorder = recorder
        self.observers = tuple(observers)
        # Told of every step, and of who moved between the pools: only those that listen (the recorder
        # keeps rows and counts, not memberships or events). Runs of steps go whole to those that take
        # them, and one step at a time to the others (simbatch.observe.observers).
        self.step_observers = tuple(o for o in observers if _overrides(o, "step") or _overrides(o, "run"))
        self.run_observers = tuple(o for o in self.step_observers if o.takes_runs)
        self.single_step_observers = tuple(o for o in self.step_observers if not o.takes_runs)
        self.move_observers = tuple(o for o in observers if _overrides(o, "admission") or _overrides(o, "preemption"))
        self.check = check_invariants
        self.step = 0
        self._wake: simpy.Event | None = None  # set while sleeping, or holding the GPU for a run of steps
        self._step_ctx: tuple | None = None  # the single step in progress, to record if the clock stops
        # A run of steps in progress: its start, its durations and the repeats of its plan done before
        # this part of it; and what applying it early needs.
        self._run_start_ns = 0
        self._run_durations: StepRun | None = None
        self._run_offset = 0
        self._run_ctx: tuple | None = None
        # With a client, requests are also sent at completion instants: the loop plans only after them.
        self.plans_after_sends = False
        # Set by the cluster for a lone accelerated replica (module docstring): every request comes
        # here, so the cluster keeps ``next_arrival_ns`` at the time of the next arrival (inf after the
        # last; 0, "not yet known", before the first), and runs of steps end there by themselves
        # instead of being woken; and, unless delayed snapshots read its state, it runs ahead (``feed``).
        self.next_arrival_ns: float = 0
        self.knows_arrivals = False
        self.run_ahead = False
        self.stop_at_ns: float = math.inf
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
        """Blocks in use now; inside a run of steps, as of the step in progress."""
        if self._run_durations is not None:
            i = self._run_durations.reach(self._run_offset, self.env.now - self._run_start_ns)
            return self.accel.kv_blocks_during(self._run_offset + i)
        return self.scheduler.kv_blocks_used

    def prefix_hit_tokens(self, probe) -> int:
        """Prompt tokens of ``probe`` (a request about to be routed) this replica's prefix cache holds
        now, in whole blocks from the first, as its scheduler would find them (for prefix_affinity)."""
        kv = self.scheduler.kv
        if not kv.caching:
            return 0
        bs = kv.block_size
        hits = kv.device.lookup(content_of(probe, bs), lookup_blocks(probe, bs))
        # Inside a run of steps the accelerated engine takes the run's blocks at its end; stepping one
        # at a time has taken those of the steps begun so far, evicting what they took: not found.
        pending = self.kv_blocks_used - self.scheduler.kv_blocks_used if self._run_durations is not None else 0
        if pending > 0 and len(hits):
            return kv.device.num_kept(hits, pending) * bs
        return len(hits) * bs

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
        """The cost model's duration of the plan, with the time the features add, on the clock's grid."""
        if not self._feature_ms:
            return self.cost.plan_ns(plan)
        return self.cost.plan_ns(plan, sum(ms(plan) for ms in self._feature_ms))

    def _sleep(self, answer: SleepUntil | Idle):
        """Wait for an arrival, or until the scheduler's timer falls due."""
        env, feed = self.env, self.feed
        # A timer due at a time the grid rounds below ``now`` still waits one tick: time advances.
        timer_ns = None if answer is IDLE else max(1, ceil_ns(answer.time_s) - env.now)
        if feed is not None:  # nobody sends: wake for the next arrival, or the timer, whichever comes first
            wake_ns = self.next_arrival_ns if timer_ns is None else min(self.next_arrival_ns, env.now + timer_ns)
            if wake_ns < math.inf:
                yield env.timeout(wake_ns - env.now)
                feed.receive_until(env.now)
                return
        self._wake = env.event()
        yield self._wake if timer_ns is None else (self._wake | env.timeout(timer_ns))
        self._wake = None

    def _moved(self, plan: StepPlan, now_s: float) -> None:
        """Tell the observers who left and joined WAITING while ``plan`` was made, in the scheduler's order."""
        index, observers, admitted, told = self.index, self.move_observers, plan.admitted, 0
        for p in plan.preempted:
            for req in admitted[told:p.admitted_before]:
                for o in observers:
                    o.admission(now_s, index, req)
            told = p.admitted_before
            for o in observers:
                o.preemption(now_s, index, p.request, p.swapped, p.kv_blocks, p.computed_tokens)
        for req in admitted[told:]:
            for o in observers:
                o.admission(now_s, index, req)

    def _stepped(self, start_ns: int, duration_ns: int, plan: StepPlan, done: bool = True) -> None:
        """Tell the step observers of one step."""
        start_s, duration_s = start_ns / NS_PER_S, duration_ns / NS_PER_S
        for o in self.step_observers:
            o.step(self.index, start_s, duration_s, plan, done)

    def _ran(self, start_ns: int, durations: StepRun, first: int, count: int, plan: StepPlan) -> None:
        """Tell the step observers of ``count`` done repeats of ``plan`` from ``start_ns``, repeats ``first ..``
        of ``durations``: whole to those that take runs, a step at a time to the others."""
        if count == 1:
            self._stepped(start_ns, durations.ns(first, 1), plan)
            return
        index, run = self.index, Run(start_ns, durations, first, count)
        for o in self.run_observers:
            o.run(index, run, plan)
        if self.single_step_observers:
            for start_s, duration_s in run:
                for o in self.single_step_observers:
                    o.step(index, start_s, duration_s, plan, True)

    def _finished(self, outcome, end_s: float) -> None:
        if outcome.stall_gaps_s:
            self.recorder.stall_gaps_s.extend(outcome.stall_gaps_s)
        if outcome.finished:
            for o in self.observers:
                o.completion(end_s, outcome.finished)

    def _run(self):
        if self.group is not None:
            return  # set by the cluster before the run starts
        env, sched, accel, rec, index = self.env, self.scheduler, self.accel, self.recorder, self.index
        # Bound once: this loop runs a few times per request.
        schedule, repeatable_steps, record = sched.schedule, accel.repeatable_steps, rec.record_steps
        step_duration_ns = self.cost.plan_ns_function() if not self._feature_ms else self.step_duration_ns
        cost_run, check, waiting = self.cost.run, self.check, sched.waiting
        feed, stop_at = self.feed, self.stop_at_ns  # set by the cluster before the run starts
        contiguous, now = False, env.now  # now: this replica's clock, ahead of env.now when running ahead
        late = self.plans_after_sends  # a client: plan after the sends of this instant (no running ahead)
        observed = bool(self.step_observers)
        while True:
            if late:
                yield Late(env)
            now_s = now / NS_PER_S
            plan = schedule(now_s)
            if self.pool is not None:
                self.dispatcher.planned(self, plan, now)
            if plan.__class__ is not StepPlan:
                yield from self._sleep(plan)
                contiguous, now = False, env.now
                continue
            duration = step_duration_ns(plan)
            # Once planned: check, count the waiting change, and shape the step's row.
            if check:
                sched.check_invariants()
            preempted, admitted = plan.preempted, plan.admitted
            if preempted or admitted:
                rec.waiting_change(now_s, len(preempted) - len(admitted))
                if self.move_observers:
                    self._moved(plan, now_s)
            # itl_tokens: every decode is one step after its previous token, until finish_step says
            # otherwise. Built as the tuple it is (StepShape's generated __new__ is a Python call).
            shape = tuple.__new__(StepShape, (
                len(sched.running), len(waiting), len(plan.decodes) + len(plan.slices),
                plan.decode_seqs + plan.draft_tokens, plan.prefill_tokens,
                plan.padded_decode_seqs + plan.padded_prefill_tokens, plan.decode_seqs, len(preempted),
                plan.swap_blocks))
            k = repeatable_steps(plan, self.step)
            if k == 1:
                kv_sum = accel.kv_blocks_sum(1)
                end = now + duration
                if feed is not None and end < stop_at:  # running ahead
                    if end >= self.next_arrival_ns:
                        feed.receive_until(end)  # the arrivals during this step, seen after it
                else:
                    if feed is not None:
                        feed.receive_until(stop_at - 1)  # the clock stops in this step: those before it
                    self._step_ctx = (now, duration, shape, kv_sum, contiguous, plan)
                    yield env.timeout(end - env.now)  # SimPy's clock catches up with the replica's
                    self._step_ctx = None
                outcome = sched.finish_step(plan, end / NS_PER_S, self.step)
                if outcome.itl_tokens != plan.decode_seqs:  # a token after a pause, or a first token
                    shape = replaced(shape, "itl_tokens", outcome.itl_tokens)
                record(index, now_s, 1, shape, kv_sum, contiguous, duration)
                if observed:
                    self._stepped(now, duration, plan)
                n = 1
            else:
                run = cost_run(plan, duration)
                n, start = 0, now  # steps of this plan done so far; start of the part in progress
                while n < k:
                    self._run_ctx = (plan, shape, contiguous)
                    self._run_start_ns, self._run_durations, self._run_offset = start, run, n
                    if self.knows_arrivals:
                        # The steps before the next arrival is seen: the step in progress when it
                        # arrives is the last (one at the instant a step ends is seen right after it).
                        t_next, m = self.next_arrival_ns, k - n
                        end = start + run.ns(n, m)
                        if t_next < end:
                            m = run.reach(n, t_next - start)
                            end = start + run.ns(n, m)
                        if feed is not None and end < stop_at:
                            if end >= self.next_arrival_ns:
                                feed.receive_until(end)
                        else:
                            if feed is not None:
                                feed.receive_until(stop_at - 1)
                            yield env.timeout(end - env.now)
                    else:
                        m = yield from self._run_of_steps(start, run, n, k - n)
                        end = start + run.ns(n, m)
                    self._run_durations = None
                    kv_sum = accel.kv_blocks_sum(n + m) - accel.kv_blocks_sum(n) if n else accel.kv_blocks_sum(m)
                    record(index, start / NS_PER_S, m, shape, kv_sum, contiguous, end - start)
                    if observed:
                        self._ran(start, run, n, m, plan)
                    n, start, contiguous = n + m, end, True
                    if n == k:
                        break  # the run is over: nothing cut it, or an arrival in its last step
                    if late:
                        yield Late(env)  # decide at the step boundary as the reference plans: after its sends
                    if not accel.plan_survives_arrivals():
                        break
                    # The arrival only lengthened WAITING: the same plan runs on, recorded anew.
                    shape = replaced(shape, "num_waiting", len(sched.waiting))
                self._run_ctx = None
                outcome = accel.finish_steps(plan, n, end / NS_PER_S, self.step)
            self.step += n
            if outcome.finished or outcome.stall_gaps_s:
                self._finished(outcome, end / NS_PER_S)
            contiguous, now = True, end

    def _run_of_steps(self, start_ns: int, run: StepRun, i0: int, k: int):
        """Hold the GPU for up to ``k`` repeats from the ``i0``-th of ``run``, or until an arrival is
        seen (woken by ``submit``).

        Returns the steps done (fewer than ``k`` when an arrival cut the run short).
        """
        env = self.env
        self._wake = env.event()
        total = run.ns(i0, k)
        yield self._wake | env.timeout(total)
        n = k
        if self._wake.triggered and env.now < start_ns + total:
            # An arrival during step n: finish that step; the scheduler sees the arrival after it.
            n = run.reach(i0, env.now - start_ns)
            end_ns = start_ns + run.ns(i0, n)
            self._wake = None
            if end_ns > env.now:
                yield env.timeout(end_ns - env.now)
        self._wake = None
        return n

    def stop(self, at_ns: int) -> None:
        """The clock stopped at ``at_ns``: settle what was in progress, as stepping one at a time would.

        The steps of a run that ended before the stop are applied. The step in progress at the stop is
        recorded as begun but never done: its admissions and preemptions happened, its tokens never came
        (``itl_tokens`` 0), and it is not applied. A step ending at the stop instant is such a step:
        nothing happens at the stop.
        """
        rec = self.recorder
        if self._run_ctx is not None:
            plan, shape, contiguous = self._run_ctx
            start, done, run = self._run_start_ns, self._run_offset, self._run_durations
            accel = self.accel
            m = run.reach(done, at_ns - start) - 1  # steps of this part that ended before the stop
            busy = run.ns(done, m)
            if m > 0:
                rec.record_steps(self.index, start / NS_PER_S, m, shape,
                                 accel.kv_blocks_sum(done + m) - accel.kv_blocks_sum(done), contiguous, busy)
                self._ran(start, run, done, m, plan)
            last_start_s, last_ns = (start + busy) / NS_PER_S, run.ns(done + m, 1)
            rec.record_steps(self.index, last_start_s, 1, replaced(shape, "itl_tokens", 0),
                             accel.kv_blocks_sum(done + m + 1) - accel.kv_blocks_sum(done + m), m > 0 or contiguous,
                             last_ns)
            self._stepped(start + busy, last_ns, plan, done=False)
            if done + m > 0:
                accel.finish_steps(plan, done + m, last_start_s, self.step)
                self.step += done + m
            self._run_ctx = None
        if self._step_ctx is not None:
            start, duration, shape, kv_blocks, contiguous, plan = self._step_ctx
            rec.record_steps(self.index, start / NS_PER_S, 1, replaced(shape, "itl_tokens", 0), kv_blocks,
                             contiguous, duration)
            self._stepped(start, duration, plan, done=False)
            self._step_ctx = None


def _overrides(observer: Observer, method: str) -> bool:
    """Whether ``observer``'s class defines its own ``method`` (the engine tells only those)."""
    return getattr(type(observer), method) is not getattr(Observer, method)
