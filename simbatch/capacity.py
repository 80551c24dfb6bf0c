"""Capacity analysis: can this device carry this traffic? Closed-form, no simulation.

Offered load against what a full batch delivers (:func:`stability`), for one replica or a fleet
(:func:`fleet_stability`), with the full batch capped by the KV memory as well as the slots
(:func:`mean_blocks_held`, :func:`memory_batch`); :func:`expected_stability` applies it to a
scenario and the workload drawn from it. Nothing here imports the engine: the CLI's ``capacity``
and ``inspect`` commands, the sweep's capacity search and the notebooks use it without simulating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from simbatch.config import Device, Scenario, replica_scenarios
from simbatch.cost import decode_throughput, step_time_s
from simbatch.workload import WorkloadArrays


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
        device.prefill_s_per_token * mean_prompt_tokens
    rho = arrival_rate * per_request_s / replicas
    w_full = step_time_s(device, full, 0) * mean_output_tokens + \
        device.prefill_s_per_token * mean_prompt_tokens
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


def expected_stability(scenario: Scenario, workload: WorkloadArrays) -> Stability:
    """The stability check for this scenario's traffic, from the workload's own lengths.

    Each replica's full batch is capped by what its KV cache holds, from the mean blocks a running
    request holds over its output (:func:`mean_blocks_held`). Closed-loop users have
    no arrival rate; the rate checked is the one they would send at the latency of a full batch W_B:
    concurrency / (W_B + think time).
    """
    duration = float(workload.arrival_s[-1]) if len(workload) else 0.0
    rate = scenario.workload.arrival.rate if scenario.workload.arrival is not None else float("inf")
    if scenario.workload.trace is not None or rate == float("inf"):
        rate = len(workload) / duration if duration > 0 else float("inf")
    held: dict[int, float] = {}  # by block size: a fleet shares one workload
    replicas = []
    for s in replica_scenarios(scenario):
        kv = s.kv_cache
        if kv.block_size not in held:
            held[kv.block_size] = mean_blocks_held(workload.prompt_tokens, workload.output_tokens, kv.block_size)
        replicas.append((s.device, s.batching.max_num_seqs, memory_batch(kv.num_blocks, held[kv.block_size])))
    shed = scenario.scheduler.max_waiting is not None or scenario.cluster.max_in_flight is not None
    means = (float(workload.output_tokens.mean()) if len(workload) else 0.0,
             float(workload.prompt_tokens.mean()) if len(workload) else 0.0)
    users = scenario.workload.closed_loop
    if users is not None:
        w_full_s = fleet_stability(replicas, 1.0, *means).full_batch_latency_s
        rate = users.concurrency / (w_full_s + users.think_time_s)
    return fleet_stability(replicas, rate, *means, admission_control=shed)
