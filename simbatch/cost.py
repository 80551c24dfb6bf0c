"""The cost model and the capacity maths built on it: pure functions, no simulation.

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
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    return math.inf if device.beta_ms == 0 else 1e3 / device.beta_ms


def batch_for_fraction(device: Device, fraction: float) -> float:
    """Batch size at which B / tau(B) reaches ``fraction`` of the roofline: B = f tau0 / (beta (1 - f))."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    if device.beta_ms == 0:
        return math.inf
    return fraction * device.tau0_ms / (device.beta_ms * (1 - fraction))


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


def peak_kv_tokens(prompt_tokens: int, output_tokens: int) -> int:
    """Tokens a request holds in the KV cache at its largest.

    The last generated token is emitted and never fed back, so it is never cached:
    prompt + output - 1 tokens (at least the prompt). Takes ints or NumPy arrays alike.
    """
    return prompt_tokens + (output_tokens > 0) * (output_tokens - 1)


@dataclass(frozen=True)
class Stability:
    """The stability check: offered work against what the device can deliver at full batch."""

    arrival_rate: float  # requests/s
    mean_output_tokens: float
    mean_prompt_tokens: float
    batch_size: int  # B_max, the running slots
    offered_tokens_per_s: float  # lambda * E[output]
    capacity_tokens_per_s: float  # B_max / tau(B_max), decode only
    utilization: float  # rho: device-seconds demanded per second, decode and prefill
    capacity_requests_per_s: float  # the arrival rate at which rho = 1
    unloaded_latency_s: float  # W at no queueing: prefill + output tokens at the full-batch step time
    demanded_concurrency: float  # Little's law L = lambda * W at the unloaded latency
    replicas: int = 1

    @property
    def stable(self) -> bool:
        return self.utilization < 1.0

    @property
    def verdict(self) -> str:
        if self.stable:
            return f"stable (utilization {self.utilization:.0%})"
        # Two decimals near 1, so that 1.02x does not read as a harmless "1.0x".
        factor = f"{self.utilization:.1f}" if self.utilization >= 1.1 else f"{self.utilization:.2f}"
        return (f"oversubscribed {factor}×: the waiting queue grows without bound; "
                "add replicas, make tokens cheaper, or shed load")


def stability(device: Device, batch_size: int, arrival_rate: float, mean_output_tokens: float,
              mean_prompt_tokens: float = 0.0, replicas: int = 1) -> Stability:
    """Offered load against capacity for ``replicas`` engines of ``batch_size`` slots.

    Each output token occupies one slot of a full-batch step, tau(B)/B device-seconds; each prompt
    token costs gamma on top. Utilization rho = lambda (E[out] tau(B)/B + gamma E[prompt]) / replicas.
    With gamma = 0 this is the chapter's token-rate inequality lambda E[out] < B / tau(B).
    """
    tau_full = step_time_s(device, batch_size)
    per_request_s = mean_output_tokens * tau_full / batch_size + device.prefill_ms_per_token * mean_prompt_tokens / 1e3
    rho = arrival_rate * per_request_s / replicas
    unloaded = step_time_s(device, batch_size, 0) * mean_output_tokens + \
        device.prefill_ms_per_token * mean_prompt_tokens / 1e3
    return Stability(
        arrival_rate=arrival_rate,
        mean_output_tokens=mean_output_tokens,
        mean_prompt_tokens=mean_prompt_tokens,
        batch_size=batch_size,
        offered_tokens_per_s=arrival_rate * mean_output_tokens,
        capacity_tokens_per_s=replicas * decode_throughput(device, batch_size),
        utilization=rho,
        capacity_requests_per_s=math.inf if per_request_s == 0 else replicas / per_request_s,
        unloaded_latency_s=unloaded,
        demanded_concurrency=arrival_rate * unloaded,
        replicas=replicas,
    )


def fleet_stability(replicas: Sequence[tuple[Device, int]], arrival_rate: float, mean_output_tokens: float,
                    mean_prompt_tokens: float = 0.0) -> Stability:
    """:func:`stability` for a fleet, one ``(device, batch_size)`` per replica, alike or not.

    Capacities add: the fleet serves the sum of its replicas' requests/s, and its utilization is
    lambda over that sum. That is every replica's utilization when the router splits traffic in
    proportion to capacity, the best split there is: at rho >= 1 no router keeps up. For a mixed
    fleet ``batch_size`` is the mean of the replicas' slots, and the unloaded latency the mean of
    theirs weighted by that traffic share. Alike replicas give exactly ``stability(..., replicas=N)``.
    """
    device, batch_size = replicas[0]
    if all(d == device and b == batch_size for d, b in replicas):
        return stability(device, batch_size, arrival_rate, mean_output_tokens, mean_prompt_tokens,
                         replicas=len(replicas))
    each = [stability(d, b, arrival_rate, mean_output_tokens, mean_prompt_tokens) for d, b in replicas]
    capacity = sum(s.capacity_requests_per_s for s in each)
    share = [1 / len(each) if math.isinf(capacity) else s.capacity_requests_per_s / capacity for s in each]
    unloaded = sum(w * s.unloaded_latency_s for w, s in zip(share, each, strict=True))
    return replace(
        each[0],
        batch_size=sum(b for _, b in replicas) / len(replicas),
        capacity_tokens_per_s=sum(s.capacity_tokens_per_s for s in each),
        utilization=arrival_rate / capacity,
        capacity_requests_per_s=capacity,
        unloaded_latency_s=unloaded,
        demanded_concurrency=arrival_rate * unloaded,
        replicas=len(replicas),
    )
