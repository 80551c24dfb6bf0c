"""Static and dynamic batching, stepped by hand: when a batch forms, and the three leaks it shows.

``conftest.BASE`` with 3 slots: 4-token blocks, 64 of them; each step lasts 1 s.
"""

from __future__ import annotations

import pytest
from builders import Driver, make_scenario, req, tokens

from simbatch.model.request import Status
from simbatch.model.step import IDLE


def driver(mode: str = "static", **overrides) -> Driver:
    return Driver(make_scenario(**{"batching__mode": mode, "batching__max_num_seqs": 3, **overrides}))


def test_an_empty_scheduler_has_nothing_to_plan():
    for mode in ("static", "dynamic"):
        assert driver(mode).sched.schedule(0.0) is IDLE


def test_static_waits_for_a_full_batch():
    d = driver()
    d.add(req(0, 4, 2), req(1, 8, 5))
    assert d.sched.schedule(0.0) is IDLE  # 2 of 3: no timer, so wait for an arrival
    d.add(req(2, 2, 1))
    assert tokens(d.plan()) == {0: 4, 1: 8, 2: 2}


def test_static_pads_prompts_keeps_finished_slots_and_holds_memory_until_the_batch_ends():
    d = driver()
    a, b, c = req(0, 4, 2), req(1, 8, 5), req(2, 2, 1)
    d.add(a, b, c)
    plan, out = d.run()
    # Prefill: every prompt padded to the longest (8): 4 + 6 pad tokens.
    assert (plan.prefill_tokens, plan.padded_prefill_tokens, plan.decode_seqs) == (14, 10, 0)
    assert plan.num_admitted == 3 and plan.padded_tokens == 10
    # Memory for the padded footprint: each slot holds 8 + 5 - 1 = 12 tokens = 3 blocks.
    assert d.sched.kv_blocks_used == 9
    assert out.finished == [c] and c.first_token_s == c.finish_s == 1.0
    shapes = []
    while d.sched.batch:
        plan, out = d.run()
        shapes.append((tuple(tokens(plan)), plan.decode_seqs, plan.padded_decode_seqs, d.sched.kv_blocks_used))
    # c's slot, then a's, idle but computed until b, the longest, is done; memory comes back at the end.
    assert shapes == [((0, 1), 2, 1, 9), ((1,), 1, 2, 9), ((1,), 1, 2, 9), ((1,), 1, 2, 0)]
    assert (a.finish_s, b.finish_s) == (2.0, 5.0)
    assert all(r.status is Status.FINISHED and r.num_generated == r.output_tokens for r in (a, b, c))
    assert d.sched.kv.device.num_free == 64


def test_tokens_stream_every_step_in_a_batch():
    d = driver()
    d.add(req(0, 4, 3), req(1, 4, 3), req(2, 4, 3))
    itl = [d.run()[1].itl_tokens for _ in range(3)]
    assert itl == [0, 3, 3]


def test_without_padding_prompts_cost_and_hold_only_their_own_length():
    d = driver(batching__pad_prompts=False)
    d.add(req(0, 4, 2), req(1, 8, 5), req(2, 2, 1))
    plan = d.plan()
    assert (plan.prefill_tokens, plan.padded_prefill_tokens) == (14, 0)
    # Each slot reserves its prompt plus the longest output (5) - 1: 8, 12 and 6 tokens = 2 + 3 + 2 blocks.
    assert d.sched.kv_blocks_used == 7


def test_head_of_line_an_arrival_waits_for_the_whole_batch():
    d = driver()
    d.add(req(0, 4, 1), req(1, 4, 4), req(2, 4, 1))
    d.run()
    d.run()
    late = req(3, 4, 1)
    d.add(late)  # t=2, with free slots and free memory
    while d.sched.batch:
        plan, _ = d.run()
        assert late not in tokens(plan)
    assert d.now == 4.0
    assert d.sched.schedule(d.now) is IDLE  # alone, not a full batch
    d.sched.close()  # arrivals have ended: flush
    plan, _ = d.run()
    assert tokens(plan) == {3: 4}
    assert late.waiting_s == 2.0


def test_a_batch_takes_only_what_fits_in_memory_and_nothing_overtakes():
    d = driver(kv_cache__num_blocks=6)
    a, b, c, small = req(0, 8, 5), req(1, 8, 5), req(2, 8, 5), req(3, 1, 1)
    d.add(a, b, c, small)
    plan = d.plan()
    # Each slot needs 3 blocks: a and b fill the 6; c does not fit and small may not pass it.
    assert tokens(plan) == {0: 8, 1: 8}
    assert d.sched.waiting.peek() is c


def test_the_batch_forms_in_policy_order():
    d = driver(scheduler__policy="priority", batching__max_num_seqs=2)
    d.add(req(0, 4, 1, priority=3), req(1, 4, 1, priority=1), req(2, 4, 1, priority=2))
    assert tokens(d.plan()) == {1: 4, 2: 4}


def test_static_max_wait_starts_a_partial_batch():
    d = driver(batching__max_wait_ms=100.0)
    a = req(0, 4, 2)
    d.add(a)
    assert d.sched.schedule(0.0).time_s == pytest.approx(0.1)
    assert d.sched.schedule(0.05).time_s == pytest.approx(0.1)
    plan = d.sched.schedule(0.1)
    assert tokens(plan) == {0: 4}
    assert a.first_scheduled_s == 0.1


def test_dynamic_dispatches_when_the_oldest_has_waited_the_queue_delay():
    d = driver("dynamic", batching__max_queue_delay_ms=10.0)
    d.add(req(0, 4, 2))
    assert d.sched.schedule(0.0).time_s == pytest.approx(0.01)
    d.now = 0.004
    d.add(req(1, 4, 2))
    assert d.sched.schedule(0.004).time_s == pytest.approx(0.01)  # the oldest sets the timer
    plan = d.sched.schedule(0.01)
    assert tokens(plan) == {0: 4, 1: 4} and plan.num_admitted == 2


def test_dynamic_dispatches_a_full_batch_at_once_and_freezes_membership():
    d = driver("dynamic", batching__max_queue_delay_ms=10.0)
    d.add(req(0, 4, 3), req(1, 4, 3), req(2, 4, 3), req(3, 4, 1))
    plan, _ = d.run()
    assert tokens(plan) == {0: 4, 1: 4, 2: 4}
    # The fourth waits out the batch even with the queue delay long past.
    assert 3 not in tokens(d.plan())


def test_dynamic_ignores_the_end_of_arrivals():
    # A dynamic batcher cannot know that no more requests will come: a partial batch still waits
    # out the queue delay. Only static batching flushes at close() (BaseScheduler.close).
    d = driver("dynamic", batching__max_queue_delay_ms=10.0)
    d.add(req(0, 4, 2))
    d.sched.close()
    assert d.sched.schedule(0.0).time_s == pytest.approx(0.01)
