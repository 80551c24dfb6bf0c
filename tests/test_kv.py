"""The paged KV cache: block pools that never go negative, and conservation across every move."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simbatch.config import KVCache
from simbatch.kv import BlockPool, KVCacheManager
from simbatch.request import Request


def request(i: int = 0) -> Request:
    return Request(i, 0.0, 1, 1)


def test_pool_allocates_and_frees():
    pool = BlockPool(10)
    assert pool.allocate(4) and (pool.num_free, pool.num_used) == (6, 4)
    assert pool.allocate(6) and pool.num_free == 0
    pool.free(10)
    assert (pool.num_free, pool.num_used) == (10, 0)


def test_pool_refuses_without_change_when_short():
    pool = BlockPool(5)
    assert pool.allocate(3)
    assert not pool.allocate(3)
    assert pool.num_free == 2


def test_pool_catches_a_double_free():
    pool = BlockPool(5)
    pool.allocate(2)
    with pytest.raises(AssertionError, match="freed more"):
        pool.free(3)


def test_grow_adds_blocks_only_at_boundaries():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10))
    r = request()
    assert kv.grow(r, 6) and r.blocks == 2
    assert kv.extra_blocks(r, 8) == 0 and kv.grow(r, 8) and r.blocks == 2
    assert kv.extra_blocks(r, 9) == 1 and kv.grow(r, 9) and r.blocks == 3
    assert kv.grow(r, 3) and r.blocks == 3  # never shrinks
    assert kv.device.num_free == 7


def test_grow_refuses_without_change_when_short():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=3))
    a, b = request(0), request(1)
    assert kv.grow(a, 8)
    assert not kv.grow(b, 5)  # needs 2, 1 free
    assert (b.blocks, kv.device.num_free) == (0, 1)
    assert not kv.grow(a, 13)  # needs 2 more
    assert (a.blocks, kv.device.num_free) == (2, 1)


def test_release_returns_every_block():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10))
    r = request()
    kv.grow(r, 10)
    assert kv.release(r) == 3
    assert (r.blocks, kv.device.num_free) == (0, 10)


def test_swap_round_trip_moves_blocks_between_pools():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10, swap_blocks=5))
    r = request()
    kv.grow(r, 12)
    r.num_computed_tokens = 12
    assert kv.swap_out(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (0, 3, 10, 2)
    assert kv.swap_in(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (3, 0, 7, 5)


def test_swap_out_saves_the_computed_tokens_and_frees_blocks_reserved_for_uncomputed_ones():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=10, swap_blocks=5))
    r = request()
    kv.grow(r, 12)  # 3 blocks reserved for a step that would compute up to token 12 ...
    r.num_computed_tokens = 5  # ... of which 5 are computed: 2 blocks of KV to save
    assert kv.swap_out(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (0, 2, 10, 3)


def test_swap_refuses_without_change_when_the_other_pool_is_short():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, swap_blocks=2))
    r = request()
    kv.grow(r, 12)
    r.num_computed_tokens = 12
    assert not kv.swap_out(r)  # 3 blocks, 2 on the host
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (3, 0, 1, 2)

    kv = KVCacheManager(KVCache(block_size=4, num_blocks=4, swap_blocks=4))
    r, other = request(0), request(1)
    kv.grow(r, 12)
    r.num_computed_tokens = 12
    assert kv.swap_out(r)
    kv.grow(other, 8)  # 2 of the 4 device blocks taken while r is out
    assert not kv.swap_in(r)
    assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == (0, 3, 2, 1)


OPS = st.lists(st.tuples(st.sampled_from(["grow", "compute", "release", "swap_out", "swap_in"]),
                         st.integers(0, 3), st.integers(0, 40)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(num_blocks=st.integers(1, 12), swap_blocks=st.integers(0, 12), ops=OPS)
def test_blocks_are_conserved_under_any_sequence_of_moves(num_blocks, swap_blocks, ops):
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=num_blocks, swap_blocks=swap_blocks))
    reqs = [request(i) for i in range(4)]
    for op, i, n in ops:
        r = reqs[i]
        before = (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free)
        if op == "grow" and not r.swapped_blocks:
            ok = kv.grow(r, n)
            assert ok == (kv.extra_blocks(r, n) == 0)
            assert ok or (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == before
        elif op == "compute":  # what a finished step does: tokens fill blocks already held
            r.num_computed_tokens = min(n, (r.blocks or r.swapped_blocks) * kv.block_size)
        elif op == "release" and not r.swapped_blocks:
            kv.release(r)
        elif (op == "swap_out" and not r.swapped_blocks and not kv.swap_out(r)) or \
                (op == "swap_in" and r.swapped_blocks and not kv.swap_in(r)):
            assert (r.blocks, r.swapped_blocks, kv.device.num_free, kv.host.num_free) == before
        assert kv.device.num_free + sum(q.blocks for q in reqs) == num_blocks
        assert kv.host.num_free + sum(q.swapped_blocks for q in reqs) == swap_blocks
        assert kv.device.num_free >= 0 and kv.host.num_free >= 0
        assert all(q.blocks == 0 or q.swapped_blocks == 0 for q in reqs)
