"""The SimPy model: an arrival process, a router, and one engine loop per replica.

The engine loop asks its scheduler for a plan, holds the GPU for the plan's step time (one
``timeout`` per step), applies the step, and repeats. With nothing to do it sleeps, without ticking,
until a request arrives or a batching timer falls due.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from simbatch.config import Scenario
from simbatch.cost import blocks_for, peak_kv_tokens, step_time_s
from simbatch.metrics.recorder import Recorder
from simbatch.request import Request
from simbatch.router import make_router
from simbatch.schedulers import BaseScheduler, StepPlan, make_scheduler
from simbatch.workload import WorkloadArrays


def rejection_reason(scenario: Scenario, prompt_tokens: int, output_tokens: int) -> str | None:
    """Why a request can never be served by an engine of this scenario, or None if it can.

    Checked at arrival so that the simulation never waits on a request that cannot fit.
    """
    kv, b = scenario.kv_cache, scenario.batching
    if blocks_for(peak_kv_tokens(prompt_tokens, output_tokens), kv.block_size) > kv.num_blocks:
        return "never_fits"
    if b.mode == "continuous" and not b.enable_chunked_prefill and prompt_tokens > b.max_num_batched_tokens:
        return "prompt_exceeds_budget"
    return None


class Replica:
    """One engine: a scheduler, its KV cache, and the SimPy process that steps it."""

    def __init__(self, env: simpy.Environment, index: int, scenario: Scenario, recorder: Recorder,
                 tenant_names: tuple[str, ...], check_invariants: bool = False):
        self.env = env
        self.index = index
        self.device = scenario.device
        self.swap_s_per_block = scenario.kv_cache.swap_ms_per_block / 1e3
        self.scheduler: BaseScheduler = make_scheduler(scenario, tenant_names)
        self.recorder = recorder
        self.check = check_invariants
        self.step = 0
        self._wake: simpy.Event | None = None
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

    # ---------------------------------------------------------------- inputs
    def submit(self, req: Request) -> None:
        req.replica = self.index
        self.scheduler.add(req, self.env.now)
        self._poke()

    def close(self) -> None:
        self.scheduler.close()
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---------------------------------------------------------------- the loop
    def step_duration_s(self, plan: StepPlan) -> float:
        return step_time_s(self.device, plan.decode_seqs + plan.padded_decode_seqs,
                           plan.prefill_tokens + plan.padded_prefill_tokens) + \
            plan.swap_blocks * self.swap_s_per_block

    def _run(self):
        env, sched, rec = self.env, self.scheduler, self.recorder
        contiguous = False
        while True:
            now = env.now
            plan = sched.schedule(now)
            if not isinstance(plan, StepPlan):
                self._wake = env.event()
                yield self._wake if plan is None else (self._wake | env.timeout(plan - now))
                self._wake = None
                contiguous = False
                continue
            if self.check:
                sched.check_invariants()
            rec.waiting_change(now, plan.num_preempted - plan.num_admitted)
            duration = self.step_duration_s(plan)
            num_running, num_waiting, kv_used = sched.num_running, sched.num_waiting, sched.kv_blocks_used
            yield env.timeout(duration)
            end = env.now
            outcome = sched.finish_step(plan, end, self.step)
            self.step += 1
            shape = (duration, num_running, num_waiting, plan.batch_size, plan.decode_seqs,
                     plan.prefill_tokens, plan.padded_tokens, outcome.itl_tokens, plan.num_preempted,
                     plan.swap_blocks)
            rec.steps(self.index, now, 1, shape, kv_used, contiguous)
            rec.stall_gaps_s.extend(outcome.stall_gaps_s)
            for req in outcome.finished:
                rec.finish(end, req)
            contiguous = True


class Engine:
    """The whole model for one scenario: build it, ``run()`` it, read its recorder."""

    def __init__(self, scenario: Scenario, workload: WorkloadArrays, check_invariants: bool = False,
                 on_progress: Callable[[float, int], None] | None = None):
        self.scenario = scenario
        self.workload = workload
        self.env = simpy.Environment()
        self.recorder = Recorder(len(workload), scenario.cluster.replicas)
        self.replicas = [Replica(self.env, i, scenario, self.recorder, workload.tenant_names, check_invariants)
                         for i in range(scenario.cluster.replicas)]
        self.router = make_router(scenario, self.replicas)
        self.on_progress = on_progress
        self.env.process(self._arrivals())

    def _arrivals(self):
        env, wl, rec, sc = self.env, self.workload, self.recorder, self.scenario
        max_waiting = sc.scheduler.max_waiting
        arrival_s = wl.arrival_s.tolist()
        prompts, outputs = wl.prompt_tokens.tolist(), wl.output_tokens.tolist()
        tenants, priorities = wl.tenant.tolist(), wl.priority.tolist()
        for i, t in enumerate(arrival_s):
            if t > env.now:
                yield env.timeout(t - env.now)
            now = env.now
            reason = rejection_reason(sc, prompts[i], outputs[i])
            if reason is not None:
                rec.reject(now, i, reason)
                continue
            replica = self.router.route(i)
            if max_waiting is not None and replica.num_waiting >= max_waiting:
                rec.reject(now, i, "queue_full")
                continue
            rec.arrive(now, i)
            replica.submit(Request(i, t, prompts[i], outputs[i], tenants[i], priorities[i]))
            if self.on_progress is not None and i % 1024 == 0:
                self.on_progress(now, i)
        for replica in self.replicas:
            replica.close()

    def run(self) -> float:
        """Run to the end (drained, or ``sim.max_time_s``); returns the end time of the run, s."""
        limit = self.scenario.sim.max_time_s
        self.env.run(until=limit)
        rec = self.recorder
        in_system = [r for rep in self.replicas for r in (*rep.scheduler.running, *rep.scheduler.waiting)]
        if in_system and limit is None:
            raise RuntimeError(f"the engine stopped with {len(in_system)} requests in the system: a scheduler bug")
        end_s = limit if in_system else rec.t_last
        for req in in_system:
            rec.unfinished(req, end_s)
        rec.close(end_s)
        return end_s
