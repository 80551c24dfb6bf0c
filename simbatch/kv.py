"""The paged KV cache: fixed-size blocks on the device and, for swap preemption, on the host.

Blocks are interchangeable (paging leaves no external fragmentation), so the pool only counts them;
each request records how many it holds. :class:`KVCacheManager` is the only writer of both pools and
of every request's block counts: schedulers ask it to grow, release, swap or reserve, and allocation
answers True/False, never raising: running out of memory is a scheduling decision (preempt, or
wait), not an error. (A lockstep scheduler's decoding requests hold their blocks through it too, in
bulk; their counts are derived from their position, see :mod:`simbatch.schedulers.lockstep`.)

Invariant, checked by :meth:`KVCacheManager.check_conservation` at every step of the tests:
``device.num_free + sum(held by requests) == num_blocks`` and likewise for the swap pool.
"""

from __future__ import annotations

from simbatch.config import KVCache
from simbatch.request import Request


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


def peak_kv_tokens(prompt_tokens: int, output_tokens: int) -> int:
    """Tokens a request holds in the KV cache at its largest.

    The last generated token is emitted and never fed back, so it is never cached:
    prompt + output - 1 tokens (at least the prompt). Takes ints or NumPy arrays alike.
    """
    return prompt_tokens + (output_tokens > 0) * (output_tokens - 1)


class BlockPool:
    """A counter of free blocks out of ``num_blocks``."""

    __slots__ = ("num_blocks", "num_free")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_free = num_blocks

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def allocate(self, n: int) -> bool:
        if n > self.num_free:
            return False
        self.num_free -= n
        return True

    def free(self, n: int) -> None:
        self.num_free += n
        assert self.num_free <= self.num_blocks, "freed more blocks than were allocated"


class KVCacheManager:
    """Device and host pools plus the per-request bookkeeping of who holds what."""

    __slots__ = ("block_size", "device", "host")

    def __init__(self, cfg: KVCache):
        self.block_size = cfg.block_size
        self.device = BlockPool(cfg.num_blocks)
        self.host = BlockPool(cfg.swap_blocks)

    def blocks_for(self, tokens: int) -> int:
        return blocks_for(tokens, self.block_size)

    def extra_blocks(self, req: Request, tokens: int) -> int:
        """Blocks ``req`` must add to hold ``tokens`` tokens (0 when it already can)."""
        return max(blocks_for(tokens, self.block_size) - req.blocks, 0)

    def grow(self, req: Request, tokens: int) -> bool:
        """Make ``req`` hold ``tokens`` tokens on the device; False (and no change) if blocks are short."""
        need = blocks_for(tokens, self.block_size) - req.blocks
        if need <= 0:
            return True
        if not self.device.allocate(need):
            return False
        req.blocks += need
        return True

    def release(self, req: Request) -> int:
        """Free every device block ``req`` holds; returns how many."""
        n, req.blocks = req.blocks, 0
        self.device.free(n)
        return n

    def swap_out(self, req: Request) -> bool:
        """Move the blocks of ``req``'s computed tokens to the host; False (and no change) if the host
        pool is short.

        Only computed tokens have KV to save. Blocks reserved for the tokens of the step being planned
        (a prefill chunk, the next decode token) hold nothing yet and are simply freed: moving them
        would make the request need more device blocks to return than its admission check counts.
        """
        keep = blocks_for(req.num_computed_tokens, self.block_size)
        if not self.host.allocate(keep):
            return False
        self.device.free(req.blocks)
        req.swapped_blocks, req.blocks = keep, 0
        return True

    def grow_together(self, wants: list[tuple[Request, int]], group_blocks: int = 0) -> bool:
        """All or nothing: each ``(request, tokens)`` grown to hold its tokens, plus ``group_blocks`` for
        a lockstep group, when the free blocks cover them all; False (and no change) otherwise."""
        extra = [max(blocks_for(tokens, self.block_size) - req.blocks, 0) for req, tokens in wants]
        if not self.device.allocate(group_blocks + sum(extra)):
            return False
        for (req, _), e in zip(wants, extra, strict=True):
            if e:
                req.blocks += e
        return True

    def allocate_group(self, n: int) -> bool:
        """``n`` blocks for a lockstep group's members (which the group attributes to them itself)."""
        return self.device.allocate(n)

    def reserve_batch(self, batch: list[Request], blocks: int) -> bool:
        """A request-level batch's memory, reserved whole at its start and attributed to its slots as
        evenly as it divides (so conservation holds per request); False if the blocks are short."""
        if not self.device.allocate(blocks):
            return False
        share, extra = divmod(blocks, len(batch))
        for i, req in enumerate(batch):
            req.blocks = share + (1 if i < extra else 0)
        return True

    def release_batch(self, batch: list[Request]) -> int:
        """Free every block a batch's slots hold; returns how many."""
        return sum(self.release(req) for req in batch)

    def check_conservation(self, device_holders, host_holders) -> None:
        """AssertionError unless every block is free or held: device and host pools alike."""
        held = sum(r.blocks for r in device_holders)
        assert self.device.num_free + held == self.device.num_blocks, "device blocks not conserved"
        swapped = sum(r.swapped_blocks for r in host_holders)
        assert self.host.num_free + swapped == self.host.num_blocks, "host blocks not conserved"

    def swap_in(self, req: Request) -> bool:
        """Move ``req``'s host blocks back to the device; False (and no change) if the device is short."""
        if not self.device.allocate(req.swapped_blocks):
            return False
        self.host.free(req.swapped_blocks)
        req.blocks, req.swapped_blocks = req.swapped_blocks, 0
        return True
