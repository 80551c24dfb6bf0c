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
    if (index + 1) * block_size <= req.shared_prefix_tokens:
        return SYSTEM_PROMPT, index
    return (req.prefix_stream if req.prefix_stream >= 0 else -2 - req.request_id), index


class CachingBlockPool(BlockPool):
    """A block pool whose blocks carry a reference count and, once published, a content key.

    The free queue holds blocks nobody references, cached or not, least recently freed first; a
    lookup that finds a cached free block takes it out of the queue (``touch``), and an allocation
    that reaches a cached block evicts its key.

    A conversation's turn shares hundreds of blocks, so everything is done on arrays, never block
    by block. The cache is one array per stream, indexed by block position (-1: not cached), so a
    lookup is a scan for the first miss; a block's key is its (stream, position + 1), 0 for none.
    Each block's place in the free queue is a sequence number: the queue is a list of freed runs in
    order, and a block taken back off it (touched, or freed again later) leaves a stale entry behind
    that allocation skips.
    """

    __slots__ = ("_streams", "_live", "_ref", "_key_stream", "_key_pos", "_queue_seq", "_runs", "_seq",
                 "_num_queued")

    COMPACT_SLACK = 1024  # stale queue entries tolerated beyond twice the pool

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self._streams: dict[int, np.ndarray] = {}  # stream -> its cached block at each position, or -1
        self._live: dict[int, int] = {}  # stream -> how many of its positions are cached
        # Zero-filled arrays cost nothing until touched, as never-used blocks must.
        self._ref = np.zeros(num_blocks, np.int32)
        self._key_stream = np.zeros(num_blocks, np.int64)
        self._key_pos = np.zeros(num_blocks, np.int64)  # position + 1 in its stream; 0: not cached
        self._queue_seq = np.zeros(num_blocks, np.int64)  # a free block's place in the queue; 0: not queued
        self._runs: deque[tuple[np.ndarray, np.ndarray]] = deque()  # (blocks, their places), oldest first
        self._seq = 0
        self._num_queued = 0  # entries in _runs, stale ones included

    # ---------------------------------------------------------------- the free queue
    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        self.num_free -= n
        first = self._next_unused
        unused = min(n, self.num_blocks - first)
        self._next_unused = first + unused
        self._ref[first:first + unused] = 1
        ids = list(range(first, first + unused))
        if unused < n:
            taken = self._dequeue(n - unused)
            self._ref[taken] = 1
            self._evict(taken)
            ids += taken.tolist()
        return ids

    def _dequeue(self, n: int) -> np.ndarray:
        """The ``n`` least recently freed blocks, off the queue."""
        runs, seq, out = self._runs, self._queue_seq, []
        while n:
            blocks, places = runs[0]
            head = blocks[:n]
            if len(head) == n and (seq[head] == places[:n]).all():  # the usual case: no stale entry ahead
                runs[0] = (blocks[n:], places[n:])
                self._num_queued -= n
                out.append(head)
                break
            # Look at as much of the run as may hold n live entries, not all of it: after a
            # compaction the run is the whole queue.
            window = 2 * n + 32
            while True:
                live = np.flatnonzero(seq[blocks[:window]] == places[:window])
                if len(live) >= n or window >= len(blocks):
                    break
                window *= 4
            if len(live) > n or (len(live) == n and window < len(blocks)):
                cut = int(live[n - 1]) + 1
                runs[0] = (blocks[cut:], places[cut:])
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

    def _evict(self, blocks: np.ndarray) -> None:
        """Forget the keys of ``blocks``, about to be reused."""
        positions = self._key_pos[blocks] - 1
        keyed = positions >= 0
        if not keyed.all():
            if not keyed.any():
                return
            blocks, positions = blocks[keyed], positions[keyed]
        streams = self._key_stream[blocks]
        self._key_pos[blocks] = 0
        groups = [(int(streams[0]), positions)] if (streams == streams[0]).all() else \
            [(stream, positions[streams == stream]) for stream in np.unique(streams).tolist()]
        for stream, mine in groups:
            self._streams[stream][mine] = -1
            live = self._live[stream] - len(mine)
            if live:
                self._live[stream] = live
            else:  # a stream with nothing cached is forgotten: one-off requests must not pile up
                del self._streams[stream], self._live[stream]

    def free(self, ids: Sequence[int]) -> None:
        """Drop one reference to each block; the unreferenced join the queue, the request's last
        block first (so a request's tail is evicted before its head, which others may share)."""
        if not ids:
            return
        blocks = np.array(ids[::-1], dtype=np.int64)
        ref = self._ref[blocks] - 1
        if (ref < 0).any():
            raise AssertionError("freed more blocks than were allocated")
        self._ref[blocks] = ref
        freed = blocks[ref == 0]
        if len(freed):
            places = np.arange(self._seq + 1, self._seq + 1 + len(freed), dtype=np.int64)
            self._seq += len(freed)
            self._queue_seq[freed] = places
            self._runs.append((freed, places))
            self._num_queued += len(freed)
            self.num_free += len(freed)
            if self._num_queued > 2 * self.num_blocks + self.COMPACT_SLACK:
                self._compact()

    def _compact(self) -> None:
        """Drop the stale entries: the queue never holds more than twice the pool."""
        blocks = np.concatenate([b for b, _ in self._runs])
        places = np.concatenate([p for _, p in self._runs])
        live = self._queue_seq[blocks] == places
        self._runs = deque([(blocks[live], places[live])])
        self._num_queued = int(live.sum())

    def touch(self, ids: Sequence[int]) -> None:
        """One more reference to each block found by a lookup, taking the unreferenced off the queue."""
        blocks = np.array(ids, dtype=np.int64)
        ref = self._ref[blocks]
        taken = blocks[ref == 0]
        self._queue_seq[taken] = 0
        self._ref[blocks] = ref + 1
        self.num_free -= len(taken)

    def num_evictable(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` are free (cached, unreferenced): touching them takes them off the queue."""
        return int(np.count_nonzero(self._ref[np.array(ids, dtype=np.int64)] == 0))

    # ---------------------------------------------------------------- the cache
    def lookup(self, req: Request, block_size: int) -> list[int]:
        """The cached blocks holding ``req``'s known tokens from the first, up to the first miss, and
        short of the block of its last known token (see :class:`~simbatch.kv.KVCacheManager`)."""
        limit = (req.prompt_tokens + req.num_generated - 1) // block_size
        system_blocks = min(req.shared_prefix_tokens // block_size, limit)
        hits: list[int] = []
        if system_blocks:
            hits = self._run(SYSTEM_PROMPT, 0, system_blocks)
            if len(hits) < system_blocks:
                return hits
        if limit > system_blocks:
            hits += self._run(block_key(req, system_blocks, block_size)[0], system_blocks, limit)
        return hits

    def _run(self, stream: int, start: int, stop: int) -> list[int]:
        """The cached blocks of ``stream`` from position ``start`` up to its first miss, short of ``stop``."""
        entries = self._streams.get(stream)
        if entries is None:
            return []
        run = entries[start:stop]
        misses = np.flatnonzero(run < 0)
        return (run[:misses[0]] if len(misses) else run).tolist()

    def publish(self, req: Request, block_size: int) -> None:
        """Offer the full blocks of ``req``'s computed tokens not offered yet, each under its
        :func:`block_key`; a key already cached keeps its block (the first one computed)."""
        ids = req.block_ids
        stop = min(req.num_computed_tokens // block_size, len(ids))
        start = req.num_published_blocks
        if start >= stop:
            return
        system_blocks = req.shared_prefix_tokens // block_size
        if start < system_blocks:
            self._offer(SYSTEM_PROMPT, start, min(stop, system_blocks), ids)
        if stop > system_blocks:
            start = max(start, system_blocks)
            self._offer(block_key(req, start, block_size)[0], start, stop, ids)
        req.num_published_blocks = stop

    def _offer(self, stream: int, start: int, stop: int, ids: list[int]) -> None:
        """Cache ``ids[start:stop]`` at those positions of ``stream``, where the position is free and
        the block uncached."""
        entries = self._streams.get(stream)
        if entries is None:
            entries = self._streams[stream] = np.full(max(stop, 16), -1, np.int64)
            self._live[stream] = 0
        elif len(entries) < stop:
            grown = np.full(max(stop, 2 * len(entries)), -1, np.int64)
            grown[:len(entries)] = entries
            entries = self._streams[stream] = grown
        blocks = np.array(ids[start:stop], dtype=np.int64)
        positions = np.arange(start, stop)
        new = (entries[start:stop] < 0) & (self._key_pos[blocks] == 0)
        if not new.all():
            blocks, positions = blocks[new], positions[new]
        entries[positions] = blocks
        self._key_stream[blocks] = stream
        self._key_pos[blocks] = positions + 1
        self._live[stream] += len(blocks)

    # ---------------------------------------------------------------- for checks and tests
    @property
    def cached(self) -> dict[tuple[int, int], int]:
        """Every cached block by its key (stream, position)."""
        blocks = np.flatnonzero(self._key_pos)
        return dict(zip(zip(self._key_stream[blocks].tolist(), (self._key_pos[blocks] - 1).tolist(), strict=True),
                        blocks.tolist(), strict=True))

    def ref_counts(self) -> dict[int, int]:
        """{block: references} of every referenced block."""
        held = np.flatnonzero(self._ref)
        return dict(zip(held.tolist(), self._ref[held].tolist(), strict=True))

    def free_ids(self) -> list[int]:
        queued = [b for blocks, places in self._runs
                  for b in blocks[self._queue_seq[blocks] == places].tolist()]
        return [*range(self._next_unused, self.num_blocks), *queued]
