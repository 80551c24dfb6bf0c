"""Blocks: the arithmetic of paged KV memory, and the pools that hand blocks out.

Where a block's identity is seen (prefix caching shares blocks by number; swapped blocks live on the
host), a block is a number in ``0 .. num_blocks - 1`` and :class:`BlockPool` hands free ones out in
vLLM's order: the never-used ones by number, then freed ones in the order they were freed (a block
that may still be found by the prefix cache is reused as late as possible). Where it is seen nowhere
(a device without prefix caching), :class:`CountedBlockPool` counts them. A pool knows blocks, not
requests: who holds which is the KV manager's (:mod:`simbatch.memory.kv`).
"""

from __future__ import annotations

from collections.abc import Sequence


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
    """Blocks ``0 .. num_blocks - 1`` and the queue of free ones.

    Never-used blocks are not listed (a pool of millions costs nothing until used): they are the
    numbers from ``_next_unused`` up, handed out first and in order; freed blocks join the end of
    ``_freed``, which is handed out from ``_head`` on.
    """

    __slots__ = ("num_blocks", "num_free", "_next_unused", "_freed", "_head")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self._next_unused = 0
        self._freed: list[int] = []
        self._head = 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def ever_used(self) -> bool:
        """Whether a block was ever handed out (until then every block is free, in order, and held by nobody)."""
        return self._next_unused > 0

    def allocate(self, n: int) -> list[int] | None:
        """``n`` free blocks, or None (and no change) if fewer are free."""
        if n > self.num_free:
            return None
        self.num_free -= n
        first, freed, head = self._next_unused, self._freed, self._head
        if first < self.num_blocks:  # some never used: those first
            unused = min(n, self.num_blocks - first)
            self._next_unused = first + unused
            if unused == n:
                return list(range(first, first + unused))
            end = head + n - unused
            ids = [*range(first, first + unused), *freed[head:end]]
        else:
            end = head + n
            ids = freed[head:end]
        if 2 * end >= len(freed):  # drop the handed-out prefix once it is half the list
            del freed[:end]
            end = 0
        self._head = end
        return ids

    def free(self, ids: Sequence[int]) -> None:
        self._freed.extend(ids)
        self.num_free += len(ids)
        assert self.num_free <= self.num_blocks, "freed more blocks than were allocated"

    def free_ids(self) -> list[int]:
        """Every block in the free queue (for checks: O(num_blocks))."""
        return [*range(self._next_unused, self.num_blocks), *self._freed[self._head:]]


class CountedBlockPool:
    """Blocks whose numbers nobody sees: a device pool without prefix caching.

    Paging leaves no external fragmentation, so which blocks a request holds changes nothing: only how
    many are free does. This pool counts them, and a request's count of blocks is all it holds. Blocks
    *reserved* are taken for holders not named yet (a lockstep group's members crossing block
    boundaries, :mod:`simbatch.engine.accel.lockstep`) and counted apart until claimed.
    """

    __slots__ = ("num_blocks", "num_free", "num_reserved")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.num_reserved = 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def take(self, n: int) -> bool:
        """``n`` free blocks taken; False (and no change) if fewer are free."""
        if n > self.num_free:
            return False
        self.num_free -= n
        return True

    def give_back(self, n: int) -> None:
        self.num_free += n
        assert self.num_free <= self.num_blocks, "freed more blocks than were taken"

    def reserve(self, n: int) -> bool:
        """``n`` free blocks taken for holders named later (:meth:`claim`); False (and no change) if fewer are free."""
        if n > self.num_free:  # (take, written out: a lockstep group reserves its blocks every plan)
            return False
        self.num_free -= n
        self.num_reserved += n
        return True

    def claim(self, n: int) -> None:
        """``n`` of the reserved blocks go to a holder (who counts them from now on)."""
        self.num_reserved -= n
        assert self.num_reserved >= 0, "claimed more blocks than were reserved"
