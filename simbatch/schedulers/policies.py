"""Queue policies: who is served next from WAITING, and who is evicted from RUNNING.

A policy is a plain *key function*: the waiting request with the smallest key goes first, and among
running requests the one with the largest victim key is preempted first. Every key ends with the
request id (its arrival sequence number), so ties are broken the same way in every run.

- ``fcfs``: arrival order. Preempted requests keep their key: with head-of-line blocking FCFS admits
  in arrival order, so a preempted request arrived before anything still waiting and returns to the
  front (as vLLM V1 puts it); with backfilling, older requests that were passed over stay ahead of it.
- ``priority``: lower value first, arrival breaks ties. With ``aging_s``, a waiting request's
  effective priority drops by one level every ``aging_s`` seconds it waits. All waiting requests age
  at the same rate, so their order depends only on ``priority + arrival_s / aging_s``: a static key,
  and no rescans as time passes.
- ``sjf``: shortest prompt first, or shortest true output (``sjf_key: output``): the latter is an
  oracle no real server has, an upper bound on what length prediction could buy.
- ``fair``: weighted fair share of running slots: the next request comes from the tenant with the
  fewest running requests per unit of weight; FCFS within a tenant. See :class:`FairQueue`.

Victims: the worst key under ``priority`` (worst priority, then the newest arrival); the newest
admitted (LIFO, cheapest to recompute) under every other policy. A request only ever evicts one ranked
below it; ``scheduler.max_preemptions`` protects a request preempted that often, unless every running
request is stalled on memory, when the lowest-ranked goes all the same.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain
from operator import itemgetter

from simbatch.config import Scheduler
from simbatch.model.request import Request

Key = Callable[[Request], tuple]
_second = itemgetter(1)  # the request of a (key, request) entry


def waiting_key(cfg: Scheduler) -> Key:
    """The ordering of WAITING under ``cfg.policy`` (smallest first)."""
    if cfg.policy == "priority":
        if cfg.aging_s is None:
            return lambda r: (r.priority, r.request_id)
        aging = cfg.aging_s
        return lambda r: (r.priority + r.arrival_s / aging, r.request_id)
    if cfg.policy == "sjf":
        if cfg.sjf_key == "output":
            return lambda r: (r.output_tokens, r.request_id)
        return lambda r: (r.prompt_tokens, r.request_id)
    return lambda r: (r.request_id,)


def victim_key(cfg: Scheduler) -> Key:
    """The ordering of RUNNING for preemption (largest is evicted first)."""
    if cfg.policy == "priority":
        order = waiting_key(cfg)
        return lambda r: (*order(r), r.admitted_seq)
    return lambda r: (r.admitted_seq,)


class WaitingQueue:
    """WAITING in policy-key order, with no scans of a long queue.

    Requests pushed in increasing key order (arrivals under FCFS) queue at the back of a deque, in
    O(1); any other (a preempted request returning to the front, arrivals under priority or SJF) goes
    to a heap, in O(log n). The head is the smaller of the two heads. Keys end with the request id,
    so they are unique and entries never compare requests.
    """

    __slots__ = ("_key", "_ordered", "_heap")

    def __init__(self, key: Key):
        self._key = key
        self._ordered: deque[tuple[tuple, Request]] = deque()
        self._heap: list[tuple[tuple, Request]] = []

    def __len__(self) -> int:
        return len(self._ordered) + len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Requests in no particular order (for invariant checks and snapshots)."""
        return map(_second, chain(self._ordered, self._heap))

    def push(self, req: Request) -> None:
        entry = (self._key(req), req)
        if not self._ordered or entry[0] > self._ordered[-1][0]:
            self._ordered.append(entry)
        else:
            heapq.heappush(self._heap, entry)

    def _head_in_heap(self) -> bool:
        return bool(self._heap) and (not self._ordered or self._heap[0][0] < self._ordered[0][0])

    def peek(self) -> Request | None:
        if self._head_in_heap():
            return self._heap[0][1]
        return self._ordered[0][1] if self._ordered else None

    def pop(self) -> Request:
        if self._head_in_heap():
            return heapq.heappop(self._heap)[1]
        return self._ordered.popleft()[1]

    # Fair queues track running counts; plain queues have nothing to do.
    def on_admit(self, req: Request) -> None:
        pass

    def on_release(self, req: Request) -> None:
        pass


class FairQueue(WaitingQueue):
    """Weighted fair share of running slots across tenants, FCFS within each tenant.

    The head is the oldest request of the tenant with the smallest ``running / weight`` (ties to the
    tenant whose head arrived first). With a handful of tenants the choice is O(tenants).
    """

    __slots__ = ("_by_tenant", "_running", "_weights", "_size")

    def __init__(self, weights: list[float]):
        super().__init__(lambda r: (r.request_id,))
        self._weights = weights
        self._by_tenant: list[list[tuple[tuple, Request]]] = [[] for _ in weights]
        self._running = [0] * len(weights)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Request]:
        return (r for heap in self._by_tenant for _, r in heap)

    def push(self, req: Request) -> None:
        heapq.heappush(self._by_tenant[req.tenant], ((req.request_id,), req))
        self._size += 1

    def _head_tenant(self) -> int | None:
        best, best_key = None, None
        for t, heap in enumerate(self._by_tenant):
            if heap:
                key = (self._running[t] / self._weights[t], heap[0][0])
                if best_key is None or key < best_key:
                    best, best_key = t, key
        return best

    def peek(self) -> Request | None:
        t = self._head_tenant()
        return None if t is None else self._by_tenant[t][0][1]

    def pop(self) -> Request:
        t = self._head_tenant()
        if t is None:
            raise IndexError("pop from an empty queue")
        self._size -= 1
        return heapq.heappop(self._by_tenant[t])[1]

    def on_admit(self, req: Request) -> None:
        self._running[req.tenant] += 1

    def on_release(self, req: Request) -> None:
        self._running[req.tenant] -= 1


def make_queue(cfg: Scheduler, tenant_names: tuple[str, ...]) -> WaitingQueue:
    if cfg.policy == "fair":
        return FairQueue([cfg.tenant_weights.get(name, 1.0) for name in tenant_names])
    return WaitingQueue(waiting_key(cfg))
