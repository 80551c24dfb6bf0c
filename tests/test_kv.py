"""The paged KV cache: block pools that never go negative, and conservation across every move."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simbatch.config import KVCache
from simbatch.memory.blocks import BlockPool
from simbatch.memory.kv import KVCacheManager
from simbatch.model.request import Request


def request(i: int = 0) -> Request:
    return Request(i, 0.0, 1, 1)


def test_pool_allocates_and_frees():
    pool = BlockPool(10)
    assert pool.allocate(4) == [0, 1, 2, 3] and (pool.num_free, pool.num_used) == (6, 4)
    assert pool.allocate(6) == [4, 5, 6, 7, 8, 9] and pool.num_free == 0
    pool.free(range(10))
    assert (pool.num_free, pool.num_used) == (10, 0)


def test_pool_hands_out_unused_blocks_first_then_freed_ones_in_the_order_they_were_freed():
    # vLLM's free queue: a freed block goes to the back, so a cached block is reused as late as possible.
    pool = BlockPool(6)
    a, b = pool.allocate(2), pool.allocate(2)
    pool.free(b)
    pool.free(a[::-1])
    assert pool.allocate(3) == [4, 5, 2]
    assert pool.allocate(3) == [3, 1, 0]
    assert pool.allocate(1) is None and pool.free_ids() == []


def test_pool_refuses_without_change_when_short():
    pool = BlockPool(5)
    assert pool.allocate(3)
    assert pool.allocate(3) is None
    assert pool.num_free == 2 and pool.allocate(0) == []


def test_pool_catches_a_double_free():
    pool = BlockPool(5)
    pool.allocate(2)
    with pytest.raises(AssertionError, match="freed more"):
        pool.free([0, 1, 1])


@pytest.mark.parametrize("caching", [False, True])
def test_allocate_slots_adds_blocks_only_at_boundaries(caching):
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10, enable_prefix_caching=caching))
    r = request()
    assert kv.allocate_slots(r, 6) == 2 and r.blocks == 2
    assert kv.num_blocks_to_allocate(r, 8) == 0 and kv.allocate_slots(r, 8) == 0 and r.blocks == 2
    assert kv.num_blocks_to_allocate(r, 9) == 1 and kv.allocate_slots(r, 9) == 1 and r.blocks == 3
    r.num_computed_tokens = 9
    assert kv.allocate_slots(r, 3) == 0 and r.blocks == 3  # 12 tokens fit in 3 blocks
    assert kv.allocate_slots(r, 4) == 1 and kv.device.num_free == 6
    # Numbers only where prefix caching shares blocks by them (in vLLM's order: never-used ones first).
    assert list(r.block_ids) == ([0, 1, 2, 3] if caching else [])


def test_allocate_slots_refuses_without_change_when_short():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=3))
    a, b = request(0), request(1)
    assert kv.allocate_slots(a, 8) == 2
    assert kv.allocate_slots(b, 5) is None  # needs 2, 1 free
    assert (b.blocks, kv.device.num_free) == (0, 1)
    assert kv.allocate_slots(a, 13) is None  # needs 2 more
    assert (a.blocks, kv.device.num_free) == (2, 1)


def test_release_returns_every_block():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10))
    r = request()
    kv.allocate_slots(r, 10)
    assert kv.release(r) == 3
    assert (r.blocks, kv.device.num_free) == (0, 10)


def test_swap_round_trip_moves_blocks_between_pools():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10, swap_blocks=5))
    r = request()
    kv.allocate_slots(r, 12)
    r.num_computed_tokens = 12
    assert kv.swap_out(r)
    assert (r.blocks, r.host_block_ids, kv.device.num_free, kv.host.num_free) == (0, [0, 1, 2], 10, 2)
    assert kv.swap_in(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (3, 0, 7, 5)


def test_swap_out_saves_the_computed_tokens_and_frees_blocks_reserved_for_uncomputed_ones():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10, swap_blocks=5))
    r = request()
    kv.allocate_slots(r, 12)  # 3 blocks reserved for a step that would compute up to token 12 ...
    r.num_computed_tokens = 5  # ... of which 5 are computed: 2 blocks of KV to save
    assert kv.swap_out(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (0, 2, 10, 3)


def test_swap_refuses_without_change_when_the_other_pool_is_short():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, swap_blocks=2))
    r = request()
    kv.allocate_slots(r, 12)
    r.num_computed_tokens = 12
    assert not kv.swap_out(r)  # 3 blocks, 2 on the host
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (3, 0, 1, 2)

    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, swap_blocks=4))
    r, other = request(0), request(1)
    kv.allocate_slots(r, 12)
    r.num_computed_tokens = 12
    assert kv.swap_out(r)
    kv.allocate_slots(other, 8)  # 2 of the 4 device blocks taken while r is out
    assert not kv.swap_in(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (0, 3, 2, 1)


def test_allocate_together_is_all_or_nothing_and_reserves_the_bulk_share():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=5))
    a, b = request(0), request(1)
    assert kv.allocate_together([(a, 5), (b, 4)], bulk_blocks=2)
    # Without prefix caching the bulk share is counted out of the free blocks, held by nobody yet.
    assert (kv.num_bulk, a.blocks, b.blocks, kv.device.num_free) == (2, 2, 1, 0)
    c = request(2)
    assert not kv.allocate_together([(c, 1)]) and c.blocks == 0


def test_with_prefix_caching_the_bulk_share_is_taken_first_by_number():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=5, enable_prefix_caching=True))
    a, b = request(0), request(1)
    assert kv.allocate_together([(a, 5), (b, 4)], bulk_blocks=2)
    assert (list(kv.device.reserved_ids()), list(a.block_ids), list(b.block_ids), kv.device.num_free) == \
        ([0, 1], [2, 3], [4], 0)


def test_blocks_taken_in_bulk_are_held_until_assigned():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4))
    a, b = request(0), request(1)
    assert kv.take_bulk(3) and not kv.take_bulk(2) and kv.num_bulk == 3
    assert kv.device.num_free == 1
    kv.assign_bulk(a, 2)
    kv.assign_bulk(b, 1)
    assert (a.blocks, b.blocks, kv.num_bulk, kv.device.num_free) == (2, 1, 0, 1)
    kv.check_conservation([a, b], [])
    assert kv.take_bulk(1)  # taken in bulk for no member: no request counts it
    with pytest.raises(AssertionError, match="device blocks not conserved"):
        kv.check_conservation([a, b], [])


def test_with_prefix_caching_blocks_taken_in_bulk_have_their_numbers_at_once():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, enable_prefix_caching=True))
    a, b = request(0), request(1)
    assert kv.take_bulk(3) and not kv.take_bulk(2) and list(kv.device.reserved_ids()) == [0, 1, 2]
    kv.assign_bulk(a, 2)
    kv.assign_bulk(b, 1)
    assert (list(a.block_ids), list(b.block_ids), kv.num_bulk) == ([1, 2], [0], 0)
    kv.check_conservation([a, b], [])
    assert kv.take_bulk(1)
    with pytest.raises(AssertionError, match="block counts disagree with the blocks held"):
        kv.check_conservation([a, b], [])


def test_reserve_batch_shares_one_reservation_among_the_slots():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=8))
    batch = [request(i) for i in range(3)]
    assert kv.reserve_batch(batch, 7)
    assert [r.blocks for r in batch] == [3, 2, 2]
    assert not kv.reserve_batch([request(3)], 2) and kv.device.num_free == 1
    assert kv.release_batch(batch) == 7 and kv.device.num_free == 8


def test_the_conservation_check_catches_counts_that_do_not_add_up():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4))
    a, b = request(0), request(1)
    kv.allocate_slots(a, 8)
    kv.allocate_slots(b, 4)
    kv.check_conservation([a, b], [])
    b.blocks = 2  # a block from nowhere
    with pytest.raises(AssertionError, match="device blocks not conserved"):
        kv.check_conservation([a, b], [])
    b.blocks, b.block_ids = 1, [2]
    with pytest.raises(AssertionError, match="lists blocks nobody numbers"):
        kv.check_conservation([a, b], [])


def test_with_prefix_caching_the_conservation_check_catches_a_block_lost_or_held_and_free():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, enable_prefix_caching=True))
    a, b = request(0), request(1)
    kv.allocate_slots(a, 8)
    kv.allocate_slots(b, 4)
    kv.check_conservation([a, b], [])
    b.block_ids = [1]  # a's block (shared without a reference), and block 2 neither free nor held
    with pytest.raises(AssertionError, match="device blocks not conserved"):
        kv.check_conservation([a, b], [])
    b.block_ids = [3]  # a free block
    with pytest.raises(AssertionError, match="held twice, or held and free"):
        kv.check_conservation([a, b], [])
    b.blocks, b.block_ids = 2, [1, 2]  # a's block shared without taking a reference to it
    with pytest.raises(AssertionError, match="reference counts disagree"):
        kv.check_conservation([a, b], [])
    b.blocks, b.block_ids = 1, [4]  # a block the pool does not have
    with pytest.raises(AssertionError, match="block number out of range"):
        kv.check_conservation([a, b], [])


def test_a_host_block_listed_twice_is_caught():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, swap_blocks=2))
    a, b = request(0), request(1)
    for r in (a, b):
        kv.allocate_slots(r, 4)
        kv.computed(r, 4)
        assert kv.swap_out(r)
    assert (list(a.host_block_ids), list(b.host_block_ids)) == ([0], [1])
    kv.check_conservation([], [a, b])
    b.host_block_ids = [0]  # a's host block, and host block 1 lost: the counts still add up
    with pytest.raises(AssertionError, match="host block held twice, or held and free"):
        kv.check_conservation([], [a, b])


OPS = st.lists(st.tuples(st.sampled_from(["grow", "compute", "release", "swap_out", "swap_in"]),
                         st.integers(0, 3), st.integers(0, 40)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(num_blocks=st.integers(1, 12), swap_blocks=st.integers(0, 12), ops=OPS, caching=st.booleans())
def test_blocks_are_conserved_under_any_sequence_of_moves(num_blocks, swap_blocks, ops, caching):
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=num_blocks, swap_blocks=swap_blocks,
                                enable_prefix_caching=caching))
    reqs = [request(i) for i in range(4)]
    for op, i, n in ops:
        r = reqs[i]
        before = (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free)
        if op == "grow" and not r.swapped_blocks:
            need = kv.num_blocks_to_allocate(r, n)
            added = kv.allocate_slots(r, n)
            assert (added is None) == (need > before[2])
            assert added is None and (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == before \
                or added == need
        elif op == "compute":  # what a finished step does: tokens fill blocks already held
            r.num_computed_tokens = min(n, (r.blocks or r.swapped_blocks) * kv.block_size)
        elif op == "release" and not r.swapped_blocks:
            kv.release(r)
        elif (op == "swap_out" and not r.swapped_blocks and not kv.swap_out(r)) or \
                (op == "swap_in" and r.swapped_blocks and not kv.swap_in(r)):
            assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == before
        assert kv.device.num_free + sum(q.blocks for q in reqs) == num_blocks
        assert kv.host.num_free + sum(q.swapped_blocks for q in reqs) == swap_blocks
        kv.check_conservation(reqs, reqs)  # and by identity: every block free or held, once
        assert kv.device.num_free >= 0 and kv.host.num_free >= 0
        assert all(q.blocks == 0 or q.swapped_blocks == 0 for q in reqs)


def test_a_large_pool_has_its_identities_checked_at_regular_calls():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4096, enable_prefix_caching=True))
    a, b = request(0), request(1)
    kv.allocate_slots(a, 8)
    kv.allocate_slots(b, 4)
    b.block_ids = [3]  # a free block for block 2: the counts still add up
    with pytest.raises(AssertionError, match="held twice"):
        kv.check_conservation([a, b], [])  # the first call checks identities ...
    for _ in range(63):
        kv.check_conservation([a, b], [])  # ... the next ones counts only ...
    with pytest.raises(AssertionError, match="held twice"):
        kv.check_conservation([a, b], [])  # ... until the 64th call after it
