"""Small builders shared by the core tests: scenarios, requests, and a hand-cranked scheduler.

The scheduler tests run without SimPy: :class:`Driver` plays the engine's part, asking the
scheduler for a plan, advancing a clock by a fixed step, and applying the step, with the pool and
block invariants checked after every call so that each hand-computed case also checks conservation.
"""

from __future__ import annotations

import copy
import math
import signal
from typing import Any

from simbatch.config import Scenario
from simbatch.engine.accel.lockstep import LockstepRequest
from simbatch.engine.replica import scheduler_for
from simbatch.inputs.loading import apply_overrides, scenario_from_dict
from simbatch.model.request import Request
from simbatch.model.step import StepOutcome, StepPlan
from simbatch.schedulers import BaseScheduler

# Small numbers that are easy to compute by hand: 4-token blocks, a 16-token budget, 4 slots,
# and a step cost of 10 ms + 1 ms per decoding sequence + 0.1 ms per prefill token.
BASE: dict[str, Any] = {
    "workload": {"num_requests": 1},
    "device": {"tau0_ms": 10.0, "beta_ms": 1.0, "prefill_ms_per_token": 0.1},
    "kv_cache": {"block_size": 4, "num_blocks": 64},
    "batching": {"mode": "continuous", "max_num_seqs": 4, "max_num_batched_tokens": 16},
}


def make_scenario(base: dict | None = None, **overrides: Any) -> Scenario:
    """A validated scenario: ``BASE`` (or ``base``) with overrides given as ``section__field=value``.

    ``make_scenario(batching__mode="static", kv_cache__num_blocks=8)`` sets ``batching.mode`` and
    ``kv_cache.num_blocks``; double underscores stand for the dots of a ``--set`` override.
    """
    data = apply_overrides(BASE if base is None else base,
                           [(key.replace("__", "."), value) for key, value in overrides.items()])
    return scenario_from_dict(data)


def changed(data: dict, **changes: Any) -> dict:
    """A deep copy of scenario ``data`` with each change made: ``kv_cache__swap_blocks=16`` sets
    ``data["kv_cache"]["swap_blocks"]`` (``__`` for the dot, so that changes are keyword arguments)."""
    out = copy.deepcopy(data)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def fixed(value: int) -> dict:
    return {"dist": "fixed", "value": value}


def spaced(n: int, gap_s: float, prompt: int, output: int, **overrides):
    """``n`` requests arriving every ``gap_s`` seconds, the first at ``gap_s``."""
    return make_scenario(workload__num_requests=n, workload__arrival__process="constant",
                         workload__arrival__rate=1 / gap_s, workload__prompt_tokens=fixed(prompt),
                         workload__output_tokens=fixed(output), **overrides)


def as_dist(length: int | dict) -> dict:
    return fixed(length) if isinstance(length, int) else length


def at_once(n: int, prompt: int | dict, output: int | dict, **overrides):
    """``n`` requests all at t=0 (``prompt``/``output``: a length or a length distribution)."""
    return make_scenario(workload__num_requests=n, workload__arrival__rate=math.inf,
                         workload__prompt_tokens=as_dist(prompt), workload__output_tokens=as_dist(output),
                         **overrides)


def req(request_id: int, prompt: int, output: int, arrival_s: float = 0.0, *, tenant: int = 0,
        priority: int = 0) -> Request:
    """A fresh request, as the engine builds one at arrival: of the accelerated twin's class, which can
    join a lockstep group and is a plain :class:`Request` otherwise, so one hand-built case steps either
    engine's scheduler."""
    return LockstepRequest(request_id, arrival_s, prompt, output, tenant=tenant, priority=priority)


def tokens(plan: StepPlan) -> dict[int, int]:
    """``plan.scheduled`` as {request_id: tokens this step}, in scheduling order."""
    return {r.request_id: n for r, n in plan.scheduled}


class Driver:
    """Steps a scheduler by hand: every step lasts ``step_s`` and ends where the next one starts."""

    def __init__(self, scenario: Scenario, tenant_names: tuple[str, ...] = ("default",), step_s: float = 1.0):
        self.sched: BaseScheduler = scheduler_for(scenario, tenant_names)
        self.now = 0.0
        self.step = 0
        self.step_s = step_s

    def add(self, *requests: Request) -> None:
        for r in requests:
            self.sched.add(r, self.now)
        self.sched.check_invariants()

    def plan(self) -> StepPlan:
        plan = self.sched.schedule(self.now)
        assert isinstance(plan, StepPlan), f"expected a step at t={self.now}, got {plan!r}"
        self.sched.check_invariants()
        return plan

    def finish(self, plan: StepPlan) -> StepOutcome:
        self.now += self.step_s
        outcome = self.sched.finish_step(plan, self.now, self.step)
        self.step += 1
        self.sched.check_invariants()
        return outcome

    def run(self) -> tuple[StepPlan, StepOutcome]:
        plan = self.plan()
        return plan, self.finish(plan)


def ctrl_c_reaches_the_child() -> None:
    """``preexec_fn`` for a child a test will Ctrl-C: a shell starts background jobs (CI runners,
    ``make test &``) with SIGINT ignored, children inherit that, and Python then never installs its
    handler. A user's foreground command has it; so must the child under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
