"""``device``: what one engine step costs, a mixture of experts' reads, and speculative decoding.

A step takes ``tau0 + beta*B + gamma*P + delta*K + epsilon*A``, or with ``weights_ms`` the decode
roofline ``tau0 + max(weights + experts + delta*K, beta*B) + gamma*P + epsilon*A``
(:mod:`simbatch.model.cost`, the one place the formula lives). This section holds the five costs as the file gives them, or a
``preset`` naming a model and a GPU; it does not derive anything. Deriving the preset's costs for
the keys the file leaves out is resolution's work (:mod:`simbatch.inputs.resolve`), which records
where each cost came from. A section without a preset is already what the engine runs.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from simbatch.config.base import MAX_CONTEXT_COST_MS, CostMs, NonNegFloat, PosFloat, PosInt, _Model, seconds
from simbatch.config.cards import GpuCard, ModelCard

DEVICE_COSTS = ("tau0_ms", "beta_ms", "prefill_ms_per_token", "kv_read_ms_per_1k_tokens",
                "prefill_attention_ms_per_1m_pairs")
"""The five costs of a step (tau0, beta, gamma, delta, epsilon), as the device section names them."""

MAX_DRAFT_COST_FRACTION = 10.0
"""A drafter's pass at most ten times the target's step (a draft model is a fraction of the target's size)."""


class Speculative(_Model):
    """Speculative decoding (simbatch/features/speculative.py): a draft model proposes tokens, the target verifies them.

    Each decode step a decoding request verifies up to ``num_speculative_tokens`` drafted tokens; each
    draft is accepted with probability ``acceptance_rate``, independently, until the first rejection
    (or with a rate of the request's own, drawn once, with ``acceptance_rate_concentration``).
    The drafter's cost is ``draft_cost_ms`` per draft step, or ``draft_cost_fraction`` of the target's
    step time over the same sequences: exactly one of the two.
    """

    num_speculative_tokens: PosInt = Field(description="k: draft tokens proposed per request per step.")
    acceptance_rate: float = Field(
        ge=0, lt=1, description="alpha: probability that a draft token is accepted, given the ones before it were.")
    acceptance_rate_concentration: PosFloat | None = Field(
        default=None, description="Each request its own acceptance rate, drawn from a Beta distribution of mean "
        "acceptance_rate and this concentration (variance alpha (1 - alpha) / (1 + concentration)); null: "
        "every request has acceptance_rate.")
    draft_cost_ms: CostMs | None = Field(default=None, description="The drafter's time per draft step, ms.")
    draft_cost_fraction: NonNegFloat | None = Field(
        default=None, le=MAX_DRAFT_COST_FRACTION, description="The drafter's time per draft step as a fraction of the target's step time "
        "over the same sequences (tau0 + beta S + delta K: a draft model this much the target's size).")

    @model_validator(mode="after")
    def _one_cost(self) -> Speculative:
        if (self.draft_cost_ms is None) == (self.draft_cost_fraction is None):
            given = "both" if self.draft_cost_ms is not None else "neither"
            raise ValueError(f"draft_cost_ms and draft_cost_fraction: {given} given; set exactly one (ms per "
                             "draft step, or a fraction of the target's step time)")
        if self.acceptance_rate_concentration is not None and self.acceptance_rate == 0:
            raise ValueError("acceptance_rate_concentration with acceptance_rate 0: a Beta distribution of mean 0 "
                             "has no spread; remove acceptance_rate_concentration or raise acceptance_rate")
        return self




class MoE(_Model):
    """A mixture of experts' routed experts (simbatch/model/cost.py): a step whose T tokens each choose k of
    E experts reads the ``E (1 - (1 - k/E)^T)`` distinct ones they chose, not a fixed share."""

    num_experts: int = Field(gt=1, strict=True, description="E: routed experts per layer.")
    experts_per_token: PosInt = Field(description="k: experts each token is routed to.")
    local_experts: PosInt = Field(description="Of the E, those one GPU reads from: all (a tensor-parallel slice of "
                                  "each) without expert parallelism, E / ep with it.")
    expert_read_ms: NonNegFloat = Field(
        le=MAX_CONTEXT_COST_MS, description="Time to stream one local expert (its slice) through every MoE layer, ms.")
    data_parallel_size: PosInt = Field(default=1, description="Data-parallel attention ranks whose tokens reach "
                                       "each GPU's experts (vLLM --data-parallel-size with --enable-expert-parallel); "
                                       "the step's tokens count this many times, and this many consecutive replicas "
                                       "are the ranks of one engine, stepping in lockstep.")

    @model_validator(mode="after")
    def _counts(self) -> MoE:
        if self.experts_per_token > self.num_experts or self.local_experts > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) and local_experts ({self.local_experts}) "
                             f"are at most num_experts ({self.num_experts})")
        return self


class Device(_Model):
    """The cost model (simbatch/model/cost.py): one engine step takes tau0 + beta*B + gamma*P + delta*K + epsilon*A.

    B decoding sequences, P prefill tokens, K the KV tokens the step reads, A the prefill attention
    pairs (docs/concepts.md). ``preset`` derives all five from a model and a GPU (docs/hardware.md);
    a key given beside it overrides the preset's value.
    """

    tau0_ms: CostMs = Field(default=20.0, description="Fixed cost of a step (streaming the weights), ms.")
    beta_ms: CostMs = Field(default=0.2, description="Marginal cost per decoding sequence, ms.")
    prefill_ms_per_token: CostMs = Field(default=0.0, description="Cost per prefill token, ms.")
    kv_read_ms_per_1k_tokens: NonNegFloat = Field(
        default=0.0, le=MAX_CONTEXT_COST_MS,
        description="delta: cost of reading 1,000 cached KV tokens (every scheduled request reads its "
        "whole context each step), ms; 0 makes step time independent of context.")
    prefill_attention_ms_per_1m_pairs: NonNegFloat = Field(
        default=0.0, le=MAX_CONTEXT_COST_MS,
        description="epsilon: prefill attention compute per 1,000,000 (query, key) token pairs, ms; a "
        "chunk of c tokens after k cached has c * (k + c / 2) pairs.")
    weights_ms: NonNegFloat | None = Field(
        default=None, le=MAX_CONTEXT_COST_MS,
        description="The weights' stream per step, ms: given, a step is tau0 + max(weights_ms + experts + delta K, "
        "beta B) + gamma P + epsilon A (the decode roofline: decode matmuls hide under the memory traffic, tau0 "
        "the overheads alone); omitted, every cost adds. Presets set it, unless tau0_ms is given.")
    gemm_tier_tokens: tuple[PosInt, PosInt] | None = Field(
        default=None,
        description="[low, high]: a step of more than low and at most high tokens (decodes, prompt tokens and "
        "drafts, padded ones too) runs its matrix multiplies with a wider kernel tile, which streams the weights "
        "more slowly: vLLM's CUTLASS fp8 GEMM on Hopper (scaled_mm_sm90_fp8_dispatch) uses its 64x64 tile for "
        "16 < M <= 64, so [16, 64]; above high a step's prompt tokens dominate (prefill_ms_per_token); omitted, "
        "no switch.")
    gemm_tier_ms: NonNegFloat = Field(
        default=0.0, le=MAX_CONTEXT_COST_MS,
        description="What a step inside the gemm_tier_tokens window costs more, ms (simbatch calibrate fits it).")
    preset: str | None = Field(
        default=None, description="<model>/<gpu>[/tpN][/epN][/fp8], e.g. llama-3.1-8b/H100-SXM/tp2: the costs "
        "above from public specs (`simbatch presets` lists the names); keys given here override it.")
    gpu_card: GpuCard | None = Field(default=None, description="Your own GPU card, named in `preset` "
                                     "(docs/hardware.md).")
    model_card: ModelCard | None = Field(default=None, description="Your own model card, named in `preset`.")
    speculative: Speculative | None = Field(
        default=None, description="Speculative decoding: k drafts per decode step, each accepted with probability "
        "alpha (continuous batching only; docs/concepts.md).")
    moe: MoE | None = Field(default=None, description="A mixture of experts' routed experts, read as the step's "
                            "tokens choose them; from the preset of a MoE model when omitted.")

    # The model runs in seconds: the settings in s, converted here and nowhere else (see ``seconds``).
    @property
    def tau0_s(self) -> float:
        return seconds(self.tau0_ms)

    @property
    def beta_s(self) -> float:
        return seconds(self.beta_ms)

    @property
    def prefill_s_per_token(self) -> float:
        return seconds(self.prefill_ms_per_token)

    @model_validator(mode="after")
    def _positive_step(self) -> Device:
        # A preset's own step is never free; the costs given beside it are checked here as given.
        if self.preset is None and (self.gpu_card is not None or self.model_card is not None):
            raise ValueError("gpu_card/model_card are used by a preset only; set device.preset to "
                             "<model>/<gpu> naming them, or remove them")
        if self.preset is not None:
            self._cards_named()
        if self.tau0_ms == 0 and self.beta_ms == 0:
            raise ValueError("tau0_ms and beta_ms are both 0: a step would take no time")
        if self.gemm_tier_tokens is not None and not self.gemm_tier_tokens[0] < self.gemm_tier_tokens[1] <= 1_000_000:
            raise ValueError(f"gemm_tier_tokens {list(self.gemm_tier_tokens)}: expected [low, high] with low < high "
                             "<= 1,000,000, e.g. [16, 64]")
        return self

    def _cards_named(self) -> None:
        """An inline card is used only when the preset names it: one it does not name would be ignored."""
        parts = self.preset.strip().split("/")
        for key, card, part, what in (("gpu_card", self.gpu_card, parts[1:2], "GPU"),
                                      ("model_card", self.model_card, parts[:1], "model")):
            if card is not None and [p.lower() for p in part] != [card.name.lower()]:
                named = part[0] if part else "none"
                raise ValueError(f"{key} {card.name!r} is not the {what} the preset names ({named!r}), so it would be "
                                 f"ignored; name it in device.preset, or remove {key}")
