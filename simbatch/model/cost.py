"""The step-time model: how long one engine step takes. Pure functions, no simulation.

A decode step is memory-bound: the weights stream through the GPU once per step whatever the batch,
and every scheduled request's KV cache streams through it too. One step over ``B`` decoding
sequences and ``P`` prefill tokens, reading ``K`` cached KV tokens, with ``A`` prefill attention
pairs, takes

    tau = tau0 + beta * B + gamma * P + delta * K + epsilon * A

``tau0`` is the fixed cost of streaming the weights, ``beta`` the small marginal cost of one more
sequence, ``gamma`` the cost of a prompt token (its share of the weight matmuls). ``delta`` is the
cost of reading one cached token's keys and values (bytes per token over memory bandwidth), so a step
slows as its requests' contexts grow; ``K`` counts the cached context of every scheduled request,
decodes and prefill chunks alike. ``epsilon`` is the attention compute of one (query, key) pair of a
prefill: a chunk of ``c`` tokens after ``k`` cached ones attends to ``c * (k + c / 2)`` pairs (each
new token sees the cached ones and, causally, half the chunk), which makes long prompts quadratic.
A decode's attention is the ``delta`` read; it is memory-bound, not compute-bound. With
``delta = epsilon = 0`` the model is the chapter's ``tau0 + beta B + gamma P``, to the bit.

Tokens a step verifies beyond each decode's own (speculative decoding's drafts, ``plan.draft_tokens``)
are costed at ``gamma``: rows through the weights, like prompt tokens. A serving feature may add time
of its own to a step (the drafter's passes: :meth:`simbatch.features.Feature.step_ms`), passed in as
``extra_ms`` and summed before the step is put on the clock's grid.

A mixture of experts (``device.moe``) adds the experts its tokens read: with ``E`` experts per layer,
``k`` chosen per token and ``T`` tokens in the step (decodes, prompt tokens and drafts, padded ones
too), the expected number of distinct experts a layer reads is ``E (1 - (1 - k/E)^T)``: one token's
``k`` at batch 1, all ``E`` once every expert is somebody's choice. A GPU holding ``L`` of them
(expert parallelism) reads ``L (1 - (1 - k/E)^(T dp))``, ``dp`` the data-parallel ranks whose tokens
it serves, each for ``expert_read_ms``. The term depends on the step's tokens only, so repeats of
one decode plan cost the same, and runs stay exact (below).

**The GEMM tile switch** (``device.gemm_tier_tokens``, ``device.gemm_tier_ms``). A GEMM library picks
its kernel by the number of rows ``M``, the step's tokens (padded: a CUDA graph's batch). vLLM's CUTLASS
fp8 GEMM on Hopper (``csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_fp8_dispatch.cuh``) runs
``M <= 16`` with a 64x16 tile and ``16 < M <= 64`` with a 64x64 one, which streams the weights more
slowly: a step of ``low < tokens <= high`` (``gemm_tier_tokens: [16, 64]``) costs ``gemm_tier_ms`` more.
Above ``high`` a step carries a prompt's tokens, whose cost ``gamma`` already is. Like the experts'
term it depends on the step's tokens only.

**The decode roofline** (``device.weights_ms``, which the presets set). A decode step's matrix
multiplies run on weights streaming from memory: until they need more time than the stream they hide
under it. With ``weights_ms`` (the weights' stream, ms) the step is

    tau = tau0 + max(weights + experts + delta * K, beta * B) + gamma * P + epsilon * A

``tau0`` then the fixed overheads alone. A prompt's tokens (``gamma``, ``epsilon``) are compute-bound
and add. Of the laws tried on every measured dataset, held out (all costs adding, a roofline of the
whole step ``max(compute, memory)``, a blend, this one; ``scripts/fit_hardware.py``, reported in
``docs/hardware_fit.md``), this predicted the configurations the fit had not seen best. Without
``weights_ms`` (the default, and every scenario that spells out ``tau0_ms``) all the costs add.

Tensor-parallel communication is no separate term: a decode step's all-reduces are latency-bound,
a constant per step (part of ``tau0``), and a prefill's scale with its tokens (part of ``gamma``).

Decode throughput ``B / tau(B)`` rises steeply at first, as ``tau0`` is shared by more sequences,
then flattens toward the roofline ``1 / beta`` (lower still once contexts are long: ``delta``).

**Exact runs.** The engine's clock counts whole nanoseconds (:mod:`simbatch.model.clock`), and a run of
repeats of one decode plan (fast-forward) must end exactly where stepping ends. With ``delta > 0``
the repeats are not alike: every decode slot reads one more token each step, so the context term
grows by ``delta * B`` per step, an arithmetic progression. The context terms are therefore kept in
integers, ``delta`` and ``epsilon`` on a femtosecond grid, and each step's context time is rounded
to the nanosecond by itself, so a step's duration is ``step_ns(tau0 + beta B + gamma P + swaps)``
plus ``floor((N + i * I) / D)`` ns for its repeat ``i``. The sum of such floors over a run has an
exact closed form (:func:`floor_sum`, logarithmic in the coefficients, independent of the run's
length), so a run of ``n`` steps costs the same few integer operations whatever ``n`` is.

Under the roofline the max is taken on the same integer grid, ``beta`` and the weights included. A
decode run's memory term grows by ``delta * B`` per repeat while ``beta * B`` stays, so the max
switches branch at most once in a run, from compute to memory: the run is split there
(:class:`SwitchingRun`), and each part sums exactly.

All times here are in seconds unless a name says ``_ms`` or ``_ns``; the scenario speaks milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from simbatch.config import Device

if TYPE_CHECKING:
    from collections.abc import Callable

    from simbatch.model.step import StepPlan

FS_PER_MS = 10**12
# The context terms' grid: twice a femtosecond per unit, because A = sum c (k + c/2) is a half-integer;
# plans carry 2A (``attention_pairs_x2``), and a step's context time is (2 delta K + epsilon 2A) / _DEN ns.
_DEN = 2 * 10**6


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum_{i=0}^{n-1} floor((a i + b) / m), exactly, for n >= 0, m >= 1, a, b >= 0.

    Euclid's algorithm on the lattice points under a line: each round takes the whole parts of the
    slope and the intercept in closed form and swaps the axes, so it takes O(log m) rounds whatever n.
    """
    total = 0
    while True:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            return total
        n, b = divmod(y_max, m)
        m, a = a, m


class StepRun:
    """The durations of consecutive repeats of one plan: repeat ``i`` (from 0) lasts
    ``base_ns + (num + i * inc) // _DEN`` ns (``inc`` is 0 unless the context grows).

    A plain class, not a dataclass: the accelerated engine makes one per run of steps.
    """

    __slots__ = ("base_ns", "num", "inc", "first_ns")

    def __init__(self, base_ns: int, num: int, inc: int):
        self.base_ns, self.num, self.inc = base_ns, num, inc
        self.first_ns = base_ns + num // _DEN

    def ns(self, i0: int, m: int) -> int:
        """Total duration of repeats ``i0 .. i0 + m - 1``, ns."""
        if not self.inc:
            return m * self.first_ns
        return m * self.base_ns + floor_sum(m, _DEN, self.inc, self.num + i0 * self.inc)

    def reach(self, i0: int, dt_ns: int) -> int:
        """Of the repeats from ``i0``, the number of the one in progress ``dt_ns`` after their start.

        A step is in progress from its start (excluded) to its end (included): at the instant a step
        ends it is still the one in progress (the tie rule of :mod:`simbatch.model.clock`). So this is the
        fewest ``m >= 1`` with ``ns(i0, m) >= dt_ns``.
        """
        if not self.inc:
            return max(1, -(-dt_ns // self.first_ns))
        if dt_ns <= self.first_ns:
            return 1
        # Estimate from the unrounded progression (each floor is within 1 ns of it), then search
        # outward from the estimate, doubling, and bisect: a handful of exact sums in practice.
        # m a + b m (m - 1) / 2 = dt, solved for m in the form that does not cancel when b is tiny.
        a = self.base_ns + (self.num + i0 * self.inc) / _DEN - 0.5
        b = self.inc / _DEN
        est = 2 * dt_ns / ((a - b / 2) + math.sqrt((a - b / 2) ** 2 + 2 * b * dt_ns))
        guess = max(1, math.ceil(est))
        if self.ns(i0, guess) >= dt_ns:
            hi, gap = guess, 1
            lo = hi - gap
            while lo >= 1 and self.ns(i0, lo) >= dt_ns:
                hi, gap = lo, 2 * gap
                lo = hi - gap
            lo = max(lo, 0)
        else:
            lo, gap = guess, 1
            hi = lo + gap
            while self.ns(i0, hi) < dt_ns:
                lo, gap = hi, 2 * gap
                hi = lo + gap
        while hi - lo > 1:  # ns(i0, lo) < dt_ns <= ns(i0, hi)
            mid = (lo + hi) // 2
            if self.ns(i0, mid) >= dt_ns:
                hi = mid
            else:
                lo = mid
        return hi


class SwitchingRun(StepRun):
    """A run whose first ``switch`` repeats last ``flat_ns`` each (the decode matmuls outlast the memory
    traffic) and whose later ones grow as a :class:`StepRun` (``switch >= 1``, ``inc >= 1``)."""

    __slots__ = ("switch", "flat_ns")

    def __init__(self, flat_ns: int, switch: int, base_ns: int, num: int, inc: int):
        super().__init__(base_ns, num, inc)
        self.flat_ns, self.switch = flat_ns, switch

    def ns(self, i0: int, m: int) -> int:
        flat = min(max(self.switch - i0, 0), m)
        rest = m - flat
        return flat * self.flat_ns + (StepRun.ns(self, i0 + flat, rest) if rest else 0)

    def reach(self, i0: int, dt_ns: int) -> int:
        flat = max(self.switch - i0, 0)
        if flat and dt_ns <= flat * self.flat_ns:
            return max(1, -(-dt_ns // self.flat_ns))
        return flat + StepRun.reach(self, i0 + flat, dt_ns - flat * self.flat_ns)


@dataclass(frozen=True, slots=True)
class LinearCost:
    """The cost model: a step's duration from what it computes and reads (module docstring), plus the
    time its swaps take. The one place the formula is written; the engine and every analysis call it.

    ``kv_read_fs_per_token`` (delta) and ``attention_fs_per_pair`` (epsilon) are integers on a
    femtosecond grid (delta is exact to 1e-12 ms per token), so that runs sum exactly (module docstring).
    """

    tau0_ms: float
    beta_ms: float
    gamma_ms: float  # per prefill token
    swap_ms_per_block: float = 0.0
    kv_read_fs_per_token: int = 0  # delta
    attention_fs_per_pair: int = 0  # epsilon
    # A mixture of experts (device.moe): a step of T tokens reads local_experts (1 - miss^(T dp)) experts,
    # each for expert_read_ms; miss = 1 - k/E, the chance one token leaves an expert alone.
    expert_read_ms: float = 0.0
    local_experts: int = 0
    expert_miss: float = 1.0
    expert_token_scale: int = 1
    # The decode roofline (device.weights_ms; module docstring): None adds every cost.
    weights_ms: float | None = None
    # The GEMM kernel's tile switch (device.gemm_tier_tokens; module docstring): 0 for none.
    tier_low: int = 0
    tier_high: int = 0
    tier_ms: float = 0.0

    @classmethod
    def of(cls, device: Device, swap_ms_per_block: float = 0.0) -> LinearCost:
        moe = device.moe
        experts = (moe.expert_read_ms, moe.local_experts, 1 - moe.experts_per_token / moe.num_experts,
                   moe.data_parallel_size) if moe is not None and moe.expert_read_ms else (0.0, 0, 1.0, 1)
        return cls(device.tau0_ms, device.beta_ms, device.prefill_ms_per_token, swap_ms_per_block,
                   round(device.kv_read_ms_per_1k_tokens * FS_PER_MS / 1e3),
                   round(device.prefill_attention_ms_per_1m_pairs * FS_PER_MS / 1e6), *experts, device.weights_ms,
                   *(device.gemm_tier_tokens or (0, 0)), device.gemm_tier_ms if device.gemm_tier_tokens else 0.0)

    def tier_of(self, tokens: int | float) -> float:
        """What the GEMM tile switch adds to a step of ``tokens`` tokens, ms (0 outside (low, high])."""
        if not self.tier_ms:
            return 0.0
        if isinstance(tokens, np.ndarray):
            return np.where((tokens > self.tier_low) & (tokens <= self.tier_high), self.tier_ms, 0.0)
        return self.tier_ms if self.tier_low < tokens <= self.tier_high else 0.0

    def experts_ms(self, tokens: int | float) -> float:
        """The routed experts ``tokens`` tokens read, ms: ``expert_read_ms L (1 - miss^(T dp))``."""
        if not self.expert_read_ms:
            return 0.0  # (no tokens read none: miss^0 is 1; tokens may be an array, as the planner's are)
        return self.expert_read_ms * self.local_experts * (1.0 - self.expert_miss ** (tokens * self.expert_token_scale))

    def _context_units(self, kv_tokens: int | float, attention_pairs_x2: int | float) -> int | float:
        """delta K + epsilon A on the grid of ``_DEN`` units per ns."""
        return 2 * self.kv_read_fs_per_token * kv_tokens + self.attention_fs_per_pair * attention_pairs_x2

    def step_ms(self, decode_seqs: int | float, prefill_tokens: int | float = 0, swap_blocks: int = 0,
                kv_tokens: int | float = 0, attention_pairs: int | float = 0) -> float:
        """Duration of one step, ms. Padded sequences and tokens are passed in and cost like real ones;
        ``kv_tokens`` is K, ``attention_pairs`` is A (not doubled)."""
        if self.weights_ms is not None:
            memory = self.weights_ms + self.experts_ms(decode_seqs + prefill_tokens) + \
                self.kv_read_fs_per_token * kv_tokens / FS_PER_MS
            compute = self.beta_ms * decode_seqs
            side = np.maximum(memory, compute) if isinstance(memory, np.ndarray) or isinstance(compute, np.ndarray) \
                else max(memory, compute)
            return self.tau0_ms + side + self.gamma_ms * prefill_tokens + self.tier_of(decode_seqs + prefill_tokens) + \
                self.swap_ms_per_block * swap_blocks + self.attention_fs_per_pair * attention_pairs / FS_PER_MS
        base = self.tau0_ms + self.beta_ms * decode_seqs + self.gamma_ms * prefill_tokens + \
            self.swap_ms_per_block * swap_blocks + self.tier_of(decode_seqs + prefill_tokens)
        if self.expert_read_ms:
            base += self.experts_ms(decode_seqs + prefill_tokens)
        if not (self.kv_read_fs_per_token or self.attention_fs_per_pair):
            return base
        return base + self._context_units(kv_tokens, 2 * attention_pairs) / _DEN / 1e6

    def _base_ns(self, plan: StepPlan, extra_ms: float = 0.0) -> int:
        """The plan's step time without its context terms, on the clock's grid: drafts are verified like
        prefill tokens (gamma), and a feature's own time (``extra_ms``) is added before rounding. Under
        the roofline, without the max either."""
        tokens = plan.prefill_tokens + plan.padded_prefill_tokens + plan.draft_tokens
        if self.weights_ms is not None:
            ms = self.tau0_ms + self.gamma_ms * tokens + self.swap_ms_per_block * plan.swap_blocks
        else:  # step_ms's sum, written out (the hot path: a call fewer per plan)
            seqs = plan.decode_seqs + plan.padded_decode_seqs
            ms = self.tau0_ms + self.beta_ms * seqs + self.gamma_ms * tokens + self.swap_ms_per_block * plan.swap_blocks
            if self.expert_read_ms:
                ms += self.experts_ms(seqs + tokens)
        if self.tier_ms and self.tier_low < plan.decode_seqs + plan.padded_decode_seqs + tokens <= self.tier_high:
            ms += self.tier_ms
        if extra_ms:
            ms += extra_ms
        ns = int(ms * 1_000_000 + 0.5)  # clock.step_ns(ms), written out: this runs per plan
        return ns if ns > 0 else 1

    def _roofline_units(self, plan: StepPlan) -> tuple[int, int]:
        """The roofline's two sides on the grid of ``_DEN`` units per ns: memory (weights, the experts the
        plan's tokens read, delta K) and the decode matmuls (beta B)."""
        slots = plan.decode_seqs + plan.padded_decode_seqs
        tokens = slots + plan.prefill_tokens + plan.padded_prefill_tokens + plan.draft_tokens
        fixed_fs = round((self.weights_ms + self.experts_ms(tokens)) * FS_PER_MS)
        return 2 * (fixed_fs + self.kv_read_fs_per_token * plan.kv_tokens), 2 * round(self.beta_ms * FS_PER_MS) * slots

    def plan_ns_function(self) -> Callable[..., int]:
        """:meth:`plan_ns`, or, for a cost without the roofline whose steps read no context, the function
        it comes down to (the engine calls it per plan): ``_base_ns``, and for the plain sum (no experts,
        no tile switch) ``_base_ns`` with its coefficients bound, the same operations in the same order."""
        if self.weights_ms is not None or self.kv_read_fs_per_token or self.attention_fs_per_pair:
            return self.plan_ns
        if self.expert_read_ms or self.tier_ms:
            return self._base_ns
        tau0, beta, gamma, swap = self.tau0_ms, self.beta_ms, self.gamma_ms, self.swap_ms_per_block

        def linear_ns(plan: StepPlan) -> int:
            ms = tau0 + beta * (plan.decode_seqs + plan.padded_decode_seqs) + \
                gamma * (plan.prefill_tokens + plan.padded_prefill_tokens + plan.draft_tokens) + swap * plan.swap_blocks
            ns = int(ms * 1_000_000 + 0.5)
            return ns if ns > 0 else 1
        return linear_ns

    def plan_ns(self, plan: StepPlan, extra_ms: float = 0.0) -> int:
        """Duration of a planned step on the clock's grid, ns: its decodes and prefill tokens, padding
        included, swaps and the features' ``extra_ms``, rounded as ever, plus its context read and
        prefill attention rounded by themselves (half up); under the roofline, the max of its memory and
        decode terms with them."""
        base = self._base_ns(plan, extra_ms)
        if self.weights_ms is not None:
            memory, compute = self._roofline_units(plan)
            return base + (max(memory, compute) + self.attention_fs_per_pair * plan.attention_pairs_x2
                           + _DEN // 2) // _DEN
        if not (self.kv_read_fs_per_token or self.attention_fs_per_pair):
            return base
        return base + (self._context_units(plan.kv_tokens, plan.attention_pairs_x2) + _DEN // 2) // _DEN

    def run(self, plan: StepPlan, first_ns: int | None = None) -> StepRun:
        """The durations of repeats of ``plan``, a decode-only plan (a prefill never repeats): each
        repeat, every decode slot, padded ones included, reads one more cached token. ``first_ns``:
        ``plan_ns(plan)`` when the caller has it already."""
        if self.weights_ms is not None:
            return self._roofline_run(plan)
        if not self.kv_read_fs_per_token:
            return StepRun(self.plan_ns(plan) if first_ns is None else first_ns, _DEN // 2, 0)
        slots = plan.decode_seqs + plan.padded_decode_seqs
        return StepRun(self._base_ns(plan),
                       self._context_units(plan.kv_tokens, plan.attention_pairs_x2) + _DEN // 2,
                       2 * self.kv_read_fs_per_token * slots)

    def _roofline_run(self, plan: StepPlan) -> StepRun:
        """Repeats under the roofline: repeat i's memory side is ``memory + i * inc``, its compute side
        stays; the first ``switch`` repeats (those where compute is the larger) last alike, the rest grow."""
        base = self._base_ns(plan)
        memory, compute = self._roofline_units(plan)
        extra = self.attention_fs_per_pair * plan.attention_pairs_x2 + _DEN // 2
        inc = 2 * self.kv_read_fs_per_token * (plan.decode_seqs + plan.padded_decode_seqs)
        if memory >= compute:
            return StepRun(base, memory + extra, inc)
        flat_ns = base + (compute + extra) // _DEN
        if not inc:
            return StepRun(flat_ns, _DEN // 2, 0)
        switch = -(-(compute - memory) // inc)  # the first repeat whose memory side reaches compute
        return SwitchingRun(flat_ns, switch, base, memory + extra, inc)


def step_time_s(device: Device, decode_seqs: int | float, prefill_tokens: int | float = 0,
                kv_tokens: int | float = 0, attention_pairs: int | float = 0) -> float:
    """Duration of one engine step, s. Padded sequences and tokens are passed in and cost like real ones."""
    return LinearCost.of(device).step_ms(decode_seqs, prefill_tokens, 0, kv_tokens, attention_pairs) / 1e3


def work_s(device: Device, decode_seqs: int | float = 0, prefill_tokens: int | float = 0,
           kv_tokens: int | float = 0, attention_pairs: int | float = 0) -> float:
    """The work these sequences and tokens add to a step, s: the step time without its fixed cost tau0;
    under the decode roofline, over an empty step's (tau0 and the weights' stream)."""
    cost = LinearCost.of(device)
    if cost.weights_ms is not None:
        return (cost.step_ms(decode_seqs, prefill_tokens, 0, kv_tokens, attention_pairs) - cost.step_ms(0)) / 1e3
    without_tau0 = replace(cost, tau0_ms=0.0)
    return without_tau0.step_ms(decode_seqs, prefill_tokens, 0, kv_tokens, attention_pairs) / 1e3


def decode_throughput(device: Device, batch_size: int | float, context_tokens: float = 0.0) -> float:
    """Tokens/s of a saturated decode batch of ``batch_size`` sequences, each reading
    ``context_tokens`` of cached context: B / tau(B, K = B c)."""
    return batch_size / step_time_s(device, batch_size, 0, batch_size * context_tokens)


def _per_sequence_s(device: Device, context_tokens: float) -> float:
    """What each sequence of a large batch adds to its step, s: beta + delta c, or under the decode
    roofline the larger of beta and delta c (the weights shared out to nothing)."""
    if device.weights_ms is None:
        return work_s(device, 1, 0, context_tokens)
    return max(device.beta_ms, device.kv_read_ms_per_1k_tokens * context_tokens / 1e3) / 1e3


def roofline_tokens_per_s(device: Device, context_tokens: float = 0.0) -> float:
    """The limit of B / tau(B) as B grows, each sequence reading ``context_tokens``: 1 / (beta + delta c)
    (infinite when that is 0; under the decode roofline 1 / max(beta, delta c))."""
    per_sequence_s = _per_sequence_s(device, context_tokens)
    return math.inf if per_sequence_s == 0 else 1 / per_sequence_s


def batch_for_fraction(device: Device, fraction: float, context_tokens: float = 0.0) -> float:
    """Batch size at which B / tau(B) reaches ``fraction`` of the roofline: B = f tau0 / (b (1 - f)),
    b = beta + delta c the time of one more sequence reading ``context_tokens``; under the decode
    roofline, found by bisection (B / tau(B) rises with B)."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    per_sequence_s = _per_sequence_s(device, context_tokens)
    if per_sequence_s == 0:
        return math.inf
    if device.weights_ms is None:
        return fraction * device.tau0_s / (per_sequence_s * (1 - fraction))
    target = fraction / per_sequence_s
    lo, hi = 0.0, 1.0
    while decode_throughput(device, hi, context_tokens) < target:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if decode_throughput(device, mid, context_tokens) < target else (lo, mid)
    return hi
