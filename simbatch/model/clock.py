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
engines finish their steps at that instant first, the client sends (``SEND``), and only then do the
engines plan (``PLAN``), so such a send sees every completion of its instant, and every plan made at its
instant sees the send.

A nanosecond is far below any step of a real engine (microseconds at the least), so rounding to it
changes no result that matters; every step lasts at least 1 ns, so time always advances.

**The horizon.** Times are held in 64-bit integers of nanoseconds, which reach 2^63 ns, 292 years. An
arrival may come at most ``MAX_ARRIVAL_S`` (half of that, 146 years) after t = 0, which leaves the other
half for serving it; a workload arriving later is refused where it is drawn, naming the setting
(a rate too low, a trace's epoch milliseconds read as seconds), never left to wrap into negative latencies.
"""

from __future__ import annotations

import math

import numpy as np
import simpy
from simpy.core import URGENT

from simbatch.config.base import MAX_TIME_S

NS_PER_S = 1_000_000_000
MAX_ARRIVAL_S = MAX_TIME_S
"""The latest arrival the clock takes, s (about 4.6e9 s, 146 years): half of what int64 nanoseconds hold."""


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
    ns = int(duration_ms * 1_000_000 + 0.5)  # durations are >= 0: int(x + 0.5) rounds
    return ns if ns > 0 else 1


# SimPy priorities after NORMAL (1), for the phases of an instant when a client sends on completions:
# steps end (normal events), then the client sends (SEND), then the engines plan (PLAN).
SEND, PLAN = 2, 3


class Late(simpy.Event):
    """An event at the current instant that fires after every urgent and normal event of it (and,
    at the default ``PLAN``, after every send): where an engine waits, with a client, before planning."""

    def __init__(self, env: simpy.Environment, priority: int = PLAN):
        super().__init__(env)
        self._ok, self._value = True, None
        env.schedule(self, priority, 0)


def trigger_late(event: simpy.Event, priority: int = SEND) -> None:
    """``event.succeed()``, but processed after the normal events of this instant (``SEND``): a client
    freed by a completion sends once every step ending at that instant is done."""
    event._ok, event._value = True, None
    event.env.schedule(event, priority, 0)


class Urgent(simpy.Event):
    """A timeout that fires before every normal event of its instant (as SimPy's own stop does): how
    arrivals, snapshots and client sends come before the engines at a tie."""

    def __init__(self, env: simpy.Environment, delay_ns: int):
        # Event.__init__ written out, as SimPy's Timeout does: one of these per arrival.
        self.env, self.callbacks = env, []
        self._ok, self._value = True, None
        env.schedule(self, URGENT, delay_ns)
