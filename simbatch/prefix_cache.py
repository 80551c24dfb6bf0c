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

from collections import OrderedDict
from collections.abc import Sequence

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
    """

    __slots__ = ("ref_cnt", "key_of", "cached", "_queue")

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self.ref_cnt: dict[int, int] = {}  # blocks ever used; absent: never used (0)
        self.key_of: dict[int, tuple[int, int]] = {}
        self.cached: dict[tuple[int, int], int] = {}
        self._queue: OrderedDict[int, None] = OrderedDict()

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free:
            return None
        self.num_free -= n
        first = self._next_unused
        unused = min(n, self.num_blocks - first)
        self._next_unused = first + unused
        ids = list(range(first, first + unused))
        if unused < n:
            popitem, evict, cached, append = self._queue.popitem, self.key_of.pop, self.cached, ids.append
            for _ in range(n - unused):
                block = popitem(False)[0]
                key = evict(block, None)
                if key is not None:
                    del cached[key]
                append(block)
        self.ref_cnt.update(dict.fromkeys(ids, 1))
        return ids

    def free(self, ids: Sequence[int]) -> None:
        """Drop one reference to each block; the unreferenced join the queue, the request's last
        block first (so a request's tail is evicted before its head, which others may share)."""
        ref, queue = self.ref_cnt, self._queue
        freed = 0
        for block in reversed(ids):
            n = ref[block] - 1
            ref[block] = n
            if not n:
                queue[block] = None
                freed += 1
            elif n < 0:
                raise AssertionError("freed more blocks than were allocated")
        self.num_free += freed

    def touch(self, ids: Sequence[int]) -> None:
        """One more reference to each block found by a lookup, taking the unreferenced off the queue."""
        ref, queue = self.ref_cnt, self._queue
        taken = 0
        for block in ids:
            n = ref[block]
            if not n:
                del queue[block]
                taken += 1
            ref[block] = n + 1
        self.num_free -= taken

    def num_evictable(self, ids: Sequence[int]) -> int:
        """How many of ``ids`` are free (cached, unreferenced): touching them takes them off the queue."""
        ref = self.ref_cnt
        return sum(not ref[block] for block in ids)

    def lookup(self, req: Request, block_size: int) -> list[int]:
        """The cached blocks holding ``req``'s known tokens from the first, up to the first miss, and
        short of the block of its last known token (see :class:`~simbatch.kv.KVCacheManager`)."""
        get = self.cached.get
        system_blocks = min(req.shared_prefix_tokens // block_size, (req.prompt_tokens + req.num_generated - 1)
                            // block_size)
        hits = []
        for i in range(system_blocks):
            block = get((SYSTEM_PROMPT, i))
            if block is None:
                return hits
            hits.append(block)
        stream = block_key(req, system_blocks, block_size)[0]
        for i in range(system_blocks, (req.prompt_tokens + req.num_generated - 1) // block_size):
            block = get((stream, i))
            if block is None:
                break
            hits.append(block)
        return hits

    def publish(self, req: Request, block_size: int) -> None:
        """Offer the full blocks of ``req``'s computed tokens not offered yet, each under its
        :func:`block_key`; a key already cached keeps its block (the first one computed)."""
        ids = req.block_ids
        stop = min(req.num_computed_tokens // block_size, len(ids))
        start = req.num_published_blocks
        if start >= stop:
            return
        cached, key_of = self.cached, self.key_of
        system_blocks = req.shared_prefix_tokens // block_size
        stream = block_key(req, max(start, system_blocks), block_size)[0]  # of the blocks past the system prompt
        for i in range(start, stop):
            key = (SYSTEM_PROMPT, i) if i < system_blocks else (stream, i)
            if key not in cached:
                block = ids[i]
                if block not in key_of:
                    cached[key] = block
                    key_of[block] = key
        req.num_published_blocks = stop

    def free_ids(self) -> list[int]:
        return [*range(self._next_unused, self.num_blocks), *self._queue]
