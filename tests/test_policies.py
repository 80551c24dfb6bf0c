"""Queue policies as plain key functions and queues, without a scheduler.

How the schedulers use them (admission order, victims, priority eviction) is tested in
``test_scheduler_continuous.py``; here each ordering is checked on its own.
"""

from __future__ import annotations

import pytest
from builders import req

from simbatch.config import Scheduler
from simbatch.schedulers.policies import FairQueue, WaitingQueue, make_queue, victim_key, waiting_key


def drain(queue: WaitingQueue) -> list[int]:
    out = []
    while len(queue):
        head = queue.peek()
        popped = queue.pop()
        assert popped is head
        out.append(popped.request_id)
    return out


def order(cfg: Scheduler, requests) -> list[int]:
    queue = make_queue(cfg, ("a", "b", "c"))
    for r in requests:
        queue.push(r)
    return drain(queue)


def test_fcfs_is_arrival_order_whatever_the_push_order():
    requests = [req(3, 1, 1), req(0, 9, 9, priority=5), req(2, 4, 4), req(1, 2, 2)]
    assert order(Scheduler(policy="fcfs"), requests) == [0, 1, 2, 3]


def test_fcfs_merges_arrivals_and_returning_requests_as_they_come_and_go():
    """Pushes and pops interleaved: arrivals in order (the O(1) path), preempted requests returning
    to the front (the heap), and a return that lands while the in-order part is empty."""
    queue = make_queue(Scheduler(policy="fcfs"), ())
    r = {i: req(i, 1, 1) for i in range(10)}
    for i in (4, 5, 6):
        queue.push(r[i])
    queue.push(r[2])  # preempted: arrived before everything waiting
    assert queue.pop() is r[2] and queue.pop() is r[4]
    queue.push(r[1])
    queue.push(r[7])
    assert queue.peek() is r[1] and len(queue) == 4
    assert drain(queue) == [1, 5, 6, 7]
    queue.push(r[3])  # into the empty queue's in-order part ...
    queue.push(r[8])
    queue.push(r[0])  # ... then one that must still come first
    assert sorted(x.request_id for x in queue) == [0, 3, 8]
    assert drain(queue) == [0, 3, 8]


def test_priority_lower_value_first_ties_by_arrival():
    requests = [req(0, 1, 1, priority=2), req(1, 1, 1, priority=0), req(2, 1, 1, priority=2),
                req(3, 1, 1, priority=0), req(4, 1, 1, priority=-1)]
    assert order(Scheduler(policy="priority"), requests) == [4, 1, 3, 0, 2]


def test_priority_aging_key_is_priority_plus_arrival_over_aging():
    cfg = Scheduler(policy="priority", aging_s=10.0)
    key = waiting_key(cfg)
    assert key(req(7, 1, 1, arrival_s=25.0, priority=1)) == (1 + 2.5, 7)
    # A low-priority request that has waited 3 aging periods longer than a high-priority one goes first:
    # effective priorities at t: 2 - t/10 for the old one, 0 - (t - 30)/10 for the new one.
    old = req(0, 1, 1, arrival_s=0.0, priority=2)
    new = req(1, 1, 1, arrival_s=30.0, priority=0)
    assert order(cfg, [new, old]) == [0, 1]
    fresh = req(2, 1, 1, arrival_s=15.0, priority=0)  # waited only 1.5 periods less: still ahead of `old`
    assert order(cfg, [old, fresh]) == [2, 0]


def test_sjf_orders_by_prompt_or_by_the_output_oracle():
    requests = [req(0, 50, 1), req(1, 10, 300), req(2, 30, 20), req(3, 10, 5)]
    assert order(Scheduler(policy="sjf"), requests) == [1, 3, 2, 0]
    assert order(Scheduler(policy="sjf", sjf_key="output"), requests) == [0, 3, 2, 1]


def test_victim_is_the_newest_admitted_except_under_priority():
    a, b, c = req(0, 1, 1, priority=0), req(1, 1, 1, priority=9), req(2, 1, 1, priority=3)
    a.admitted_seq, b.admitted_seq, c.admitted_seq = 5, 3, 4  # a was readmitted after a preemption
    for policy in ("fcfs", "sjf", "fair"):
        assert max([a, b, c], key=victim_key(Scheduler(policy=policy))) is a
    assert max([a, b, c], key=victim_key(Scheduler(policy="priority"))) is b
    # Equal priorities: the later arrival goes first.
    b.priority = 3
    assert max([a, b, c], key=victim_key(Scheduler(policy="priority"))) is c


def test_fair_queue_serves_the_tenant_with_fewest_running_per_weight():
    queue = make_queue(Scheduler(policy="fair", tenant_weights={"a": 2.0}), ("a", "b"))
    assert isinstance(queue, FairQueue)
    a0, a1, a2 = (req(i, 1, 1, tenant=0) for i in (0, 1, 2))
    b0, b1 = req(3, 1, 1, tenant=1), req(4, 1, 1, tenant=1)
    for r in (a0, a1, a2, b0, b1):
        queue.push(r)
    assert len(queue) == 5 and {r.request_id for r in queue} == {0, 1, 2, 3, 4}
    admitted = []
    for _ in range(4):  # admit the head each time, as a scheduler does
        r = queue.pop()
        queue.on_admit(r)
        admitted.append(r.request_id)
    # Shares: 0/2 vs 0/1 tie -> older head (a0); 1/2 vs 0 -> b0; 1/2 vs 1 -> a1; 2/2 vs 1 -> tie, older head a2.
    assert admitted == [0, 3, 1, 2]
    queue.on_release(a0)
    queue.on_release(a1)
    queue.on_release(a2)  # tenant a: 0 running; b: 1 running, and only b waits
    assert queue.peek() is b1


def test_fair_queue_is_fcfs_within_a_tenant_and_empties_cleanly():
    queue = make_queue(Scheduler(policy="fair"), ("a", "b"))
    for r in (req(5, 1, 1, tenant=1), req(2, 1, 1, tenant=1), req(9, 1, 1, tenant=0)):
        queue.push(r)
    assert drain(queue) == [2, 5, 9]  # tenant b's head (2) is older than a's (9); running counts tie
    assert queue.peek() is None
    with pytest.raises(IndexError):
        queue.pop()


def test_unlisted_tenants_weigh_one():
    # a (unlisted, weight 1) runs 1, b (weight 3) runs 2: shares 1/1 against 2/3, so b is served;
    # had a's weight defaulted to anything above 1.5, a would be.
    queue = make_queue(Scheduler(policy="fair", tenant_weights={"b": 3.0}), ("a", "b"))
    for r in (req(0, 1, 1, tenant=0), req(1, 1, 1, tenant=1), req(2, 1, 1, tenant=1)):
        queue.on_admit(r)
    queue.push(req(3, 1, 1, tenant=0))
    queue.push(req(4, 1, 1, tenant=1))
    assert queue.peek().request_id == 4
