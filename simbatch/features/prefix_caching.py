"""Automatic prefix caching (``kv_cache.enable_prefix_caching``, vLLM's ``--enable-prefix-caching``).

A KV block holds the keys and values of ``block_size`` tokens, which depend on those tokens and on
every token before them. So two requests whose prompts start alike (a system prompt, the earlier
turns of a conversation) would compute the same blocks; with prefix caching the second finds the
first's and computes only the rest. vLLM V1 keys each full block by a hash chained over its tokens
and its predecessor's hash, keeps freed blocks findable until they are reused (least recently used
first), and shares a block among every request that holds it, by reference count.

The memory side, the keys, the lookup, the sharing and the eviction order, is the KV cache's
(:mod:`simbatch.memory.prefix_cache`, reached through :class:`~simbatch.memory.kv.KVCacheManager`).
This module is the scheduler's side, the three points where vLLM's ``schedule()`` consults the cache:

- admission (rule 3): a request with nothing computed looks up its prefix (``lookup``: vLLM's
  ``get_computed_blocks``; with a host KV tier, ``kv_cache.host_blocks``, the lookup runs on into
  host memory past the device's blocks, and what it finds there is loaded into blocks of its own:
  :mod:`simbatch.memory.host_tier`, whose time is :mod:`simbatch.features.host_tier`'s), is sized by the budget for the tokens it does not have, and is admitted
  if the free blocks cover the new ones and the cached ones it takes off the free queue
  (``take_cached``: vLLM's ``allocate_slots`` with the computed blocks). A request preempted by
  recompute looks up again: its blocks may still be cached;
- the end of a step: each prefill chunk's full blocks become findable at once
  (``prefill_computed``), so the next request of a conversation finds them even while this one runs;
- release: a finished or preempted request's full blocks stay findable until evicted (the KV
  manager's ``release``, which publishes them first).

``num_cached_tokens``, the prompt tokens a request found cached at its first admission (vLLM's
``num_cached_tokens``), is what the summary's hit rate counts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simbatch.features import Feature, register
from simbatch.memory.blocks import blocks_for

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from simbatch.config import Scenario
    from simbatch.model.request import Request


@register
class PrefixCaching(Feature):
    """``kv_cache.enable_prefix_caching``: a prompt starts from the cached blocks of its prefix (module docstring)."""

    name = "prefix_caching"
    description = "A request starts from the cached KV blocks of its longest cached prefix and computes the rest."
    switch = "kv_cache.enable_prefix_caching"
    # Hits happen at admission, which a run of steps never crosses: its steps repeat as without it (a run
    # ends before an eviction that could change what a waiting request finds: the KV pool says when).
    repeatable = True

    def __init__(self, scenario: Scenario):
        super().__init__(scenario)
        # What the last lookup found, for take_cached: the device's cached blocks, and the blocks the
        # host tier holds right after them (simbatch.memory.host_tier; 0 without a tier).
        self._hits: np.ndarray | tuple = ()
        self._host = 0

    @staticmethod
    def enabled(scenario: Scenario) -> bool:
        return scenario.kv_cache.enable_prefix_caching

    def lookup(self, req: Request) -> int:
        """The cached blocks at the start of its known tokens (never the block of its last one): on the
        device, then, with a host KV tier, in host memory, up to the first block neither holds."""
        kv = self.kv
        self._hits = hits = kv.cached_prefix(req)
        self._host = host = kv.host_prefix(req, len(hits)) if kv.host_tier is not None else 0
        return (len(hits) + host) * kv.block_size

    def take_cached(self, req: Request, num_new_tokens: int) -> bool:
        """Room for the new blocks, those the host's blocks are loaded into, and the cached free ones
        among the device's hits: then it shares the hits, loads the host's, and at its first admission
        counts both as its cached tokens (the host's apart too, vLLM's external hits)."""
        kv, hits, bs = self.kv, self._hits, self.kv.block_size
        found, load = len(hits), self._host * bs
        if not (kv.fits(req, hits, load + num_new_tokens) if found else
                blocks_for(req.num_computed_tokens + load + num_new_tokens, bs) <= kv.device.num_free):
            return False
        if found:
            kv.use_cached(req, hits)
        if kv.host_tier is not None:
            kv.load_from_host(req, self._host)
        if req.num_preemptions == 0:
            req.num_cached_tokens = found * bs + load
            req.num_host_cached_tokens = load
        return True

    def prefill_computed(self, req: Request) -> None:
        """Its full blocks are findable from now on."""
        self.kv.publish(req)

    @staticmethod
    def summary(requests: pd.DataFrame) -> dict[str, float]:
        """vLLM's ``prefix_cache_queries`` and ``prefix_cache_hits`` (prompt tokens looked up and found,
        over the requests admitted) and their ratio, ``prefix_cache_hit_rate``."""
        admitted = requests["first_scheduled_s"].notna().to_numpy()
        queries = int(requests["prompt_tokens"].to_numpy()[admitted].sum())
        hits = int(requests["num_cached_tokens"].to_numpy()[admitted].sum())
        return {"prefix_cache_queries": queries, "prefix_cache_hits": hits,
                "prefix_cache_hit_rate": hits / queries if queries else math.nan}
