"""The ranks of one data-parallel MoE engine, stepping in lockstep as vLLM's do.

vLLM runs ``--data-parallel-size N`` of a mixture of experts as N engine cores, each with its own
scheduler and KV cache (data-parallel attention), whose MoE layers are collectives across the ranks
(expert parallelism's dispatch and combine, or the all-gather without it). So every rank runs a forward
pass at every step, together (vLLM's ``DPEngineCoreProc``, v1/engine/core.py):

- a step begins when every rank has planned it and lasts as long as the slowest rank's: one rank's
  prefill holds the other ranks' decodes;
- a rank with nothing to run while the group is running steps a dummy batch, one decode token
  through the whole model (``execute_dummy_batch``): a step of one padded decode slot;
- every step, the ranks agree on their token counts (``coordinate_batch_across_dp``): when every rank's
  fits a CUDA graph (at most ``min(2 max_num_seqs (1 + num_speculative_tokens), 512,
  max_num_batched_tokens)`` tokens, vLLM's largest capture size), each pads its batch to the largest
  rank's count, pad tokens computed through the whole model like real ones (``padded_tokens``); a
  larger step runs eager on every rank, unpadded. (vLLM also rounds a count up to its CUDA graph's
  size, with or without data parallelism; simbatch does not, here or elsewhere);
- the ranks agree whether any of them has requests left only every 32 steps of a "wave"
  (``_has_global_unfinished_reqs``): after the last request leaves, the group runs dummy steps up to the
  next multiple of 32 since the wave began, then sleeps until a request arrives at any rank, which
  starts a new wave.

Dense models' data-parallel ranks are independent engines in vLLM (``reconfigure_for_independent_dp_rank``)
and run as independent replicas here. A group is a scenario's replicas that share a device whose
``moe.data_parallel_size`` is N > 1, taken N at a time in index order (:func:`form_groups`).

The group is one SimPy process that plans, costs and applies its ranks' steps one at a time, in rank
order, on the ranks' own schedulers, recorder rows and observers; each rank's own loop
(:mod:`simbatch.engine.replica`) stands aside. It takes no runs of steps and never runs ahead: the
accelerated engine's schedulers (their twins) plan the very same single steps, so both engines give
identical frames, and a group costs one SimPy event a step (not a run), which is the price of being
exact without a closed form for a max over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import simpy

from simbatch.config import Scenario
from simbatch.model.clock import NS_PER_S, Late, ceil_ns
from simbatch.model.step import IDLE, StepPlan
from simbatch.observe.recorder import StepShape, replaced

SYNC_EVERY_STEPS = 32
"""vLLM's ranks all-reduce whether any has unfinished requests every this many steps of a wave."""

DUMMY = StepPlan(padded_decode_seqs=1)
"""An idle rank's dummy batch: one decode token through the whole model, reading no KV cache."""


def data_parallel_size(scenario: Scenario) -> int:
    """The ranks that step together in an engine of ``scenario``: its MoE's ``data_parallel_size``, 1 for a
    dense model (whose data-parallel ranks are independent)."""
    moe = scenario.device.moe
    return 1 if moe is None else moe.data_parallel_size


def max_graph_tokens(scenario: Scenario) -> int:
    """The most tokens a step of ``scenario``'s engine runs in a CUDA graph: vLLM 0.19's default largest
    capture size, ``min(2 max_num_seqs (1 + num_speculative_tokens), 512, max_num_batched_tokens)``
    (``VllmConfig._set_cudagraph_sizes``)."""
    b, spec = scenario.batching, scenario.device.speculative
    decode_query_tokens = 1 + (spec.num_speculative_tokens if spec is not None else 0)
    return min(2 * b.max_num_seqs * decode_query_tokens, 512, b.max_num_batched_tokens)


def _tokens(plan: StepPlan) -> int:
    """The tokens a plan runs through the model, padding included."""
    return plan.decode_seqs + plan.padded_decode_seqs + plan.prefill_tokens + plan.padded_prefill_tokens + \
        plan.draft_tokens


def dp_pads(tokens: Sequence[int], graph_tokens: int) -> list[int]:
    """The pad tokens each rank adds to its step (``coordinate_batch_across_dp``): up to the largest
    rank's count when every rank's fits a CUDA graph (the largest does), none otherwise."""
    most = max(tokens)
    return [most - t for t in tokens] if most <= graph_tokens else [0] * len(tokens)


def form_groups(env: simpy.Environment, replicas: Sequence, scenarios: Sequence[Scenario]) -> list[DPGroup]:
    """Group the replicas that are ranks of one data-parallel MoE engine: consecutive replicas running
    one scenario whose MoE spans N > 1 data-parallel ranks, N at a time. Fewer than N left over (a lone
    replica standing for one rank of a symmetric engine) run alone, as before."""
    groups, i = [], 0
    while i < len(replicas):
        n = data_parallel_size(scenarios[i])
        if n > 1 and i + n <= len(replicas) and all(s is scenarios[i] for s in scenarios[i:i + n]):
            groups.append(DPGroup(env, replicas[i:i + n], max_graph_tokens(scenarios[i])))
            i += n
        else:
            i += 1
    return groups


class DPGroup:
    """The ranks of one data-parallel engine and the process that steps them together (module docstring)."""

    def __init__(self, env: simpy.Environment, ranks: Sequence, graph_tokens: int):
        self.env = env
        self.ranks = tuple(ranks)
        self.graph_tokens = graph_tokens  # the largest step every rank pads to the largest rank's count
        for rank in self.ranks:
            rank.group = self
        self.wave_steps = 0  # steps of the wave in progress (vLLM's step_counter); 0: the group sleeps
        self.process = env.process(self._run())

    def _unfinished(self) -> bool:
        return any(r.scheduler.num_running or r.scheduler.num_waiting for r in self.ranks)

    def _sleep(self, plans: list):
        """Every rank is idle and the wave is over: wait for an arrival at any rank (each rank's ``submit``
        pokes the event the group gives them all), or the earliest of their timers."""
        env = self.env
        wake = env.event()
        for rank in self.ranks:
            rank._wake = wake
        due = [ceil_ns(p.time_s) for p in plans if p is not IDLE]
        yield wake if not due else (wake | env.timeout(max(1, min(due) - env.now)))
        for rank in self.ranks:
            rank._wake = None

    def _moved(self, rank, plan: StepPlan, now_s: float) -> None:
        """What the rank's own loop does with a plan before its step: check, count and tell who moved."""
        if rank.check:
            rank.scheduler.check_invariants()
        preempted, admitted = plan.preempted, plan.admitted
        if preempted or admitted:
            rank.recorder.waiting_change(now_s, len(preempted) - len(admitted))
            if rank.move_observers:
                rank._moved(plan, now_s)

    def _step(self, rank, plan: StepPlan, pad: int, real: bool) -> tuple[int, StepShape, int]:
        """The rank's step: its duration with ``pad`` pad tokens more (costed as padded decode slots),
        its row's shape and its KV blocks."""
        sched = rank.scheduler
        costed = replace(plan, padded_decode_seqs=plan.padded_decode_seqs + pad) if pad else plan
        shape = StepShape(len(sched.running), len(sched.waiting), len(plan.decodes) + len(plan.slices),
                          plan.decode_seqs + plan.draft_tokens, plan.prefill_tokens,
                          costed.padded_decode_seqs + plan.padded_prefill_tokens, plan.decode_seqs,
                          len(plan.preempted), plan.swap_blocks)
        return rank.step_duration_ns(costed), shape, rank.accel.kv_blocks_sum(1) if real else sched.kv_blocks_used

    def _run(self):
        env, ranks = self.env, self.ranks
        late = ranks[0].plans_after_sends  # a client: plan after the sends of this instant
        contiguous = False
        while True:
            if late:
                yield Late(env)
            now = env.now
            now_s = now / NS_PER_S
            plans = [r.scheduler.schedule(now_s) for r in ranks]
            real = [p.__class__ is StepPlan for p in plans]
            if not self.wave_steps and not any(real):
                yield from self._sleep(plans)
                contiguous = False
                continue
            plans = [p if is_real else DUMMY for p, is_real in zip(plans, real, strict=True)]
            for rank, plan, is_real in zip(ranks, plans, real, strict=True):
                if is_real:
                    self._moved(rank, plan, now_s)
            pads = dp_pads([_tokens(p) for p in plans], self.graph_tokens)
            # Per rank: (plan, duration on the rank, shape, KV blocks, real).
            steps = [(plan, *self._step(rank, plan, pad, is_real), is_real)
                     for rank, plan, pad, is_real in zip(ranks, plans, pads, real, strict=True)]
            duration = max(s[1] for s in steps)  # every rank waits for the slowest at the collectives
            end = now + duration
            for rank, (plan, _, shape, kv_sum, _) in zip(ranks, steps, strict=True):
                rank._step_ctx = (now, duration, shape, kv_sum, contiguous, plan)  # (for a clock stop)
            yield env.timeout(duration)
            end_s = end / NS_PER_S
            for rank, (plan, _, shape, kv_sum, is_real) in zip(ranks, steps, strict=True):
                rank._step_ctx = None
                if is_real:
                    outcome = rank.scheduler.finish_step(plan, end_s, rank.step)
                    if outcome.itl_tokens != plan.decode_seqs:
                        shape = replaced(shape, "itl_tokens", outcome.itl_tokens)
                    rank.step += 1
                rank.recorder.record_steps(rank.index, now_s, 1, shape, kv_sum, contiguous, duration)
                if rank.step_observers:
                    rank._stepped(now, duration, plan)
                if is_real and (outcome.finished or outcome.stall_gaps_s):
                    rank._finished(outcome, end_s)
            contiguous = True
            self.wave_steps += 1
            if self.wave_steps % SYNC_EVERY_STEPS == 0 and not self._unfinished():
                self.wave_steps = 0  # the wave is over
