"""Continuous batching, stepped by hand: every rule of the scheduler on a case small enough to compute.

Unless a test says otherwise (see ``conftest.BASE``): 4-token blocks, 64 of them, 4 slots, a budget of
16 tokens per step, chunked prefill on, FCFS, recompute preemption; each step lasts 1 s, so the step
that starts at t=k ends at t=k+1. Token accounting follows ``simbatch.model.request``: a request with
prompt p that has generated g tokens holds p + g - 1 computed tokens while it decodes, so its decode
step computes token p + g and needs ceil((p + g) / block_size) blocks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import Driver, make_scenario, req, tokens

from simbatch.engine import rejection_reasons
from simbatch.model.request import Status
from simbatch.model.step import IDLE


def driver(**overrides) -> Driver:
    return Driver(make_scenario(**overrides))


# --------------------------------------------------------------------------- one request's life
def test_prefill_then_decodes_grow_a_block_at_each_boundary():
    d = driver()
    r = req(0, 6, 5)
    d.add(r)
    plan, out = d.run()
    assert tokens(plan) == {0: 6}
    assert (plan.prefill_tokens, plan.decode_seqs, plan.num_admitted) == (6, 0, 1)
    assert (r.num_computed_tokens, r.num_generated, r.blocks) == (6, 1, 2)
    assert (r.first_scheduled_s, r.first_token_s) == (0.0, 1.0)
    # Decodes compute tokens 7, 8, 9, 10: the one computing token 9 needs the third block.
    blocks = []
    for _ in range(3):
        plan, out = d.run()
        assert tokens(plan) == {0: 1} and (plan.decode_seqs, plan.prefill_tokens) == (1, 0)
        assert out.itl_tokens == 1 and out.stall_gaps_s == []
        blocks.append(r.blocks)
    assert blocks == [2, 2, 3]
    assert (r.num_computed_tokens, r.num_generated, r.status) == (9, 4, Status.RUNNING)
    plan, out = d.run()
    # The fifth token is sampled after computing token 10 = prompt + output - 1: peak 3 blocks.
    assert out.finished == [r]
    assert (r.status, r.finish_s, r.num_generated, r.blocks) == (Status.FINISHED, 5.0, 5, 0)
    assert d.sched.kv.device.num_free == 64 and not d.sched.running
    assert d.sched.schedule(d.now) is IDLE


def test_one_token_output_finishes_at_its_prefill():
    d = driver()
    r = req(0, 5, 1)
    d.add(r)
    _, out = d.run()
    assert out.finished == [r]
    assert r.first_token_s == r.finish_s == 1.0
    assert d.sched.kv.device.num_free == 64


def test_an_idle_scheduler_has_nothing_to_plan():
    assert driver().sched.schedule(0.0) is IDLE


# --------------------------------------------------------------------------- the token budget
def test_long_prompt_is_chunked_by_the_budget_and_samples_after_the_last_chunk():
    d = driver()
    r = req(0, 40, 3)
    d.add(r)
    chunks, blocks = [], []
    for _ in range(3):
        plan, _ = d.run()
        chunks.append(tokens(plan)[0])
        blocks.append(r.blocks)
        assert plan.prefill_tokens == chunks[-1] and plan.decode_seqs == 0
    assert chunks == [16, 16, 8]
    assert blocks == [4, 8, 10]
    assert r.first_token_s == 3.0 and r.num_generated == 1 and not r.prefill_pending


def test_long_prefill_token_threshold_caps_each_requests_chunk():
    d = driver(batching__long_prefill_token_threshold=5)
    d.add(req(0, 12, 2), req(1, 12, 2), req(2, 3, 3))
    plan, _ = d.run()
    assert tokens(plan) == {0: 5, 1: 5, 2: 3}  # 13 of 16: the cap, not the budget, binds
    plan, _ = d.run()
    assert tokens(plan) == {2: 1, 0: 5, 1: 5}
    plan, _ = d.run()
    assert tokens(plan) == {2: 1, 0: 2, 1: 2}


def test_budget_goes_to_decodes_then_running_prefills_then_admissions():
    d = driver()
    a, b, c = req(0, 4, 10), req(1, 30, 10), req(2, 8, 10)
    d.add(a, b)
    plan, _ = d.run()
    assert tokens(plan) == {0: 4, 1: 12}
    d.add(c)
    plan, _ = d.run()
    # a decodes (1), b's prefill continues with the rest of the budget (15 of its 18), c gets nothing.
    assert tokens(plan) == {0: 1, 1: 15}
    assert plan.num_admitted == 0 and c.status is Status.WAITING
    plan, _ = d.run()
    assert tokens(plan) == {0: 1, 1: 3, 2: 8}
    assert (plan.decode_seqs, plan.prefill_tokens, plan.num_admitted) == (1, 11, 1)


def test_admission_chunk_is_what_is_left_of_the_budget():
    d = driver()
    d.add(req(0, 10, 5), req(1, 20, 5))
    plan, _ = d.run()
    assert tokens(plan) == {0: 10, 1: 6}


def test_without_chunking_a_prompt_must_fit_whole_and_nothing_overtakes_it():
    d = driver(batching__enable_chunked_prefill=False)
    a, b, c = req(0, 10, 5), req(1, 8, 5), req(2, 2, 5)
    d.add(a, b, c)
    plan, _ = d.run()
    # b needs 8 of the 6 left: admission stops, and c (2 tokens) may not jump ahead of it.
    assert tokens(plan) == {0: 10}
    assert b.status is Status.WAITING and c.status is Status.WAITING
    plan, _ = d.run()
    assert tokens(plan) == {0: 1, 1: 8, 2: 2}


def rejection_reason(scenario, prompt_tokens: int, output_tokens: int) -> str | None:
    return rejection_reasons(scenario, np.array([prompt_tokens]), np.array([output_tokens])).get(0)


def test_prompts_that_can_never_run_are_rejected_at_arrival():
    on = make_scenario()
    off = make_scenario(batching__enable_chunked_prefill=False)
    assert rejection_reason(off, 16, 1) is None
    assert rejection_reason(off, 17, 1) == "prompt_exceeds_budget"
    assert rejection_reason(on, 17, 1) is None  # chunked: any prompt can be split
    # 64 blocks of 4 hold 256 tokens; the peak is prompt + output - 1.
    assert rejection_reason(on, 200, 57) is None
    assert rejection_reason(on, 200, 58) == "never_fits"
    assert rejection_reason(make_scenario(batching__mode="static"), 300, 1) == "never_fits"
    assert rejection_reason(make_scenario(batching__mode="static", batching__enable_chunked_prefill=False),
                            17, 1) is None  # the budget is a continuous-batching knob


def test_without_chunking_a_recompute_longer_than_the_budget_is_still_split():
    d = driver(batching__enable_chunked_prefill=False)
    r = req(0, 14, 10)
    # The state recompute preemption leaves: 3 tokens generated, nothing computed, 17 tokens to redo.
    r.num_generated, r.first_token_s, r.last_token_s = 3, 0.0, 0.0
    d.add(r)
    plan, out = d.run()
    assert tokens(plan) == {0: 16} and r.num_generated == 3 and r.prefill_pending
    plan, out = d.run()
    assert tokens(plan) == {0: 1} and plan.prefill_tokens == 1
    assert (r.num_generated, r.first_token_s, out.stall_gaps_s) == (4, 0.0, [2.0])


# --------------------------------------------------------------------------- slots and memory
def test_max_num_seqs_caps_the_running_set_and_a_finished_slot_is_reused_at_once():
    d = driver(batching__max_num_seqs=2)
    a, b, c = req(0, 2, 1), req(1, 2, 3), req(2, 2, 1)
    d.add(a, b, c)
    plan, out = d.run()
    assert tokens(plan) == {0: 2, 1: 2} and c.status is Status.WAITING
    assert out.finished == [a]
    plan, _ = d.run()
    assert tokens(plan) == {1: 1, 2: 2}  # a's slot went to c in the very next step


def test_finished_blocks_are_free_for_the_very_next_step():
    d = driver(kv_cache__num_blocks=2)
    a, b = req(0, 8, 1), req(1, 8, 1)
    d.add(a, b)
    plan, _ = d.run()
    assert tokens(plan) == {0: 8}  # b needs both blocks a holds
    plan, _ = d.run()
    assert tokens(plan) == {1: 8}


def test_admission_stops_at_the_first_request_that_does_not_fit_in_memory():
    d = driver(kv_cache__num_blocks=4, batching__max_num_batched_tokens=32)
    a, b, c = req(0, 12, 5), req(1, 8, 5), req(2, 4, 5)
    d.add(a, b, c)
    plan, _ = d.run()
    # a takes 3 blocks; b needs 2 of the 1 left; c would fit in 1 but may not overtake b.
    assert tokens(plan) == {0: 12}
    assert d.sched.kv.device.num_free == 1


# --------------------------------------------------------------------------- preemption
def three_at_a_boundary(**overrides) -> tuple[Driver, list]:
    """Three 4-token prompts in 4 blocks (unless overridden): after the prefill one block is free,
    and every decode (computing token 5) needs a second block; a (output 2) then finishes."""
    d = driver(**{"kv_cache__num_blocks": 4, **overrides})
    reqs = [req(0, 4, 2), req(1, 4, 10), req(2, 4, 10)]
    d.add(*reqs)
    plan, _ = d.run()
    assert tokens(plan) == {0: 4, 1: 4, 2: 4} and d.sched.kv.device.num_used == 3
    return d, reqs


def test_recompute_preempts_the_newest_admitted_and_sends_it_to_the_front():
    d, (a, b, c) = three_at_a_boundary()
    late = req(3, 1, 1)
    d.add(late)
    plan = d.plan()
    # a takes the free block; b needs one more: the newest admitted, c, is the victim.
    assert tokens(plan) == {0: 1, 1: 1}
    assert (plan.num_preempted, plan.num_admitted, plan.swap_blocks) == (1, 0, 0)
    assert c.status is Status.WAITING and c not in d.sched.running
    assert (c.blocks, c.num_computed_tokens, c.prefill_pending, c.num_preemptions) == (0, 0, True, 1)
    assert (c.num_generated, c.waiting_since_s) == (1, 1.0)
    # The victim's block went to b, none is left, and c is back at the head of WAITING (FCFS).
    assert d.sched.kv.device.num_free == 0
    assert d.sched.waiting.peek() is c
    d.finish(plan)
    assert a.status is Status.FINISHED


def test_recompute_resumes_with_prompt_plus_generated_and_keeps_the_first_token():
    d, (a, b, c) = three_at_a_boundary()
    d.run()  # c preempted; a finishes at t=2 and frees its 2 blocks
    plan, out = d.run()
    # c recomputes its prompt and the token it had generated: 5 tokens, 2 blocks.
    assert tokens(plan) == {1: 1, 2: 5}
    assert (plan.decode_seqs, plan.prefill_tokens, plan.num_admitted) == (1, 5, 1)
    assert (c.num_computed_tokens, c.num_generated, c.blocks) == (5, 2, 2)
    assert c.first_token_s == 1.0 and c.first_scheduled_s == 0.0  # not re-emitted, not reset
    assert c.waiting_s == 1.0  # waited from its preemption (t=1) to its return (t=2)
    # c's second token came 2 s after its first: a stall, not an inter-token gap of this step.
    assert out.stall_gaps_s == [2.0] and out.itl_tokens == 1


def test_a_preemption_step_admits_nobody():
    d, (a, b, c) = three_at_a_boundary(kv_cache__num_blocks=7)
    # 7 blocks: 4 free after the prefill, 3 for the decodes, 1 for a late arrival: it is admitted.
    d.add(req(3, 1, 1))
    plan = d.plan()
    assert plan.num_preempted == 0 and plan.num_admitted == 1

    d, (a, b, c) = three_at_a_boundary()
    small = req(3, 1, 5)
    d.add(small)
    plan, _ = d.run()
    assert plan.num_preempted == 1 and plan.num_admitted == 0 and small.status is Status.WAITING
    # Next step: c (back at the front) takes the 2 blocks a freed; none is left for the late one.
    plan, _ = d.run()
    assert tokens(plan) == {1: 1, 2: 5}
    assert small.status is Status.WAITING


def test_a_victim_never_outranks_the_requester():
    d = driver(kv_cache__num_blocks=3)
    a, b = req(0, 4, 10), req(1, 4, 10)
    d.add(a, b)
    d.run()
    plan, out = d.run()
    # a grows into the free block; b, the newest admitted, needs one too. The only other request, a,
    # outranks it, and b is never its own victim: b stalls, keeping its block, and a runs on.
    assert tokens(plan) == {0: 1} and plan.num_preempted == 0
    assert (b.status, b.blocks, b.num_computed_tokens) == (Status.RUNNING, 1, 4)
    assert a.blocks == 2 and a.num_preemptions == 0


def test_max_preemptions_protects_a_victim():
    d, (a, b, c) = three_at_a_boundary(scheduler__max_preemptions=1)
    c.num_preemptions = 1  # c has used up its preemptions
    plan = d.plan()
    # As in the recompute case, a takes the free block and b needs one; c, the only request below b,
    # is protected now: nobody is evicted, and b and c stall.
    assert tokens(plan) == {0: 1} and plan.num_preempted == 0
    assert all(r.status is Status.RUNNING for r in (a, b, c))


def test_with_every_victim_protected_a_request_stalls_and_keeps_its_blocks():
    d = driver(kv_cache__num_blocks=2, scheduler__max_preemptions=1)
    a, b = req(0, 4, 10), req(1, 3, 10)
    d.add(a, b)
    d.run()
    a.num_preemptions = b.num_preemptions = 1
    plan, out = d.run()
    # a must grow to a second block and b holds the only other one, protected: a stalls.
    assert tokens(plan) == {1: 1} and plan.num_preempted == 0
    assert (a.status, a.blocks, a.num_computed_tokens) == (Status.RUNNING, 1, 4)
    # Now both need a block and neither may be preempted: the cap yields to progress, or the engine
    # would spin forever. The newest admitted (b) goes.
    plan, out = d.run()
    assert tokens(plan) == {0: 1} and plan.num_preempted == 1
    assert b.status is Status.WAITING and b.num_preemptions == 2
    assert out.stall_gaps_s == [2.0]  # a's token after its stalled step: t=1 -> t=3


def test_two_requests_short_of_memory_do_not_evict_each_other_forever():
    # 4 blocks; two requests of prompt 4 and output 8 (peak 11 tokens, 3 blocks each), chunks of 3.
    # They cannot both reach their peak, so one must wait for the other. Livelock seen: b's recompute
    # chunk evicts a, one token from done; a's recompute chunk then evicts b; and so on: neither ever
    # finishes, and simulate() never returns. The older request must keep its progress: a newer
    # one may not evict it.
    d = driver(kv_cache__num_blocks=4, batching__long_prefill_token_threshold=3)
    a, b = req(0, 4, 8), req(1, 4, 8)
    d.add(a, b)
    for _ in range(60):  # one after the other: 2 prefill + 7 decode steps each
        if not (d.sched.num_running or d.sched.num_waiting):
            break
        d.run()
    assert (a.status, b.status) == (Status.FINISHED, Status.FINISHED), \
        f"livelock: {a.num_preemptions} and {b.num_preemptions} preemptions in {d.step} steps"


def test_swap_moves_the_victim_to_the_host_and_resumes_without_recompute():
    d, (a, b, c) = three_at_a_boundary(scheduler__preemption="swap", kv_cache__swap_blocks=8)
    plan, _ = d.run()
    assert plan.num_preempted == 1 and plan.swap_blocks == 1  # c's one block, out
    assert (c.blocks, c.swapped_blocks, c.num_computed_tokens, c.prefill_pending) == (0, 1, 4, False)
    assert d.sched.kv.host.num_free == 7
    plan, out = d.run()
    # c comes back decoding: its block is swapped in (charged again) and grows to 2 for token 5.
    assert tokens(plan) == {1: 1, 2: 1}
    assert (plan.decode_seqs, plan.prefill_tokens, plan.swap_blocks) == (2, 0, 1)
    assert (c.blocks, c.swapped_blocks, c.num_generated) == (2, 0, 2)
    assert d.sched.kv.host.num_free == 8
    assert out.stall_gaps_s == [2.0]


def test_swap_falls_back_to_recompute_when_the_host_pool_is_short():
    d, (a, b, c) = three_at_a_boundary(scheduler__preemption="swap", kv_cache__swap_blocks=0)
    plan, _ = d.run()
    assert plan.num_preempted == 1 and plan.swap_blocks == 0
    assert (c.blocks, c.swapped_blocks, c.num_computed_tokens, c.prefill_pending) == (0, 0, 0, True)


def test_priority_victim_is_the_worst_priority_not_the_newest():
    d, (a, b, c) = three_at_a_boundary(scheduler__policy="priority")
    a.priority = 7  # not re-keyed in WAITING: everyone is running
    plan = d.plan()
    # a decodes first and takes the free block; b needs one: the worst priority, a, is evicted, even
    # though c is newer, and a's token leaves the plan.
    assert tokens(plan) == {1: 1, 2: 1}
    assert a.status is Status.WAITING and c.status is Status.RUNNING


# --------------------------------------------------------------------------- priority eviction
@pytest.mark.parametrize("priority", [0, 1])
def test_only_a_strictly_better_waiting_request_evicts_the_worst_running_one(priority):
    d = driver(scheduler__policy="priority", batching__max_num_seqs=2)
    a, b = req(0, 4, 10, priority=1), req(1, 4, 10, priority=1)
    d.add(a, b)
    d.run()
    newcomer = req(2, 4, 10, priority=priority)
    d.add(newcomer)
    plan = d.plan()
    if priority == 0:  # better: the worst running request (b, the later of two equals) makes room
        assert tokens(plan) == {0: 1, 2: 4} and (plan.num_preempted, plan.num_admitted) == (1, 1)
        assert b.status is Status.WAITING and newcomer.status is Status.RUNNING
    else:  # equal: it waits for a free slot
        assert tokens(plan) == {0: 1, 1: 1} and plan.num_preempted == 0


def test_an_earlier_arrival_of_equal_priority_does_not_evict():
    # The state a preemption can leave: b (arrived second) runs, a (arrived first, same priority)
    # waits, with no room. The arrival order breaks ties in the queue, but it is not a better
    # priority: evicting b for a would just swap their places (and, repeated, thrash).
    d = driver(scheduler__policy="priority", batching__max_num_seqs=1)
    a, b = req(0, 4, 10, priority=1), req(1, 4, 10, priority=1)
    d.add(b)
    d.run()
    d.add(a)
    plan = d.plan()
    assert tokens(plan) == {1: 1} and plan.num_preempted == 0
    urgent = req(2, 4, 10, priority=0)
    d.finish(plan)
    d.add(urgent)
    plan = d.plan()
    assert tokens(plan) == {2: 4} and plan.num_preempted == 1  # strictly better: b goes


# --------------------------------------------------------------------------- policies' admission orders
def admission_order(d: Driver, requests) -> list[int]:
    d.add(*requests)
    while d.sched.num_running or d.sched.num_waiting:
        d.run()
    return [r.request_id for r in sorted(requests, key=lambda r: (r.first_scheduled_s, r.admitted_seq))]


def test_admission_follows_each_policy():
    def one_at_a_time(**overrides):
        return driver(batching__max_num_seqs=1, **overrides)

    mix = [req(0, 9, 1, priority=2), req(1, 3, 4, priority=0), req(2, 5, 2, priority=1), req(3, 3, 1, priority=0)]
    assert admission_order(one_at_a_time(), mix) == [0, 1, 2, 3]
    mix = [req(0, 9, 1, priority=2), req(1, 3, 4, priority=0), req(2, 5, 2, priority=1), req(3, 3, 1, priority=0)]
    assert admission_order(one_at_a_time(scheduler__policy="priority"), mix) == [1, 3, 2, 0]
    mix = [req(0, 9, 1, priority=2), req(1, 3, 4, priority=0), req(2, 5, 2, priority=1), req(3, 3, 1, priority=0)]
    assert admission_order(one_at_a_time(scheduler__policy="sjf"), mix) == [1, 3, 2, 0]
    mix = [req(0, 9, 1, priority=2), req(1, 3, 4, priority=0), req(2, 5, 2, priority=1), req(3, 3, 1, priority=0)]
    assert admission_order(one_at_a_time(scheduler__policy="sjf", scheduler__sjf_key="output"), mix) == [0, 3, 2, 1]


def test_fair_policy_shares_running_slots_across_tenants():
    d = Driver(make_scenario(scheduler__policy="fair", batching__max_num_seqs=3), tenant_names=("a", "b"))
    reqs = [req(0, 2, 5, tenant=0), req(1, 2, 5, tenant=0), req(2, 2, 5, tenant=0), req(3, 2, 5, tenant=1)]
    d.add(*reqs)
    plan, _ = d.run()
    # FCFS would run a's three; fair share gives b one of the three slots.
    assert set(tokens(plan)) == {0, 3, 1}


def test_fair_policy_frees_a_tenants_share_when_its_request_finishes():
    d = Driver(make_scenario(scheduler__policy="fair", batching__max_num_seqs=2), tenant_names=("a", "b"))
    reqs = [req(0, 2, 1, tenant=0), req(1, 2, 9, tenant=1), req(2, 2, 9, tenant=1), req(3, 2, 9, tenant=0)]
    d.add(*reqs)
    plan, _ = d.run()
    assert set(tokens(plan)) == {0, 1}
    plan, _ = d.run()
    # a's request finished: a runs 0, b runs 1, so a's next request (3) beats b's older one (2).
    assert 3 in tokens(plan) and 2 not in tokens(plan)


def test_nothing_is_scheduled_twice_and_times_are_recorded_once():
    d = driver()
    rs = [req(i, 5 + 3 * i, 4) for i in range(4)]
    d.add(*rs)
    while d.sched.num_running or d.sched.num_waiting:
        plan, _ = d.run()
        ids = [r.request_id for r, _ in plan.scheduled]
        assert len(ids) == len(set(ids))
        assert sum(n for _, n in plan.scheduled) <= 16
    for r in rs:
        assert r.status is Status.FINISHED and r.num_generated == 4
        assert r.first_scheduled_s <= r.first_token_s <= r.finish_s
        assert not math.isnan(r.finish_s)
