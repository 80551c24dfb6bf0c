"""The simulation clock: whole nanoseconds.

SimPy's clock here counts integer nanoseconds, and every time that crosses into the model (arrival
instants, step durations, timers, the clock stop) is put on that grid once, at the engine's edge.
Sums of integers are exact, so a run of ``n`` steps of ``d`` ns ends at ``start + n * d`` whether
it is stepped one event at a time or taken in one go, and whether an arrival falls *exactly* on a
step boundary is a fact, not an accident of floating-point rounding. That makes the tie rule below
decidable, and fast-forward provably the same as stepping.

**The tie rule.** Events at one instant happen in this order: the clock stop (``sim.max_time_s``;
nothing at or after it happens), then arrivals and the router's snapshots, then the engines. So an
arrival at the instant a step ends is seen by the plan of the next step, and a router reading a
replica at that instant sees the step that is ending. A client that sends a request because another
completed (``workload.max_concurrency``, closed loops) sends it at the completion's instant; then the
engines finish their steps at that instant first, the client sends, and only then do the engines plan
(:class:`Late`), so such a send too is seen by every plan made at its instant.

A nanosecond is far below any step of a real engine (microseconds at the least), so rounding to it
changes no result that matters; every step lasts at least 1 ns, so time always advances.
"""

from __future__ import annotations

import math

import numpy as np
import simpy
from simpy.core import URGENT

NS_PER_S = 1_000_000_000


def to_ns(seconds: float) -> int:
    """The nearest nanosecond."""
    return round(seconds * NS_PER_S)


def ceil_ns(seconds: float) -> int:
    """The first nanosecond at or after ``seconds`` (a timer must not fire early)."""
    return math.ceil(seconds * NS_PER_S)


def snap_s(seconds: np.ndarray) -> np.ndarray:
    """Times in seconds put on the nanosecond grid (still in seconds, as the frames report them)."""
    return np.rint(np.asarray(seconds, dtype=np.float64) * NS_PER_S) / NS_PER_S


def step_ns(duration_ms: float) -> int:
    """A step's duration on the grid: the nearest nanosecond, and at least one."""
    return max(1, int(duration_ms * 1_000_000 + 0.5))  # durations are >= 0: int(x + 0.5) rounds


LATE = 2  # a SimPy priority after NORMAL (1): after everything else of its instant


class Late(simpy.Event):
    """An event at the current instant that fires after every urgent and normal event of it: where
    an engine waits, with a client, before planning (the tie rule above)."""

    def __init__(self, env: simpy.Environment):
        super().__init__(env)
        self._ok, self._value = True, None
        env.schedule(self, LATE, 0)


class Urgent(simpy.Event):
    """A timeout that fires before every normal event of its instant (as SimPy's own stop does): how
    arrivals, snapshots and client sends come before the engines at a tie."""

    def __init__(self, env: simpy.Environment, delay_ns: int):
        super().__init__(env)
        self._ok, self._value = True, None
        env.schedule(self, URGENT, delay_ns)
