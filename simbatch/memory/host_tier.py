"""The host KV tier: blocks the device's prefix cache evicts, kept in host memory, least recently used first out.

As vLLM's KV offloading (``--kv-offloading-size``, the CPU backend of its offloading connector) and
LMCache's local CPU backend. When an allocation on the device takes a cached free block, the block's
content would be lost; with a host tier its KV is copied to host memory first, under its content key
(:func:`simbatch.memory.prefix_cache.block_key`). A later lookup that runs past the device's cached
blocks goes on in the host tier: the blocks found there are loaded back over the host link into
device blocks the request takes, instead of being computed again; a block in neither tier is computed.

The tier is a victim cache: a block is in it because the device evicted it, and leaves it when it is
loaded back (so one content is in one tier, and the two tiers together are one LRU stack of
``num_blocks + host_blocks`` blocks: a block whose stack distance is at most the device's capacity is
found on the device, one within both capacities in the host tier; tests/validation/test_two_tier_lru.py).
When full, the tier drops its least recently stored block. A block computed again on the device while
its copy is still on the host (a lookup stopped short of it) leaves the copy in place: the copy ages out.

A tier knows keys, not blocks of memory: its ``num_blocks`` slots are the host memory, its ``num_used``
the keys it holds, and conservation is ``num_used + num_free == num_blocks`` (checked with the device's).
"""

from __future__ import annotations

from collections.abc import Iterable


class HostTier:
    """``num_blocks`` slots of host memory holding evicted blocks' content keys, in LRU order."""

    __slots__ = ("num_blocks", "_keys", "num_stored", "num_refreshed", "num_dropped", "num_loaded")

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._keys: dict[int, None] = {}  # insertion order is recency: the first key is the least recent
        self.num_stored = 0  # blocks copied in (device evictions)
        self.num_refreshed = 0  # ... of which the tier held already (computed again on the device meanwhile)
        self.num_dropped = 0  # blocks dropped to make room (their content is gone)
        self.num_loaded = 0  # blocks loaded back to the device

    @property
    def num_used(self) -> int:
        return len(self._keys)

    @property
    def num_free(self) -> int:
        return self.num_blocks - len(self._keys)

    def store(self, keys: Iterable[int]) -> None:
        """Copy in the blocks the device evicts, in eviction order (the last is the most recent); a key
        held already becomes the most recent; the least recent go when the tier is full."""
        held = self._keys
        for key in keys:
            if key in held:
                del held[key]
                self.num_refreshed += 1
            elif len(held) >= self.num_blocks:
                del held[next(iter(held))]
                self.num_dropped += 1
            held[key] = None
            self.num_stored += 1

    def run(self, keys: Iterable[int]) -> int:
        """How many of ``keys``, from the first, the tier holds before its first miss."""
        held, n = self._keys, 0
        for key in keys:
            if key not in held:
                break
            n += 1
        return n

    def take(self, keys: Iterable[int]) -> None:
        """The blocks of ``keys`` are loaded back to the device: their slots are free again."""
        held = self._keys
        for key in keys:
            del held[key]
            self.num_loaded += 1

    def check(self) -> None:
        """AssertionError unless every block that came in is still held, was dropped or was loaded back,
        and the tier holds no more than its slots."""
        assert self.num_used <= self.num_blocks, "host tier holds more blocks than it has"
        assert self.num_stored == self.num_used + self.num_refreshed + self.num_dropped + self.num_loaded, \
            "host tier blocks not conserved"

    def __contains__(self, key: int) -> bool:
        return key in self._keys
