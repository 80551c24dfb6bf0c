"""Capacity analysis: can this device carry this traffic? Closed-form, no simulation.

Offered load against what a full batch delivers (:func:`stability`), for one replica or a fleet
(:func:`fleet_stability`), with the full batch capped by the KV memory as well as the slots
(:func:`mean_blocks_held`, :func:`memory_batch`), and each decode step charged for the context it
reads (:func:`mean_context_tokens`); :func:`expected_stability` applies it to a scenario and the
workload drawn from it. Nothing here imports the engine: the CLI's ``capacity``
and ``inspect`` commands, the sweep's capacity search and the notebooks use it without simulating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from simbatch.config import Device, Scenario, replica_scenarios
from simbatch.features import speculative
from simbatch.inputs.resolve import resolve
from simbatch.model.cost import LinearCost, work_s
from simbatch.registry import MODES
from simbatch.workload import WorkloadArrays
from simbatch.workload.prefix import expected_cached_tokens, expected_hash_hits


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


def mean_context_tokens(prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> float:
    """c_bar, the cached context a decode step reads per sequence, on average over every decode step.

    Request ``i`` reads ``P``, ``P + 1``, ... ``P + O - 1`` tokens over its ``O`` steps (the tokens it
    holds, :func:`mean_blocks_held` without the block rounding), so c_bar = sum_i (O P + O (O - 1) / 2)
    / sum_i O: weighted by output length, as a snapshot of the batch finds requests. KV tokens / c_bar
    is the batch the memory holds, which :func:`memory_batch` counts in whole blocks.
    """
    prompt, output = np.asarray(prompt_tokens, dtype=np.float64), np.asarray(output_tokens, dtype=np.float64)
    total_steps = output.sum()
    if total_steps == 0:
        return 0.0
    return float((output * prompt + output * (output - 1) / 2).sum() / total_steps)


def memory_batch(num_blocks: int, blocks_held: float) -> float:
    """The running requests the KV cache holds at once: num_blocks / mean blocks held per request."""
    return math.inf if blocks_held == 0 else num_blocks / blocks_held


@dataclass(frozen=True)
class Stability:
    """The stability check: offered work against what the device can deliver at full batch.

    The full batch is the smaller of the slots (``max_num_seqs``) and the batch the KV memory holds
    (:func:`memory_batch`); ``limited_by`` says which binds, or that neither does much: compute, when
    most of a request's device time is work no batch shares. With admission control (a waiting cap),
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
    mean_context_tokens: float = 0.0  # c_bar: cached tokens a decode step reads per sequence
    context_cost: bool = False  # the device charges the context read (delta > 0)
    mean_prompt_sq_tokens: float = 0.0  # E[prompt^2]: a prompt of P tokens has P^2 / 2 attention pairs
    # The share of a request's device time that the batch shares out: its output tokens' part of tau0,
    # E[out] tau0 / B; the rest (beta, delta c_bar, prefill) is the same work whatever the batch.
    shared_fraction: float = 1.0
    # Disaggregated prefill and decode: the pool that binds ("prefill" or "decode"; its replicas are
    # ``replicas``), and each pool's capacity (:func:`pool_capacity`). Empty for one pool of replicas.
    pool: str = ""
    prefill_capacity_requests_per_s: float = math.nan
    decode_capacity_requests_per_s: float = math.nan
    # A finite burst (rate: inf, every request at t = 0): how many, and about how long they take to drain.
    # There is no steady rate to carry: a burst is never "oversubscribed", it takes its time.
    burst: int = 0
    drain_s: float = math.nan
    # A client holding at most this many requests in flight (workload.max_concurrency), and the rate those
    # can carry, C / W(b), W(b) a request's latency at the batch b they make (C over the replicas, at most B).
    client_concurrency: int | None = None
    client_capacity_requests_per_s: float = math.inf

    @property
    def client_bound(self) -> bool:
        """The client's cap, not the server, limits the rate, and the traffic is above it."""
        return self.client_capacity_requests_per_s < self.capacity_requests_per_s and \
            self.arrival_rate >= self.client_capacity_requests_per_s

    @property
    def stable(self) -> bool:
        """The traffic is carried: a burst always drains; a stream needs rho < 1 and, with a client cap,
        a rate below what the requests in flight carry (else they wait at the client without bound)."""
        if self.burst:
            return True
        return self.offered_load < 1.0 and self.arrival_rate < self.client_capacity_requests_per_s

    @property
    def limited_by(self) -> str:
        """Which limit binds: "compute" when most of a request's device time is work no batch
        shares (a larger batch would not even double capacity), else what sets the full batch:
        "slots" (max_num_seqs) or "memory" (the KV cache)."""
        if self.shared_fraction < 0.5:
            return "compute"
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
    def short_verdict(self) -> str:
        """The verdict in a table cell: ``stable 77%``, ``over 5.1×``, ``shed 40%``, ``client 4.05×``, ``burst``."""
        if self.burst:
            return "burst"
        if self.client_bound:
            return f"client {self.arrival_rate / self.client_capacity_requests_per_s:.2f}×"
        if self.stable:
            return f"stable {self.offered_load:.0%}"
        if self.admission_control:
            return f"shed {self.shed_fraction:.0%}"
        return f"over {_factor(self.offered_load)}×"

    @property
    def verdict(self) -> str:
        limit = f" (the {self.pool} pool binds)" if self.pool else \
            {"memory": " (KV memory limits the batch)",
             "compute": " (compute binds: a larger batch would barely help)"}.get(self.limited_by, "")
        if self.burst:
            slots = self.batch_size * self.replicas
            batches = "within one full batch" if self.burst <= slots else \
                f"about {math.ceil(self.burst / slots):,} full batches of {_batch_text(slots)}"
            return (f"a burst of {self.burst:,} requests at t = 0 (no steady rate to carry): {batches}, drained in "
                    f"about {self.drain_s:.3g} s{limit}")
        cap, x = self.client_concurrency, self.client_capacity_requests_per_s
        if self.client_bound:
            return (f"client-bound {self.arrival_rate / x:.2f}×: {cap} in flight carry about {x:.3g} requests/s of "
                    f"the {self.arrival_rate:.3g} offered (the server could take {self.capacity_requests_per_s:.3g}); "
                    f"the rest wait at the client without bound (client wait): raise max_concurrency to about "
                    f"{math.ceil(self.demanded_concurrency) + 1:,}")
        if self.stable:
            client = "" if cap is None else f"; the client's {cap} in flight carry it ({self.arrival_rate / x:.0%})"
            return f"stable (offered load {self.offered_load:.0%}){limit}{client}"
        rho = self.offered_load
        factor = _factor(rho)
        need = self.replicas_needed
        fix = (f"{need:,} {self.pool + ' ' if self.pool else ''}replicas would carry it" if need <= 100_000 else
               "more replicas finish it sooner" if math.isinf(need) else "no fleet of a sane size carries it")
        if self.admission_control:
            return (f"overloaded {factor}×{limit}: shedding about {self.shed_fraction:.0%} of requests (429s); "
                    f"{fix}, or make tokens cheaper")
        return (f"oversubscribed {factor}×{limit}: the waiting queue grows without bound; "
                f"{fix}, or make tokens cheaper, or shed load")


def _factor(rho: float) -> str:
    # Two decimals near 1, so that 1.02x does not read as a harmless "1.0x"; three figures far above.
    return f"{rho:.2f}" if rho < 1.1 else f"{rho:.1f}" if rho < 1000 else f"{rho:.3g}"


def _batch_text(b: float) -> str:
    return f"{b:g}" if float(b).is_integer() else f"{b:.1f}"


def _law(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values and their empirical CDF."""
    distinct, counts = np.unique(np.asarray(values, dtype=np.float64), return_counts=True)
    return distinct, np.cumsum(counts) / max(counts.sum(), 1)


def _expected_max(law: tuple[np.ndarray, np.ndarray], b: int) -> float:
    distinct, cdf = law
    return float((distinct * np.diff(cdf ** b, prepend=0.0)).sum())


def expected_max(values: np.ndarray, b: int) -> float:
    """E[max of ``b`` draws with replacement from ``values``]: sum over the sorted distinct values x_i of
    x_i (F(x_i)^b - F(x_{i-1})^b), F the empirical CDF (the longest request a batch of b holds)."""
    return _expected_max(_law(values), b)


def token_step_s(device: Device, batch_size: float, context_tokens: float = 0.0) -> float:
    """A decode step of ``batch_size`` sequences reading ``context_tokens`` each, per token each emits, s:
    tau(B), or with speculative decoding tau_spec(B) / E, E the tokens per step
    (:func:`simbatch.features.speculative.tokens_per_step`)."""
    spec = device.speculative
    k, tokens = (spec.num_speculative_tokens, speculative.tokens_per_step(spec)) if spec else (0, 1.0)
    return speculative.step_ms(LinearCost.of(device), batch_size, k, context_tokens, spec) / 1e3 / tokens


def stability(device: Device, batch_size: int, arrival_rate: float, mean_output_tokens: float,
              mean_prompt_tokens: float = 0.0, replicas: int = 1, memory_batch: float = math.inf,
              admission_control: bool = False, mean_context_tokens: float = 0.0,
              mean_prompt_sq_tokens: float | None = None, slot_steps: float | None = None,
              prefill_tokens: float | None = None, client_concurrency: int | None = None,
              burst: int = 0) -> Stability:
    """Offered load against capacity for ``replicas`` engines of ``batch_size`` slots.

    The full batch is ``B = min(batch_size, memory_batch)`` (see :func:`memory_batch`). Each output
    token occupies one slot of a full-batch step whose sequences each read ``mean_context_tokens``
    (c_bar, :func:`mean_context_tokens`), tau(B, K = B c_bar)/B device-seconds; each prompt costs its
    prefill on top, gamma E[prompt] + epsilon E[prompt^2] / 2 (a prompt of P tokens has P^2 / 2
    attention pairs however it is chunked; ``mean_prompt_sq_tokens`` defaults to E[prompt]^2). So a
    request takes E[out] (tau0/B + beta + delta c_bar) + gamma E[prompt] + epsilon E[prompt^2] / 2,
    and rho = lambda x that / replicas. With gamma = delta = epsilon = 0 and no memory limit this is
    the chapter's token-rate inequality lambda E[out] < B / tau(B). With speculative decoding a step
    emits E tokens per sequence: tau(B) becomes tau_spec(B) / E (:func:`token_step_s`).

    ``slot_steps`` (default E[out]): the steps a request holds its slot; request-level batching holds it
    until the batch's longest request ends (:func:`request_level_costs`). ``prefill_tokens`` (default
    E[prompt]): the prompt tokens computed per request, padding included. ``client_concurrency``: a
    client's cap on requests in flight, whose rate C / W(b) the verdict weighs (b: C over the replicas,
    at most B). ``burst``: every one of this many requests arrives at t = 0 (see :class:`Stability`).
    """
    steps = mean_output_tokens if slot_steps is None else slot_steps
    computed = mean_prompt_tokens if prefill_tokens is None else prefill_tokens
    full = min(batch_size, memory_batch)
    tau_full = token_step_s(device, full, mean_context_tokens)
    prompt_sq = mean_prompt_tokens ** 2 if mean_prompt_sq_tokens is None else mean_prompt_sq_tokens
    prefill_s = work_s(device, prefill_tokens=computed, attention_pairs=prompt_sq / 2)
    per_request_s = (math.inf if full == 0 else steps * tau_full / full) + prefill_s
    rho = arrival_rate * per_request_s / replicas

    def latency_s(b: float) -> float:  # a request's time in a batch of b: its slot's steps, then its prefill
        return token_step_s(device, b, mean_context_tokens) * steps + prefill_s

    w_full = latency_s(full)
    shared_s = math.inf if full == 0 else steps * token_step_s(device, 0) / full
    capacity = math.inf if per_request_s == 0 else replicas / per_request_s
    client_capacity = math.inf
    if client_concurrency is not None:
        w = latency_s(min(client_concurrency / replicas, full))
        client_capacity = math.inf if w == 0 else client_concurrency / w
    drain = math.nan
    if burst:
        drain = max(burst / capacity if capacity else math.inf, latency_s(min(math.ceil(burst / replicas), full)))
    return Stability(
        arrival_rate=arrival_rate,
        mean_output_tokens=mean_output_tokens,
        mean_prompt_tokens=mean_prompt_tokens,
        batch_size=full,
        offered_tokens_per_s=arrival_rate * mean_output_tokens,
        # Tokens delivered: a request-level batch computes slot_steps steps per request for E[out] tokens.
        capacity_tokens_per_s=replicas * full / tau_full * (mean_output_tokens / steps if steps else 1.0),
        offered_load=rho,
        capacity_requests_per_s=capacity,
        full_batch_latency_s=w_full,
        demanded_concurrency=arrival_rate * w_full,
        replicas=replicas,
        slots=batch_size,
        memory_batch=memory_batch,
        admission_control=admission_control,
        mean_context_tokens=mean_context_tokens,
        context_cost=device.kv_read_ms_per_1k_tokens > 0,
        mean_prompt_sq_tokens=prompt_sq,
        shared_fraction=1.0 if per_request_s == 0 or math.isinf(shared_s) else shared_s / per_request_s,
        burst=burst,
        drain_s=drain,
        client_concurrency=client_concurrency,
        client_capacity_requests_per_s=client_capacity,
    )


Replica = tuple[Device, int] | tuple[Device, int, float] | tuple[Device, int, float, dict]


def fleet_stability(replicas: Sequence[Replica], arrival_rate: float,
                    mean_output_tokens: float, mean_prompt_tokens: float = 0.0,
                    admission_control: bool = False, mean_context_tokens: float = 0.0,
                    mean_prompt_sq_tokens: float | None = None, client_concurrency: int | None = None,
                    burst: int = 0) -> Stability:
    """:func:`stability` for a fleet, one ``(device, slots[, memory_batch[, costs]])`` per replica, alike
    or not; ``costs`` are a replica's own keyword arguments of :func:`stability` (request-level batching's
    ``slot_steps``, ``prefill_tokens``, ``mean_context_tokens``: :func:`request_level_costs`).

    Capacities add: the fleet serves the sum of its replicas' requests/s, and its offered load is
    lambda over that sum. That is every replica's offered load when the router splits traffic in
    proportion to capacity, the best split there is: at rho >= 1 no router keeps up. For a mixed
    fleet ``batch_size``, ``slots`` and ``memory_batch`` are means over the replicas, and the
    full-batch latency the mean of theirs weighted by that traffic share; a client's requests in flight
    are shared equally. Alike replicas give exactly ``stability(..., replicas=N)``.
    """
    specs = [(r[0], r[1], r[2] if len(r) > 2 else math.inf, r[3] if len(r) > 3 else {}) for r in replicas]
    device, slots, mem, own = specs[0]
    context = {"mean_context_tokens": mean_context_tokens, "mean_prompt_sq_tokens": mean_prompt_sq_tokens}
    if all(s == specs[0] for s in specs):
        return stability(device, slots, arrival_rate, mean_output_tokens, mean_prompt_tokens,
                         replicas=len(specs), memory_batch=mem, admission_control=admission_control,
                         **context | own, client_concurrency=client_concurrency, burst=burst)
    n = len(specs)
    each = [stability(d, b, arrival_rate, mean_output_tokens, mean_prompt_tokens, memory_batch=m, **context | extra,
                      client_concurrency=None if client_concurrency is None else client_concurrency / n,
                      burst=math.ceil(burst / n)) for d, b, m, extra in specs]
    capacity = sum(s.capacity_requests_per_s for s in each)
    share = [1 / n if math.isinf(capacity) else s.capacity_requests_per_s / capacity for s in each]
    w_full = sum(w * s.full_batch_latency_s for w, s in zip(share, each, strict=True))
    return replace(
        each[0],
        batch_size=sum(s.batch_size for s in each) / n,
        slots=sum(b for _, b, _, _ in specs) / n,
        memory_batch=sum(m for _, _, m, _ in specs) / n,
        capacity_tokens_per_s=sum(s.capacity_tokens_per_s for s in each),
        offered_load=arrival_rate / capacity,
        capacity_requests_per_s=capacity,
        full_batch_latency_s=w_full,
        demanded_concurrency=arrival_rate * w_full,
        replicas=n,
        admission_control=admission_control,
        shared_fraction=sum(w * s.shared_fraction for w, s in zip(share, each, strict=True)),
        burst=burst,
        drain_s=max(burst / capacity, min(s.drain_s for s in each)) if burst else math.nan,
        client_concurrency=client_concurrency,
        client_capacity_requests_per_s=sum(s.client_capacity_requests_per_s for s in each),
    )


def request_level_costs(prompt_tokens: np.ndarray, output_tokens: np.ndarray, slots: int, num_blocks: int,
                        block_size: int, pad_prompts: bool) -> tuple[int, dict]:
    """The full batch of request-level batching (static, dynamic) and what a request costs in it.

    A batch of b decodes until its longest request ends, so each request holds its slot for
    E[max of b outputs] steps (done slots are still computed: padding), and with ``pad_prompts`` its
    prompt is computed at the batch's longest, E[max of b prompts]; a step reads about E[max prompt] +
    E[max output] / 2 per slot. Every slot reserves the longest prompt plus the longest output, so the
    batch is the largest b <= ``slots`` whose b such footprints fit in ``num_blocks``.
    Returns (b, keyword arguments of :func:`stability` for it).
    """
    prompts, outputs = _law(prompt_tokens), _law(output_tokens)

    def costs(b: int) -> tuple[float, float]:
        return _expected_max(prompts, b), _expected_max(outputs, b)

    b = slots
    while b > 1 and b * math.ceil(sum(costs(b)) / block_size) > num_blocks:
        b -= 1
    p_max, o_max = costs(b)
    return b, {"slot_steps": o_max, "prefill_tokens": p_max if pad_prompts else float(np.mean(prompt_tokens)),
               "mean_context_tokens": (p_max if pad_prompts else float(np.mean(prompt_tokens))) + (o_max - 1) / 2}


def prefill_capacity(device: Device, replicas: int, token_budget: int, max_num_seqs: int, mean_prompt_tokens: float,
                     mean_prompt_sq_tokens: float | None = None) -> float:
    """Requests/s a pool of prefill-only replicas completes at saturation (disaggregated prefill).

    A saturated prefill replica runs steps full of prompt tokens: ``token_budget`` of them, or fewer
    when ``max_num_seqs`` prompts fill the step first (T = min(budget, max_num_seqs E[P])), so each
    prompt token carries tau0 / T of a step's fixed cost besides its own gamma, and each prompt its
    attention, epsilon E[P^2] / 2. A request then takes E[P] (tau0 / T + gamma) + epsilon E[P^2] / 2
    device-seconds. Left out: the context a later chunk of a chunked prompt reads (delta), and whole
    prompts not packing a step exactly when prefill is not chunked.
    """
    prompt_sq = mean_prompt_tokens ** 2 if mean_prompt_sq_tokens is None else mean_prompt_sq_tokens
    tokens_per_step = min(token_budget, max_num_seqs * mean_prompt_tokens)
    per_request_s = mean_prompt_tokens * device.tau0_s / tokens_per_step + \
        work_s(device, prefill_tokens=mean_prompt_tokens, attention_pairs=prompt_sq / 2) if mean_prompt_tokens else 0.0
    return math.inf if per_request_s == 0 else replicas / per_request_s


def pool_capacity(prefill: float, decode: float) -> tuple[float, str]:
    """A disaggregated cluster's capacity, requests/s, and the pool that sets it: every request
    passes through both pools, so the cluster carries min(prefill capacity, decode capacity)."""
    return (prefill, "prefill") if prefill < decode else (decode, "decode")


def best_split(gpus: int, prefill_per_replica: float, decode_per_replica: float) -> int:
    """Of ``gpus`` replicas, how many to make prefill replicas (at least one of each pool) for the
    most capacity, min(p x prefill_per_replica, (gpus - p) x decode_per_replica): DistServe's
    placement search in closed form (ties: the fewer prefill replicas)."""
    if gpus < 2:
        raise ValueError(f"gpus ({gpus}) must be at least 2: one prefill and one decode replica")
    return max(range(1, gpus), key=lambda p: (min(p * prefill_per_replica, (gpus - p) * decode_per_replica), -p))


def _disaggregated_stability(scenario: Scenario, workload: WorkloadArrays, rate: float) -> Stability:
    """:func:`expected_stability` for disaggregated prefill and decode: each pool checked on its own
    work, and the verdict the binding pool's.

    The decode pool decodes ``O - 1`` tokens a request (the first came from the prefill pool), each
    request holding and reading ``P + 1`` .. ``P + O - 1`` tokens, and holds its slot one step more:
    the transfer starts when a step is planned, and the request decodes from the step after the one
    its KV arrived in (a transfer longer than a step holds it longer, which this leaves out). So a
    request takes O slot-steps (O - 1 decoding). The prefill pool prefills prompts
    (:func:`prefill_capacity`).
    """
    pools = scenario.cluster.disaggregated
    specs = replica_scenarios(scenario)
    prompt, output = workload.prompt_tokens, workload.output_tokens
    decoded = np.maximum(output - 1, 0)
    slot_steps = np.where(output > 1, output, 0)  # a one-token output never reaches the decode pool
    shed = scenario.scheduler.max_waiting is not None
    n = len(workload)
    dec = specs[-1]
    held = mean_blocks_held(prompt + 1, decoded, dec.kv_cache.block_size)
    decode = fleet_stability([(dec.device, dec.batching.max_num_seqs, memory_batch(dec.kv_cache.num_blocks, held))]
                             * pools.decode.count, rate, float(slot_steps.mean()) if n else 0.0,
                             admission_control=shed, mean_context_tokens=mean_context_tokens(prompt + 1, decoded),
                             mean_prompt_sq_tokens=0.0)
    pre = specs[0]
    mean_p = float(prompt.mean()) if n else 0.0
    prefill = prefill_capacity(pre.device, pools.prefill.count, pre.batching.max_num_batched_tokens,
                               pre.batching.max_num_seqs, mean_p,
                               float((prompt.astype(np.float64) ** 2).mean()) if n else 0.0)
    capacity, binding = pool_capacity(prefill, decode.capacity_requests_per_s)
    out = replace(decode, mean_prompt_tokens=mean_p, pool=binding, prefill_capacity_requests_per_s=prefill,
                  decode_capacity_requests_per_s=decode.capacity_requests_per_s)
    if binding == "prefill":
        out = replace(out, offered_load=rate / prefill, capacity_requests_per_s=prefill, replicas=pools.prefill.count)
    return out


def expected_stability(scenario: Scenario, workload: WorkloadArrays) -> Stability:
    """The stability check for this scenario's traffic, from the workload's own lengths.

    Each replica's full batch is capped by what its KV cache holds, from the mean blocks a running
    request holds over its output (:func:`mean_blocks_held`); its decode steps read the mean context
    (:func:`mean_context_tokens`) and its prefills cost by the mean square prompt. Closed-loop users have
    no arrival rate; the rate checked is the one they would send at the latency of a full batch W_B:
    concurrency / (W_B + think time). With prefix caching on every replica, the prefill charged is
    what a cache that never evicts would leave (:func:`~simbatch.workload.prefix.expected_cached_tokens`, or
    for a trace's block ids :func:`~simbatch.workload.prefix.expected_hash_hits`):
    the check then says whether the traffic is carried when conversations stay cached. A scenario not
    resolved yet is resolved first (presets, ``num_blocks: auto``), as :func:`simbatch.simulation.simulate` does.
    """
    scenario = resolve(scenario)
    duration = float(workload.arrival_s[-1]) if len(workload) else 0.0
    rate = scenario.workload.arrival.rate if scenario.workload.arrival is not None else float("inf")
    if scenario.workload.trace is not None or rate == float("inf"):
        rate = len(workload) / duration if duration > 0 else float("inf")
    if scenario.cluster.disaggregated is not None:
        return _disaggregated_stability(scenario, workload, rate)
    held: dict[int, float] = {}  # by block size: a fleet shares one workload
    request_level: dict[tuple, tuple[int, dict]] = {}
    replicas = []
    for s in replica_scenarios(scenario):
        kv, b = s.kv_cache, s.batching
        if not MODES[b.mode].iteration_level and len(workload):  # whole batches, held to their longest request
            key = (b.max_num_seqs, kv.num_blocks, kv.block_size, b.pad_prompts)
            if key not in request_level:
                request_level[key] = request_level_costs(workload.prompt_tokens, workload.output_tokens, *key)
            batch, costs = request_level[key]
            replicas.append((s.device, b.max_num_seqs, batch if batch < b.max_num_seqs else math.inf, costs))
            continue
        if kv.block_size not in held:
            held[kv.block_size] = mean_blocks_held(workload.prompt_tokens, workload.output_tokens, kv.block_size)
        replicas.append((s.device, b.max_num_seqs, memory_batch(kv.num_blocks, held[kv.block_size])))
    shed = scenario.scheduler.max_waiting is not None or scenario.cluster.max_in_flight is not None
    prefill_tokens = workload.prompt_tokens
    specs = replica_scenarios(scenario)
    if all(s.kv_cache.enable_prefix_caching for s in specs):  # only the prefill the cache leaves is work
        block = specs[0].kv_cache.block_size
        prefill_tokens = prefill_tokens - (
            expected_hash_hits(workload.prompt_tokens, workload.hashes, block) if workload.hashes is not None else
            expected_cached_tokens(workload.prompt_tokens, workload.output_tokens, workload.prefix_stream,
                                   workload.shared_prefix_tokens, block))
    means = (float(workload.output_tokens.mean()) if len(workload) else 0.0,
             float(prefill_tokens.mean()) if len(workload) else 0.0)
    # A prefill of c tokens after h cached ones attends c (h + c/2) pairs: (P^2 - h^2) / 2 in all.
    prompt = workload.prompt_tokens.astype(np.float64)
    cached = prompt - prefill_tokens
    context = {"mean_context_tokens": mean_context_tokens(workload.prompt_tokens, workload.output_tokens),
               "mean_prompt_sq_tokens": float((prompt * prompt - cached * cached).mean()) if len(workload) else 0.0}
    users = scenario.workload.closed_loop
    if users is not None:
        w_full_s = fleet_stability(replicas, 1.0, *means, **context).full_batch_latency_s
        rate = users.concurrency / (w_full_s + users.think_time_s)
    burst = len(workload) if math.isinf(rate) and users is None else 0
    return fleet_stability(replicas, rate, *means, admission_control=shed, **context, burst=burst,
                           client_concurrency=scenario.workload.max_concurrency)
