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

from collections import deque
from collections.abc import Sequence

import numpy as np

from simbatch.kv import BlockPool
from simbatch.request import Request

SYSTEM_PROMPT = -1
"""The stream of the shared system prompt's blocks, whichever request holds them."""


def block_key(req: Request, index: int, block_size: int) -> tuple[int, int]:
    """The content of block ``index`` of ``req``'s tokens, as (stream, block index).

    Two blocks with one key hold the same tokens: the system prompt's blocks (those wholly inside
    it), or one stream's block at one position (simbatch.workload.prefix). A request on a stream of
    its own gets a stream no other has (-2 - its id).
    """
    return (SYSTEM_PROMPT if index < system_blocks(req, block_size) else own_stream(req)), index


def system_blocks(req: Request, block_size: int) -> int:
    """How many of ``req``'s first blocks lie wholly inside the shared system prompt."""
    return req.shared_prefix_tokens // block_size


def own_stream(req: Request) -> int:
    """The stream of ``req``'s blocks past the system prompt (see :func:`block_key`)."""
    return req.prefix_stream if req.prefix_stream >= 0 else -2 - req.request_id


def _key(stream: int, position: int) -> int:
    """A key as one number: the stream in the high bits, position + 1 in the low 32 (0: no key)."""
    return (stream << 32) + position + 1


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


class CachingBlockPool(BlockPool):
    """A block pool whose blocks carry a reference count and, once published, a content key.

    The free queue holds blocks nobody references, cached or not, least recently freed first; a
    lookup that finds a cached free block takes it out of the queue (``touch``), and an allocation
    that reaches a cached block evicts its key.

    A conversation's turn shares hundreds of blocks, so the work is done on arrays, not block by
    block (but for a few blocks at a time, see ``_LOOP``). Each block has its key (:func:`_key`),
    the truth. The index from keys to blocks is one array per stream: the block last cached at
    each position. An entry is a hint, good while its block still has that key: evicting a block
    only clears the block's key, and a lookup checks the hints it reads, up to the first that fails.
    Each block's place in the free queue is a sequence number: the queue is a list of freed runs in
    order, and a block taken back off it (touched, or freed again later) leaves a stale entry behind
    that allocation skips.
    """

    __slots__ = ("_streams", "_num_streams_kept", "_ref", "_key", "_queue_seq", "_runs", "_seq", "_num_queued")

    COMPACT_SLACK = 1024  # stale queue entries tolerated beyond twice the pool

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self._streams: dict[int, np.ndarray] = {}  # stream -> the block cached at each position, or num_blocks
        self._num_streams_kept = 0  # streams after the last sweep (_forget_dead_streams)
        # Zero-filled arrays cost nothing until touched, as never-used blocks must.
        self._ref = np.zeros(num_blocks, np.int32)
        # One more key than blocks: an empty position points at block num_blocks, which has none.
        self._key = np.zeros(num_blocks + 1, np.int64)
        self._queue_seq = np.zeros(num_blocks, np.int64)  # a free block's place in the queue; 0: not queued
        # (blocks, the first one's place): freed runs, oldest first; the places in a run are consecutive
        self._runs: deque[tuple[np.ndarray, int]] = deque()
        self._seq = 0
        self._num_queued = 0  # entries in _runs, stale ones included

    # ---------------------------------------------------------------- the free queue
    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        self.num_free -= n
        first = self._next_unused
        unused = min(n, self.num_blocks - first)
        if unused:
            self._next_unused = first + unused
            self._ref[first:first + unused] = 1
            if unused == n:
                return list(range(first, first + n))
        elif n <= _LOOP:
            taken = self._dequeue_few(n)
            if taken is not None:
                return taken
        taken = self._dequeue(n - unused)
        self._ref[taken] = 1
        self._key[taken] = 0  # evicted: what they held is gone
        return [*range(first, first + unused), *taken.tolist()]

    def _dequeue_few(self, n: int) -> list[int] | None:
        """:meth:`allocate` of a few blocks from the queue's head, block by block; None (and no change)
        unless the head run's first ``n`` entries are all live (the usual case)."""
        blocks, first_place = self._runs[0]
        head = blocks[:n].tolist()
        seq = self._queue_seq
        if len(head) < n or any(seq.item(block) != place for place, block in enumerate(head, first_place)):
            return None
        self._runs[0] = (blocks[n:], first_place + n)
        self._num_queued -= n
        ref, key = self._ref, self._key
        for block in head:
            ref[block] = 1
            seq[block] = 0
            key[block] = 0
        return head

    def _dequeue(self, n: int) -> np.ndarray:
        """The ``n`` least recently freed blocks, off the queue."""
        runs, seq, out = self._runs, self._queue_seq, []
        while n:
            blocks, first_place = runs[0]
            head = blocks[:n]
            if len(head) == n and _all(seq[head] == np.arange(first_place, first_place + n)):  # no stale entry
                runs[0] = (blocks[n:], first_place + n)
                self._num_queued -= n
                out.append(head)
                break
            # Look at as much of the run as may hold n live entries, not all of it: after a
            # compaction the run is the whole queue.
            window = 2 * n + 32
            while True:
                ahead = blocks[:window]
                live = np.flatnonzero(seq[ahead] == np.arange(first_place, first_place + len(ahead)))
                if len(live) >= n or window >= len(blocks):
                    break
                window *= 4
            if len(live) > n or (len(live) == n and window < len(blocks)):
                cut = int(live[n - 1]) + 1
                runs[0] = (blocks[cut:], first_place + cut)
                self._num_queued -= cut
                out.append(blocks[live[:n]])
                break
            runs.popleft()
            self._num_queued -= len(blocks)
            out.append(blocks[live])
            n -= len(live)
        taken = np.concatenate(out) if len(out) > 1 else out[0]
        seq[taken] = 0
        return taken

    def free(self, ids: Sequence[int]) -> None:
        """Drop one reference to each block; the unreferenced join the queue, the request's last
        block first (so a request's tail is evicted before its head, which others may share)."""
        if not len(ids):
            return
        blocks = _array(ids)[::-1]
        ref = self._ref[blocks] - 1
        if np.count_nonzero(ref < 0):
            raise AssertionError("freed more blocks than were allocated")
        self._ref[blocks] = ref
        freed = blocks[ref == 0]
        if len(freed):
            self._enqueue(freed)
            self.num_free += len(freed)
            if self._num_queued > 2 * self.num_blocks + self.COMPACT_SLACK:
                self._compact()

    def _enqueue(self, blocks: np.ndarray) -> None:
        """``blocks`` join the queue's tail, in order, at the next places."""
        first_place = self._seq + 1
        self._seq += len(blocks)
        self._queue_seq[blocks] = np.arange(first_place, self._seq + 1)
        self._runs.append((blocks, first_place))
        self._num_queued += len(blocks)

    def _compact(self) -> None:
        """Drop the stale entries (the queue never holds more than twice the pool), renumbering the
        live ones in their order."""
        runs, self._runs, self._num_queued = self._runs, deque(), 0
        self._enqueue(np.concatenate([self._live_entries(blocks, first_place) for blocks, first_place in runs]))

    def _live_entries(self, blocks: np.ndarray, first_place: int) -> np.ndarray:
        """The blocks of a run still queued at their place in it."""
        return blocks[self._queue_seq[blocks] == np.arange(first_place, first_place + len(blocks))]

    def touch(self, ids: Sequence[int] | np.ndarray) -> None:
        """One more reference to each block found by a lookup, taking the unreferenced off the queue."""
        blocks = _array(ids)
        ref = self._ref[blocks]
        taken = blocks[ref == 0]
        self._queue_seq[taken] = 0
        self._ref[blocks] = ref + 1
        self.num_free -= len(taken)

    def num_evictable(self, ids: Sequence[int] | np.ndarray) -> int:
        """How many of ``ids`` are free (cached, unreferenced): touching them takes them off the queue."""
        return int(np.count_nonzero(self._ref[_array(ids)] == 0))

    # ---------------------------------------------------------------- the cache
    def lookup(self, req: Request, block_size: int) -> np.ndarray:
        """The cached blocks holding ``req``'s known tokens from the first, up to the first miss, and
        short of the block of its last known token (see :class:`~simbatch.kv.KVCacheManager`)."""
        limit = (req.prompt_tokens + req.num_generated - 1) // block_size
        system = min(system_blocks(req, block_size), limit)
        hits = _NO_BLOCKS
        if system:
            hits = self._run(SYSTEM_PROMPT, 0, system)
            if len(hits) < system:
                return hits.copy()
        if limit > system:
            more = self._run(own_stream(req), system, limit)
            return np.concatenate((hits, more)) if len(hits) else more.copy()
        return hits.copy()  # the caller's own, not a view of the index, which changes

    def _run(self, stream: int, start: int, stop: int) -> np.ndarray:
        """The cached blocks of ``stream`` from position ``start`` up to its first miss, short of
        ``stop`` (a view of the index)."""
        entries = self._streams.get(stream)
        if entries is None:
            return _NO_BLOCKS
        run = entries[start:stop]
        first_key = _key(stream, start)
        stale = self._key[run] != np.arange(first_key, first_key + len(run))
        miss = stale.argmax()
        return run[:miss] if stale[miss] else run

    def publish(self, req: Request, block_size: int) -> None:
        """Offer the full blocks of ``req``'s computed tokens not offered yet, each under its
        :func:`block_key`; a key already cached keeps its block (the first one computed)."""
        ids = req.block_ids
        stop = min(req.num_computed_tokens // block_size, len(ids))
        start = req.num_published_blocks
        if start >= stop:
            return
        system = system_blocks(req, block_size)
        if start < system:
            self._offer(SYSTEM_PROMPT, start, min(stop, system), ids)
        if stop > system:
            self._offer(own_stream(req), max(start, system), stop, ids)
        req.num_published_blocks = stop

    def _offer(self, stream: int, start: int, stop: int, ids: Sequence[int] | np.ndarray) -> None:
        """Cache ``ids[start:stop]`` at those positions of ``stream``, where the position is free and
        the block uncached."""
        entries = self._streams.get(stream)
        if entries is None:
            if len(self._streams) > 2 * self._num_streams_kept + 64:
                self._forget_dead_streams()
            entries = self._streams[stream] = np.full(max(stop, 16), self.num_blocks, np.int64)
        elif len(entries) < stop:
            grown = np.full(max(stop, 2 * len(entries)), self.num_blocks, np.int64)
            grown[:len(entries)] = entries
            entries = self._streams[stream] = grown
        key, first_key = self._key, _key(stream, start)
        if stop - start <= _LOOP:
            for position in range(start, stop):
                block, block_key_ = ids[position], first_key + position - start
                if not key.item(block) and key.item(entries.item(position)) != block_key_:
                    entries[position] = block
                    key[block] = block_key_
            return
        blocks = _array(ids[start:stop])
        keys = np.arange(first_key, first_key + len(blocks))
        new = (key[blocks] == 0) & (key[entries[start:stop]] != keys)
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
        for stream, entries in list(self._streams.items()):
            if not np.count_nonzero(key[entries] == np.arange(_key(stream, 0), _key(stream, len(entries)))):
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

    def ref_counts(self) -> dict[int, int]:
        """{block: references} of every referenced block."""
        held = np.flatnonzero(self._ref)
        return dict(zip(held.tolist(), self._ref[held].tolist(), strict=True))

    def free_ids(self) -> list[int]:
        queued = [b for blocks, first_place in self._runs for b in self._live_entries(blocks, first_place).tolist()]
        return [*range(self._next_unused, self.num_blocks), *queued]
