"""Prefix caching: computed KV blocks kept by their content, shared, and evicted least recently freed first.

As vLLM's automatic prefix caching. A full block of computed tokens is *published* under a key
that names its content (:func:`block_key`), and a later request whose prompt starts with the same
content finds those blocks at admission: it shares them (a reference count per block) and skips
their prefill. A block whose last holder leaves goes back to the free queue with its key: free,
yet still found by a lookup until an allocation takes it from the queue's head and evicts it.

What is published when. A prefill chunk's full blocks as soon as the chunk is computed (so a shared
system prompt is found while its first reader still runs); blocks filled by decoding when the
request leaves the running set (finished or preempted): a conversation's next turn quotes the
previous answer, which exists only once it has finished. A lookup never covers the last known
token: its logits must be computed, so at least one token is prefilled (vLLM does the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np

from simbatch.memory.blocks import BlockPool
from simbatch.memory.host_tier import HostTier

SYSTEM_PROMPT = -1
"""The stream of the shared system prompt's blocks, whichever request holds them."""

HASHED = -(1 << 30)
"""Streams at and below this are a trace's block ids: id h is stream HASHED - h (ids below 2**30,
request ids too, so that no stream is two things and every key fits 64 bits)."""


class Content(NamedTuple):
    """What one request's blocks hold, as the cache keys them: the KV manager describes each request
    so (:meth:`simbatch.memory.kv.KVCacheManager.content_of`); the pool knows no request.

    Prompts are described by where their tokens come from (simbatch.workload.prefix): a system prompt
    that many requests start with, then a stream of the request's own (a conversation's, shared by its
    turns; or one no other request has). A trace may instead give its prompts' content as block ids,
    one per ``hash_block_tokens`` tokens (Mooncake's ``hash_ids``).
    """

    block_size: int
    stream: int  # the stream of its blocks past the system prompt
    system_blocks: int  # its first blocks that lie wholly inside the shared system prompt
    prompt_blocks: int  # its prompt's whole blocks (the ones a trace's block ids name)
    hashes: np.ndarray | None = None  # a trace's block ids, one per hash_block_tokens of the prompt
    hash_block_tokens: int = 0


def block_key(content: Content, index: int) -> tuple[int, int]:
    """The content of block ``index``, as (stream, block index).

    Two blocks with one key hold the same tokens: the system prompt's blocks (those wholly inside
    it), or one stream's block at one position. A block of a prompt with a trace's block ids is named
    by the id of the trace block holding its last token, which names that block's content and all
    before it, and its place among the blocks ending in that trace block (:func:`hashed_key`).
    """
    if content.hashes is not None and index < content.prompt_blocks:
        return hashed_key(content, index)
    return (SYSTEM_PROMPT if index < content.system_blocks else content.stream), index


def hashed_key(content: Content, index: int) -> tuple[int, int]:
    """(stream of the trace block holding block ``index``'s last token, position among its blocks)."""
    bs, T = content.block_size, content.hash_block_tokens
    t = ((index + 1) * bs - 1) // T
    return HASHED - int(content.hashes[t]), index - t * T // bs


def _hashed_spans(content: Content, start: int, stop: int):
    """(stream, first block of its trace block, start, stop) for the hashed blocks in [start, stop)."""
    bs, T, j = content.block_size, content.hash_block_tokens, start
    while j < stop:
        t = ((j + 1) * bs - 1) // T
        first, end = t * T // bs, min((t + 1) * T // bs, stop)
        yield HASHED - int(content.hashes[t]), first, j, end
        j = end


def _key(stream: int, position: int) -> int:
    """A key as one number: the stream in the high bits, position + 1 in the low 32 (0: no key)."""
    return (stream << 32) + position + 1


def iter_block_keys(content: Content, start: int, stop: int):
    """The keys of ``content``'s blocks ``start .. stop - 1`` as numbers (:func:`_key`), one at a time:
    what a host tier holds (:mod:`simbatch.memory.host_tier`).

    A stream's keys at consecutive positions are consecutive numbers, so without a trace's block ids
    they are two ranges (the system prompt's blocks, then the stream's), which a host tier's lookup
    walks without a call per block: a waiting request is looked up at every plan it is tried."""
    if content.hashes is not None and start < content.prompt_blocks:
        return (_key(*block_key(content, i)) for i in range(start, stop))
    system = min(max(content.system_blocks, start), stop)
    own = _key(content.stream, system)
    return chain(range(_key(SYSTEM_PROMPT, start), _key(SYSTEM_PROMPT, system)), range(own, own + stop - system))


_LOOP = 8
"""Calls on at most this many blocks go block by block: below it, NumPy's fixed cost per call (about
a microsecond) exceeds a Python loop's."""

_NO_BLOCKS = np.zeros(0, np.int64)
_NO_BLOCKS.flags.writeable = False


def _all(mask: np.ndarray) -> bool:
    """``mask.all()``, without the method's Python-level dispatch (a third of a small call's cost)."""
    return np.count_nonzero(mask) == len(mask)


def _array(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Block ids as an int64 array (a request that started from a cached prefix holds one already)."""
    return ids if isinstance(ids, np.ndarray) else np.array(ids, dtype=np.int64)


class _Index:
    """One stream's index: at each position the block last cached there (``no_block``: none), a
    hint, good while that block still has the key ``expected`` holds for the position.

    The first ``system`` positions are the system prompt's, which every stream behind it shares: the
    hints there point at its blocks, so that one look finds a conversation's whole cached prefix.
    (``system`` is -1 once requests on the stream disagree on the system prompt's length: then the
    index holds the stream's own blocks only.) From ``top`` on, no block was ever cached.
    """

    __slots__ = ("entries", "expected", "system", "top")

    def __init__(self, stream: int, system: int, size: int, no_block: int):
        self.entries = np.full(size, no_block, np.int64)
        self.system, self.top = system, 0
        self.expected = self._keys(stream, size)

    def _keys(self, stream: int, size: int) -> np.ndarray:
        keys = np.arange(_key(stream, 0), _key(stream, size))
        if self.system > 0:
            keys[:self.system] = np.arange(_key(SYSTEM_PROMPT, 0), _key(SYSTEM_PROMPT, self.system))
        return keys

    def grow(self, stream: int, size: int, no_block: int) -> None:
        """Room for ``size`` positions at least (doubling, so growing costs O(1) a position)."""
        grown = np.full(max(size, 2 * len(self.entries)), no_block, np.int64)
        grown[:len(self.entries)] = self.entries
        self.entries, self.expected = grown, self._keys(stream, len(grown))

    def own_only(self, stream: int) -> None:
        """Requests on the stream disagree on the system prompt: keep no hint to it from now on."""
        self.system = -1
        self.expected = self._keys(stream, len(self.entries))


class CachingBlockPool(BlockPool):
    """A block pool whose blocks carry a reference count and, once published, a content key.

    The free queue holds blocks nobody references, cached or not, least recently freed first; a
    lookup that finds a cached free block takes it out of the queue (``touch``), and an allocation
    that reaches a cached block evicts its key.

    A conversation's turn shares hundreds of blocks, so the work is done on arrays, not block by
    block (but for a few blocks at a time, see ``_LOOP``). Each block has its key (:func:`_key`),
    the truth. The index from keys to blocks is one array per stream (:class:`_Index`): the block
    last cached at each position. An entry is a hint, good while its block still has that key:
    evicting a block only clears the block's key, and a lookup checks the hints it reads, up to the
    first that fails. The free queue is one array of blocks in the order they were freed, each
    block's place in it noted: a block taken back off the queue (touched, or freed again later)
    leaves a stale entry behind, which allocation skips and a compaction drops.
    """

    __slots__ = ("_streams", "_num_streams_kept", "_ref", "_key", "_queue_seq", "_queue", "_places", "_head",
                 "_tail", "spill", "_reserved", "_scalars")

    QUEUE_SLACK = 1024  # the queue holds up to 3 x num_blocks + QUEUE_SLACK entries, stale ones included
    FIRST_PLACES = 4096  # the queue's places are listed this far at first (see _make_room)

    def __init__(self, num_blocks: int, spill: HostTier | None = None):
        super().__init__(num_blocks)
        # Reserved blocks, taken at once (reserve): taking a block may evict a cached one, and when that
        # happens is seen by every later lookup.
        self._reserved: list[int] = []
        # Where evicted blocks' content goes (a host tier, simbatch.memory.host_tier), or None: lost.
        self.spill = spill
        self._streams: dict[int, _Index] = {}
        self._num_streams_kept = 0  # streams after the last sweep (_forget_dead_streams)
        # Zero-filled arrays cost nothing until touched, as never-used blocks must.
        self._ref = np.zeros(num_blocks, np.int32)
        # One more key than blocks: an empty position points at block num_blocks, which has none.
        self._key = np.zeros(num_blocks + 1, np.int64)
        # The queue: entries _queue[_head:_tail], oldest first. The entry at i is live if its block's
        # place, _queue_seq, is i + 1. A block off the queue keeps a place no live entry has: taken
        # off by an allocation, which drops every entry up to its own; or by a touch, which sets 0.
        self._queue = np.zeros(3 * num_blocks + self.QUEUE_SLACK, np.int64)
        # Places in 32 bits while they fit: the places are read at random, half the bytes stay in cache.
        self._queue_seq = np.zeros(num_blocks, np.int32 if len(self._queue) < 2**31 else np.int64)
        self._head = self._tail = 0
        # _places[i] = i + 1, as far as the queue has reached (grown by doubling, so that a huge pool
        # pays only for what it uses): a slice of it is the places of a run of entries.
        self._places = np.arange(1, min(len(self._queue), self.FIRST_PLACES) + 1, dtype=self._queue_seq.dtype)
        self._scalars = self._views()

    def _views(self) -> tuple[memoryview, ...]:
        """The queue, places, counts and keys again as memoryviews, for allocate()'s few blocks at a time:
        an element read or written through one is a plain C index, where NumPy's scalar indexing parses an
        index each time (here a read takes less than half the time, a write about 0.7 of it). The arrays are
        never replaced, so the views stay theirs."""
        return memoryview(self._queue), memoryview(self._queue_seq), memoryview(self._ref), memoryview(self._key)

    # A copy or a pickle (a pool taken as it stands, a test's "what would this allocation take") leaves the
    # views out, which cannot be copied, and makes them anew over the copied arrays.
    def __getstate__(self) -> tuple[None, dict]:
        _, slots = object.__getstate__(self)
        return None, {name: value for name, value in slots.items() if name != "_scalars"}

    def __setstate__(self, state: tuple[None, dict]) -> None:
        for name, value in state[1].items():
            setattr(self, name, value)
        self._scalars = self._views()

    @property
    def _num_queued(self) -> int:
        """Entries in the queue, stale ones included (bounded by its length: see _compact)."""
        return self._tail - self._head

    # ---------------------------------------------------------------- the free queue
    def reserve(self, n: int) -> bool:
        """``n`` free blocks taken for holders named later (:meth:`claim`), by number at once: taking
        a block may evict a cached one, which every later lookup must see; False (and no change) if
        fewer are free."""
        ids = self.allocate(n)
        if ids is None:
            return False
        self._reserved += ids
        return True

    def claim(self, n: int) -> list[int]:
        """The last ``n`` blocks reserved."""
        reserved = self._reserved
        ids = reserved[-n:]
        del reserved[-n:]
        return ids

    @property
    def num_reserved(self) -> int:
        return len(self._reserved)

    def reserved_ids(self) -> list[int]:
        return self._reserved

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        if self._next_unused == self.num_blocks and n <= _LOOP:
            # A few blocks, block by block, from the queue's head when its first n entries are live
            # (the usual case).
            h = self._head
            queue, seq, ref, key = self._scalars
            head = queue[h:h + n].tolist()
            if len(head) == n:
                place = h + 1
                for block in head:
                    if seq[block] != place:
                        break
                    place += 1
                else:
                    self._head = h + n
                    self.num_free -= n
                    if self.spill is not None:
                        self._spill(head)
                    for block in head:
                        ref[block] = 1
                        key[block] = 0  # evicted: what it held is gone
                    return head
        self.num_free -= n
        first = self._next_unused
        unused = min(n, self.num_blocks - first)
        if unused:
            self._next_unused = first + unused
            self._ref[first:first + unused] = 1
            if unused == n:
                return list(range(first, first + n))
        taken = self._dequeue(n - unused)
        self._ref[taken] = 1
        if self.spill is not None:
            self._spill(taken)
        self._key[taken] = 0
        return [*range(first, first + unused), *taken.tolist()] if unused else taken.tolist()

    def _spill(self, taken) -> None:
        """The cached among blocks ``taken`` (off the queue, least recently freed first) are evicted:
        their content goes to the host tier, in that order."""
        keys = self._key[taken]
        self.spill.store(keys[keys != 0].tolist())

    def _dequeue(self, n: int) -> np.ndarray:
        """The ``n`` least recently freed blocks, off the queue (which holds at least n live entries);
        perhaps a view of the queue, good until the next free."""
        queue, seq, h = self._queue, self._queue_seq, self._head
        head = queue[h:h + n]
        if _all(seq[head] == self._places[h:h + n]):  # no stale entry
            self._head = h + n
            return head
        ahead, live = self._live_ahead(n)
        self._head = h + int(live[n - 1]) + 1
        return ahead[live[:n]]

    def _live_ahead(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The queue's entries from its head, as far as may hold ``n`` live ones (not all of it, unless
        fewer are live), and the offsets of the live ones among them."""
        queue, seq, h, t = self._queue, self._queue_seq, self._head, self._tail
        window = 2 * n + 32
        while True:
            ahead = queue[h:min(h + window, t)]
            live = np.flatnonzero(seq[ahead] == self._places[h:h + len(ahead)])
            if len(live) >= n or h + window >= t:
                return ahead, live
            window *= 4

    def num_kept(self, ids: np.ndarray, n: int) -> int:
        """How many of ``ids`` (cached blocks, a lookup's run), from the first, allocating ``n`` blocks
        now would leave in place; read only. What a step-by-step engine still finds at an instant inside
        a run of steps whose blocks the accelerated one takes at the run's end.

        Never-used blocks go first; then the queue's live entries, oldest first. A free block's place
        is its live entry's, so the blocks taken are the free ones placed no later than the entry that
        the allocation's last block would come from."""
        k = n - (self.num_blocks - self._next_unused)
        if k <= 0:
            return len(ids)
        free = self._ref[ids] == 0
        if not free.any():
            return len(ids)
        _, live = self._live_ahead(k)  # the allocation's last block is the k-th live entry's
        last_place = self._head + int(live[k - 1]) + 1 if len(live) >= k else self._tail
        gone = free & (self._queue_seq[ids] <= last_place)
        return int(gone.argmax()) if gone.any() else len(ids)

    def num_before_eviction(self, limit: int) -> int:
        """How many blocks, at most ``limit``, allocations may take from now before one evicts a cached
        block (which a lookup could have found); read only. Never-used blocks go first, then the queue's
        live entries, oldest first, as :meth:`allocate` takes them."""
        unused = self.num_blocks - self._next_unused
        if limit <= unused:
            return limit
        k = limit - unused
        ahead, live = self._live_ahead(k)
        cached = np.flatnonzero(self._key[ahead[live[:k]]])
        return unused + (int(cached[0]) if len(cached) else min(k, len(live)))

    def free(self, ids: Sequence[int]) -> None:
        """Drop one reference to each block; the unreferenced join the queue, the request's last
        block first (so a request's tail is evicted before its head, which others may share).

        A block freed more often than it was held is not caught here (looking would cost every
        free): its count goes negative, which :meth:`~simbatch.memory.kv.KVCacheManager.check_conservation`
        reports."""
        if not len(ids):
            return
        blocks = _array(ids)[::-1]
        ref = self._ref[blocks]
        ref -= 1
        self._ref[blocks] = ref
        freed = blocks[ref == 0]
        n = len(freed)
        if not n:
            return
        t = self._tail
        if t + n > len(self._places):
            self._make_room(n)
            t = self._tail
        self._queue[t:t + n] = freed
        self._queue_seq[freed] = self._places[t:t + n]
        self._tail = t + n
        self.num_free += n

    def _make_room(self, n: int) -> None:
        """Room for ``n`` more entries at the queue's tail, and their places: compact a full queue."""
        if self._tail + n > len(self._queue):
            self._compact()
        stop = self._tail + n
        if stop > len(self._places):
            self._places = np.arange(1, min(max(2 * len(self._places), stop), len(self._queue)) + 1,
                                     dtype=self._queue_seq.dtype)

    def _compact(self) -> None:
        """Drop the stale entries, moving the live ones to the queue's start in their order. At most
        num_blocks entries are live, so at least 2 x num_blocks are dropped for each compaction: its
        cost, spread over them, stays O(1) an entry."""
        live = self._live_entries()
        self._queue[:len(live)] = live
        self._queue_seq[live] = self._places[:len(live)]
        self._head, self._tail = 0, len(live)

    def _live_entries(self) -> np.ndarray:
        h, t = self._head, self._tail
        entries = self._queue[h:t]
        return entries[self._queue_seq[entries] == self._places[h:t]]

    def touch(self, ids: Sequence[int] | np.ndarray) -> None:
        """One more reference to each block found by a lookup, taking the unreferenced off the queue."""
        blocks = _array(ids)
        ref = self._ref[blocks]
        self.num_free -= len(ref) - np.count_nonzero(ref)
        # Place 0 is no live entry's: off the queue go the unreferenced, and the referenced (off it
        # already) lose nothing, with no mask to tell them apart.
        self._queue_seq[blocks] = 0
        ref += 1
        self._ref[blocks] = ref

    def num_evictable(self, ids: Sequence[int] | np.ndarray) -> int:
        """How many of ``ids`` are free (cached, unreferenced): touching them takes them off the queue."""
        return int(np.count_nonzero(self._ref[_array(ids)] == 0))

    # ---------------------------------------------------------------- the cache
    def lookup(self, content: Content, limit: int) -> np.ndarray:
        """The cached blocks holding ``content``'s first blocks, up to the first miss, and at most
        ``limit`` of them (the manager stops short of the block of a request's last known token).

        Perhaps a view of the index: good until the pool next changes (copy it to keep it)."""
        if content.hashes is not None:
            return self._hashed_lookup(content, limit)
        system, stream = content.system_blocks, content.stream
        index = self._streams.get(stream)
        if index is not None and index.system == system and limit:
            run = index.entries[:min(limit, index.top)]  # from top on, nothing was ever cached
            stale = self._key[run] != index.expected[:len(run)]
            if not np.count_nonzero(stale):
                return run
            miss = stale.argmax()
            if miss >= system:
                return run[:miss]
            # A hint to the system prompt is stale (its block evicted, perhaps computed again since):
            # look in the system prompt's own index, and refresh the hints from it.
        else:
            index = None
        system = min(system, limit)
        hits = _NO_BLOCKS
        if system:
            hits = self._run(SYSTEM_PROMPT, 0, system)
            if index is not None:
                index.entries[:len(hits)] = hits
            if len(hits) < system:
                return hits
        if limit > system:
            more = self._run(stream, system, limit)
            return np.concatenate((hits, more)) if len(hits) else more
        return hits

    def _hashed_lookup(self, content: Content, limit: int) -> np.ndarray:
        """A lookup by a trace's block ids: each trace block's run in its own stream, up to the first
        miss; past the prompt's whole blocks, the request's own (after a preemption)."""
        full = content.prompt_blocks
        runs = []
        for stream, first, start, stop in _hashed_spans(content, 0, min(limit, full)):
            run = self._run(stream, start - first, stop - first)
            runs.append(run)
            if len(run) < stop - start:
                return np.concatenate(runs)
        if limit > full:
            runs.append(self._run(content.stream, full, limit))
        return np.concatenate(runs) if runs else _NO_BLOCKS

    def _run(self, stream: int, start: int, stop: int) -> np.ndarray:
        """The cached blocks of ``stream`` from position ``start`` up to its first miss, short of
        ``stop`` (a view of the index)."""
        index = self._streams.get(stream)
        if index is None:
            return _NO_BLOCKS
        run = index.entries[start:stop]
        first_key = _key(stream, start)
        stale = self._key[run] != np.arange(first_key, first_key + len(run))
        miss = stale.argmax()
        return run[:miss] if stale[miss] else run

    def publish(self, content: Content, ids: Sequence[int] | np.ndarray, start: int, stop: int) -> None:
        """Offer blocks ``ids[start:stop]``, full blocks of computed tokens of ``content``, each under its
        :func:`block_key`; a key already cached keeps its block (the first one computed)."""
        if content.hashes is not None:
            full = content.prompt_blocks
            for stream, first, a, b in _hashed_spans(content, start, min(stop, full)):
                self._offer(stream, 0, a - first, b - first, ids[first:b])
            if stop > full:
                self._offer(content.stream, 0, max(start, full), stop, ids)
            return
        system = content.system_blocks
        if start < system:
            self._offer(SYSTEM_PROMPT, 0, start, min(stop, system), ids)
            if stop <= system:
                return
            start = system
        stream = content.stream
        index = self._streams.get(stream)
        if index is not None and start >= index.top and stop <= len(index.entries) \
                and (index.system == system or index.system < 0):
            # Past all the stream ever cached (the usual case: a conversation's next blocks) every
            # position is free: the blocks go in unchecked.
            index.top = stop
            blocks = ids[start:stop]
            index.entries[start:stop] = blocks
            self._key[blocks] = index.expected[start:stop]
        else:
            self._offer(stream, system, start, stop, ids)

    def _offer(self, stream: int, system: int, start: int, stop: int, ids: Sequence[int] | np.ndarray) -> None:
        """Cache ``ids[start:stop]`` at those positions of ``stream`` (behind a ``system``-block system
        prompt) where no block is cached.

        The blocks are uncached: past the published ones a request holds only blocks allocated to it
        since (allocation evicts), and a block offered and not taken is never offered again.
        """
        index = self._streams.get(stream)
        if index is None:
            if len(self._streams) > 2 * self._num_streams_kept + 64:
                self._forget_dead_streams()
            index = self._streams[stream] = _Index(stream, system, max(2 * stop, 64), self.num_blocks)
            shared = self._streams.get(SYSTEM_PROMPT) if system else None
            if shared is not None:
                index.entries[:system] = shared.entries[:system]
        else:
            if len(index.entries) < stop:
                index.grow(stream, stop, self.num_blocks)
            if index.system != system and index.system >= 0:
                index.own_only(stream)
        entries, key, first_key = index.entries, self._key, _key(stream, start)
        index.top = max(index.top, stop)
        if stop - start <= _LOOP:
            for position in range(start, stop):
                block_key_ = first_key + position - start
                if key.item(entries.item(position)) != block_key_:
                    block = ids[position]
                    entries[position] = block
                    key[block] = block_key_
            return
        blocks = _array(ids[start:stop])
        keys = np.arange(first_key, first_key + len(blocks))
        new = key[entries[start:stop]] != keys
        if _all(new):
            entries[start:stop] = blocks
            key[blocks] = keys
        else:
            offsets = np.flatnonzero(new)
            entries[start + offsets] = blocks[offsets]
            key[blocks[offsets]] = keys[offsets]

    def _forget_dead_streams(self) -> None:
        """Drop the index of every stream with nothing cached any more: one-off requests must not
        pile up. Run each time the streams have doubled since the last time, so its cost is spread."""
        key = self._key
        for stream, index in list(self._streams.items()):
            own = max(index.system, 0)  # the hints to the system prompt keep no stream alive
            if not np.count_nonzero(key[index.entries[own:]] == index.expected[own:]):
                del self._streams[stream]
        self._num_streams_kept = len(self._streams)

    # ---------------------------------------------------------------- for checks and tests
    @property
    def cached(self) -> dict[tuple[int, int], int]:
        """Every cached block by its key (stream, position)."""
        blocks = np.flatnonzero(self._key[:self.num_blocks])
        keys = self._key[blocks]
        return dict(zip(zip((keys >> 32).tolist(), ((keys & 0xFFFFFFFF) - 1).tolist(), strict=True),
                        blocks.tolist(), strict=True))

    @property
    def num_streams(self) -> int:
        """Streams the index holds, dead ones not yet forgotten included (bounded: see _offer)."""
        return len(self._streams)

    def references(self) -> np.ndarray:
        """Each block's reference count (read only)."""
        return self._ref

    def free_ids(self) -> np.ndarray:
        """Every block in the free queue, as an array (for checks: O(num_blocks), a list would cost
        more than the steps a check runs between)."""
        return np.concatenate((np.arange(self._next_unused, self.num_blocks), self._live_entries()))
