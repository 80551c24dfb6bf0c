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
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np
import simpy

from simbatch.client import Client
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
        self._cost_ms = (device.tau0_ms, device.beta_ms, device.prefill_ms_per_token)
        self.swap_s_per_block = scenario.kv_cache.swap_ms_per_block / 1e3
        self.fast_forward = scenario.sim.fast_forward
        self.scheduler: BaseScheduler = make_scheduler(scenario, tenant_names)
        self.recorder = recorder
        self.check = check_invariants
        self.step = 0
        self._wake: simpy.Event | None = None  # set while sleeping or inside a run of steps
        self._run_start_s = 0.0  # the run of steps in progress: start and step time
        self._run_step_s = 0.0
        self._run_offset = 0
        self._run_ctx: tuple | None = None  # what a run of steps in progress needs to be applied early
        self._step_ctx: tuple | None = None  # the single step in progress, to record if the clock stops
        # Set by the arrival process when every request comes here: when the next one arrives
        # (inf after the last). Runs of steps then end there by themselves instead of being woken.
        self.next_arrival_at_s: float | None = None
        # Whether the replica may run ahead of SimPy's clock (module docstring), up to the next
        # arrival and to stop_at_s.
        self.run_ahead = False
        self.stop_at_s = math.inf if scenario.sim.max_time_s is None else scenario.sim.max_time_s
        # Told of every completion, at its time (a client whose next send waits on it); None: nobody.
        self.on_finish: Callable[[int], None] | None = None
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
        if self._run_step_s > 0:
            i = int((self.env.now - self._run_start_s) // self._run_step_s) + 1
            return self.scheduler.kv_blocks_during(self._run_offset + i)
        return self.scheduler.kv_blocks_used

    # ---------------------------------------------------------------- inputs
    def submit(self, req: Request, now: float) -> None:
        req.replica = self.index
        self.scheduler.add(req, now)
        self._poke()

    def close(self) -> None:
        self.scheduler.close()
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---------------------------------------------------------------- the loop
    def step_duration_s(self, plan: StepPlan) -> float:
        """:func:`simbatch.cost.step_time_s` of the plan, plus its swap traffic (same arithmetic)."""
        tau0_ms, beta_ms, gamma_ms = self._cost_ms
        return (tau0_ms + beta_ms * (plan.decode_seqs + plan.padded_decode_seqs)
                + gamma_ms * (plan.prefill_tokens + plan.padded_prefill_tokens)) / 1e3 + \
            plan.swap_blocks * self.swap_s_per_block

    def _run(self):
        env, sched, rec, index = self.env, self.scheduler, self.recorder, self.index
        # Bound once: this loop runs a few times per request.
        schedule, repeatable_steps, record = sched.schedule, sched.repeatable_steps, rec.steps
        step_duration_s = self.step_duration_s
        fast_forward, run_ahead, stop_at_s = self.fast_forward, self.run_ahead, self.stop_at_s
        contiguous, now = False, env.now  # now: this replica's clock, ahead of env.now when running ahead
        while True:
            plan = schedule(now)
            if plan.__class__ is not StepPlan:
                self._wake = env.event()
                yield self._wake if plan is None else (self._wake | env.timeout(plan - env.now))
                self._wake = None
                contiguous, now = False, env.now
                continue
            if self.check:
                sched.check_invariants()
            if plan.num_preempted or plan.num_admitted:
                rec.waiting_change(now, plan.num_preempted - plan.num_admitted)
            duration = step_duration_s(plan)
            # The row of these steps, in SHAPE_COLUMNS order.
            shape = (duration, len(sched.running), len(sched.waiting), plan.batch_size, plan.decode_seqs,
                     plan.prefill_tokens, plan.padded_tokens, plan.decode_seqs, plan.num_preempted, plan.swap_blocks)
            k = repeatable_steps(plan, self.step) if fast_forward else 1
            if k == 1:
                kv_sum = sched.kv_blocks_sum(1)
                end = now + duration
                if not run_ahead or end >= self.next_arrival_at_s or end >= stop_at_s:
                    self._step_ctx = (now, shape, kv_sum, contiguous)
                    # SimPy's clock catches up with the replica's (its arithmetic when they agree).
                    yield env.timeout(duration if env.now == now else end - env.now)
                    self._step_ctx = None
                outcome = sched.finish_step(plan, end, self.step)
                if outcome.itl_tokens != plan.decode_seqs:  # a token after a pause, or a first token
                    shape = _replaced(shape, _ITL, outcome.itl_tokens)
                record(index, now, 1, shape, kv_sum, contiguous)
                n = 1
            else:
                n, start = 0, now  # steps of this plan done so far; start of the part in progress
                while n < k:
                    self._run_ctx = (plan, shape, contiguous)
                    self._run_start_s, self._run_step_s, self._run_offset = start, duration, n
                    if self.next_arrival_at_s is not None:
                        m, cut = self._steps_before_arrival(start, duration, k - n)
                        end = start + m * duration
                        if not run_ahead or cut or end >= stop_at_s:
                            yield env.timeout(m * duration if env.now == start else end - env.now)
                    else:
                        m, cut = yield from self._run_of_steps(start, duration, k - n)
                        end = start + m * duration
                    self._run_step_s = 0.0
                    kv_sum = sched.kv_blocks_sum(n + m) - sched.kv_blocks_sum(n) if n else sched.kv_blocks_sum(m)
                    record(index, start, m, shape, kv_sum, contiguous)
                    n, start, contiguous = n + m, end, True
                    if cut and not sched.plan_survives_arrivals():
                        break
                    # The arrival only lengthened WAITING: the same plan runs on, recorded anew.
                    shape = _replaced(shape, _WAITING, len(sched.waiting))
                self._run_ctx = None
                outcome = sched.finish_steps(plan, n, end, self.step)
            self.step += n
            if outcome.stall_gaps_s:
                rec.stall_gaps_s.extend(outcome.stall_gaps_s)
            if outcome.finished:
                rec.finish(end, outcome.finished)
                if self.on_finish is not None:
                    self.on_finish(len(outcome.finished))
            contiguous, now = True, end

    def stop(self, at_s: float) -> None:
        """The clock stopped at ``at_s``: settle what was in progress, as stepping would have.

        Steps of a run that ended before the stop are applied. The step in progress at the stop is
        recorded (it began: its admissions and preemptions happened) with no tokens (``itl_tokens``
        0; its tokens never came), and not applied.
        """
        sched, rec = self.scheduler, self.recorder
        if self._step_ctx is not None:
            start, shape, kv_sum, contiguous = self._step_ctx
            rec.steps(self.index, start, 1, _replaced(shape, _ITL, 0), kv_sum, contiguous)
            self._step_ctx = None
        if self._run_ctx is not None:
            plan, shape, contiguous = self._run_ctx
            start, done, duration = self._run_start_s, self._run_offset, shape[0]
            m = int((at_s - start) // duration)
            if m > 0 and start + m * duration >= at_s:
                m -= 1
            if m > 0:
                rec.steps(self.index, start, m, shape, sched.kv_blocks_sum(done + m) - sched.kv_blocks_sum(done),
                          contiguous)
            rec.steps(self.index, start + m * duration, 1, _replaced(shape, _ITL, 0),
                      sched.kv_blocks_sum(done + m + 1) - sched.kv_blocks_sum(done + m), m > 0 or contiguous)
            if done + m > 0:
                sched.finish_steps(plan, done + m, start + m * duration, self.step)
                self.step += done + m
            self._run_ctx = None
        self.scheduler.sync()

    def _steps_before_arrival(self, start_s: float, step_s: float, k: int) -> tuple[int, bool]:
        """Of up to ``k`` steps from ``start_s``, how many run before the next arrival here is seen.

        The step during which it arrives is the last one. Returns (steps, whether the arrival cut the run).
        """
        t_next = self.next_arrival_at_s
        if t_next < start_s + k * step_s:
            return min(int((t_next - start_s) // step_s) + 1, k), True
        return k, False

    def _run_of_steps(self, start_s: float, step_s: float, k: int):
        """Hold the GPU for up to ``k`` steps, or until an arrival is seen (woken by ``submit``).

        Returns (steps done, whether an arrival cut the run short).
        """
        env = self.env
        self._wake = env.event()
        yield self._wake | env.timeout(k * step_s)
        n, cut = k, False
        if self._wake.triggered and env.now < start_s + k * step_s:
            # An arrival during step n: finish that step; the scheduler sees the arrival after it.
            n, cut = min(int((env.now - start_s) // step_s) + 1, k), True
            end_s = start_s + n * step_s
            self._wake = None
            if end_s > env.now:
                yield env.timeout(end_s - env.now)
        self._wake = None
        return n, cut

    @property
    def kv_blocks_total(self) -> int:
        """Device KV blocks of this replica (a heterogeneous fleet's replicas differ)."""
        return self.scheduler.kv.device.num_blocks


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
        # With a signal delay, the router reads snapshots taken signal_delay_ms before each arrival.
        self._views: deque[tuple[Load, ...]] | None = None
        if scenario.cluster.signal_delay_ms > 0:
            self._views = deque()
            self.env.process(self._observe())  # first, so that it snapshots t <= 0 before any arrival
        self._arrival_s = workload.arrival_s.tolist()  # floats: faster to read one at a time than NumPy's
        # A client sends when earlier requests complete, so send times are known only as the run goes.
        self.client = Client.of(self.env, scenario.workload)
        if self.client is not None:
            for replica in self.replicas:
                replica.on_finish = self.client.done
        # A lone replica is told when each request will arrive (see _arrivals), and unless
        # snapshots read its state in between, it may run ahead up to there; not with a client,
        # whose next send may wait on any of its completions.
        self.replicas[0].run_ahead = len(self.replicas) == 1 and self._views is None and self.client is None
        self.env.process(self._arrivals())

    def _observe(self):
        """Snapshot every replica at each arrival time minus the signal delay.

        The arrival times are known in advance, so the router's view of request i is the replicas'
        state at exactly t_i - delay (before t = 0: the empty cluster), not an approximation
        refreshed at some polling period. Cost: one event and one snapshot of N replicas per arrival.
        """
        env, delay_s = self.env, self.scenario.cluster.signal_delay_ms / 1e3
        for t in self._arrival_s:
            if t - delay_s > env.now:
                yield env.timeout(t - delay_s - env.now)
            self._views.append(tuple(Load.of(r) for r in self.replicas))

    def _arrivals(self):
        """Admit each request at its arrival instant: cluster cap, router, then the replica's checks.

        Rejection reasons: ``cluster_full`` (``cluster.max_in_flight`` requests already in the
        cluster; never routed), then, at the replica the router chose, ``never_fits`` or
        ``prompt_exceeds_budget`` (see :func:`rejection_reasons`) and ``queue_full``
        (``scheduler.max_waiting``). A routed request records its replica even when rejected.
        """
        env, wl, rec, sc = self.env, self.workload, self.recorder, self.scenario
        max_waiting, max_in_flight = sc.scheduler.max_waiting, sc.cluster.max_in_flight
        replicas, views = self.replicas, self._views
        arrival_s = self._arrival_s
        prompts, outputs = wl.prompt_tokens.tolist(), wl.output_tokens.tolist()
        tenants, priorities = wl.tenant.tolist(), wl.priority.tolist()
        single = len(replicas) == 1 and views is None
        client = self.client
        # Closed-loop users stop at the workload's duration (open-loop arrivals are all before it).
        stop_sending_s = sc.workload.duration_s if client is not None and not client.open_loop else None
        # Told when each request will arrive; not with a client, whose send times depend on completions.
        lone = replicas[0] if len(replicas) == 1 and client is None else None
        rejected = [rejection_reasons(s, wl.prompt_tokens, wl.output_tokens) for s in self.replica_scenarios]
        for i, t in enumerate(arrival_s):
            if lone is not None:
                lone.next_arrival_at_s = t
            now = env.now
            if client is not None:
                wait_s = yield from client.send(t)
                now = env.now
                if stop_sending_s is not None and now >= stop_sending_s:
                    break
                rec.sent(i, now, wait_s)
                t = now  # the server's clock starts at the send
            elif t > now:
                yield env.timeout(t - now)
                now = env.now
            if self.on_progress is not None and i % 1024 == 0:
                self.on_progress(now, i)
            if max_in_flight is not None and \
                    sum(r.num_running + r.num_waiting for r in replicas) >= max_in_flight:
                rec.reject(now, i, "cluster_full")
                if client is not None:
                    client.done()
                continue
            if single:
                replica = replicas[0]
            else:
                replica = replicas[self.router.route(i, replicas if views is None else views.popleft())]
            rec.replica[i] = replica.index
            reason = rejected[replica.index].get(i)
            if reason is None and max_waiting is not None and replica.num_waiting >= max_waiting:
                reason = "queue_full"
            if reason is not None:
                rec.reject(now, i, reason)
                if client is not None:
                    client.done()
                continue
            rec.arrive(now, i)
            replica.submit(Request(i, t, prompts[i], outputs[i], tenants[i], priorities[i]), now)
        if lone is not None:
            lone.next_arrival_at_s = math.inf
        for replica in replicas:
            replica.close()

    def run(self) -> float:
        """Run to the end (drained, or ``sim.max_time_s``); returns the end time of the run, s."""
        limit = self.scenario.sim.max_time_s
        self.env.run(until=limit)
        for replica in self.replicas:
            replica.stop(self.env.now)
        rec = self.recorder
        in_system = [r for rep in self.replicas for r in (*rep.scheduler.running, *rep.scheduler.waiting)]
        if in_system and limit is None:
            raise RuntimeError(f"the engine stopped with {len(in_system)} requests in the system: a scheduler bug")
        end_s = limit if in_system else rec.t_last
        for req in in_system:
            rec.unfinished(req, end_s)
        rec.close(end_s)
        return end_s
