"""The host KV tier's time: blocks found in host memory cost their transfer over the host link.

The mechanism (what is kept, what is found) is the KV manager's and the tier's
(:mod:`simbatch.memory.host_tier`): at admission a request's lookup runs on into the host tier past the
device's cached blocks, and the blocks found there are loaded into device blocks of its own instead of
being computed. This feature says what that costs. A block is ``block_size x kv_bytes_per_token`` bytes
and crosses the link at ``host_link_gb_s``, so the step that admits requests with ``L`` blocks from the
host moves ``L x block bytes``:

- ``host_load_overlap: true`` (default): the load runs under the step's compute, layer by layer (LMCache's
  layerwise pipeline, vLLM's offloading connector loading asynchronously), and the step lasts
  ``max(compute, load)``: it adds ``max(0, load - compute)``;
- ``false``: the load precedes the forward pass and adds its whole time.

Storing evicted blocks to the host costs no step time: both systems write the device's blocks back
asynchronously, off the critical path. A hit therefore trades a prefill of ``bs`` tokens (``gamma bs`` ms
and its attention) for a transfer of one block; the tier pays when the link moves a block faster than
the GPU computes it, and when what the device evicts comes back (long multi-turn conversations), not
when nothing is ever asked again (docs/concepts.md, "A host KV tier").

Loads happen only at admissions, and a step that admits never repeats (the lockstep twin's runs are of
decodes alone), so the feature leaves the twin's runs alone: ``repeatable``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from simbatch.config import Scenario
from simbatch.features import Feature, register
from simbatch.features import speculative as _registered_before  # noqa: F401  (registration order is fixed)
from simbatch.model.cost import LinearCost

if TYPE_CHECKING:
    import pandas as pd

    from simbatch.model.request import Request
    from simbatch.model.step import StepPlan

NS_PER_MS = 1e6


def load_ms_per_block(scenario: Scenario) -> float:
    """Time to move one block over the host link, ms: block_size x KV bytes per token / bandwidth (both
    given, or taken from the preset by resolution: :func:`simbatch.inputs.resolve.resolve`)."""
    cache = scenario.kv_cache
    return cache.block_size * cache.kv_bytes_per_token / (cache.host_link_gb_s * 1e9) * 1e3


@register
class HostKVTier(Feature):
    """``kv_cache.host_blocks``: what the prefix cache evicts is kept on the host and loaded back (module docstring)."""

    name = "host_kv_tier"
    description = "What the prefix cache evicts is kept in host memory and loaded back over the host link."
    switch = "kv_cache.host_blocks"
    columns = (("num_host_cached_tokens", "int64"),)

    def __init__(self, scenario: Scenario):
        super().__init__(scenario)
        self.ms_per_block = load_ms_per_block(scenario)
        self.overlap = scenario.kv_cache.host_load_overlap
        self.cost = LinearCost.of(scenario.device, scenario.kv_cache.swap_ms_per_block)
        self._blocks = 0  # blocks loaded by the admissions of the step being planned
        self._plan: StepPlan | None = None  # the plan last costed, and what the tier added to it
        self._ms = 0.0

    @staticmethod
    def enabled(scenario: Scenario) -> bool:
        return scenario.kv_cache.enable_prefix_caching and scenario.kv_cache.host_blocks > 0

    def admitted(self, req: Request) -> None:
        """The blocks it loaded from the host (prefix caching's take_cached), counted once."""
        self._blocks += req.host_loaded_blocks
        req.host_loaded_blocks = 0

    def step_ms(self, plan: StepPlan) -> float:
        """The step's loads from the host: their time beyond the compute (overlapped) or all of it. Asked
        again for the same plan (a disaggregated pool times its first tokens too), the same answer."""
        if plan is not self._plan:
            load_ms = self._blocks * self.ms_per_block
            self._blocks = 0
            if load_ms and self.overlap:
                load_ms = max(0.0, load_ms - self.cost.plan_ns(plan) / NS_PER_MS)
            self._plan, self._ms = plan, load_ms
        return self._ms

    @staticmethod
    def summary(requests: pd.DataFrame) -> dict[str, float]:
        """vLLM's external prefix cache keys (a KV connector's hits, here the host tier's), in tokens, over
        the admitted requests' prompts: ``external_prefix_cache_hits`` and its rate. The device's and the
        host's hits together are ``prefix_cache_hits``."""
        admitted = requests["first_scheduled_s"].notna().to_numpy()
        queries = int(requests["prompt_tokens"].to_numpy()[admitted].sum())
        hits = int(requests["num_host_cached_tokens"].to_numpy()[admitted].sum())
        return {"external_prefix_cache_queries": queries, "external_prefix_cache_hits": hits,
                "external_prefix_cache_hit_rate": hits / queries if queries else math.nan}
