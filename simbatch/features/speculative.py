"""Speculative decoding: a cheap drafter guesses tokens, the target model checks them in one step.

Each decode step, a decoding request proposes ``d`` draft tokens (``d`` at most
``device.speculative.num_speculative_tokens`` = k) and the target computes ``1 + d`` tokens for it:
the token sampled last step and the drafts, out of the step's token budget and with KV slots
reserved for all of them, as vLLM does. Verification accepts the drafts up to the first rejection,
A of them, and the request emits ``A + 1`` tokens (the accepted drafts and the target's own token at
the first mismatch, or the bonus token after the last draft). ``num_computed_tokens`` advances by
``A + 1``; the rejected drafts' slots are rolled back, their blocks kept by the request for the
tokens that come next (vLLM frees none either).

The drafts a request proposes, ``d = min(k, tokens it still needs - 1, budget)``: never a draft
past its last token, so the KV a request reaches is never more than without speculation; and never
so many that a later decode of the same step loses its verified token to the budget.

Acceptance. Each draft is accepted with probability alpha (``acceptance_rate``), independently of
the others, so ``P(A >= j) = alpha^j`` for ``j <= d``: A is a geometric count truncated at ``d``, and
with ``d = k`` the expected tokens per step is ``(1 - alpha^(k+1)) / (1 - alpha)`` (Leviathan et al.,
2023). The counts come from a stream of the request's own (:class:`AcceptanceStream`, seeded by the
scenario's seed and the request's id), so they do not depend on which engine runs it, on the order
in which requests are stepped, or on the other requests. With ``acceptance_rate_concentration`` each
request first draws its own alpha from a Beta distribution of mean ``acceptance_rate`` (easy and hard
prompts), and a run then averages fewer tokens per step than E(alpha) (:func:`tokens_per_step`).

Cost (:meth:`simbatch.model.cost.LinearCost.plan_ns`). The target verifies a request's ``1 + d`` tokens as
one decode sequence (``beta``, reading its context once: ``delta K``) plus ``d`` drafts costed at
``gamma``, the prefill rate: each draft is one more row through the weight matmuls, which is what a
prefill token is, while the weights and the KV are read once for all of them. The drafter runs
``max d`` sequential passes over the speculating sequences, each ``draft_cost_ms``, or
``draft_cost_fraction`` times the target's decode step over them (``tau0 + beta S + delta K_S``).
So speculation multiplies tokens per step by up to ``E`` for a small extra step time at small batch,
where ``tau0`` dominates, and loses once the drafts' ``gamma k B`` outweighs what they bring.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simbatch.config import Scenario, Speculative
from simbatch.features import Feature, register
from simbatch.features import prefix_caching as _registered_before  # noqa: F401  (registration order is fixed)
from simbatch.model import streams
from simbatch.model.cost import LinearCost

if TYPE_CHECKING:
    import pandas as pd

    from simbatch.model.request import Request
    from simbatch.model.step import StepPlan

_BATCH = 64  # draws fetched from a request's generator at a time


def expected_tokens_per_step(k: int, alpha):
    """E[A + 1] for k drafts, each accepted with probability alpha (a number or an array in [0, 1)):
    1 + alpha + ... + alpha^k, in closed form (1 - alpha^(k+1)) / (1 - alpha), so that any k costs the
    same. ``-expm1((k + 1) log alpha)`` is 1 - alpha^(k+1) without the cancellation near alpha = 1."""
    a = np.asarray(alpha, dtype=np.float64)
    # log 0 = -inf: alpha = 0 gives 1 - 0 = 1 token, as it should; at alpha = 1 (a quadrature node at the
    # end of [0, 1]) the limit, k + 1.
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a == 1.0, k + 1.0, -np.expm1((k + 1) * np.log(a)) / (1 - a))
    return float(out) if out.ndim == 0 else out


def tokens_per_step(spec: Speculative) -> float:
    """The tokens per speculating step a long run of equal-length requests averages (total tokens over
    total steps): E(alpha) above with one acceptance rate. With a rate of each request's own, drawn
    from Beta(c alpha, c (1 - alpha)), a request emits its tokens in 1 / E(alpha_i) steps each, so the
    run averages the harmonic mean 1 / E[1 / E(alpha_i)], below E(alpha) (the requests that accept
    little take more of the steps). The same figure turns a step's cost into a token's."""
    k, alpha, c = spec.num_speculative_tokens, spec.acceptance_rate, spec.acceptance_rate_concentration
    if c is None:
        return expected_tokens_per_step(k, alpha)
    # E[1 / E(alpha_i)] by Gauss-Jacobi quadrature, whose weight on [-1, 1] is the Beta density's with
    # alpha = (1 + x) / 2: exact for polynomials of degree < 128, and 1 / E is smooth and bounded.
    # A Beta parameter below ~1e-16 would round the Jacobi exponent to -1, where the weight is not
    # integrable; that close to 0 the law is a point mass at its end of [0, 1] whichever tiny value it
    # has, so 1e-12 stands for every smaller one (numpy's own Beta draws are then 0 or 1 exactly).
    x, w = _gauss_jacobi(64, max(c * (1 - alpha), 1e-12) - 1, max(c * alpha, 1e-12) - 1)
    return float(1.0 / (w @ (1.0 / expected_tokens_per_step(k, (1 + x) / 2))))


def _gauss_jacobi(n: int, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """Nodes in [-1, 1] and weights summing to 1 of the n-point Gauss rule for the weight
    (1 - x)^a (1 + x)^b, by Golub and Welsch: the eigenvalues of the Jacobi matrix of the monic
    Jacobi polynomials' recurrence, and the squared first components of its eigenvectors.

    Normalised, the weights need no total mass 2^(a+b+1) B(a+1, b+1), which overflows for a Beta of
    concentration above ~1,000 (scipy's roots_jacobi then gives infinite weights); rounding may put a
    node a hair outside [-1, 1], so the nodes are clipped."""
    from scipy.linalg import eigh_tridiagonal  # only a spread needs it

    i = np.arange(1, n, dtype=np.float64)
    s = 2 * i + a + b  # 2i + a + b for i = 1 .. n-1
    diag = np.empty(n)
    diag[0] = (b - a) / (a + b + 2)
    diag[1:] = (b * b - a * a) / (s * (s + 2))
    off2 = np.empty(n - 1)
    off2[0] = 4 * (1 + a) * (1 + b) / ((2 + a + b) ** 2 * (3 + a + b))  # i = 1, its 0/0 at a + b = -1 cancelled
    j, t = i[1:], s[1:]
    off2[1:] = 4 * j * (j + a) * (j + b) * (j + a + b) / (t * t * (t + 1) * (t - 1))
    nodes, vectors = eigh_tridiagonal(diag, np.sqrt(off2))
    weights = vectors[0] ** 2
    return np.clip(nodes, -1.0, 1.0), weights / weights.sum()


class AcceptanceStream:
    """One request's accepted-draft counts, step after step: G with P(G >= j) = alpha^j, untruncated
    (the scheduler caps each by the drafts it proposed). Drawn from the request's own generator,
    ``streams.rng(seed, SPECULATIVE, request_id)``, a batch at a time; with a ``concentration``, its
    first draw is the request's own alpha, from Beta(c alpha, c (1 - alpha))."""

    __slots__ = ("_rng", "_p", "_draws", "_at", "alpha")

    def __init__(self, seed: int, request_id: int, alpha: float, concentration: float | None = None):
        self._rng = streams.rng(seed, streams.SPECULATIVE, request_id)
        if concentration is not None:
            # Below 1 however close a draw comes: numpy's geometric needs a rejection probability > 0.
            a, b = concentration * alpha, concentration * (1 - alpha)
            # A parameter that underflows to 0 makes the law the point mass at that end of [0, 1]
            # (as tokens_per_step takes it); numpy refuses it.
            alpha = min(0.0 if a <= 0 else 1.0 if b <= 0 else float(self._rng.beta(a, b)), 1 - 1e-12)
        self.alpha = alpha
        self._p = 1.0 - alpha  # numpy's geometric counts trials up to the first rejection, from 1
        self._draws: list[int] = []
        self._at = 0

    def next(self) -> int:
        if self._at == len(self._draws):
            self._draws = (self._rng.geometric(self._p, size=_BATCH) - 1).tolist()
            self._at = 0
        self._at += 1
        return self._draws[self._at - 1]


def drafter_ms(cost: LinearCost, spec: Speculative, draft_steps: int | float, seqs: int | float,
               kv_tokens: int | float = 0) -> float:
    """The drafter's time in a step, ms: ``draft_steps`` sequential passes over ``seqs`` speculating
    sequences reading ``kv_tokens`` of context, each ``draft_cost_ms``, or ``draft_cost_fraction`` of
    the target's decode step over them."""
    if not draft_steps:
        return 0.0
    per_pass = spec.draft_cost_ms or 0.0
    if spec.draft_cost_fraction:
        per_pass += spec.draft_cost_fraction * cost.step_ms(seqs, 0, 0, kv_tokens)
    return draft_steps * per_pass


def step_ms(cost: LinearCost, batch_size: float, k: int, context_tokens: float = 0.0,
            spec: Speculative | None = None) -> float:
    """A decode step of ``batch_size`` sequences, each reading ``context_tokens`` and verifying ``k``
    drafts (``k = 0``: no speculation) with ``spec``'s drafter, ms: the cost model's plan cost, in closed form."""
    kv = batch_size * context_tokens
    drafter = drafter_ms(cost, spec, k, batch_size, kv) if k and spec is not None else 0.0
    return cost.step_ms(batch_size, batch_size * k, 0, kv) + drafter


def speedup(cost: LinearCost, spec: Speculative, batch_size: float, context_tokens: float = 0.0) -> float:
    """Decode throughput with speculation over without, at ``batch_size`` saturated decodes:
    E tau(B) / tau_spec(B), E the run's tokens per step (:func:`tokens_per_step`)."""
    return tokens_per_step(spec) * step_ms(cost, batch_size, 0, context_tokens) / \
        step_ms(cost, batch_size, spec.num_speculative_tokens, context_tokens, spec)


@register
class SpeculativeDecoding(Feature):
    """``device.speculative``: each decode verifies up to k drafts and keeps those accepted (module docstring)."""

    name = "speculative_decoding"
    description = "A drafter proposes k tokens per decode, the target verifies them in one step."
    switch = "device.speculative"
    repeatable = False  # each step accepts a random number of drafts: no two are alike
    columns = (("num_drafts", "int32"), ("num_draft_tokens", "int64"), ("num_accepted_tokens", "int64"))

    def __init__(self, scenario: Scenario):
        super().__init__(scenario)
        self.spec = spec = scenario.device.speculative
        self.k = spec.num_speculative_tokens
        self.cost = LinearCost.of(scenario.device)

    @staticmethod
    def enabled(scenario: Scenario) -> bool:
        return scenario.device.speculative is not None

    def decode_tokens(self, req: Request, spare: int) -> int:
        """Its drafts: no more than k, than it still needs beyond the token it computes, or than ``spare``."""
        return max(0, min(self.k, req.output_tokens - req.num_generated - 1, spare))

    def applied(self, req: Request, n: int) -> int:
        """Its own token and the drafts it accepts, from its own stream; counted as vLLM counts them."""
        if req.acceptance is None:
            req.acceptance = AcceptanceStream(self.scenario.seed, req.request_id, self.spec.acceptance_rate,
                                              self.spec.acceptance_rate_concentration)
        drafts = n - 1
        accepted = min(req.acceptance.next(), drafts)
        req.num_drafts += 1
        req.num_draft_tokens += drafts
        req.num_accepted_tokens += accepted
        return 1 + accepted  # the rejected drafts' slots roll back

    def step_ms(self, plan: StepPlan) -> float:
        """The drafter: as many sequential passes as the most drafts any decode of the step has, over the
        speculating decodes and their context."""
        steps = seqs = kv = 0
        for req, n in plan.slices:
            if not req.prefill_pending:
                steps, seqs, kv = max(steps, n - 1), seqs + 1, kv + req.num_computed_tokens
        return drafter_ms(self.cost, self.spec, steps, seqs, kv)

    @staticmethod
    def summary(requests: pd.DataFrame) -> dict[str, float]:
        """vLLM's ``spec_decode_*`` keys, as ``vllm bench serve`` writes them, over every request: the steps
        that verified drafts, the drafts verified and those accepted, the acceptance rate in percent
        (100 accepted / drafts verified) and the acceptance length (1 + accepted / steps)."""
        drafts = int(requests["num_drafts"].sum())
        draft_tokens = int(requests["num_draft_tokens"].sum())
        accepted = int(requests["num_accepted_tokens"].sum())
        return {"spec_decode_num_drafts": drafts, "spec_decode_draft_tokens": draft_tokens,
                "spec_decode_accepted_tokens": accepted,
                "spec_decode_acceptance_rate": 100 * accepted / draft_tokens if draft_tokens else math.nan,
                "spec_decode_acceptance_length": 1 + accepted / drafts if drafts else math.nan}
