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

All times here are in seconds unless a name says ``_ms`` or ``_ns``; the scenario speaks milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from simbatch.config import Device
from simbatch.model.clock import step_ns

if TYPE_CHECKING:
    from simbatch.schedulers.base import StepPlan

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

    @classmethod
    def of(cls, device: Device, swap_ms_per_block: float = 0.0) -> LinearCost:
        return cls(device.tau0_ms, device.beta_ms, device.prefill_ms_per_token, swap_ms_per_block,
                   round(device.kv_read_ms_per_1k_tokens * FS_PER_MS / 1e3),
                   round(device.prefill_attention_ms_per_1m_pairs * FS_PER_MS / 1e6))

    def _context_units(self, kv_tokens: int | float, attention_pairs_x2: int | float) -> int | float:
        """delta K + epsilon A on the grid of ``_DEN`` units per ns."""
        return 2 * self.kv_read_fs_per_token * kv_tokens + self.attention_fs_per_pair * attention_pairs_x2

    def step_ms(self, decode_seqs: int | float, prefill_tokens: int | float = 0, swap_blocks: int = 0,
                kv_tokens: int | float = 0, attention_pairs: int | float = 0) -> float:
        """Duration of one step, ms. Padded sequences and tokens are passed in and cost like real ones;
        ``kv_tokens`` is K, ``attention_pairs`` is A (not doubled)."""
        base = self.tau0_ms + self.beta_ms * decode_seqs + self.gamma_ms * prefill_tokens + \
            self.swap_ms_per_block * swap_blocks
        if not (self.kv_read_fs_per_token or self.attention_fs_per_pair):
            return base
        return base + self._context_units(kv_tokens, 2 * attention_pairs) / _DEN / 1e6

    def _base_ns(self, plan: StepPlan, extra_ms: float = 0.0) -> int:
        """The plan's step time without its context terms, on the clock's grid: drafts are verified like
        prefill tokens (gamma), and a feature's own time (``extra_ms``) is added before rounding."""
        ms = self.step_ms(plan.decode_seqs + plan.padded_decode_seqs,
                          plan.prefill_tokens + plan.padded_prefill_tokens + plan.draft_tokens, plan.swap_blocks)
        if extra_ms:
            ms += extra_ms
        return step_ns(ms)

    def plan_ns(self, plan: StepPlan, extra_ms: float = 0.0) -> int:
        """Duration of a planned step on the clock's grid, ns: its decodes and prefill tokens, padding
        included, swaps and the features' ``extra_ms``, rounded as ever, plus its context read and
        prefill attention rounded by themselves (half up)."""
        base = self._base_ns(plan, extra_ms)
        if not (self.kv_read_fs_per_token or self.attention_fs_per_pair):
            return base
        return base + (self._context_units(plan.kv_tokens, plan.attention_pairs_x2) + _DEN // 2) // _DEN

    def run(self, plan: StepPlan, first_ns: int | None = None) -> StepRun:
        """The durations of repeats of ``plan``, a decode-only plan (a prefill never repeats): each
        repeat, every decode slot, padded ones included, reads one more cached token. ``first_ns``:
        ``plan_ns(plan)`` when the caller has it already."""
        if not self.kv_read_fs_per_token:
            return StepRun(self.plan_ns(plan) if first_ns is None else first_ns, _DEN // 2, 0)
        slots = plan.decode_seqs + plan.padded_decode_seqs
        return StepRun(self._base_ns(plan),
                       self._context_units(plan.kv_tokens, plan.attention_pairs_x2) + _DEN // 2,
                       2 * self.kv_read_fs_per_token * slots)


def step_time_s(device: Device, decode_seqs: int | float, prefill_tokens: int | float = 0,
                kv_tokens: int | float = 0, attention_pairs: int | float = 0) -> float:
    """Duration of one engine step, s. Padded sequences and tokens are passed in and cost like real ones."""
    return LinearCost.of(device).step_ms(decode_seqs, prefill_tokens, 0, kv_tokens, attention_pairs) / 1e3


def work_s(device: Device, decode_seqs: int | float = 0, prefill_tokens: int | float = 0,
           kv_tokens: int | float = 0, attention_pairs: int | float = 0) -> float:
    """The step time without its fixed cost tau0, s: the work these sequences and tokens add to a step."""
    without_tau0 = replace(LinearCost.of(device), tau0_ms=0.0)
    return without_tau0.step_ms(decode_seqs, prefill_tokens, 0, kv_tokens, attention_pairs) / 1e3


def decode_throughput(device: Device, batch_size: int | float, context_tokens: float = 0.0) -> float:
    """Tokens/s of a saturated decode batch of ``batch_size`` sequences, each reading
    ``context_tokens`` of cached context: B / tau(B, K = B c)."""
    return batch_size / step_time_s(device, batch_size, 0, batch_size * context_tokens)


def roofline_tokens_per_s(device: Device, context_tokens: float = 0.0) -> float:
    """The limit of B / tau(B) as B grows, each sequence reading ``context_tokens``: 1 / (beta + delta c)
    (infinite when that is 0)."""
    per_sequence_s = work_s(device, 1, 0, context_tokens)
    return math.inf if per_sequence_s == 0 else 1 / per_sequence_s


def batch_for_fraction(device: Device, fraction: float, context_tokens: float = 0.0) -> float:
    """Batch size at which B / tau(B) reaches ``fraction`` of the roofline: B = f tau0 / (b (1 - f)),
    b = beta + delta c the time of one more sequence reading ``context_tokens``."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    per_sequence_s = work_s(device, 1, 0, context_tokens)
    if per_sequence_s == 0:
        return math.inf
    return fraction * device.tau0_s / (per_sequence_s * (1 - fraction))
