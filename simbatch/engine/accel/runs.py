"""The accelerated engine (``sim.fast_forward``, the default): the same steps, fewer events.

Two accelerations, each provably invisible (the tests hold the frames to the reference engine's,
bit for bit, on scenarios full of exact ties):

- **Runs of identical steps** (fast-forward). When the scheduler says a plan repeats ``k`` times if
  nothing arrives (``BaseScheduler.repeatable_steps``: lockstep decodes until the next completion or
  block shortage), the run is one timeout. The repeats do the same work, but with a context-aware
  cost each reads one more token per decode slot than the last, so their durations form a
  progression whose sums the cost model gives exactly (:class:`~simbatch.model.cost.StepRun`). An
  arrival at this replica during the run cuts it at the end of the step in progress, which is exactly when a step-by-step engine would first see the
  arrival; the run goes on if the plan survives the arrival (``plan_survives_arrivals``).
- **Running ahead.** A lone replica that nobody observes (no router, no delayed snapshots) is told
  when the next request arrives. A step or run that ends before then, and before the clock stop,
  cannot be affected by anything outside the replica, so it is applied at once, on the replica's own
  clock, without a SimPy event. The replica yields only for the step during which the next request
  arrives (or the clock stops), so SimPy still orders every interaction.
"""

from __future__ import annotations

import math
from typing import Protocol

from simbatch.engine.replica import Replica
from simbatch.model.clock import NS_PER_S, Late
from simbatch.model.cost import StepRun
from simbatch.observe.recorder import replaced
from simbatch.schedulers import StepPlan
from simbatch.schedulers.base import StepOutcome


class FastForward(Protocol):
    """What a scheduler offers the accelerated engine (the lockstep and request-level schedulers do).

    Between scheduling events a plan repeats: the same requests decode, step after step, at the same
    step time, or, when the cost reads the context, at one growing by the same amount each step
    (:meth:`simbatch.model.cost.LinearCost.run`). These methods let the engine take such a run of steps in one go, with exactly the state
    that stepping one at a time would leave.
    """

    def repeatable_steps(self, plan: StepPlan, step: int) -> int:
        """How many consecutive steps identical to ``plan`` (itself included) run if nothing arrives."""

    def plan_survives_arrivals(self) -> bool:
        """Whether the run planned last goes on unchanged now that requests have arrived mid-run."""

    def finish_steps(self, plan: StepPlan, n: int, end_s: float, step: int) -> StepOutcome:
        """Apply ``n`` repeats of ``plan`` (``step`` is the first one's number, ``end_s`` the last one's end)."""

    def kv_blocks_during(self, i: int) -> int:
        """Device blocks in use during the ``i``-th step (1-based) of the run planned last."""

    def kv_blocks_sum(self, n: int) -> int:
        """Sum over the first ``n`` steps of the run planned last of the blocks in use."""


class AcceleratedReplica(Replica):
    """A :class:`~simbatch.engine.replica.Replica` that takes runs of steps in one go and may run ahead."""

    scheduler: FastForward

    def __init__(self, *args, **kwargs):
        self._run_start_ns = 0  # the part of a run of steps in progress: its start, its durations
        self._run_durations: StepRun | None = None  # and the repeats of its plan done before it
        self._run_offset = 0
        self._run_ctx: tuple | None = None  # what a run of steps in progress needs to be applied early
        # With ``knows_arrivals`` (every request comes here), the arrival process keeps this at the
        # time of the next arrival (inf after the last; 0, "not yet known", before the first), and runs
        # of steps end there by themselves instead of being woken.
        self.next_arrival_ns: float = 0
        self.knows_arrivals = False
        # Whether the replica may run ahead of SimPy's clock (module docstring), up to the next
        # arrival and to stop_at_ns.
        self.run_ahead = False
        self.stop_at_ns: float = math.inf
        super().__init__(*args, **kwargs)

    @property
    def kv_blocks_used(self) -> int:
        """Blocks in use now; inside a run of steps, as of the step in progress."""
        if self._run_durations is not None:
            i = self._run_durations.reach(self._run_offset, self.env.now - self._run_start_ns)
            return self.scheduler.kv_blocks_during(self._run_offset + i)
        return self.scheduler.kv_blocks_used

    def _run(self):
        env, sched, rec, index = self.env, self.scheduler, self.recorder, self.index
        # Bound once: this loop runs a few times per request.
        schedule, repeatable_steps, record = sched.schedule, sched.repeatable_steps, rec.record_steps
        step_duration_ns, planned, cost_run = self.cost.plan_ns, self._planned, self.cost.run
        run_ahead, stop_at = self.run_ahead, self.stop_at_ns  # set by the cluster before the run starts
        contiguous, now = False, env.now  # now: this replica's clock, ahead of env.now when running ahead
        late = self.plans_after_sends  # a client: plan after the sends of this instant (no running ahead)
        observed = bool(self.step_observers)
        while True:
            if late:
                yield Late(env)
            now_s = now / NS_PER_S
            plan = schedule(now_s)
            if self.pool is not None:
                self._hand_over(plan, now)
            if plan.__class__ is not StepPlan:
                yield from self._sleep(plan)
                contiguous, now = False, env.now
                continue
            duration = step_duration_ns(plan)
            shape = planned(plan, now_s)
            k = repeatable_steps(plan, self.step)
            if k == 1:
                kv_sum = sched.kv_blocks_sum(1)
                end = now + duration
                if not run_ahead or end >= self.next_arrival_ns or end >= stop_at:
                    self._step_ctx = (now, duration, shape, kv_sum, contiguous, plan)
                    yield env.timeout(end - env.now)  # SimPy's clock catches up with the replica's
                    self._step_ctx = None
                outcome = sched.finish_step(plan, end / NS_PER_S, self.step)
                if outcome.itl_tokens != plan.decode_seqs:  # a token after a pause, or a first token
                    shape = replaced(shape, "itl_tokens", outcome.itl_tokens)
                record(index, now_s, 1, shape, kv_sum, contiguous, duration)
                if observed:
                    self._observed(now_s, duration / NS_PER_S, 1, plan)
                n = 1
            else:
                run = cost_run(plan, duration)
                n, start = 0, now  # steps of this plan done so far; start of the part in progress
                while n < k:
                    self._run_ctx = (plan, shape, contiguous)
                    self._run_start_ns, self._run_durations, self._run_offset = start, run, n
                    if self.knows_arrivals:
                        m = self._steps_before_arrival(start, run, n, k - n)
                        end = start + run.ns(n, m)
                        if not run_ahead or end >= self.next_arrival_ns or end >= stop_at:
                            yield env.timeout(end - env.now)
                    else:
                        m = yield from self._run_of_steps(start, run, n, k - n)
                        end = start + run.ns(n, m)
                    self._run_durations = None
                    kv_sum = sched.kv_blocks_sum(n + m) - sched.kv_blocks_sum(n) if n else sched.kv_blocks_sum(m)
                    record(index, start / NS_PER_S, m, shape, kv_sum, contiguous, end - start)
                    if observed:
                        self._observed(start / NS_PER_S, (end - start) / m / NS_PER_S, m, plan)
                    n, start, contiguous = n + m, end, True
                    if n == k:
                        break  # the run is over: nothing cut it, or an arrival in its last step
                    if late:
                        yield Late(env)  # decide at the step boundary as the reference plans: after its sends
                    if not sched.plan_survives_arrivals():
                        break
                    # The arrival only lengthened WAITING: the same plan runs on, recorded anew.
                    shape = replaced(shape, "num_waiting", len(sched.waiting))
                self._run_ctx = None
                outcome = sched.finish_steps(plan, n, end / NS_PER_S, self.step)
            self.step += n
            if outcome.finished or outcome.stall_gaps_s:
                self._finished(outcome, end / NS_PER_S)
            contiguous, now = True, end

    def stop(self, at_ns: int) -> None:
        """The clock stopped at ``at_ns``: settle what was in progress, as stepping would have.

        Steps of a run that ended before the stop are applied; the step in progress at the stop is
        recorded as the reference engine records it (:meth:`Replica.stop`).
        """
        sched, rec = self.scheduler, self.recorder
        if self._run_ctx is not None:
            plan, shape, contiguous = self._run_ctx
            start, done, run = self._run_start_ns, self._run_offset, self._run_durations
            m = run.reach(done, at_ns - start) - 1  # steps of this part that ended before the stop
            busy = run.ns(done, m)
            if m > 0:
                rec.record_steps(self.index, start / NS_PER_S, m, shape,
                                 sched.kv_blocks_sum(done + m) - sched.kv_blocks_sum(done), contiguous, busy)
                self._observed(start / NS_PER_S, busy / m / NS_PER_S, m, plan)
            last_start_s, last_ns = (start + busy) / NS_PER_S, run.ns(done + m, 1)
            rec.record_steps(self.index, last_start_s, 1, replaced(shape, "itl_tokens", 0),
                             sched.kv_blocks_sum(done + m + 1) - sched.kv_blocks_sum(done + m), m > 0 or contiguous,
                             last_ns)
            self._observed(last_start_s, last_ns / NS_PER_S, 1, plan, done=False)
            if done + m > 0:
                sched.finish_steps(plan, done + m, last_start_s, self.step)
                self.step += done + m
            self._run_ctx = None
        super().stop(at_ns)

    def _steps_before_arrival(self, start_ns: int, run: StepRun, i0: int, k: int) -> int:
        """Of up to ``k`` repeats from the ``i0``-th of ``run``, starting at ``start_ns``, how many run
        before the next arrival here is seen.

        The step in progress when it arrives is the last one (an arrival at the instant a step ends is
        seen right after that step); fewer than ``k`` means the arrival cut the run short.
        """
        t_next = self.next_arrival_ns
        return run.reach(i0, t_next - start_ns) if t_next < start_ns + run.ns(i0, k) else k

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
