"""The structures of WAITING, and the policies' keys as a scheduler section gives them.

A queue policy is declared in :mod:`simbatch.registry.policies` (its keys, and what it declares about
them); this module holds what the schedulers build from one: :func:`waiting_key` and
:func:`victim_key` for a ``scheduler`` section, and the waiting queue its declared ``queue`` names
(:data:`QUEUES`): a :class:`WaitingQueue` ordered by the waiting key, or a :class:`FairQueue` that
shares running slots among tenants.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain
from operator import itemgetter

from simbatch.config import Scheduler
from simbatch.model.request import Request
from simbatch.registry import POLICIES, Key

_second = itemgetter(1)  # the request of a (key, request) entry
_UNKNOWN = -1  # FairQueue's head tenant, to be found again


def waiting_key(cfg: Scheduler) -> Key:
    """The ordering of WAITING under ``cfg.policy`` (smallest first)."""
    return POLICIES[cfg.policy].waiting_key(cfg)


def _by_admission(r: Request) -> tuple:
    return (r.admitted_seq,)


def victim_key(cfg: Scheduler) -> Key:
    """The ordering of RUNNING for preemption (largest is evicted first): the policy's, or the newest
    admitted first when it declares none."""
    order = POLICIES[cfg.policy].victim_key
    return _by_admission if order is None else order(cfg)


class WaitingQueue:
    """WAITING in policy-key order, with no scans of a long queue.

    Requests pushed in increasing key order (arrivals under FCFS) queue at the back of a deque, in
    O(1); any other (a preempted request returning to the front, arrivals under priority or SJF) goes
    to a heap, in O(log n). The head is the smaller of the two heads. Keys end with the request id,
    so they are unique and entries never compare requests.
    """

    __slots__ = ("_key", "_ordered", "_heap", "_size")

    def __init__(self, key: Key):
        self._key = key
        self._ordered: deque[tuple[tuple, Request]] = deque()
        self._heap: list[tuple[tuple, Request]] = []
        self._size = 0  # counted, not summed: the schedulers ask for it several times a plan

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Request]:
        """Requests in no particular order (for invariant checks and snapshots)."""
        return map(_second, chain(self._ordered, self._heap))

    def push(self, req: Request) -> None:
        entry = (self._key(req), req)
        self._size += 1
        if not self._ordered or entry[0] > self._ordered[-1][0]:
            self._ordered.append(entry)
        else:
            heapq.heappush(self._heap, entry)

    def peek(self) -> Request | None:
        heap, ordered = self._heap, self._ordered
        if heap and (not ordered or heap[0][0] < ordered[0][0]):  # the head is in the heap
            return heap[0][1]
        return ordered[0][1] if ordered else None

    def pop(self) -> Request:
        heap, ordered = self._heap, self._ordered
        entry = heapq.heappop(heap) if heap and (not ordered or heap[0][0] < ordered[0][0]) else ordered.popleft()
        self._size -= 1  # (after: popping an empty queue raises and leaves the count alone)
        return entry[1]

    # Fair queues track running counts; plain queues have nothing to do.
    def on_admit(self, req: Request) -> None:
        pass

    def on_release(self, req: Request) -> None:
        pass


class FairQueue(WaitingQueue):
    """Weighted fair share of running slots across tenants, in key order within each tenant.

    The head is the first request (by ``key``: arrival under ``fair``) of the tenant with the smallest
    ``running / weight`` (ties to the tenant whose head comes first by key). With a handful of tenants
    the choice is O(tenants).
    """

    __slots__ = ("_by_tenant", "_running", "_weights", "_head")

    def __init__(self, weights: list[float], key: Key = lambda r: (r.request_id,)):
        super().__init__(key)
        self._weights = weights
        self._by_tenant: list[list[tuple[tuple, Request]]] = [[] for _ in weights]
        self._running = [0] * len(weights)
        # The head's tenant as last found (None: the queue is empty), or _UNKNOWN once a push, a pop or
        # a running count has changed: admission peeks, then pops, the same head.
        self._head: int | None = _UNKNOWN

    def __iter__(self) -> Iterator[Request]:
        return map(_second, chain.from_iterable(self._by_tenant))

    def push(self, req: Request) -> None:
        heapq.heappush(self._by_tenant[req.tenant], (self._key(req), req))
        self._size += 1
        self._head = _UNKNOWN

    def _head_tenant(self) -> int | None:
        if self._head != _UNKNOWN:
            return self._head
        best, best_key = None, None
        for t, heap in enumerate(self._by_tenant):
            if heap:
                key = (self._running[t] / self._weights[t], heap[0][0])
                if best_key is None or key < best_key:
                    best, best_key = t, key
        self._head = best
        return best

    def peek(self) -> Request | None:
        t = self._head_tenant()
        return None if t is None else self._by_tenant[t][0][1]

    def pop(self) -> Request:
        t = self._head_tenant()
        if t is None:
            raise IndexError("pop from an empty queue")
        self._size -= 1
        self._head = _UNKNOWN
        return heapq.heappop(self._by_tenant[t])[1]

    def on_admit(self, req: Request) -> None:
        self._running[req.tenant] += 1
        self._head = _UNKNOWN

    def on_release(self, req: Request) -> None:
        self._running[req.tenant] -= 1
        self._head = _UNKNOWN


def _keyed(cfg: Scheduler, tenant_names: tuple[str, ...]) -> WaitingQueue:
    return WaitingQueue(waiting_key(cfg))


def _tenant_share(cfg: Scheduler, tenant_names: tuple[str, ...]) -> WaitingQueue:
    return FairQueue([cfg.tenant_weights.get(name, 1.0) for name in tenant_names], waiting_key(cfg))


QUEUES: dict[str, Callable[[Scheduler, tuple[str, ...]], WaitingQueue]] = {"keyed": _keyed, "tenant_share": _tenant_share}
"""Each queue structure a policy may declare (``Policy.queue``), built for a ``scheduler`` section and the
workload's tenants."""


def make_queue(cfg: Scheduler, tenant_names: tuple[str, ...]) -> WaitingQueue:
    """WAITING for one engine, as ``cfg.policy`` declares it."""
    structure = POLICIES[cfg.policy].queue
    if structure not in QUEUES:
        raise KeyError(f"queue policy {cfg.policy!r} needs a queue structure {structure!r}, which "
                       f"simbatch.schedulers.policies does not have ({', '.join(QUEUES)})")
    return QUEUES[structure](cfg, tenant_names)
