"""Prefix caching, by hand and against its closed form: the pool, the lookups, the scheduler, the run.

Cases use ``builders.BASE`` (4-token blocks, 64 of them, a 16-token budget, 4 slots, 1 s steps)
with ``kv_cache.enable_prefix_caching`` on.
"""

from __future__ import annotations

import copy
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
from builders import Driver, make_scenario, req, tokens
from hypothesis import given
from hypothesis import strategies as st
from test_cli import invoke

from simbatch.config import KVCache, Prefix
from simbatch.inputs.loading import scenario_from_dict
from simbatch.memory.kv import KVCacheManager, content_of, lookup_blocks
from simbatch.memory.prefix_cache import SYSTEM_PROMPT, CachingBlockPool, _key, block_key, iter_block_keys
from simbatch.simulation import simulate
from simbatch.workload.prefix import OWN_STREAM, apply_prefix


def caching_driver(**overrides) -> Driver:
    return Driver(make_scenario(kv_cache__enable_prefix_caching=True, **overrides))


def with_system_prompt(request, tokens_: int):
    request.shared_prefix_tokens = tokens_
    return request


# --------------------------------------------------------------------------- the pool
def publish(pool: CachingBlockPool, request, block_size: int = 4) -> None:
    """Offer ``request``'s full computed blocks not offered yet, as the KV manager does."""
    stop = min(request.num_computed_tokens // block_size, len(request.block_ids))
    if request.num_published_blocks < stop:
        pool.publish(content_of(request, block_size), request.block_ids, request.num_published_blocks, stop)
        request.num_published_blocks = stop


def lookup(pool: CachingBlockPool, request, block_size: int = 4):
    """``request``'s cached prefix, as the KV manager looks it up."""
    return pool.lookup(content_of(request, block_size), lookup_blocks(request, block_size))


def computed(pool: CachingBlockPool, request, num_tokens: int, block_size: int = 4):
    """``request`` holding new blocks for ``num_tokens`` computed tokens, published."""
    request.block_ids = pool.allocate(-(-num_tokens // block_size))
    request.num_computed_tokens = num_tokens
    publish(pool, request, block_size)
    return request


def test_a_cached_block_stays_findable_while_free_and_is_evicted_from_the_queue_head():
    pool = CachingBlockPool(4)
    r = req(0, 8, 1)
    r.prefix_stream = 7
    a = computed(pool, r, 8).block_ids  # blocks 0, 1
    pool.free(a)  # the request's tail joins the queue first: 1, then 0
    assert pool.num_free == 4 and pool.cached == {(7, 0): 0, (7, 1): 1}
    assert pool.allocate(2) == [2, 3]  # never-used blocks go first
    assert pool.allocate(1) == [1] and pool.cached == {(7, 0): 0}  # then the queue's head, evicted
    assert pool.num_evictable([0]) == 1
    pool.touch([0])  # a hit takes a free cached block off the queue
    assert pool.num_free == 0 and pool.allocate(1) is None and pool.references()[0] == 1


def test_the_blocks_before_an_eviction_count_never_used_then_uncached_free_ones():
    pool = CachingBlockPool(6)
    r = req(0, 8, 1)
    r.prefix_stream = 7
    cached = computed(pool, r, 8).block_ids  # blocks 0, 1, published
    loose = pool.allocate(1)  # block 2, never published
    pool.free(loose)
    pool.free(cached)  # the queue, oldest first: 2 (no key), 1, 0 (cached)
    assert pool.num_free == 6
    # Three never-used blocks (3, 4, 5), then block 2; the fifth allocated would be block 1: evicted.
    assert pool.num_before_eviction(9) == 4 and pool.num_before_eviction(2) == 2
    assert pool.allocate(4) == [3, 4, 5, 2] and pool.cached == {(7, 0): 0, (7, 1): 1}  # read only, and true
    assert pool.num_before_eviction(1) == 0


def test_one_off_requests_leave_no_index_behind():
    """Each request on a stream of its own is indexed under a new stream; once its blocks are evicted
    the stream is forgotten (within a doubling of the index), so the index stays bounded however many
    one-off requests pass, while the live streams stay findable."""
    pool = CachingBlockPool(16)
    for n in range(2_000):
        pool.free(computed(pool, req(n, 8, 1), 8).block_ids)  # 2 blocks, published, freed: cached
        assert pool.num_streams <= 2 * 16 + 64 + 1
    # The last 8 requests' blocks are still cached (16 blocks, 2 each), and found.
    assert sorted(stream for stream, _ in pool.cached) == sorted(2 * [-2 - n for n in range(1_992, 2_000)])
    assert lookup(pool, req(1_999, 9, 1)).tolist() == [pool.cached[(-2 - 1_999, 0)], pool.cached[(-2 - 1_999, 1)]]


def test_a_shared_block_returns_to_the_queue_with_its_last_holder():
    pool = CachingBlockPool(2)
    [b] = computed(pool, with_system_prompt(req(0, 5, 1), 4), 4).block_ids
    assert pool.cached == {(SYSTEM_PROMPT, 0): b}
    pool.touch([b])
    assert pool.references()[b] == 2 and pool.num_evictable([b]) == 0
    pool.free([b])
    assert pool.num_free == 1  # still held once
    pool.free([b])
    assert pool.num_free == 2 and pool.free_ids().tolist() == [1, b]
    pool.free([b])  # once too often: the pool does not look (it costs every free), the check does
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=2, enable_prefix_caching=True))
    kv.device = pool
    with pytest.raises(AssertionError, match="reference counts disagree"):
        kv.check_conservation([], [])


@pytest.mark.parametrize("copy_of", [copy.deepcopy, lambda pool: pickle.loads(pickle.dumps(pool))],
                         ids=["deepcopy", "pickle"])
def test_a_copied_pool_allocates_as_the_original_and_writes_only_to_itself(copy_of):
    pool = CachingBlockPool(8)
    first = computed(pool, with_system_prompt(req(0, 17, 1), 8), 16)  # blocks 0-3, 0 and 1 the system prompt's
    others = pool.allocate(4)
    pool.free(first.block_ids)
    pool.free(others)  # every block used, and free: allocate() takes the queue's head a block at a time
    twin = copy_of(pool)
    assert twin.allocate(2) == pool.allocate(2) == [3, 2]  # (a request's last block is freed first)
    twin.allocate(1)  # block 1, the system prompt's second, and what it held: gone from the copy only
    later = with_system_prompt(req(1, 17, 1), 8)
    assert lookup(pool, later).tolist() == [0, 1] and lookup(twin, later).tolist() == [0]
    assert twin.num_free == pool.num_free - 1


def test_a_key_keeps_the_block_computed_first():
    pool = CachingBlockPool(3)
    first, second = req(0, 6, 1), req(1, 6, 1)
    first.prefix_stream = second.prefix_stream = 3  # two turns of one conversation, computed side by side
    computed(pool, first, 4)
    computed(pool, second, 4)
    assert pool.cached == {(3, 0): first.block_ids[0]}  # and nothing else: the second block stays uncached
    assert second.num_published_blocks == 1  # offered, and not taken: it is not offered again


def test_a_streams_hints_to_the_system_prompt_follow_it_when_it_is_computed_again(monkeypatch):
    """A conversation's index points at the system prompt's blocks too, so one look finds its whole
    prefix. When those blocks are evicted and another request computes the system prompt again in
    other blocks, the hints are stale: the lookup finds the new blocks through the system prompt's
    own index, and refreshes the hints, so the next lookup needs only the one look again."""
    pool = CachingBlockPool(6)
    a = with_system_prompt(req(0, 17, 1), 8)
    a.prefix_stream = 5
    computed(pool, a, 16)  # blocks 0, 1 (the system prompt), 2, 3
    pool.free(a.block_ids)
    evict = pool.allocate(6)  # 4, 5, then the queue: every cached block is evicted
    assert pool.cached == {}
    pool.free([0, 1])
    pool.free([b for b in evict if b not in (0, 1)])  # the queue: 1, 0, then the rest
    b = with_system_prompt(req(1, 13, 1), 8)
    b.prefix_stream = 7
    computed(pool, b, 12)  # the system prompt again, in blocks 1 and 0 (swapped)
    assert pool.cached[(SYSTEM_PROMPT, 0)] == 1 and pool.cached[(SYSTEM_PROMPT, 1)] == 0
    c = with_system_prompt(req(2, 21, 1), 8)
    c.prefix_stream = 5  # a's conversation goes on: its own blocks are gone, the system prompt is not
    runs, original = [], CachingBlockPool._run  # the streams each lookup reads an index of, one by one
    monkeypatch.setattr(CachingBlockPool, "_run", lambda self, *args: runs.append(args[0]) or original(self, *args))
    assert lookup(pool, c).tolist() == [1, 0] and SYSTEM_PROMPT in runs
    runs.clear()
    assert lookup(pool, c).tolist() == [1, 0] and runs == []  # the hints were refreshed


class PlainPool:
    """The pool's rules stated plainly (a dict per concept, one block at a time): the oracle that
    :class:`CachingBlockPool`, which does the same on arrays, is held to."""

    def __init__(self, num_blocks: int):
        self.num_blocks, self.num_free, self.next_unused = num_blocks, num_blocks, 0
        self.ref: dict[int, int] = {}
        self.queue: dict[int, None] = {}  # insertion-ordered: least recently freed first
        self.cached: dict[tuple[int, int], int] = {}
        self.key_of: dict[int, tuple[int, int]] = {}

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        self.num_free -= n
        ids = []
        while len(ids) < n and self.next_unused < self.num_blocks:
            ids.append(self.next_unused)
            self.next_unused += 1
        while len(ids) < n:
            block = next(iter(self.queue))
            del self.queue[block]
            key = self.key_of.pop(block, None)
            if key is not None:
                del self.cached[key]
            ids.append(block)
        self.ref.update(dict.fromkeys(ids, 1))
        return ids

    def free(self, ids: list[int]) -> None:
        for block in reversed(ids):
            self.ref[block] -= 1
            if not self.ref[block]:
                self.queue[block] = None
                self.num_free += 1

    def touch(self, ids: list[int]) -> None:
        for block in ids:
            if not self.ref[block]:
                del self.queue[block]
                self.num_free -= 1
            self.ref[block] += 1

    def lookup(self, request, block_size: int) -> list[int]:
        hits = []
        for i in range((request.prompt_tokens + request.num_generated - 1) // block_size):
            block = self.cached.get(block_key(content_of(request, block_size), i))
            if block is None:
                break
            hits.append(block)
        return hits

    def publish(self, request, ids: list[int], start: int, block_size: int) -> None:
        for i in range(start, min(request.num_computed_tokens // block_size, len(ids))):
            key = block_key(content_of(request, block_size), i)
            if key not in self.cached and ids[i] not in self.key_of:
                self.cached[key], self.key_of[ids[i]] = ids[i], key

    def free_ids(self) -> list[int]:
        return [*range(self.next_unused, self.num_blocks), *self.queue]


def _tree_hashes(rng, prompt: int, trace_block: int, ids: dict) -> np.ndarray:
    """Block ids as a trace's: a path through a small tree of contents, one id per node (equal ids, equal
    prefixes), ``trace_block`` tokens a node."""
    path, out = (), []
    for _ in range(-(-prompt // trace_block)):
        path = (*path, int(rng.integers(2)))
        out.append(ids.setdefault(path, len(ids)))
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize(("seed", "num_blocks", "max_prompt", "system_per_stream", "trace_block"),
                         [(0, 24, 40, False, None), (1, 24, 40, False, None), (2, 200, 400, False, None),
                          (3, 200, 400, False, None), (4, 24, 40, True, None), (5, 200, 400, True, None),
                          (6, 24, 40, False, 8), (7, 200, 400, False, 6)])
def test_the_array_pool_keeps_the_plain_rules_through_thousands_of_turns(seed, num_blocks, max_prompt,
                                                                        system_per_stream, trace_block, monkeypatch):
    """Requests on a few streams (some behind a system prompt) arrive, find their cached prefix, take
    blocks, publish them and leave, thousands of times over a pool small enough to evict all the
    time and, with no slack, to compact its queue often (and to list its places a few at first, so
    that the list grows): every answer and the whole state match the plain oracle. The system prompt is either each stream's own for good (as the workload makes
    them: a stream's index then points at the system prompt's blocks too, and those hints go stale
    as its blocks are evicted and computed again), or drawn afresh for every request. With a
    ``trace_block``, requests carry a trace's block ids instead (a tree of prefixes; 6 tokens a trace
    block: blocks straddle two), and the keys are the ids'."""
    monkeypatch.setattr(CachingBlockPool, "QUEUE_SLACK", 0)
    monkeypatch.setattr(CachingBlockPool, "FIRST_PLACES", 4)
    rng = np.random.default_rng(seed)
    block_size, pool, plain = 4, CachingBlockPool(num_blocks), PlainPool(num_blocks)
    holders: list = []
    tree: dict = {}
    for n in range(3_000):
        if holders and (len(holders) > 3 or rng.random() < 0.4):
            request = holders.pop(int(rng.integers(len(holders))))
            pool.free(request.block_ids)
            plain.free(request.block_ids)
        else:
            request = req(n, int(rng.integers(1, max_prompt)), 1)
            request.prefix_stream = int(rng.integers(3))
            request.shared_prefix_tokens = (0, 8, 8)[request.prefix_stream] if system_per_stream else \
                int(rng.choice([0, 8]))
            if trace_block is not None:
                request.block_hashes = _tree_hashes(rng, request.prompt_tokens, trace_block, tree)
                request.hash_block_tokens = trace_block
            hits = lookup(pool, request, block_size).tolist()
            assert hits == plain.lookup(request, block_size)
            new = -(-request.prompt_tokens // block_size) - len(hits)
            if new + pool.num_evictable(hits) > pool.num_free:  # touching takes the free hits off the queue
                continue
            pool.touch(hits)
            plain.touch(hits)
            ids = pool.allocate(new)
            assert ids == plain.allocate(new)
            request.block_ids = hits + ids
            request.num_published_blocks = len(hits)
            request.num_computed_tokens = request.prompt_tokens
            plain.publish(request, request.block_ids, len(hits), block_size)
            publish(pool, request, block_size)
            holders.append(request)
        assert pool.num_free == plain.num_free and pool.free_ids().tolist() == plain.free_ids()
        assert pool.cached == plain.cached and pool.references().tolist() == [plain.ref.get(b, 0) for b in range(pool.num_blocks)]
        assert pool._num_queued <= 3 * num_blocks  # stale queue entries are dropped: its memory is bounded


# --------------------------------------------------------------------------- keys and lookups
def test_block_keys_name_the_system_prompt_the_stream_or_the_request_alone():
    r = with_system_prompt(req(5, 20, 1), 10)
    assert [block_key(content_of(r, 4), i) for i in range(4)] == [(SYSTEM_PROMPT, 0), (SYSTEM_PROMPT, 1), (-7, 2), (-7, 3)]
    r.prefix_stream = 3  # a conversation
    assert block_key(content_of(r, 4), 2) == (3, 2) and block_key(content_of(r, 4), 1) == (SYSTEM_PROMPT, 1)


def test_block_keys_of_a_traces_block_ids():
    """A whole block of the prompt is named by the id of the trace block holding its last token and its place
    among that trace block's blocks; past the prompt's whole blocks, the request's own stream."""
    from simbatch.memory.prefix_cache import HASHED

    r = req(3, 22, 4)
    r.block_hashes, r.hash_block_tokens = np.array([40, 41, 42]), 8  # 4-token blocks: two per trace block
    assert [block_key(content_of(r, 4), i) for i in range(7)] == [
        (HASHED - 40, 0), (HASHED - 40, 1), (HASHED - 41, 0), (HASHED - 41, 1), (HASHED - 42, 0), (-5, 5), (-5, 6)]
    r.block_hashes, r.hash_block_tokens = np.array([40, 41, 42, 43]), 6  # blocks straddle trace blocks
    assert [HASHED - block_key(content_of(r, 4), i)[0] for i in range(5)] == [40, 41, 41, 42, 43]


@given(system_tokens=st.integers(0, 40), stream=st.integers(-3, 5), hashed=st.booleans(),
       start=st.integers(0, 14), length=st.integers(-2, 14))
def test_a_host_tiers_keys_are_the_blocks_keys_in_order(system_tokens, stream, hashed, start, length):
    """iter_block_keys walks a stream's keys as ranges: they must be the keys block_key gives, block by
    block, on either side of the system prompt's end and of a trace's ids."""
    r = with_system_prompt(req(3, 30, 4), system_tokens)
    r.prefix_stream = stream
    if hashed:  # one id per 6 tokens of its 30-token prompt
        r.block_hashes, r.hash_block_tokens = np.arange(40, 45), 6
    content, stop = content_of(r, 4), start + length
    assert list(iter_block_keys(content, start, stop)) == \
        [_key(*block_key(content, i)) for i in range(start, stop)]


def test_a_lookup_never_covers_the_last_known_token():
    kv = KVCacheManager(KVCache(block_size=4, num_blocks=16, enable_prefix_caching=True))
    first = with_system_prompt(req(0, 8, 1), 8)
    kv.allocate_slots(first, 8)
    first.num_computed_tokens = 8
    kv.release(first)  # publishes both full blocks of the system prompt
    exact = with_system_prompt(req(1, 8, 1), 8)
    assert kv.cached_prefix(exact).tolist() == [0]  # 8 known tokens: the block of token 8 is computed again
    longer = with_system_prompt(req(2, 9, 1), 8)
    assert kv.cached_prefix(longer).tolist() == [0, 1]
    # A new block, and both cached ones leave the free queue: 3 of the 16 free.
    assert kv.fits(longer, [0, 1], 1)
    kv.allocate_slots(req(3, 52, 1), 52)  # 13 blocks: 3 left free, of them the 2 cached
    assert kv.fits(longer, [0, 1], 1) and not kv.fits(longer, [0, 1], 5)


# --------------------------------------------------------------------------- the scheduler, by hand
def test_a_second_request_skips_the_system_prompt_the_first_computed():
    d = caching_driver()
    first = with_system_prompt(req(0, 10, 3), 8)
    d.add(first)
    plan, _ = d.run()
    assert tokens(plan) == {0: 10}  # prefill: blocks 0 and 1 (the system prompt) are published
    second = with_system_prompt(req(1, 10, 3), 8)
    d.add(second)
    plan, _ = d.run()
    # The first decodes token 11; the second finds 8 tokens cached and prefills only 2.
    assert tokens(plan) == {0: 1, 1: 2} and plan.prefill_tokens == 2
    assert second.num_cached_tokens == 8 and list(second.block_ids[:2]) == list(first.block_ids[:2])
    assert d.sched.kv.device.references()[first.block_ids[0]] == 2
    while d.sched.running:
        d.run()
    assert d.sched.kv.device.num_free == 64  # shared blocks freed once each, by their last holder


def test_a_recomputed_request_finds_its_own_blocks():
    d = caching_driver(kv_cache__num_blocks=5, batching__max_num_seqs=2)
    a, b = req(0, 8, 6), req(1, 8, 6)
    d.add(a, b)
    d.run()  # both prefill 8 tokens: 4 blocks
    d.run()  # both decode token 9 into a new block each: 5 blocks ... one of them waits for the other
    plans = [d.run()[0] for _ in range(6)]
    victim = b if b.num_preemptions else a
    assert victim.num_preemptions >= 1
    # Re-admitted, it skipped the blocks its first run published (its prompt and first decodes).
    readmit = next(p for p in plans if p.num_admitted)
    assert tokens(readmit)[victim.request_id] < victim.prompt_tokens + victim.num_generated
    while d.sched.running or d.sched.num_waiting:
        d.run()


def test_without_caching_nothing_is_found():
    d = Driver(make_scenario())
    first, second = with_system_prompt(req(0, 10, 2), 8), with_system_prompt(req(1, 10, 2), 8)
    d.add(first)
    d.run()
    d.add(second)
    plan, _ = d.run()
    assert tokens(plan) == {0: 1, 1: 10} and second.num_cached_tokens == 0


# --------------------------------------------------------------------------- the workload
def test_conversations_grow_turn_by_turn_and_start_over_past_the_context_limit():
    prefix = Prefix(shared_tokens=5, share=1.0, multi_turn=True, max_context_tokens=60)
    prompts, stream, shared = apply_prefix(prefix, np.array([10, 10, 10, 10]), np.array([5, 5, 5, 5]),
                                           np.array([0, 1, 0, 0]), np.random.default_rng(0))
    # Session 0: 5 + 10 = 15, then 15 + 5 + 10 = 30, then 30 + 5 + 10 = 45 would end at 50 <= 60 ...
    assert prompts.tolist() == [15, 15, 30, 45] and stream.tolist() == [0, 1, 0, 0]
    prompts, stream, _ = apply_prefix(prefix.model_copy(update={"max_context_tokens": 40}), np.array([10, 10, 10]),
                                      np.array([5, 5, 5]), np.array([0, 0, 0]), np.random.default_rng(0))
    assert prompts.tolist() == [15, 30, 15] and stream.tolist() == [0, 0, 1]  # 30 + 5 + 10 + 5 > 40
    assert shared.tolist() == [5, 5, 5, 5]


def test_a_shared_system_prompt_is_prepended_to_its_share():
    prompts, stream, shared = apply_prefix(Prefix(shared_tokens=100, share=0.25), np.full(4000, 7),
                                           np.full(4000, 3), np.arange(4000), np.random.default_rng(1))
    assert set(prompts.tolist()) == {7, 107} and (stream == OWN_STREAM).all()
    assert abs((shared > 0).mean() - 0.25) < 0.03


# --------------------------------------------------------------------------- whole runs against the closed form
def test_shared_prefix_hits_follow_the_closed_form():
    """With an ample cache and requests far apart, every request with the system prompt but the first
    finds its whole blocks: floor(S / b) b tokens each, and nothing else is found."""
    s_tokens, b = 100, 16
    sc = scenario_from_dict({
        "workload": {"num_requests": 60, "arrival": {"process": "constant", "rate": 0.5},
                     "prompt_tokens": {"dist": "uniform", "low": 1, "high": 50},
                     "output_tokens": {"dist": "fixed", "value": 8},
                     "prefix": {"shared_tokens": s_tokens, "share": 0.5}},
        "kv_cache": {"block_size": b, "enable_prefix_caching": True}})
    rq = simulate(sc, check_invariants=True).requests
    sharing = rq["prompt_tokens"] > s_tokens - 1  # the prompts drawn are 1..50 tokens: > 99 means shared
    expected = np.where(sharing, s_tokens // b * b, 0)
    expected[np.flatnonzero(sharing)[0]] = 0  # the first computes it
    assert rq["num_cached_tokens"].tolist() == expected.tolist()
    s = simulate(sc).summary
    assert s["prefix_cache_hits"] == expected.sum() and s["prefix_cache_queries"] == rq["prompt_tokens"].sum()
    assert math.isclose(s["prefix_cache_hit_rate"], expected.sum() / rq["prompt_tokens"].sum())


def test_a_conversation_finds_every_full_block_of_the_previous_turn():
    """Turns 4 s apart, each done within 0.7 s, and an ample cache: turn k finds floor((P + O - 1) / b) b
    tokens of turn k-1 (its last output token was never computed), and the first turn nothing."""
    b = 8
    sc = scenario_from_dict({
        "workload": {"num_requests": 40, "arrival": {"process": "constant", "rate": 0.25}, "num_sessions": 3,
                     "prompt_tokens": {"dist": "uniform", "low": 1, "high": 40},
                     "output_tokens": {"dist": "uniform", "low": 1, "high": 30},
                     "prefix": {"multi_turn": True, "max_context_tokens": 400}},
        "kv_cache": {"block_size": b, "enable_prefix_caching": True}})
    rq = simulate(sc, check_invariants=True).requests
    from simbatch.workload import generate

    wl = generate(sc)
    expected, last = [], {}
    for i in range(len(wl)):
        prev = last.get(int(wl.prefix_stream[i]))
        expected.append(0 if prev is None else (prev - 1) // b * b)
        last[int(wl.prefix_stream[i])] = int(wl.prompt_tokens[i] + wl.output_tokens[i])
    assert rq["num_cached_tokens"].tolist() == expected
    assert sum(expected) > 0


def test_a_cramped_cache_evicts_and_still_conserves_every_block():
    sc = scenario_from_dict({
        "workload": {"num_requests": 150, "arrival": {"rate": 20.0}, "num_sessions": 5,
                     "prompt_tokens": {"dist": "uniform", "low": 10, "high": 60},
                     "output_tokens": {"dist": "uniform", "low": 1, "high": 40},
                     "prefix": {"shared_tokens": 64, "share": 0.7, "multi_turn": True, "max_context_tokens": 600}},
        "kv_cache": {"block_size": 4, "num_blocks": 200, "enable_prefix_caching": True},
        "batching": {"max_num_seqs": 8, "max_num_batched_tokens": 256}})
    cramped = simulate(sc, check_invariants=True)
    ample = simulate(sc.model_copy(update={"kv_cache": sc.kv_cache.model_copy(update={"num_blocks": 20_000})}))
    assert (cramped.requests["status"] == "finished").all()
    assert 0 < cramped.summary["prefix_cache_hit_rate"] < ample.summary["prefix_cache_hit_rate"]


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("sets", "says"), [
    (["batching.mode=static", "kv_cache.enable_prefix_caching=true"], "enable_prefix_caching with a request-level"),
    (["workload.prefix.multi_turn=true"], "prefix.multi_turn needs num_sessions"),
])
def test_prefix_settings_that_cannot_work_are_one_line_errors(tmp_path, sets, says):
    args = ["validate", Path(__file__).parent.parent / "scenarios" / "stable.yaml"]
    for s in sets:
        args += ["--set", s]
    done = invoke(*args)
    assert done.exit_code == 2 and says in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_caching_run_plots_its_hit_rate_and_a_comparison_shows_both(tmp_path):
    from simbatch.app.plots import save_compare_plots, save_run_plots

    sc = scenario_from_dict({
        "workload": {"num_requests": 60, "arrival": {"rate": 4.0}, "num_sessions": 4,
                     "prompt_tokens": {"dist": "fixed", "value": 40}, "output_tokens": {"dist": "fixed", "value": 8},
                     "prefix": {"shared_tokens": 64, "multi_turn": True}},
        "kv_cache": {"enable_prefix_caching": True}})
    cached = simulate(sc)
    plain = simulate(sc.model_copy(update={"kv_cache": sc.kv_cache.model_copy(update={"enable_prefix_caching": False})}))
    for name in ("cached", "both"):
        (tmp_path / name).mkdir()
    assert "prefix_cache.png" in {p.name for p in save_run_plots(tmp_path / "cached", cached)}
    assert "prefix_cache_hit_rate" not in plain.summary  # which is what leaves the plot out of a plain run
    compared = save_compare_plots(tmp_path / "both", {"cache": cached, "none": plain})
    assert "prefix_cache.png" in {p.name for p in compared}
