"""Batching modes: how an engine forms batches, each a registered scheduler.

A mode is a :class:`BatchingMode` in :data:`MODES`: its declarations, and two implementations
attached by name where they live: the model's scheduler (role ``scheduler``, in
:mod:`simbatch.schedulers`) and, optionally, its accelerated twin (role ``twin``, in
:mod:`simbatch.engine.accel`), which must plan the very same steps. A mode without a twin runs on the
reference engine's one-step-at-a-time loop even when ``sim.fast_forward`` is on: slower, never wrong.

- ``continuous``: iteration-level scheduling (Orca, vLLM V1): every step is planned afresh within a
  token budget (:mod:`simbatch.schedulers.continuous`).
- ``static`` and ``dynamic``: request-level batching, a batch held together from its start to its
  longest request's end (:mod:`simbatch.schedulers.request_level`). They differ only in their timer:
  static waits for a full batch (or ``max_wait_ms``), dynamic dispatches after ``max_queue_delay_ms``.

What the rest reads instead of a mode's name:

- ``iteration_level``: steps are planned token by token within ``max_num_batched_tokens``. What works
  per token needs it (prefix caching, speculative decoding, async scheduling, disaggregated pools,
  the serving features of :mod:`simbatch.features`); the scenario's checks refuse them elsewhere,
  prompts beyond an unchunked budget are rejected at arrival, and capacity analysis models the mode
  as a continuous batcher rather than as whole batches.
- ``batch_timer``: for request-level modes, the ``batching`` key (ms) after which a partial batch
  starts once its oldest request has waited that long; null there means it waits for a full batch.
- ``knobs``: the ``batching`` keys only this mode reads, each with what it does: set under another
  mode, ``simbatch run`` says they have no effect.

Why the declarations live here and the classes elsewhere: :mod:`simbatch.config` validates
``batching.mode`` and checks what a mode supports without importing the schedulers, which import
the schema; the classes attach themselves to their names where they are defined.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from simbatch.registry.base import Registry


@dataclass(frozen=True, eq=False)
class BatchingMode:
    """One batching mode: what it declares (its scheduler and twin are attached to its name)."""

    name: str
    description: str
    iteration_level: bool
    """Steps planned afresh, token by token, within a token budget (continuous batching's family)."""
    batch_timer: str | None = None
    """Request-level: the ``batching`` key, ms, after which a partial batch starts (its value null: never)."""
    knobs: Mapping[str, str] = field(default_factory=dict)
    """The ``batching`` keys only this mode reads, with what they do there."""

    def timer_s(self, batching) -> float | None:
        """The batch timer of a ``batching`` section, s: None waits for a full batch (or has no timer)."""
        ms = None if self.batch_timer is None else getattr(batching, self.batch_timer)
        return None if ms is None else ms / 1e3

    def waits_for_full_batch(self, batching) -> bool:
        """A request-level mode whose timer is off: a partial batch waits until it fills, or arrivals end."""
        return not self.iteration_level and self.timer_s(batching) is None


MODES: Registry[BatchingMode] = Registry("batching mode", "batching.mode")

MODES.register(BatchingMode(
    "static", "Request-level: waits for a full batch (or max_wait_ms); the batch runs to its longest request.",
    iteration_level=False, batch_timer="max_wait_ms",
    knobs={"max_wait_ms": "it starts a partial batch"}))
MODES.register(BatchingMode(
    "dynamic", "Request-level: dispatches a full batch, or whatever waits after max_queue_delay_ms.",
    iteration_level=False, batch_timer="max_queue_delay_ms",
    knobs={"max_queue_delay_ms": "it dispatches a partial batch"}))
MODES.register(BatchingMode(
    "continuous", "Iteration-level scheduling (vLLM V1): every step planned afresh within a token budget.",
    iteration_level=True,
    knobs={"long_prefill_token_threshold": "it caps a prefill chunk"}))
