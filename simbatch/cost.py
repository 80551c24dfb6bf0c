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

import numpy as np

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


def mean_blocks_held(prompt_tokens: np.ndarray, output_tokens: np.ndarray, block_size: int) -> float:
    """KV blocks held by a running request, on average over the running set, counting growth.

    While request ``i`` emits its ``O`` tokens it holds ``P``, then ``P + 1``, ... ``P + O - 1`` tokens
    (see :func:`peak_kv_tokens`), one step each: ``S_i = sum_{k=P}^{P+O-1} ceil(k / bs)`` block-steps.
    A request stays in the batch for ``O`` steps, so a snapshot of the batch holds requests in
    proportion to their output length, and the mean blocks held per running request is
    ``sum_i S_i / sum_i O_i``, not the mean of the peaks (too high) nor of the prompts (too low).
    ``S_i`` has a closed form, ``F(P+O-1) - F(P-1)`` with ``F(n) = sum_{k=1}^n ceil(k/bs)
    = bs q (q+1)/2 + r (q+1)`` for ``n = q bs + r``.
    """
    def f(n: np.ndarray) -> np.ndarray:
        q, r = np.divmod(n.astype(np.float64), block_size)
        return block_size * q * (q + 1) / 2 + r * (q + 1)

    prompt, output = np.asarray(prompt_tokens), np.asarray(output_tokens)
    total_steps = output.sum(dtype=np.float64)
    if total_steps == 0:
        return 0.0
    return float((f(prompt + output - 1) - f(prompt - 1)).sum() / total_steps)


def memory_batch(num_blocks: int, blocks_held: float) -> float:
    """The running requests the KV cache holds at once: num_blocks / mean blocks held per request."""
    return math.inf if blocks_held == 0 else num_blocks / blocks_held


@dataclass(frozen=True)
class Stability:
    """The stability check: offered work against what the device can deliver at full batch.

    The full batch is the smaller of the slots (``max_num_seqs``) and the batch the KV memory holds
    (:func:`memory_batch`); ``limited_by`` says which binds. With admission control (a waiting cap),
    an overloaded server does not queue without bound: it turns away the excess, about ``1 - 1/rho``
    of arrivals (only ``capacity`` of every ``lambda`` requests/s can be served).
    """

    arrival_rate: float  # requests/s
    mean_output_tokens: float
    mean_prompt_tokens: float
    batch_size: float  # B, the full batch: min(slots, memory batch) (a mixed fleet: the replicas' mean)
    offered_tokens_per_s: float  # lambda * E[output]
    capacity_tokens_per_s: float  # B / tau(B), decode only
    offered_load: float  # rho: device-seconds demanded per device-second, decode and prefill
    capacity_requests_per_s: float  # the arrival rate at which rho = 1
    # W_B, the latency with every slot busy and no queue: prefill plus output tokens at the full-batch
    # step time. Not the latency of an idle server (output tokens at tau(1), far shorter).
    full_batch_latency_s: float
    demanded_concurrency: float  # Little's law L = lambda * W_B
    replicas: int = 1
    slots: float = 0  # max_num_seqs (a mixed fleet: the replicas' mean)
    memory_batch: float = math.inf  # num_blocks / mean blocks held per running request
    admission_control: bool = False  # max_waiting or max_in_flight: the excess is rejected, not queued

    @property
    def stable(self) -> bool:
        return self.offered_load < 1.0

    @property
    def limited_by(self) -> str:
        """Which limit sets the full batch: "slots" (max_num_seqs) or "memory" (the KV cache)."""
        return "memory" if self.memory_batch < self.slots else "slots"

    @property
    def shed_fraction(self) -> float:
        """The share of arrivals an overloaded server with admission control rejects: 1 - 1/rho."""
        return max(0.0, 1.0 - 1.0 / self.offered_load) if self.offered_load > 0 else 0.0

    @property
    def replicas_needed(self) -> float:
        """The fewest replicas like these that carry the traffic (rho < 1): floor(rho x replicas) + 1
        (infinite for rate: inf, everything at once, which no fleet carries as a steady stream)."""
        load = self.offered_load * self.replicas
        return math.inf if not math.isfinite(load) else math.floor(load) + 1

    @property
    def verdict(self) -> str:
        limit = " (KV memory limits the batch)" if self.limited_by == "memory" else ""
        if self.stable:
            return f"stable (offered load {self.offered_load:.0%}){limit}"
        rho = self.offered_load
        # Two decimals near 1, so that 1.02x does not read as a harmless "1.0x"; three figures far above.
        factor = f"{rho:.2f}" if rho < 1.1 else f"{rho:.1f}" if rho < 1000 else f"{rho:.3g}"
        need = self.replicas_needed
        fix = (f"{need:,} replicas would carry it" if need <= 100_000 else
               "more replicas finish it sooner" if math.isinf(need) else "no fleet of a sane size carries it")
        if self.admission_control:
            return (f"overloaded {factor}×{limit}: shedding about {self.shed_fraction:.0%} of requests (429s); "
                    f"{fix}, or make tokens cheaper")
        return (f"oversubscribed {factor}×{limit}: the waiting queue grows without bound; "
                f"{fix}, or make tokens cheaper, or shed load")


def stability(device: Device, batch_size: int, arrival_rate: float, mean_output_tokens: float,
              mean_prompt_tokens: float = 0.0, replicas: int = 1, memory_batch: float = math.inf,
              admission_control: bool = False) -> Stability:
    """Offered load against capacity for ``replicas`` engines of ``batch_size`` slots.

    The full batch is ``B = min(batch_size, memory_batch)`` (see :func:`memory_batch`). Each output
    token occupies one slot of a full-batch step, tau(B)/B device-seconds; each prompt token costs
    gamma on top. Offered load rho = lambda (E[out] tau(B)/B + gamma E[prompt]) / replicas. With
    gamma = 0 and no memory limit this is the chapter's token-rate inequality lambda E[out] < B / tau(B).
    """
    full = min(batch_size, memory_batch)
    tau_full = step_time_s(device, full)
    per_request_s = (math.inf if full == 0 else mean_output_tokens * tau_full / full) + \
        device.prefill_ms_per_token * mean_prompt_tokens / 1e3
    rho = arrival_rate * per_request_s / replicas
    w_full = step_time_s(device, full, 0) * mean_output_tokens + \
        device.prefill_ms_per_token * mean_prompt_tokens / 1e3
    return Stability(
        arrival_rate=arrival_rate,
        mean_output_tokens=mean_output_tokens,
        mean_prompt_tokens=mean_prompt_tokens,
        batch_size=full,
        offered_tokens_per_s=arrival_rate * mean_output_tokens,
        capacity_tokens_per_s=replicas * decode_throughput(device, full),
        offered_load=rho,
        capacity_requests_per_s=math.inf if per_request_s == 0 else replicas / per_request_s,
        full_batch_latency_s=w_full,
        demanded_concurrency=arrival_rate * w_full,
        replicas=replicas,
        slots=batch_size,
        memory_batch=memory_batch,
        admission_control=admission_control,
    )


def fleet_stability(replicas: Sequence[tuple[Device, int] | tuple[Device, int, float]], arrival_rate: float,
                    mean_output_tokens: float, mean_prompt_tokens: float = 0.0,
                    admission_control: bool = False) -> Stability:
    """:func:`stability` for a fleet, one ``(device, slots[, memory_batch])`` per replica, alike or not.

    Capacities add: the fleet serves the sum of its replicas' requests/s, and its offered load is
    lambda over that sum. That is every replica's offered load when the router splits traffic in
    proportion to capacity, the best split there is: at rho >= 1 no router keeps up. For a mixed
    fleet ``batch_size``, ``slots`` and ``memory_batch`` are means over the replicas, and the
    full-batch latency the mean of theirs weighted by that traffic share. Alike replicas give exactly
    ``stability(..., replicas=N)``.
    """
    specs = [(r[0], r[1], r[2] if len(r) > 2 else math.inf) for r in replicas]
    device, slots, mem = specs[0]
    if all(s == specs[0] for s in specs):
        return stability(device, slots, arrival_rate, mean_output_tokens, mean_prompt_tokens,
                         replicas=len(specs), memory_batch=mem, admission_control=admission_control)
    each = [stability(d, b, arrival_rate, mean_output_tokens, mean_prompt_tokens, memory_batch=m)
            for d, b, m in specs]
    capacity = sum(s.capacity_requests_per_s for s in each)
    share = [1 / len(each) if math.isinf(capacity) else s.capacity_requests_per_s / capacity for s in each]
    w_full = sum(w * s.full_batch_latency_s for w, s in zip(share, each, strict=True))
    return replace(
        each[0],
        batch_size=sum(s.batch_size for s in each) / len(each),
        slots=sum(b for _, b, _ in specs) / len(specs),
        memory_batch=sum(m for _, _, m in specs) / len(specs),
        capacity_tokens_per_s=sum(s.capacity_tokens_per_s for s in each),
        offered_load=arrival_rate / capacity,
        capacity_requests_per_s=capacity,
        full_batch_latency_s=w_full,
        demanded_concurrency=arrival_rate * w_full,
        replicas=len(specs),
        admission_control=admission_control,
    )
