"""The autoscaler: replicas started and stopped during the run, as a Horizontal Pod Autoscaler does.

Every ``interval_s`` (an urgent event: it reads the replicas as an arrival at that instant would,
before the engines' steps of the instant) the autoscaler reads its metric over the *ready*
replicas, those taking requests, and applies HPA's rule::

    ratio   = metric / target                  # metric: mean over the ready replicas
    desired = ready            if |ratio - 1| <= tolerance
              ceil(ready x ratio)  otherwise   # clipped to [min_replicas, max_replicas]

With ``queue_per_replica`` (running + waiting) ``ready x ratio`` is the fleet's requests / target, so
the answer does not compound over evaluations while new replicas start. Asking for more starts them
at once (the lowest free indices), each ready ``startup_delay_s`` later; asking for fewer takes the
highest recommendation of the last ``cooldown_s`` (HPA's scale-down stabilization window) and, if
that is still fewer than ready + starting, cancels starting replicas first, then drains the ready
ones of highest index: a draining replica takes no new requests, and is released when its last one
finishes. A replica started again after a release is a new engine (its KV cache cold).

Every change is an event ``(time_s, replica, event)``: ``start``, ``ready``, ``cancel`` (a start
withdrawn before it was ready), ``drain``, ``stop``; replicas ready at t = 0 have a ``ready`` event at 0
and no ``start``. A replica is billed from its ``start`` (or t = 0) to its ``stop`` or ``cancel``, or to
the end of the run (:mod:`simbatch.analysis.autoscale`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import simpy

from simbatch.config import Autoscale
from simbatch.engine.replica import Replica
from simbatch.model.clock import NS_PER_S, Urgent, to_ns
from simbatch.observe.observers import Observer

OFF, STARTING, READY, DRAINING = "off", "starting", "ready", "draining"


class ScaledReplica(Replica):
    """A replica of an autoscaled fleet: one that also counts its time asleep, for the busy fraction
    (the rest is steps; both engines sleep at the same instants). A class of its own so that a fixed
    fleet's replicas keep their attributes, and their memory, as they are."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._idle_ns, self._idle_since = 0, None

    def busy_ns(self, now_ns: int) -> int:
        """Time spent computing steps up to ``now_ns`` (all but the sleeps), ns."""
        asleep = now_ns - self._idle_since if self._idle_since is not None else 0
        return now_ns - self._idle_ns - asleep

    def _sleep(self, answer):
        self._idle_since = self.env.now
        yield from super()._sleep(answer)
        self._idle_ns += self.env.now - self._idle_since
        self._idle_since = None


def desired_replicas(spec: Autoscale, ready: int, metric: float) -> int:
    """HPA's recommendation for ``ready`` replicas whose mean metric is ``metric`` (module docstring)."""
    ratio = metric / spec.target
    want = ready if abs(ratio - 1.0) <= spec.tolerance else math.ceil(ready * ratio - 1e-9)
    return min(max(want, spec.min_replicas), spec.max_replicas)


class Autoscaler(Observer):
    """Owns which replicas are ready (``active``, the list the router reads, in index order) and the
    fleet's events; told of completions so that a draining replica is released at its last one."""

    def __init__(self, env: simpy.Environment, spec: Autoscale, replicas: list, initial: int,
                 make_replica: Callable[[int], object], arrivals_done: Callable[[], bool]):
        self.env, self.spec, self.replicas = env, spec, replicas
        self._make_replica, self._arrivals_done = make_replica, arrivals_done
        self.state = [READY] * initial + [OFF] * (len(replicas) - initial)
        self.active = list(replicas[:initial])
        self.events: list[tuple[float, int, str]] = [(0.0, i, READY) for i in range(initial)]
        self._boots = [0] * len(replicas)  # a start's number: a cancelled start's boot finds it changed
        self._used = [i < initial for i in range(len(replicas))]  # an engine that served: a restart is a new one
        self._recommendations: deque[tuple[int, int]] = deque()
        self._last_ns = 0
        self._busy_mark = [0] * len(replicas)  # busy_ns at the last evaluation (or when it became ready)
        self._ready_ns = [0] * len(replicas)
        env.process(self._run())

    # ---------------------------------------------------------------- the loop
    def _run(self):
        env, interval = self.env, to_ns(self.spec.interval_s)
        while True:
            yield Urgent(env, interval)
            if self._arrivals_done() and all(r.num_running + r.num_waiting == 0 for r in self.replicas):
                return  # nothing more will happen: let the run end
            self.evaluate(env.now)

    def metric(self, now_ns: int) -> float:
        """The metric's mean over the ready replicas now (and, for busy_fraction, the marks moved on)."""
        active = self.active
        if self.spec.metric == "queue_per_replica":
            return sum(r.num_running + r.num_waiting for r in active) / len(active)
        total = 0.0
        for r in active:
            since = max(self._last_ns, self._ready_ns[r.index])
            busy = r.busy_ns(now_ns)
            if now_ns > since:
                total += (busy - self._busy_mark[r.index]) / (now_ns - since)
            self._busy_mark[r.index] = busy
        return total / len(active)

    def evaluate(self, now_ns: int) -> None:
        spec = self.spec
        desired = desired_replicas(spec, len(self.active), self.metric(now_ns))
        self._last_ns = now_ns
        recs = self._recommendations
        recs.append((now_ns, desired))
        while recs[0][0] < now_ns - to_ns(spec.cooldown_s):
            recs.popleft()
        current = sum(s in (READY, STARTING) for s in self.state)
        if desired < current:
            desired = min(current, max(d for _, d in recs))
        if desired > current:
            self._start(desired - current, now_ns)
        elif desired < current:
            self._stop(current - desired, now_ns)

    # ---------------------------------------------------------------- changes
    def _start(self, count: int, now_ns: int) -> None:
        for i in [i for i, s in enumerate(self.state) if s == OFF][:count]:
            self.state[i] = STARTING
            self._boots[i] += 1
            self.events.append((now_ns / NS_PER_S, i, "start"))
            self.env.process(self._boot(i, self._boots[i]))

    def _boot(self, i: int, boot: int):
        yield Urgent(self.env, to_ns(self.spec.startup_delay_s))
        if self._boots[i] != boot or self.state[i] != STARTING:
            return  # cancelled meanwhile
        now = self.env.now
        if self._used[i]:
            self.replicas[i] = self._make_replica(i)
        self._used[i] = True
        replica = self.replicas[i]
        self.state[i] = READY
        self._ready_ns[i], self._busy_mark[i] = now, replica.busy_ns(now)
        at = next((k for k, r in enumerate(self.active) if r.index > i), len(self.active))
        self.active.insert(at, replica)  # in place: the engine routes over this very list
        self.events.append((now / NS_PER_S, i, READY))

    def _stop(self, count: int, now_ns: int) -> None:
        now_s = now_ns / NS_PER_S
        for i in reversed(range(len(self.state))):
            if count and self.state[i] == STARTING:
                self.state[i] = OFF
                self.events.append((now_s, i, "cancel"))
                count -= 1
        for replica in reversed(list(self.active)):
            if not count:
                break
            i = replica.index
            self.active.remove(replica)
            self.state[i] = DRAINING
            self.events.append((now_s, i, "drain"))
            count -= 1
            self._release_if_drained(replica, now_s)

    def _release_if_drained(self, replica, now_s: float) -> None:
        if self.state[replica.index] == DRAINING and replica.num_running + replica.num_waiting == 0:
            self.state[replica.index] = OFF
            self.events.append((now_s, replica.index, "stop"))

    def completion(self, t_s: float, requests: list) -> None:
        for i in {req.replica for req in requests}:
            self._release_if_drained(self.replicas[i], t_s)
