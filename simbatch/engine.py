"""The SimPy model: an arrival process, a router, and one engine loop per replica.

The engine loop asks its scheduler for a plan, holds the GPU for the plan's step time (one
``timeout`` per step), applies the step, and repeats. With nothing to do it sleeps, without ticking,
until a request arrives or a batching timer falls due.

A lone replica that nobody observes (no router, no delayed snapshots) may *run ahead*: a step that
ends before the next arrival and before ``sim.max_time_s`` cannot be affected by anything outside
the replica, so it is applied at once, on the replica's own clock, without a SimPy event. The
replica yields only for the step during which the next request arrives (or the clock stops), so
SimPy still orders every interaction, and the model's state at every arrival is what stepping
one event at a time gives.

Time is kept in integer nanoseconds (:mod:`simbatch.clock`, which also states the tie rule: at one
instant, the clock stop, then arrivals and snapshots, then the engines). Arrivals and snapshots are
therefore *urgent* SimPy events; the replicas' steps and timers are normal ones.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np
import simpy
from simpy.core import URGENT

from simbatch.clock import NS_PER_S, ceil_ns, step_ns, to_ns
from simbatch.config import Scenario
from simbatch.cost import blocks_for, peak_kv_tokens
from simbatch.metrics.recorder import SHAPE_COLUMNS, Recorder
from simbatch.request import Request
from simbatch.router import Load, make_router, replica_scenarios
from simbatch.schedulers import BaseScheduler, StepPlan, make_scheduler
from simbatch.workload import WorkloadArrays


def rejection_reasons(scenario: Scenario, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> dict[int, str]:
    """The requests an engine of this scenario can never serve: {index: reason} (all others: none).

    Checked at arrival so that the simulation never waits on a request that cannot fit; computed for
    the whole workload at once, since lengths are known in advance.
    """
    kv, b = scenario.kv_cache, scenario.batching
    reasons: dict[int, str] = {}
    if b.mode == "continuous" and not b.enable_chunked_prefill:
        reasons.update(dict.fromkeys(np.flatnonzero(prompt_tokens > b.max_num_batched_tokens).tolist(),
                                     "prompt_exceeds_budget"))
    never_fits = blocks_for(peak_kv_tokens(prompt_tokens, output_tokens), kv.block_size) > kv.num_blocks
    reasons.update(dict.fromkeys(np.flatnonzero(never_fits).tolist(), "never_fits"))
    return reasons


_WAITING, _ITL = SHAPE_COLUMNS.index("num_waiting"), SHAPE_COLUMNS.index("itl_tokens")


def _replaced(shape: tuple, column: int, value: int) -> tuple:
    """A row with one column changed."""
    return (*shape[:column], value, *shape[column + 1:])


def _steps_to_reach(start_ns: int, step_ns_: int, t_ns: int) -> int:
    """Of steps of ``step_ns_`` from ``start_ns``, the number of the one in progress at ``t_ns``.

    A step is in progress from its start (excluded) to its end (included): at the instant a step
    ends, that step is still the one in progress (the tie rule of :mod:`simbatch.clock`).
    """
    return max(1, -(-(t_ns - start_ns) // step_ns_))


class _Urgent(simpy.Event):
    """A timeout that fires before every normal event of its instant (as SimPy's own stop does)."""

    def __init__(self, env: simpy.Environment, delay_ns: int):
        super().__init__(env)
        self._ok, self._value = True, None
        env.schedule(self, URGENT, delay_ns)


class Replica:
    """One engine: a scheduler, its KV cache, and the SimPy process that steps it.

    With ``sim.fast_forward`` the loop takes a run of identical steps (see
    ``BaseScheduler.repeatable_steps``) as one timeout. An arrival at this replica during the run
    cuts it at the end of the step in progress, which is exactly when a step-by-step engine would
    first see the arrival: both modes record the same steps, events and state.
    """

    def __init__(self, env: simpy.Environment, index: int, scenario: Scenario, recorder: Recorder,
                 tenant_names: tuple[str, ...], check_invariants: bool = False):
        self.env = env
        self.index = index
        self.device = device = scenario.device
        self._cost_ms = (device.tau0_ms, device.beta_ms, device.prefill_ms_per_token,
                         scenario.kv_cache.swap_ms_per_block)
        self.fast_forward = scenario.sim.fast_forward
        self.scheduler: BaseScheduler = make_scheduler(scenario, tenant_names)
        self.recorder = recorder
        self.check = check_invariants
        self.step = 0
        self._wake: simpy.Event | None = None  # set while sleeping or inside a run of steps
        self._run_start_ns = 0  # the run of steps in progress: start and step time
        self._run_step_ns = 0
        self._run_offset = 0
        self._run_ctx: tuple | None = None  # what a run of steps in progress needs to be applied early
        self._step_ctx: tuple | None = None  # the single step in progress, to record if the clock stops
        # With ``knows_arrivals`` (every request comes here), the arrival process keeps this at the
        # time of the next arrival (inf after the last; 0, "not yet known", before the first), and runs
        # of steps end there by themselves instead of being woken.
        self.next_arrival_ns: float = 0
        self.knows_arrivals = False
        # Whether the replica may run ahead of SimPy's clock (module docstring), up to the next
        # arrival and to stop_at_ns.
        self.run_ahead = False
        self.stop_at_ns = math.inf if scenario.sim.max_time_s is None else _stop_ns(scenario.sim.max_time_s)
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
        if self._run_step_ns > 0:
            i = _steps_to_reach(self._run_start_ns, self._run_step_ns, self.env.now)
            return self.scheduler.kv_blocks_during(self._run_offset + i)
        return self.scheduler.kv_blocks_used

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
        """:func:`simbatch.cost.step_time_s` of the plan plus its swap traffic, on the clock's grid."""
        tau0_ms, beta_ms, gamma_ms, swap_ms = self._cost_ms
        return step_ns(tau0_ms + beta_ms * (plan.decode_seqs + plan.padded_decode_seqs)
                       + gamma_ms * (plan.prefill_tokens + plan.padded_prefill_tokens)
                       + swap_ms * plan.swap_blocks)

    def _run(self):
        env, sched, rec, index = self.env, self.scheduler, self.recorder, self.index
        # Bound once: this loop runs a few times per request.
        schedule, repeatable_steps, record = sched.schedule, sched.repeatable_steps, rec.steps
        step_duration_ns = self.step_duration_ns
        fast_forward, run_ahead, stop_at = self.fast_forward, self.run_ahead, self.stop_at_ns
        contiguous, now = False, env.now  # now: this replica's clock, ahead of env.now when running ahead
        while True:
            now_s = now / NS_PER_S
            plan = schedule(now_s)
            if plan.__class__ is not StepPlan:
                self._wake = env.event()
                # A timer due at a time the grid rounds below ``now`` still waits one tick: time advances.
                yield self._wake if plan is None else \
                    (self._wake | env.timeout(max(1, ceil_ns(plan) - env.now)))
                self._wake = None
                contiguous, now = False, env.now
                continue
            if self.check:
                sched.check_invariants()
            if plan.num_preempted or plan.num_admitted:
                rec.waiting_change(now_s, plan.num_preempted - plan.num_admitted)
            duration = step_duration_ns(plan)
            # The row of these steps, in SHAPE_COLUMNS order.
            shape = (duration / NS_PER_S, len(sched.running), len(sched.waiting), plan.batch_size,
                     plan.decode_seqs, plan.prefill_tokens, plan.padded_tokens, plan.decode_seqs,
                     plan.num_preempted, plan.swap_blocks)
            k = repeatable_steps(plan, self.step) if fast_forward else 1
            if k == 1:
                kv_sum = sched.kv_blocks_sum(1)
                end = now + duration
                if not run_ahead or end >= self.next_arrival_ns or end >= stop_at:
                    self._step_ctx = (now, shape, kv_sum, contiguous)
                    yield env.timeout(end - env.now)  # SimPy's clock catches up with the replica's
                    self._step_ctx = None
                outcome = sched.finish_step(plan, end / NS_PER_S, self.step)
                if outcome.itl_tokens != plan.decode_seqs:  # a token after a pause, or a first token
                    shape = _replaced(shape, _ITL, outcome.itl_tokens)
                record(index, now_s, 1, shape, kv_sum, contiguous)
                n = 1
            else:
                n, start = 0, now  # steps of this plan done so far; start of the part in progress
                while n < k:
                    self._run_ctx = (plan, shape, contiguous)
                    self._run_start_ns, self._run_step_ns, self._run_offset = start, duration, n
                    if self.knows_arrivals:
                        m, cut = self._steps_before_arrival(start, duration, k - n)
                        end = start + m * duration
                        if not run_ahead or end >= self.next_arrival_ns or end >= stop_at:
                            yield env.timeout(end - env.now)
                    else:
                        m, cut = yield from self._run_of_steps(start, duration, k - n)
                        end = start + m * duration
                    self._run_step_ns = 0
                    kv_sum = sched.kv_blocks_sum(n + m) - sched.kv_blocks_sum(n) if n else sched.kv_blocks_sum(m)
                    record(index, start / NS_PER_S, m, shape, kv_sum, contiguous)
                    n, start, contiguous = n + m, end, True
                    if cut and not sched.plan_survives_arrivals():
                        break
                    # The arrival only lengthened WAITING: the same plan runs on, recorded anew.
                    shape = _replaced(shape, _WAITING, len(sched.waiting))
                self._run_ctx = None
                outcome = sched.finish_steps(plan, n, end / NS_PER_S, self.step)
            self.step += n
            if outcome.stall_gaps_s:
                rec.stall_gaps_s.extend(outcome.stall_gaps_s)
            if outcome.finished:
                rec.finish(end / NS_PER_S, outcome.finished)
            contiguous, now = True, end

    def stop(self, at_ns: int) -> None:
        """The clock stopped at ``at_ns``: settle what was in progress, as stepping would have.

        Steps of a run that ended before the stop are applied. The step in progress at the stop
        (one ending at the stop instant included: nothing happens at the stop) is recorded, since it
        began and its admissions and preemptions happened, with no tokens (``itl_tokens`` 0: they
        never came), and not applied.
        """
        sched, rec = self.scheduler, self.recorder
        if self._step_ctx is not None:
            start, shape, kv_sum, contiguous = self._step_ctx
            rec.steps(self.index, start / NS_PER_S, 1, _replaced(shape, _ITL, 0), kv_sum, contiguous)
            self._step_ctx = None
        if self._run_ctx is not None:
            plan, shape, contiguous = self._run_ctx
            start, done, duration = self._run_start_ns, self._run_offset, self._run_step_ns
            m = _steps_to_reach(start, duration, at_ns) - 1  # steps of this part that ended before the stop
            if m > 0:
                rec.steps(self.index, start / NS_PER_S, m, shape,
                          sched.kv_blocks_sum(done + m) - sched.kv_blocks_sum(done), contiguous)
            last_start_s = (start + m * duration) / NS_PER_S
            rec.steps(self.index, last_start_s, 1, _replaced(shape, _ITL, 0),
                      sched.kv_blocks_sum(done + m + 1) - sched.kv_blocks_sum(done + m), m > 0 or contiguous)
            if done + m > 0:
                sched.finish_steps(plan, done + m, last_start_s, self.step)
                self.step += done + m
            self._run_ctx = None
        self.scheduler.sync()

    def _steps_before_arrival(self, start_ns: int, step_ns_: int, k: int) -> tuple[int, bool]:
        """Of up to ``k`` steps from ``start_ns``, how many run before the next arrival here is seen.

        The step in progress when it arrives is the last one (an arrival at the instant a step ends is
        seen right after that step). Returns (steps, whether the arrival cut the run short).
        """
        t_next = self.next_arrival_ns
        if t_next < start_ns + k * step_ns_:
            return _steps_to_reach(start_ns, step_ns_, t_next), True
        return k, False

    def _run_of_steps(self, start_ns: int, step_ns_: int, k: int):
        """Hold the GPU for up to ``k`` steps, or until an arrival is seen (woken by ``submit``).

        Returns (steps done, whether an arrival cut the run short).
        """
        env = self.env
        self._wake = env.event()
        yield self._wake | env.timeout(k * step_ns_)
        n, cut = k, False
        if self._wake.triggered and env.now < start_ns + k * step_ns_:
            # An arrival during step n: finish that step; the scheduler sees the arrival after it.
            n, cut = _steps_to_reach(start_ns, step_ns_, env.now), True
            end_ns = start_ns + n * step_ns_
            self._wake = None
            if end_ns > env.now:
                yield env.timeout(end_ns - env.now)
        self._wake = None
        return n, cut

    @property
    def kv_blocks_total(self) -> int:
        """Device KV blocks of this replica (a heterogeneous fleet's replicas differ)."""
        return self.scheduler.kv.device.num_blocks


def _stop_ns(max_time_s: float) -> int:
    """``sim.max_time_s`` on the grid (at least one tick: SimPy stops only in the future)."""
    return max(1, to_ns(max_time_s))


class Engine:
    """The whole model for one scenario: build it, ``run()`` it, read its recorder."""

    def __init__(self, scenario: Scenario, workload: WorkloadArrays, check_invariants: bool = False,
                 on_progress: Callable[[float, int], None] | None = None):
        self.scenario = scenario
        self.workload = workload
        self.env = simpy.Environment()
        self.recorder = Recorder(len(workload), scenario.cluster.replicas)
        self.replica_scenarios = replica_scenarios(scenario)
        self.replicas = [Replica(self.env, i, s, self.recorder, workload.tenant_names, check_invariants)
                         for i, s in enumerate(self.replica_scenarios)]
        self.router = make_router(scenario, workload.session)
        self.on_progress = on_progress
        self.arrivals_done = False
        # Integers: exact on the clock's grid, and faster to read one at a time than NumPy's.
        self._arrival_ns = np.rint(workload.arrival_s * NS_PER_S).astype(np.int64).tolist()
        # With a signal delay, the router reads snapshots taken signal_delay_ms before each arrival.
        self._views: deque[tuple[Load, ...]] | None = None
        if scenario.cluster.signal_delay_ms > 0:
            self._views = deque()
            self.env.process(self._observe())  # first, so that it snapshots t <= 0 before any arrival
        # A lone replica is told when each request will arrive (see _arrivals), and unless
        # snapshots read its state in between, it may run ahead up to there.
        if len(self.replicas) == 1:
            self.replicas[0].knows_arrivals = True
            self.replicas[0].run_ahead = self._views is None
        self.env.process(self._arrivals())

    def _observe(self):
        """Snapshot every replica at each arrival time minus the signal delay.

        The arrival times are known in advance, so the router's view of request i is the replicas'
        state at exactly t_i - delay (before t = 0: the empty cluster), not an approximation
        refreshed at some polling period. Cost: one event and one snapshot of N replicas per arrival.
        """
        env, delay_ns = self.env, to_ns(self.scenario.cluster.signal_delay_ms / 1e3)
        for t in self._arrival_ns:
            if t - delay_ns > env.now:
                yield _Urgent(env, t - delay_ns - env.now)
            self._views.append(tuple(Load.of(r) for r in self.replicas))

    def _arrivals(self):
        """Admit each request at its arrival instant: cluster cap, router, then the replica's checks.

        Rejection reasons: ``cluster_full`` (``cluster.max_in_flight`` requests already in the
        cluster; never routed), then, at the replica the router chose, ``never_fits`` or
        ``prompt_exceeds_budget`` (see :func:`rejection_reasons`) and ``queue_full``
        (``scheduler.max_waiting``). A routed request records its replica even when rejected.
        Every arrival takes its own snapshot off the queue, routed or not.
        """
        env, wl, rec, sc = self.env, self.workload, self.recorder, self.scenario
        max_waiting, max_in_flight = sc.scheduler.max_waiting, sc.cluster.max_in_flight
        replicas, views = self.replicas, self._views
        arrival_ns = self._arrival_ns
        prompts, outputs = wl.prompt_tokens.tolist(), wl.output_tokens.tolist()
        tenants, priorities = wl.tenant.tolist(), wl.priority.tolist()
        arrival_s = wl.arrival_s.tolist()
        single = len(replicas) == 1 and views is None
        lone = replicas[0] if len(replicas) == 1 else None  # told when each request will arrive
        rejected = [rejection_reasons(s, wl.prompt_tokens, wl.output_tokens) for s in self.replica_scenarios]
        for i, t in enumerate(arrival_ns):
            if lone is not None:
                lone.next_arrival_ns = t
            if t > env.now:
                yield _Urgent(env, t - env.now)
            now_s = arrival_s[i]
            if self.on_progress is not None and i % 1024 == 0:
                self.on_progress(now_s, i)
            view = None if views is None else views.popleft()
            if max_in_flight is not None and \
                    sum(r.num_running + r.num_waiting for r in replicas) >= max_in_flight:
                rec.reject(now_s, i, "cluster_full")
                continue
            if single:
                replica = replicas[0]
            else:
                replica = replicas[self.router.route(i, replicas if view is None else view)]
            rec.replica[i] = replica.index
            reason = rejected[replica.index].get(i)
            if reason is None and max_waiting is not None and replica.num_waiting >= max_waiting:
                reason = "queue_full"
            if reason is not None:
                rec.reject(now_s, i, reason)
                continue
            rec.arrive(now_s, i)
            replica.submit(Request(i, now_s, prompts[i], outputs[i], tenants[i], priorities[i]), now_s)
        if lone is not None:
            lone.next_arrival_ns = math.inf
        self.arrivals_done = True
        for replica in replicas:
            replica.close()

    def run(self) -> float:
        """Run to the end (drained, or ``sim.max_time_s``); returns the end time of the run, s.

        The run ends at its last event (a completion, a rejection or an arrival) when it drained, and
        at the clock stop when the stop cut it short (requests still in the system, or still to come).
        """
        limit = self.scenario.sim.max_time_s
        limit_ns = None if limit is None else _stop_ns(limit)
        self.env.run(until=limit_ns)
        for replica in self.replicas:
            replica.stop(self.env.now)
        rec = self.recorder
        in_system = [r for rep in self.replicas for r in (*rep.scheduler.running, *rep.scheduler.waiting)]
        if in_system and limit is None:
            raise RuntimeError(f"the engine stopped with {len(in_system)} requests in the system: a scheduler bug")
        cut = limit_ns is not None and (in_system or not self.arrivals_done)
        end_s = limit_ns / NS_PER_S if cut else rec.t_last
        for req in in_system:
            rec.unfinished(req, end_s)
        rec.close(end_s)
        return end_s
