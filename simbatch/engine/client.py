"""The benchmark client: who sends requests to the server, and when.

Without a client section every request is sent at its arrival time (an open loop: the server
sees the traffic whatever state it is in). Two clients hold requests back:

- **Concurrency-capped open loop** (``workload.max_concurrency``, vLLM's ``--max-concurrency``).
  Requests keep their intended arrival times, but at most N are in flight: one that arrives while
  N are outstanding waits at the client, in arrival order, and is sent when one of them completes
  (or is rejected). ``client_wait_s`` is that wait; TTFT and E2E latency count from the send,
  as ``vllm bench serve`` measures them (its semaphore is taken before the request's clock starts).
- **Closed loop** (``workload.closed_loop``, GenAI-Perf's ``--concurrency``, GuideLLM's concurrent
  profile). N users, each sending its next request when its previous one ends, after
  ``think_time_s``. Requests have no intended times, so no client wait: each arrives when sent.

Either way requests are sent in index order, so the workload's lengths, tenants and priorities
stay attached to the same request indices as in an open-loop run of the same seed.
"""

from __future__ import annotations

import simpy

from simbatch.config import Workload
from simbatch.model.clock import Urgent, to_ns, trigger_late
from simbatch.observe.observers import Observer


class Client(Observer):
    """N slots shared by the requests in flight; the engine asks one before each send, and the
    client, observing the run, frees it when that request completes or is rejected.

    A slot freed by a completion is usable ``think_time_s`` later (0 for the capped open loop).
    """

    def __init__(self, env: simpy.Environment, slots: int, think_time_s: float, open_loop: bool,
                 response_latency_s: float = 0.0):
        self.env = env
        self.free = slots
        # A slot is free when the client has the response (frontend.response_latency_ms after the
        # server's last token), and, in a closed loop, its user has thought.
        self.think_time_ns = to_ns(think_time_s) + to_ns(response_latency_s)
        self.open_loop = open_loop
        self._wake: simpy.Event | None = None

    @classmethod
    def of(cls, env: simpy.Environment, workload: Workload, response_latency_s: float = 0.0) -> Client | None:
        """The client a workload asks for, or None when requests are sent at their arrival times."""
        if workload.closed_loop is not None:
            return cls(env, workload.closed_loop.concurrency, workload.closed_loop.think_time_s, open_loop=False,
                       response_latency_s=response_latency_s)
        if workload.max_concurrency is not None:
            return cls(env, workload.max_concurrency, 0.0, open_loop=True, response_latency_s=response_latency_s)
        return None

    def send(self, intended_ns: int):
        """SimPy generator: wait for the intended time (open loop) and a free slot, then take the slot.

        Times are on the engine's clock (whole nanoseconds). Returns the client-side wait, ns: from the
        intended arrival to the send (0 in a closed loop, where a request is intended when its user is
        ready, which is when it is sent). An intended arrival is an arrival: urgent at its instant.
        """
        env = self.env
        if self.open_loop and intended_ns > env.now:
            yield Urgent(env, intended_ns - env.now)
        while self.free == 0:
            self._wake = env.event()
            yield self._wake
        self.free -= 1
        return env.now - intended_ns if self.open_loop else 0

    def completion(self, t_s: float, requests: list) -> None:
        self.done(len(requests))

    def rejection(self, t_s: float, request_id: int, reason: str) -> None:
        self.done()

    def done(self, count: int = 1) -> None:
        """``count`` requests left the server (finished or rejected): their slots free up."""
        if self.think_time_ns > 0:
            self.env.timeout(self.think_time_ns).callbacks.append(lambda _event: self._release(count))
        else:
            self._release(count)

    def _release(self, count: int) -> None:
        self.free += count
        if self._wake is not None and not self._wake.triggered:
            trigger_late(self._wake)  # after every step ending now (simbatch.model.clock's tie rule)
