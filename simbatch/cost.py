"""The step-time model: how long one engine step takes. Pure functions, no simulation.

A decode step is memory-bound: the weights stream through the GPU once per step whatever the batch,
so one step over ``B`` decoding sequences and ``P`` prefill tokens takes

    tau(B, P) = tau0 + beta * B + gamma * P

``tau0`` is the fixed cost of streaming the weights, ``beta`` the small marginal cost of one more
sequence, ``gamma`` the cost of a prompt token. Decode throughput ``B / tau(B)`` rises steeply at
first, as ``tau0`` is shared by more sequences, then flattens toward the roofline ``1 / beta``.

All times here are in seconds unless a name says ``_ms``; the scenario speaks milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simbatch.config import Device

if TYPE_CHECKING:
    from simbatch.schedulers.base import StepPlan


@dataclass(frozen=True, slots=True)
class LinearCost:
    """The cost model: a step's duration from what it computes, tau0 + beta B + gamma P, plus the
    time its swaps take. The one place the formula is written; the engine and every analysis call it.

    A richer model (one whose step time grows with the context each request reads) would implement
    ``plan_ms`` too; the engine asks nothing else of a cost model.
    """

    tau0_ms: float
    beta_ms: float
    gamma_ms: float  # per prefill token
    swap_ms_per_block: float = 0.0

    @classmethod
    def of(cls, device: Device, swap_ms_per_block: float = 0.0) -> LinearCost:
        return cls(device.tau0_ms, device.beta_ms, device.prefill_ms_per_token, swap_ms_per_block)

    def step_ms(self, decode_seqs: int | float, prefill_tokens: int | float = 0, swap_blocks: int = 0) -> float:
        """Duration of one step, ms. Padded sequences and tokens are passed in and cost like real ones."""
        return self.tau0_ms + self.beta_ms * decode_seqs + self.gamma_ms * prefill_tokens + \
            self.swap_ms_per_block * swap_blocks

    def plan_ms(self, plan: StepPlan) -> float:
        """Duration of a planned step, ms: its decodes and prefill tokens, padding included, and swaps."""
        return self.step_ms(plan.decode_seqs + plan.padded_decode_seqs,
                            plan.prefill_tokens + plan.padded_prefill_tokens, plan.swap_blocks)


def step_time_s(device: Device, decode_seqs: int | float, prefill_tokens: int | float = 0) -> float:
    """Duration of one engine step, s. Padded sequences and tokens are passed in and cost like real ones."""
    return LinearCost.of(device).step_ms(decode_seqs, prefill_tokens) / 1e3


def decode_throughput(device: Device, batch_size: int | float) -> float:
    """Tokens/s of a saturated decode batch of ``batch_size`` sequences: B / tau(B)."""
    return batch_size / step_time_s(device, batch_size)


def roofline_tokens_per_s(device: Device) -> float:
    """The limit of B / tau(B) as B grows: 1 / beta (infinite when beta is 0)."""
    return math.inf if device.beta_ms == 0 else 1 / device.beta_s


def batch_for_fraction(device: Device, fraction: float) -> float:
    """Batch size at which B / tau(B) reaches ``fraction`` of the roofline: B = f tau0 / (beta (1 - f))."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    if device.beta_ms == 0:
        return math.inf
    return fraction * device.tau0_ms / (device.beta_ms * (1 - fraction))
