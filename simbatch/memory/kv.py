"""The paged KV cache: fixed-size blocks on the device and, for swap preemption, on the host.

(The host KV tier, which keeps what the prefix cache evicts, is :mod:`simbatch.memory.host_tier`.)

A request holds a count of device blocks (:attr:`~simbatch.model.request.Request.blocks`). Which
blocks they are changes nothing without prefix caching (paging leaves no external fragmentation, so
only counts matter), and then the device pool only counts them
(:class:`~simbatch.memory.blocks.CountedBlockPool`). With prefix caching a block's identity is what
requests share: the pool numbers them, handed out in vLLM's order (the never-used ones by number,
then freed ones in the order they were freed, a cached block reused as late as possible), and a
request also lists its own (:attr:`~simbatch.model.request.Request.block_ids`), as swapped ones are
listed on the host.

:class:`KVCacheManager` is the only writer of both pools, of every request's blocks and of its count of
computed tokens (the tokens whose KV the blocks hold): schedulers ask it to allocate slots, to record
computed tokens, release, swap or reserve, and allocation answers with how many blocks it added or
None, never raising: running out of memory is a scheduling decision (preempt, or wait), not an
error. (Blocks may be taken in bulk and assigned later, for a lockstep group whose members cross
block boundaries every step; the device pool holds them reserved meanwhile: see
:mod:`simbatch.engine.accel.lockstep`.)

Invariant, checked by :meth:`KVCacheManager.check_conservation` at every step of the tests: every
block is free or held, never both, never twice, on the device and on the host alike (where blocks are
only counted, the counts add up).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter

import numpy as np

from simbatch.config import KVCache
from simbatch.memory.blocks import BlockPool, CountedBlockPool, blocks_for, peak_kv_tokens
from simbatch.memory.host_tier import HostTier
from simbatch.memory.prefix_cache import CachingBlockPool, Content, iter_block_keys
from simbatch.model.request import Request

__all__ = ["BlockPool", "Content", "CountedBlockPool", "KVCacheManager", "blocks_for", "content_of",
           "lookup_blocks", "peak_kv_tokens"]


class KVCacheManager:
    """Device and host pools plus the per-request bookkeeping of who holds which blocks."""

    __slots__ = ("block_size", "device", "host", "host_tier", "caching", "_num_checks")

    def __init__(self, cfg: KVCache):
        self.block_size = cfg.block_size
        self.caching = cfg.enable_prefix_caching
        # The host KV tier (simbatch.memory.host_tier): what the prefix cache evicts, kept in host memory.
        self.host_tier = HostTier(cfg.host_blocks) if self.caching and cfg.host_blocks else None
        if self.caching:
            self.device: CachingBlockPool | CountedBlockPool = CachingBlockPool(cfg.num_blocks, self.host_tier)
        else:
            self.device = CountedBlockPool(cfg.num_blocks)
        self.host = BlockPool(cfg.swap_blocks)
        self._num_checks = 0

    def blocks_for(self, tokens: int) -> int:
        return blocks_for(tokens, self.block_size)

    def num_blocks_to_allocate(self, req: Request, num_new_tokens: int) -> int:
        """Blocks ``req`` must add to compute ``num_new_tokens`` more tokens (0 when it already can)."""
        return max(blocks_for(req.num_computed_tokens + num_new_tokens, self.block_size) - req.blocks, 0)

    def allocate_slots(self, req: Request, num_new_tokens: int) -> int | None:
        """Room on the device for ``req`` to compute ``num_new_tokens`` more tokens: how many blocks it
        added (0 when it had room), or None (and no change) if blocks are short."""
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size) - req.blocks  # blocks_for(...)
        if need <= 0:
            return 0
        if self.caching:
            ids = self.device.allocate(need)
            if ids is None:
                return None
            _give(req, ids)
        elif self.device.take(need):
            req.blocks += need
        else:
            return None
        return need

    def release(self, req: Request) -> int:
        """Free every device block ``req`` holds (with prefix caching, publishing its full blocks
        first: they stay findable until evicted); returns how many."""
        n = req.blocks
        if self.caching:
            self.publish(req)
            req.num_published_blocks = 0
            ids, req.block_ids = req.block_ids, ()
            self.device.free(ids)
        else:
            self.device.give_back(n)
        req.blocks = 0
        return n

    def computed(self, req: Request, n: int) -> None:
        """``req`` computed ``n`` more tokens: their KV is in its blocks."""
        req.num_computed_tokens += n

    def computed_each(self, reqs: Iterable[Request], n: int = 1) -> None:
        """Each of ``reqs`` computed ``n`` more tokens (a step's one-token decodes, a batch's run of steps)."""
        for req in reqs:
            req.num_computed_tokens += n

    def recompute(self, req: Request) -> None:
        """``req`` is preempted by recompute: its blocks are freed (with prefix caching, found again
        by a later lookup while nobody has evicted them) and it has computed nothing."""
        self.release(req)
        req.num_computed_tokens = 0

    # ---------------------------------------------------------------- prefix caching
    def cached_prefix(self, req: Request) -> np.ndarray:
        """The cached blocks that hold the start of ``req``'s known tokens, longest run from block 0;
        never the block of the last known token, whose logits must be computed."""
        bs = self.block_size
        return self.device.lookup(content_of(req, bs), lookup_blocks(req, bs))

    def host_prefix(self, req: Request, device_hits: int) -> int:
        """Blocks the host tier holds right after ``req``'s first ``device_hits`` (those the device found),
        up to the first it misses and short of the block of the last known token."""
        bs = self.block_size
        limit = lookup_blocks(req, bs)
        if device_hits >= limit:
            return 0
        return self.host_tier.run(iter_block_keys(content_of(req, bs), device_hits, limit))

    def load_from_host(self, req: Request, blocks: int) -> None:
        """``req``, admitted on its cached prefix, loads the next ``blocks`` blocks from the host tier into
        device blocks of its own (the caller checked they fit, :meth:`fits`): their tokens are computed,
        and the tier's copies freed. They are published with the step's prefill, at its end."""
        req.host_loaded_blocks = blocks
        if not blocks:
            return
        bs = self.block_size
        start = req.num_computed_tokens // bs
        # Off the tier first: the device blocks they go to may evict others into it, which must not
        # push these out.
        self.host_tier.take(iter_block_keys(content_of(req, bs), start, start + blocks))
        added = self.allocate_slots(req, blocks * bs)
        assert added is not None, "a request was admitted without room for its blocks from the host"
        req.num_computed_tokens += blocks * bs

    def fits(self, req: Request, hits: Sequence[int], num_new_tokens: int) -> bool:
        """Whether the free blocks cover admitting ``req`` on the cached ``hits`` to compute
        ``num_new_tokens`` more: the new blocks, and the cached free ones among the hits, which
        touching takes off the free queue."""
        new = blocks_for(len(hits) * self.block_size + num_new_tokens, self.block_size) - len(hits)
        free = self.device.num_free
        return new + len(hits) <= free or new + self.device.num_evictable(hits) <= free

    def use_cached(self, req: Request, hits: np.ndarray) -> None:
        """``req`` shares ``hits``: its first ``len(hits)`` blocks are computed already."""
        self.device.touch(hits)
        # Its blocks are an array (the pool frees them without converting), in a buffer of its own
        # with room for all it will hold, so that later blocks are written in, not appended: see _give.
        room = np.empty(max(blocks_for(req.prompt_tokens + req.output_tokens, self.block_size), len(hits)), np.int64)
        room[:len(hits)] = hits
        req.block_ids = room[:len(hits)]
        req.blocks = req.num_published_blocks = len(hits)
        req.num_computed_tokens = len(hits) * self.block_size

    def publish(self, req: Request) -> None:
        """Offer the full blocks of ``req``'s computed tokens not offered yet to the prefix cache
        (simbatch.memory.prefix_cache)."""
        ids = req.block_ids
        stop = min(req.num_computed_tokens // self.block_size, len(ids))
        start = req.num_published_blocks
        if start < stop:
            req.num_published_blocks = stop
            self.device.publish(content_of(req, self.block_size), ids, start, stop)

    def swap_out(self, req: Request) -> bool:
        """Move the blocks of ``req``'s computed tokens to the host; False (and no change) if the host
        pool is short.

        Only computed tokens have KV to save. Blocks reserved for the tokens of the step being planned
        (a prefill chunk, the next decode token) hold nothing yet and are simply freed: moving them
        would make the request need more device blocks to return than its admission check counts.
        """
        host_ids = self.host.allocate(blocks_for(req.num_computed_tokens, self.block_size))
        if host_ids is None:
            return False
        self.release(req)
        req.host_block_ids = host_ids
        return True

    def swap_in(self, req: Request) -> bool:
        """Move ``req``'s host blocks back to the device; False (and no change) if the device is short."""
        n = len(req.host_block_ids)
        if self.caching:
            ids = self.device.allocate(n)
            if ids is None:
                return False
            req.block_ids = ids
        elif not self.device.take(n):
            return False
        self.host.free(req.host_block_ids)
        req.host_block_ids, req.blocks = (), n
        return True

    def allocate_together(self, wants: list[tuple[Request, int]], bulk_blocks: int = 0) -> bool:
        """All or nothing: room for each ``(request, num_new_tokens)``, plus ``bulk_blocks`` taken in
        bulk (:meth:`take_bulk`), when the free blocks cover them all; False (and no change) otherwise."""
        extra = [self.num_blocks_to_allocate(req, n) for req, n in wants]
        device, total = self.device, sum(extra)
        if bulk_blocks + total > device.num_free:
            return False
        device.reserve(bulk_blocks)
        if self.caching:
            ids, at = device.allocate(total), 0
            for (req, _), e in zip(wants, extra, strict=True):
                if e:
                    _give(req, ids[at:at + e])
                    at += e
        else:
            device.take(total)
            for (req, _), e in zip(wants, extra, strict=True):
                req.blocks += e
        return True

    def take_bulk(self, n: int) -> bool:
        """``n`` blocks taken for requests that will be told later which are theirs (:meth:`assign_bulk`):
        a lockstep group's members crossing block boundaries, counted, not listed, step by step. The
        device pool holds them reserved meanwhile (:meth:`CountedBlockPool.reserve`); False (and no change) if too
        few are free."""
        return self.device.reserve(n)

    def assign_bulk(self, req: Request, n: int) -> None:
        """``n`` of the blocks taken in bulk become ``req``'s own."""
        if self.caching:
            _give(req, self.device.claim(n))
        else:
            self.device.claim(n)
            req.blocks += n

    @property
    def num_bulk(self) -> int:
        """Blocks taken in bulk and not yet assigned."""
        return self.device.num_reserved

    def reserve_batch(self, batch: list[Request], blocks: int) -> bool:
        """A request-level batch's memory, reserved whole at its start and shared among its slots as
        evenly as it divides (so every block has one holder); False if the blocks are short."""
        if self.caching:
            ids = self.device.allocate(blocks)
            if ids is None:
                return False
        elif not self.device.take(blocks):
            return False
        share, extra = divmod(blocks, len(batch))
        at = 0
        for i, req in enumerate(batch):
            n = share + (1 if i < extra else 0)
            if self.caching:
                req.block_ids = ids[at:at + n]
            req.blocks, at = n, at + n
        return True

    def release_batch(self, batch: list[Request]) -> int:
        """Free every block a batch's slots hold; returns how many."""
        return sum(self.release(req) for req in batch)

    def check_conservation(self, device_holders: Iterable[Request], host_holders: Iterable[Request]) -> None:
        """AssertionError unless every block is free or held, once: device and host pools alike.

        The blocks taken in bulk are held too (a lockstep member's count includes those taken for it).
        Where blocks are numbered, a request's count (``blocks``) must agree with the blocks it lists;
        identities (no block held twice, none both held and free) cost O(num_blocks), so a pool of more
        than ``FULL_CHECK_BLOCKS`` has them checked at every ``FULL_CHECK_EVERY``-th call.
        """
        device_holders = list(device_holders)  # read twice below
        device, host = self.device, self.host
        held = sum(map(_blocks, device_holders))
        self._num_checks += 1
        every = self._num_checks % FULL_CHECK_EVERY == 1
        if self.caching:
            device_lists = list(map(_block_ids, device_holders))
            assert held == sum(map(len, device_lists)) + device.num_reserved, \
                "block counts disagree with the blocks held"
            # A block may have several holders (its reference count says how many): the distinct ones
            # are counted from their ids.
            refs = _holders_per_block(device.num_blocks, [*device_lists, device.reserved_ids()], "device")
            assert np.count_nonzero(refs) + device.num_free == device.num_blocks, "device blocks not conserved"
            if every or 0 < device.num_blocks <= FULL_CHECK_BLOCKS:  # (an empty pool: the count says all)
                _check_identities(device, refs, "device")
        else:
            assert not any(map(len, map(_block_ids, device_holders))), "a request lists blocks nobody numbers"
            assert held + device.num_free == device.num_blocks, "device blocks not conserved"
        # The host: one holder a block.
        host_lists = list(map(_host_block_ids, host_holders))
        assert sum(map(len, host_lists)) + host.num_free == host.num_blocks, "host blocks not conserved"
        # (A host pool nobody ever swapped to has nothing to check: most runs never swap.)
        if (every or 0 < host.num_blocks <= FULL_CHECK_BLOCKS) and host.ever_used:
            _check_identities(host, _holders_per_block(host.num_blocks, host_lists, "host"), "host")
        if self.host_tier is not None:
            self.host_tier.check()


FULL_CHECK_BLOCKS = 64
FULL_CHECK_EVERY = 64


def content_of(req: Request, block_size: int) -> Content:
    """What ``req``'s blocks hold, as the prefix cache keys them (simbatch.workload.prefix): its own
    stream (a conversation's, or one no other request has: -2 - its id), the blocks of the shared
    system prompt it starts with, and a trace's block ids when it has them."""
    return Content(block_size, req.prefix_stream if req.prefix_stream >= 0 else -2 - req.request_id,
                   req.shared_prefix_tokens // block_size, req.prompt_tokens // block_size, req.block_hashes,
                   req.hash_block_tokens)


def lookup_blocks(req: Request, block_size: int) -> int:
    """The most blocks a lookup may find for ``req``: those of its known tokens but the block of its
    last one, whose logits must be computed (vLLM's rule: at least one token is prefilled)."""
    return (req.prompt_tokens + req.num_generated - 1) // block_size


def _give(req: Request, ids: list[int]) -> None:
    """Add ``ids`` to the blocks ``req`` holds: a list of its own the first time (it held the shared
    ()), or an array when it started from a cached prefix, a view of the buffer
    :meth:`KVCacheManager.use_cached` made for it (its ``base``, the request's own: no other array of
    blocks is a view) while the buffer has room."""
    req.blocks += len(ids)
    held = req.block_ids
    if isinstance(held, list):
        held += ids
    elif not len(held):
        req.block_ids = ids.copy()  # not the caller's list: the request's grows
    else:
        n, room = len(held), held.base
        if room is not None and n + len(ids) <= len(room):
            room[n:n + len(ids)] = ids
            req.block_ids = room[:n + len(ids)]
        else:
            req.block_ids = np.concatenate((held, ids))


def _holders_per_block(num_blocks: int, held: list[Sequence[int]], name: str) -> np.ndarray:
    """How many of the lists ``held`` name each block of a pool of ``num_blocks`` (an array: the lists
    hold hundreds of blocks each, and a set of them would cost more than the step it checks)."""
    ids = np.concatenate([np.asarray(x, np.int64) for x in held if len(x)] or [np.empty(0, np.int64)])
    assert not len(ids) or (ids.min() >= 0 and ids.max() < num_blocks), f"{name} block number out of range"
    return np.bincount(ids, minlength=num_blocks)


def _check_identities(pool: BlockPool, refs: np.ndarray, name: str) -> None:
    """Every block of ``pool`` held (``refs``: by how many) or free, not both, and free at most once."""
    free = pool.free_ids()
    assert len(free) == pool.num_free, f"{name} free count disagrees with the free queue"
    queued = _holders_per_block(pool.num_blocks, [free], f"{name} free")
    assert ((refs > 0) + queued == 1).all(), f"{name} block held twice, or held and free"
    references = getattr(pool, "references", None)
    if references is None:
        assert refs.max(initial=0) <= 1, f"{name} block held twice"
    else:
        assert np.array_equal(refs, references()), f"{name} reference counts disagree"


_block_ids, _host_block_ids, _blocks = attrgetter("block_ids"), attrgetter("host_block_ids"), attrgetter("blocks")
