"""The scenario: one pydantic model that every YAML file maps onto 1:1.

Every knob of the simulator lives here, with its unit in its name and its default in one place.
Models forbid unknown keys, so a typo in a scenario is an error, never a silent default.
``docs/scenarios.md`` is generated from these models.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from simbatch.hardware.cards import GpuCard, ModelCard

MAX_TOKENS = 10_000_000
"""The longest prompt or output a length may have: ten times the longest context windows there are.
A larger value is a typo (an exponent too many), and would make every figure derived from it absurd."""

MAX_RATE = 1e6
"""The highest finite arrival rate, requests/s: a thousand times a large fleet's; above it, a typo."""

PosInt = Annotated[int, Field(gt=0, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, strict=True)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, strict=True)]
MeanTokens = Annotated[float, Field(gt=0, le=MAX_TOKENS)]


def seconds(ms: float | None) -> float | None:
    """A setting in ms, as the model reads it: in seconds. Scenario files speak milliseconds, the model
    runs in seconds; the sections' ``*_s`` properties are the one place where one becomes the other."""
    return None if ms is None else ms / 1e3


class _Model(BaseModel):
    # Every number is finite: an infinity or NaN is a typo that would surface much later, in a plot
    # or a verdict. The one setting where infinity means something (rate: inf) says so itself.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- lengths
class Fixed(_Model):
    """Every request has the same length."""

    dist: Literal["fixed"] = "fixed"
    value: Tokens = Field(description="The length, in tokens.")


class Uniform(_Model):
    """Integer lengths uniform on [low, high], both ends included."""

    dist: Literal["uniform"]
    low: Tokens = Field(description="Smallest length, tokens.")
    high: Tokens = Field(description="Largest length, tokens.")

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


class Choice(_Model):
    """A weighted choice among listed lengths."""

    dist: Literal["choice"]
    values: list[Tokens] = Field(min_length=1, description="The possible lengths, tokens.")
    weights: list[PosFloat] | None = Field(
        default=None, description="Relative weights, one per value; equal when omitted."
    )

    @model_validator(mode="after")
    def _same_length(self) -> Choice:
        if self.weights is not None and len(self.weights) != len(self.values):
            raise ValueError(f"weights has {len(self.weights)} entries but values has {len(self.values)}")
        return self


class Exponential(_Model):
    """Geometric-like heavy tail: ceil of an exponential draw with this mean, optionally capped."""

    dist: Literal["exponential"]
    mean: MeanTokens = Field(description="Mean of the underlying exponential, tokens.")
    max: Tokens | None = Field(default=None, description="Cap, tokens (lengths above it are clipped).")


class LogNormal(_Model):
    """Lognormal lengths with the given mean; sigma is the std of log-length."""

    dist: Literal["lognormal"]
    mean: MeanTokens = Field(description="Mean length, tokens (before rounding and capping).")
    sigma: PosFloat = Field(description="Standard deviation of log(length).")
    max: Tokens | None = Field(default=None, description="Cap, tokens.")


class Zipf(_Model):
    """Bounded Zipf: P(k) proportional to k**-a on min..max."""

    dist: Literal["zipf"]
    a: PosFloat = Field(description="Exponent.")
    min: Tokens = Field(default=1, description="Smallest length, tokens.")
    max: Tokens = Field(description="Largest length, tokens.")

    @model_validator(mode="after")
    def _ordered(self) -> Zipf:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self


class Empirical(_Model):
    """Resample (with replacement) a column of a CSV file; the path is relative to the scenario file.

    When a workload's (or a class's) prompt and output lengths both resample the same file, each
    request takes both from one row: observed (prompt, output) pairs, their correlation kept.
    """

    dist: Literal["empirical"]
    path: Path = Field(description="CSV file.")
    column: str = Field(description="Column holding positive integer lengths.")
    max: Tokens | None = Field(default=None, description="Cap, tokens (lengths above it are clipped).")


class Random(_Model):
    """``vllm bench serve --dataset-name random``: integers uniform on [floor(len (1 - r)), ceil(len (1 + r))].

    ``len`` is ``--random-input-len`` (or ``--random-output-len``), ``range_ratio`` is
    ``--random-range-ratio``; 0 makes every request exactly ``len`` tokens.
    """

    dist: Literal["random"]
    len: PosInt = Field(description="Centre of the range, tokens (vLLM's --random-input-len / --random-output-len).")
    range_ratio: float = Field(default=0.0, ge=0, lt=1, description="Half-width of the range as a fraction of len "
                               "(vLLM's --random-range-ratio), in [0, 1).")


class DatasetShape(_Model):
    """``dist: sharegpt``, ``azure-conv`` or ``azure-code``: a lognormal fitted to that dataset's lengths.

    The field decides which: under ``prompt_tokens`` the prompt fit, under ``output_tokens`` the
    output fit. The parameters (no data) are in :mod:`simbatch.workload.shapes`, with their sources.
    """

    dist: Literal["sharegpt", "azure-conv", "azure-code"]


DATASET_SHAPES: tuple[str, ...] = get_args(DatasetShape.model_fields["dist"].annotation)

LengthDist = Annotated[
    Fixed | Uniform | Choice | Exponential | LogNormal | Zipf | Empirical | Random | DatasetShape,
    Field(discriminator="dist"),
]


# --------------------------------------------------------------------------- workload
class Arrival(_Model):
    """When requests arrive."""

    process: Literal["poisson", "gamma", "constant"] = Field(
        default="poisson",
        description="poisson: exponential gaps; gamma: gamma gaps with shape `burstiness` "
        "(CV = 1/sqrt(burstiness), as in `vllm bench serve`); constant: equal gaps.",
    )
    rate: float = Field(default=1.0, gt=0, allow_inf_nan=True,
                        description="Mean arrival rate, requests/s; `inf` sends all at t=0.")
    burstiness: PosFloat = Field(
        default=1.0, description="Gamma shape; 1 is Poisson, <1 burstier, >1 smoother (gamma only)."
    )

    @field_validator("rate")
    @classmethod
    def _plausible(cls, rate: float) -> float:
        if math.isnan(rate):
            raise ValueError("rate is NaN; give requests/s, or inf to send every request at t=0")
        if math.isfinite(rate) and rate > MAX_RATE:
            raise ValueError(f"rate {rate:.3g} requests/s is beyond any fleet (at most {MAX_RATE:,.0f}); "
                             "use inf to send every request at t=0")
        return rate


class RequestClass(_Model):
    """One class of traffic in a mixture: a tenant with its priority and, optionally, its own lengths."""

    name: str = Field(description="Tenant name (fair policy, requests frame); classes sharing a name are one tenant.")
    share: PosFloat = Field(default=1.0, description="Relative share of arrivals.")
    priority: int = Field(default=0, description="Lower is served first under the `priority` policy.")
    prompt_tokens: LengthDist | None = Field(default=None, description="Overrides workload.prompt_tokens.")
    output_tokens: LengthDist | None = Field(default=None, description="Overrides workload.output_tokens.")


class Trace(_Model):
    """Replay a CSV trace: one row per request with an arrival timestamp and token counts."""

    path: Path = Field(description="CSV file; relative paths are resolved against the scenario file.")
    time_scale: PosFloat = Field(
        default=1.0, description="Multiplies every inter-arrival gap (2.0 halves the rate)."
    )
    timestamp_column: str = Field(
        default="TIMESTAMP", description="Arrival time: seconds, or date-times (offsets from the first row)."
    )
    prompt_column: str = Field(default="ContextTokens", description="Prompt length column, tokens.")
    output_column: str = Field(default="GeneratedTokens", description="Output length column, tokens.")
    priority_column: str | None = Field(
        default=None, description="Per-request priority (whole numbers, lower is served first); "
        "replaces the priorities classes assign."
    )
    tenant_column: str | None = Field(
        default=None, description="Per-request tenant name; replaces classes (leave `classes` out)."
    )
    keep_time_origin: bool = Field(
        default=False, description="false: the first arrival is at t = 0. true: times as the trace gives "
        "them: numbers as seconds from t = 0, date-times as seconds from midnight (UTC) of the first row's day."
    )


class ClosedLoop(_Model):
    """A closed-loop client: ``concurrency`` users, each sending its next request when its previous one ends.

    As GenAI-Perf's ``--concurrency`` and GuideLLM's concurrent profile: the load is set by the
    number of users, not by a rate, so requests have no intended arrival times (no client wait).
    """

    concurrency: PosInt = Field(description="Users, each with at most one request in flight.")
    think_time_s: NonNegFloat = Field(
        default=0.0, description="A user's pause between a response ending and its next request, s.")


class Prefix(_Model):
    """What requests' prompts have in common, for prefix caching (``kv_cache.enable_prefix_caching``).

    A shared system prompt: a share of the requests, drawn at random, start with the same
    ``shared_tokens`` tokens, prepended to the prompt the lengths section draws. Multi-turn sessions:
    each request of a session continues its conversation, its prompt the conversation so far (every
    earlier turn's prompt and output) followed by the new tokens the lengths section draws; a
    conversation that would pass ``max_context_tokens`` starts over.
    """

    shared_tokens: NonNegInt = Field(default=0, description="Tokens of the shared system prompt.")
    share: float = Field(default=1.0, ge=0, le=1, description="Share of requests that start with it.")
    multi_turn: bool = Field(
        default=False, description="Each request continues its session's conversation (needs workload.num_sessions).")
    max_context_tokens: PosInt = Field(
        default=32_768, description="A conversation whose next turn (prompt and output) would pass this starts over.")


class Workload(_Model):
    """The traffic: arrivals and lengths, or a trace. Drawn from seeded streams independent of the mode."""

    num_requests: PosInt | None = Field(
        default=None, description="Stop after this many arrivals (a trace: replay its first N rows)."
    )
    duration_s: PosFloat | None = Field(default=None, description="Stop arrivals after this much time, s.")
    arrival: Arrival | None = Field(default_factory=Arrival,
                                    description="When requests arrive; null with closed_loop, whose users send instead.")
    prompt_tokens: LengthDist = Field(default_factory=lambda: Fixed(value=128),
                                      description="Prompt lengths: the prefill work and the KV held on admission.")
    output_tokens: LengthDist = Field(default_factory=lambda: Fixed(value=128),
                                      description="Output lengths: decode steps a request occupies a slot.")
    classes: list[RequestClass] | None = Field(
        default=None, description="A mixture of tenants/priorities; one anonymous class when omitted."
    )
    trace: Trace | None = Field(default=None, description="Replay a trace instead of synthetic traffic.")
    num_sessions: PosInt | None = Field(
        default=None, description="Draw each request's session id uniformly from this many sessions "
        "(for `cluster.router: session_affinity`); every request is its own session when omitted."
    )
    max_concurrency: PosInt | None = Field(
        default=None, description="Client-side cap on requests in flight (vLLM's --max-concurrency): a "
        "request whose arrival finds this many in flight waits at the client (`client_wait_s`) and is "
        "sent when one completes or is rejected; its TTFT and E2EL count from the send."
    )
    closed_loop: ClosedLoop | None = Field(
        default=None, description="Closed-loop users instead of an arrival process (set arrival to null): "
        "num_requests is the total they send, duration_s (if set) stops them sending."
    )
    prefix: Prefix | None = Field(
        default=None, description="Shared system prompt and multi-turn conversations (what prefix caching reuses)."
    )

    @model_validator(mode="after")
    def _bounded(self) -> Workload:
        if self.trace is not None:
            ignored = [k for k in ("arrival", "prompt_tokens", "output_tokens") if k in self.model_fields_set]
            ignored += [f"classes.{i}.{k}" for i, c in enumerate(self.classes or [])
                        for k in ("prompt_tokens", "output_tokens") if getattr(c, k) is not None]
            if ignored:
                raise ValueError(f"{', '.join(ignored)} would be ignored: a trace gives arrival times and "
                                 "lengths; remove them or remove the trace")
            if self.trace.tenant_column is not None and self.classes:
                raise ValueError("classes would be ignored: trace.tenant_column gives every request its tenant; "
                                 "remove classes or remove tenant_column")
        if self.trace is None and self.num_requests is None and self.duration_s is None:
            raise ValueError("set num_requests or duration_s, or the workload never ends")
        if self.arrival is None and self.closed_loop is None:
            raise ValueError("arrival is null, so nobody sends requests; give an arrival process or closed_loop users")
        if self.trace is None and self.arrival is not None and math.isinf(self.arrival.rate) and \
                self.num_requests is None:
            raise ValueError("rate: inf sends everything at t=0, so num_requests must be set")
        if self.closed_loop is not None:
            clash = [k for k in ("trace", "max_concurrency") if k in self.model_fields_set]
            clash += ["arrival"] if "arrival" in self.model_fields_set and self.arrival is not None else []
            if clash:
                raise ValueError(f"closed_loop with {', '.join(clash)}: closed-loop users send when their previous "
                                 "request ends, so there are no arrival times; remove it (set arrival to null)")
            if self.num_requests is None:
                raise ValueError("closed_loop needs num_requests: the users send that many requests in all")
        if self.prefix is not None:
            if self.trace is not None:
                raise ValueError("prefix with a trace: the trace gives every prompt, and says nothing of what they "
                                 "share; remove prefix or the trace")
            if self.prefix.multi_turn and self.num_sessions is None:
                raise ValueError("prefix.multi_turn needs num_sessions: a conversation is a session's requests; "
                                 "set num_sessions")
        return self


# --------------------------------------------------------------------------- device, memory
MAX_CONTEXT_COST_MS = 1e6
"""The largest context cost per 1k tokens or 1M pairs, ms: a thousand seconds; above it, a typo."""

DEVICE_COSTS = ("tau0_ms", "beta_ms", "prefill_ms_per_token", "kv_read_ms_per_1k_tokens",
                "prefill_attention_ms_per_1m_pairs")
"""The five costs of a step (tau0, beta, gamma, delta, epsilon), as the device section names them."""


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
    draft_cost_ms: NonNegFloat | None = Field(default=None, description="The drafter's time per draft step, ms.")
    draft_cost_fraction: NonNegFloat | None = Field(
        default=None, description="The drafter's time per draft step as a fraction of the target's step time "
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


class Device(_Model):
    """The cost model (simbatch/model/cost.py): one engine step takes tau0 + beta*B + gamma*P + delta*K + epsilon*A.

    B decoding sequences, P prefill tokens, K the KV tokens the step reads, A the prefill attention
    pairs (docs/concepts.md). ``preset`` derives all five from a model and a GPU (docs/hardware.md);
    a key given beside it overrides the preset's value.
    """

    tau0_ms: NonNegFloat = Field(default=20.0, description="Fixed cost of a step (streaming the weights), ms.")
    beta_ms: NonNegFloat = Field(default=0.2, description="Marginal cost per decoding sequence, ms.")
    prefill_ms_per_token: NonNegFloat = Field(default=0.0, description="Cost per prefill token, ms.")
    kv_read_ms_per_1k_tokens: NonNegFloat = Field(
        default=0.0, le=MAX_CONTEXT_COST_MS,
        description="delta: cost of reading 1,000 cached KV tokens (every scheduled request reads its "
        "whole context each step), ms; 0 makes step time independent of context.")
    prefill_attention_ms_per_1m_pairs: NonNegFloat = Field(
        default=0.0, le=MAX_CONTEXT_COST_MS,
        description="epsilon: prefill attention compute per 1,000,000 (query, key) token pairs, ms; a "
        "chunk of c tokens after k cached has c * (k + c / 2) pairs.")
    preset: str | None = Field(
        default=None, description="<model>/<gpu>[/tpN][/fp8], e.g. llama-3.1-8b/H100-SXM/tp2: the five costs "
        "above from public specs (`simbatch presets` lists the names); keys given here override it.")
    gpu_card: GpuCard | None = Field(default=None, description="Your own GPU card, named in `preset` "
                                     "(docs/hardware.md).")
    model_card: ModelCard | None = Field(default=None, description="Your own model card, named in `preset`.")
    speculative: Speculative | None = Field(
        default=None, description="Speculative decoding: k drafts per decode step, each accepted with probability "
        "alpha (continuous batching only; docs/concepts.md).")

    # The keys the preset set (not given in the file); set by the validator, not the YAML.
    _from_preset: tuple[str, ...] = PrivateAttr(default=())

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
        if self.preset is not None:
            self._apply_preset()
        elif self.gpu_card is not None or self.model_card is not None:
            raise ValueError("gpu_card/model_card are used by a preset only; set device.preset to "
                             "<model>/<gpu> naming them, or remove them")
        if self.tau0_ms == 0 and self.beta_ms == 0:
            raise ValueError("tau0_ms and beta_ms are both 0: a step would take no time")
        return self

    def deployment(self):
        """The :class:`~simbatch.hardware.preset.Deployment` the preset names, or None without one."""
        from simbatch.hardware.preset import parse  # the cards load on first use, not with the config

        if self.preset is None:
            return None
        return parse(self.preset, {self.gpu_card.name: self.gpu_card} if self.gpu_card else None,
                     {self.model_card.name: self.model_card} if self.model_card else None)

    def _apply_preset(self) -> None:
        from simbatch.hardware.preset import fitted

        derived = self.deployment().device_ms(fitted()[0])
        taken = tuple(k for k in derived if k not in self.model_fields_set)
        for key in taken:
            # Six significant digits, as printed; every value is finite and >= 0, as validation would demand.
            self.__dict__[key] = float(f"{derived[key]:.6g}")
        self._from_preset = taken

    def sources(self) -> dict[str, str]:
        """Where each cost came from: "preset", "explicit" (given in the scenario) or "default"."""
        return {k: "preset" if k in self._from_preset else "explicit" if k in self.model_fields_set else "default"
                for k in DEVICE_COSTS}


class KVCache(_Model):
    """Paged KV cache: fixed-size blocks, allocated as sequences grow."""

    block_size: PosInt = Field(default=16, description="Tokens per block.")
    num_blocks: PosInt | Literal["auto"] = Field(
        default=8192, description="Blocks on the device; auto: from the GPU's memory as vLLM sizes it (needs "
        "device.preset), or from gpu_kv_cache_tokens.")
    gpu_kv_cache_tokens: PosInt | None = Field(
        default=None, description="The token count vLLM logs at start-up (\"GPU KV cache size: N tokens\"): "
        "num_blocks = N // block_size.")
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="num_blocks auto: the fraction of GPU memory vLLM may use "
        "(its --gpu-memory-utilization).")
    activation_reserve_gib: NonNegFloat | None = Field(
        default=None, description="num_blocks auto: memory kept for activations and outside PyTorch, GiB per "
        "GPU; estimated from the model when omitted (docs/hardware.md).")
    swap_blocks: NonNegInt = Field(default=0, description="Blocks in the host swap pool (swap preemption).")
    swap_ms_per_block: NonNegFloat = Field(default=0.0, description="Transfer time per block, each way, ms.")
    enable_prefix_caching: bool = Field(
        default=False, description="Keep computed blocks, keyed by their content, for later requests with the "
        "same prefix (vLLM's automatic prefix caching; continuous batching only)."
    )

    # How num_blocks was derived when it was not given as a number; set by `resolved`, not the YAML.
    _derivation: str = PrivateAttr(default="")

    @field_validator("num_blocks", mode="before")
    @classmethod
    def _blocks_or_auto(cls, value):
        # One message for both halves of the union (pydantic would list a failure for each).
        if value == "auto" or isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        raise ValueError("num_blocks must be a whole number of blocks greater than 0, or auto")

    def resolved(self, device: Device, batching: Batching, where: str) -> KVCache:
        """This cache with ``num_blocks`` a number: itself when it is one already, else derived from
        ``gpu_kv_cache_tokens`` or the device's preset. ``where`` names the section in errors."""
        if self.gpu_kv_cache_tokens is not None:
            blocks = self.gpu_kv_cache_tokens // self.block_size
            if blocks < 1:
                raise ValueError(f"{where}.gpu_kv_cache_tokens ({self.gpu_kv_cache_tokens}) is less than one block "
                                 f"of {self.block_size} tokens; give the token count vLLM logs")
            if "num_blocks" in self.model_fields_set and self.num_blocks not in ("auto", blocks):
                raise ValueError(f"{where}.gpu_kv_cache_tokens ({self.gpu_kv_cache_tokens}) gives {blocks} blocks "
                                 f"of {self.block_size} tokens, but num_blocks is {self.num_blocks}; remove "
                                 "num_blocks (or set it to auto)")
            how = f"gpu_kv_cache_tokens {self.gpu_kv_cache_tokens:,} / block_size {self.block_size}"
        elif self.num_blocks != "auto":
            return self
        else:
            deployment = device.deployment()
            if deployment is None:
                raise ValueError(f"{where}.num_blocks is auto, which derives the blocks from the model and the GPU; "
                                 "set device.preset (e.g. llama-3.1-8b/H100-SXM), or give "
                                 f"{where}.gpu_kv_cache_tokens or a number of blocks")
            from simbatch.hardware.memory import kv_budget

            budget = kv_budget(deployment, self.block_size, self.gpu_memory_utilization,
                               batching.max_num_batched_tokens, batching.max_num_seqs, self.activation_reserve_gib)
            blocks, how = budget.blocks, f"{deployment.name}: {budget.describe()}"
        out = self.model_copy()
        out.__dict__["num_blocks"] = blocks  # a validated value: a positive int
        out._derivation = how
        return out


# --------------------------------------------------------------------------- batching
class Batching(_Model):
    """How the engine forms batches. `max_num_seqs` is the slot count in every mode."""

    mode: Literal["static", "dynamic", "continuous"] = Field(
        default="continuous",
        description="static: request-level, waits for a full batch; dynamic: request-level, "
        "dispatches on a full batch or a queue delay; continuous: iteration-level scheduling.",
    )
    max_num_seqs: PosInt = Field(default=64, description="Running slots (batch size for static/dynamic).")
    max_num_batched_tokens: PosInt = Field(
        default=2048, description="Token budget of one step (continuous)."
    )
    enable_chunked_prefill: bool = Field(default=True, description="Split prompts across steps (continuous).")
    long_prefill_token_threshold: PosInt | None = Field(
        default=None, description="Cap on one request's prefill chunk per step, tokens (continuous)."
    )
    pad_prompts: bool = Field(
        default=True, description="Pad prompts to the longest in the batch (static/dynamic)."
    )
    max_wait_ms: NonNegFloat | None = Field(
        default=None,
        description="static: start a partial batch once the oldest request has waited this long; "
        "null waits for a full batch (flushing when arrivals end).",
    )
    max_queue_delay_ms: NonNegFloat = Field(
        default=10.0, description="dynamic: dispatch once the oldest request has waited this long, ms."
    )

    @property
    def max_wait_s(self) -> float | None:
        return seconds(self.max_wait_ms)

    @property
    def max_queue_delay_s(self) -> float:
        return seconds(self.max_queue_delay_ms)

    @model_validator(mode="after")
    def _budget(self) -> Batching:
        if self.mode == "continuous" and self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than max_num_seqs "
                f"({self.max_num_seqs}): running decodes could not all be served; raise the budget"
            )
        return self


class Scheduler(_Model):
    """Queue order, preemption and admission control."""

    policy: Literal["fcfs", "priority", "sjf", "fair"] = Field(
        default="fcfs",
        description="fcfs; priority (lower first); sjf (shortest job first); fair (weighted tenant share).",
    )
    sjf_key: Literal["prompt", "output"] = Field(
        default="prompt",
        description="sjf orders by prompt length, or by true output length (an oracle: an upper bound).",
    )
    aging_s: PosFloat | None = Field(
        default=None, description="priority: a waiting request gains one priority level per aging_s."
    )
    tenant_weights: dict[str, PosFloat] = Field(
        default_factory=dict, description="fair: weight per tenant (1 when not listed)."
    )
    preemption: Literal["recompute", "swap"] = Field(
        default="recompute", description="What happens to a preempted request's KV blocks."
    )
    max_preemptions: PosInt | None = Field(
        default=None,
        description="A request preempted this many times is not chosen as a victim again, unless every "
        "running request is stalled on memory: then the lowest-ranked one goes all the same (the newest "
        "admitted; under `priority`, the worst priority, then the newest), or the engine would wait forever.",
    )
    head_of_line_blocking: bool = Field(
        default=True,
        description="true: admission stops at the first waiting request (in policy order) that does not fit "
        "(vLLM V1: no overtaking). false: it is passed over and later ones may be admitted in the same step "
        "(first-fit backfilling, as the chapter's toy does); a large request can then starve behind "
        "a stream of small ones.",
    )
    max_waiting: PosInt | None = Field(
        default=None, description="Waiting-queue cap per replica; arrivals beyond it are rejected (429)."
    )
    async_scheduling: bool = Field(
        default=False,
        description="vLLM's --async-scheduling (on by default in vLLM V1): the engine plans step k+1 while step k "
        "runs, so a request arriving during step k is first scheduled in step k+2, and a request finishing in "
        "step k keeps its slot and blocks through the plan of step k+1; an engine with nothing to run plans at "
        "once (continuous batching only; docs/concepts.md).",
    )


class ReplicaSpec(_Model):
    """A group of alike replicas in a heterogeneous fleet.

    A section given here (device, kv_cache, batching) replaces the scenario's section for these
    replicas, whole: fields left out of it take their defaults. A section left out is the scenario's.
    """

    count: PosInt = Field(default=1, description="Replicas in this group.")
    device: Device | None = Field(
        default=None, description="This group's cost model, replacing the scenario's whole; the scenario's when omitted."
    )
    kv_cache: KVCache | None = Field(
        default=None, description="This group's KV cache, replacing the scenario's whole; the scenario's when omitted."
    )
    batching: Batching | None = Field(
        default=None, description="This group's batching, replacing the scenario's whole; the scenario's when omitted."
    )


LOAD_ROUTERS = ("least_outstanding", "least_kv", "power_of_two", "session_affinity")


class KVTransfer(_Model):
    """The link a request's KV crosses from its prefill replica to its decode replica."""

    bandwidth_gb_s: PosFloat = Field(description="Bytes moved per second, in GB/s (10^9 bytes).")
    latency_ms: NonNegFloat = Field(default=0.0, description="Fixed cost of one transfer (set-up, handshake), ms.")

    def seconds_for(self, num_bytes: float) -> float:
        """One transfer of ``num_bytes``: bytes / bandwidth + latency, s."""
        return num_bytes / (self.bandwidth_gb_s * 1e9) + seconds(self.latency_ms)


class Disaggregated(_Model):
    """Disaggregated prefill and decode: two pools of replicas, and the KV transfer between them.

    A request is prefilled on a prefill replica (chosen by ``cluster.router``), samples its first
    token there, and moves on to a decode replica, which decodes it to the end (docs/concepts.md,
    "Disaggregated prefill and decode"). Replicas 0 .. prefill.count - 1 are the prefill pool, the
    rest the decode pool.
    """

    prefill: ReplicaSpec = Field(description="The prefill pool: count, and the sections it overrides.")
    decode: ReplicaSpec = Field(description="The decode pool: count, and the sections it overrides.")
    kv_transfer: KVTransfer
    decode_router: Literal["round_robin", "random", "least_outstanding", "least_kv", "power_of_two",
                           "session_affinity"] = Field(
        default="least_outstanding", description="Which decode replica a prefilled request goes to (as "
        "cluster.router, over the decode pool; read when its KV transfer is requested).")
    kv_bytes_per_token: PosFloat | None = Field(
        default=None, description="Bytes per token. The KV of one token on one GPU (all layers, keys and "
        "values); from the prefill pool's device.preset when omitted (required without one).")


class Cluster(_Model):
    """Replicas behind a router, and the admission control in front of them."""

    replicas: PosInt = Field(
        default=1, description="Number of engines; with replica_specs, the sum of their counts (may be omitted)."
    )
    replica_specs: list[ReplicaSpec] | None = Field(
        default=None, min_length=1,
        description="A heterogeneous fleet: groups of replicas, in index order, each overriding sections.",
    )
    router: Literal["round_robin", "random", "least_outstanding", "least_kv", "power_of_two",
                    "session_affinity"] = Field(
        default="round_robin",
        description="round_robin; random; least_outstanding (fewest running + waiting); least_kv (lowest KV "
        "usage fraction); power_of_two (two random replicas, the less outstanding); session_affinity (a "
        "session sticks to the replica its first request went to, chosen by least_outstanding).",
    )
    signal_delay_ms: NonNegFloat = Field(
        default=0.0, description="Load-reading routers see each replica's state as it was this long ago, ms."
    )
    max_in_flight: PosInt | None = Field(
        default=None, description="Cap on requests in the cluster (waiting + running, all replicas); "
        "arrivals beyond it are rejected (429, reason cluster_full)."
    )
    disaggregated: Disaggregated | None = Field(
        default=None, description="Separate prefill and decode pools with a KV transfer between them "
        "(continuous batching only); replicas is then the pools' total.")

    @model_validator(mode="before")
    @classmethod
    def _count_from_specs(cls, data):
        # The replica count is the specs' total, so everything that reads `replicas` reads the truth.
        specs = data.get("replica_specs") if isinstance(data, dict) else None
        pools = data.get("disaggregated") if isinstance(data, dict) else None
        if specs is None and isinstance(pools, dict | Disaggregated):
            get = pools.get if isinstance(pools, dict) else (lambda k: getattr(pools, k))
            specs = [get("prefill"), get("decode")]
        if isinstance(specs, list) and "replicas" not in data:
            counts = [s.get("count", 1) if isinstance(s, dict) else getattr(s, "count", None) for s in specs]
            if all(isinstance(c, int) and c > 0 for c in counts):
                data = {**data, "replicas": sum(counts)}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Cluster:
        if self.disaggregated is not None:
            if self.replica_specs is not None:
                raise ValueError("cluster.replica_specs with cluster.disaggregated: the pools are the fleet; give "
                                 "each pool's sections under disaggregated.prefill / disaggregated.decode")
            if self.max_in_flight is not None:
                raise ValueError(f"cluster.max_in_flight ({self.max_in_flight}) with cluster.disaggregated is not "
                                 "modelled (a request in transfer is in neither pool); remove max_in_flight, or "
                                 "cap each pool's queue with scheduler.max_waiting")
        if self.groups() is not None:
            total = sum(s.count for s in self.groups())
            if self.replicas != total:
                raise ValueError(f"replicas ({self.replicas}) disagrees with replica_specs, whose counts sum to "
                                 f"{total}; remove replicas or set it to {total}")
        if self.signal_delay_ms > 0 and self.router not in LOAD_ROUTERS:
            raise ValueError(f"signal_delay_ms ({self.signal_delay_ms}) has no effect on router {self.router}, "
                             f"which reads no load; remove it or use one of {', '.join(LOAD_ROUTERS)}")
        return self

    @property
    def signal_delay_s(self) -> float:
        return seconds(self.signal_delay_ms)

    def groups(self) -> list[ReplicaSpec] | None:
        """The groups of alike replicas, in index order (the two pools when disaggregated), or None
        when every replica runs the scenario's own sections."""
        if self.disaggregated is not None:
            return [self.disaggregated.prefill, self.disaggregated.decode]
        return self.replica_specs


class SLO(_Model):
    """Service-level objectives, for goodput (a request counts when it meets every one that is set)."""

    ttft_ms: PosFloat | None = Field(default=None, description="Time to first token at most this, ms.")
    tpot_ms: PosFloat | None = Field(default=None, description="Time per output token at most this, ms.")
    e2el_ms: PosFloat | None = Field(default=None, description="End-to-end latency at most this, ms.")

    def limits_s(self) -> dict[str, float]:
        """The objectives that are set, in seconds, by the requests frame's column they bound."""
        limits = {"ttft_s": self.ttft_ms, "tpot_s": self.tpot_ms, "e2e_s": self.e2el_ms}
        return {col: seconds(ms) for col, ms in limits.items() if ms is not None}


LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


class Metrics(_Model):
    """Which latency percentiles the summary adds, as ``vllm bench serve --percentile-metrics/--metric-percentiles``.

    The summary always holds mean, median, std, p90 and p99 of every latency; these add
    ``p<P>_<metric>_ms`` (vLLM's spelling: ``p95_ttft_ms``, ``p99.9_itl_ms``) and choose what the table shows.
    """

    percentile_metrics: list[Literal["ttft", "tpot", "itl", "e2el"]] = Field(
        default_factory=lambda: list(LATENCY_METRICS), min_length=1,
        description="Latencies printed in the result table and given the extra percentiles.")
    metric_percentiles: list[Annotated[float, Field(gt=0, lt=100)]] = Field(
        default_factory=lambda: [99.0], min_length=1,
        description="Percentiles (0 < P < 100) printed per latency, and added to the summary as p<P>_<metric>_ms.")


MAX_FRONTEND_MS = 60_000.0
"""The longest frontend latency, ms: a minute; above it, a typo (and an overflow risk on the ns clock)."""


class Frontend(_Model):
    """The API server between the client and the engine: what a request spends outside the GPU steps.

    vLLM's OpenAI-compatible server parses the request, tokenises the prompt (batching prompts for up
    to 2 ms) and hands it to the engine core process; each step's tokens come back the other way,
    detokenised and streamed as one server-sent event. ``vllm bench serve`` times a request from before
    its POST, so both latencies are in its TTFT and E2E latency; TPOT and ITL, differences between
    tokens, are not changed by them.
    """

    request_latency_ms: NonNegFloat = Field(
        default=0.0, le=MAX_FRONTEND_MS,
        description="From the client's send to the engine's waiting queue (HTTP, tokenisation, hand-off), ms.")
    response_latency_ms: NonNegFloat = Field(
        default=0.0, le=MAX_FRONTEND_MS,
        description="From the end of the step that sampled a token to the client receiving it (detokenisation, "
        "streaming), ms.")

    @property
    def request_latency_s(self) -> float:
        return seconds(self.request_latency_ms)

    @property
    def response_latency_s(self) -> float:
        return seconds(self.response_latency_ms)


class Sim(_Model):
    """Simulation controls."""

    max_time_s: PosFloat | None = Field(
        default=None, description="Stop the clock here; requests still in the system are `unfinished`."
    )
    fast_forward: bool = Field(
        default=True,
        description="The accelerated engine: decodes advanced in lockstep, runs of identical steps in one go, "
        "a lone replica running ahead (the same frames, bit for bit). false: the reference engine, one "
        "SimPy event per step and every request scheduled one at a time.",
    )


class Scenario(_Model):
    """A complete, self-contained simulation: traffic, device, memory, batching, policy."""

    name: str = Field(default="scenario", description="Used to name result folders.")
    description: str = Field(default="", description="Free text.")
    seed: NonNegInt = Field(default=0, description="Root seed of every random stream.")
    workload: Workload = Field(default_factory=Workload)
    device: Device = Field(default_factory=Device)
    kv_cache: KVCache = Field(default_factory=KVCache)
    batching: Batching = Field(default_factory=Batching)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    cluster: Cluster = Field(default_factory=Cluster)
    frontend: Frontend = Field(default_factory=Frontend)
    slo: SLO = Field(default_factory=SLO)
    metrics: Metrics = Field(default_factory=Metrics)
    sim: Sim = Field(default_factory=Sim)

    # Where relative paths (traces, empirical lengths) are resolved; set by the loader, not the YAML.
    _base_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _kv_blocks(self) -> Scenario:
        # num_blocks: auto becomes a number here, where the device and batching it depends on are known;
        # a replica group with its own device but the scenario's cache gets its own number too.
        given = self.kv_cache
        self.__dict__["kv_cache"] = given.resolved(self.device, self.batching, "kv_cache")
        derived = given.num_blocks == "auto" or given.gpu_kv_cache_tokens is not None
        for where, spec in _named_groups(self.cluster):
            cache = spec.kv_cache if spec.kv_cache is not None else \
                given if derived and (spec.device is not None or spec.batching is not None) else None
            if cache is not None:
                spec.__dict__["kv_cache"] = cache.resolved(spec.device or self.device, spec.batching or self.batching,
                                                           f"{where}.kv_cache")
        return self

    @model_validator(mode="after")
    def _continuous_only(self) -> Scenario:
        """Prefix caching and speculative decoding work per token: continuous batching only."""
        specs = self.cluster.groups()
        pairs = [(self.kv_cache, self.batching)] if specs is None else \
            [(s.kv_cache or self.kv_cache, s.batching or self.batching) for s in specs]
        if any(kv.enable_prefix_caching and b.mode != "continuous" for kv, b in pairs):
            raise ValueError("kv_cache.enable_prefix_caching with a request-level batching mode: a static or "
                             "dynamic batch reserves its memory whole, for padded prompts; use batching.mode: "
                             "continuous, or set enable_prefix_caching to false")
        devices = [(self.device, self.batching)] if specs is None else \
            [(s.device or self.device, s.batching or self.batching) for s in specs]
        if any(d.speculative is not None and b.mode != "continuous" for d, b in devices):
            raise ValueError("device.speculative with a request-level batching mode: a static or dynamic batch "
                             "emits one token per step for every slot; use batching.mode: continuous, or remove "
                             "device.speculative")
        if self.scheduler.async_scheduling and any(b.mode != "continuous" for _, b in pairs):
            raise ValueError("scheduler.async_scheduling with a request-level batching mode: it is how vLLM's "
                             "engine overlaps planning a step with running the last one; use batching.mode: "
                             "continuous, or set async_scheduling to false")
        return self

    @model_validator(mode="after")
    def _client_and_delay(self) -> Scenario:
        wl = self.workload
        if self.cluster.signal_delay_ms > 0 and (wl.max_concurrency is not None or wl.closed_loop is not None):
            which = "max_concurrency" if wl.max_concurrency is not None else "closed_loop"
            raise ValueError(f"cluster.signal_delay_ms ({self.cluster.signal_delay_ms:g}) with workload.{which}: "
                             "delayed snapshots need arrival times known in advance, and a client sends when "
                             "requests complete; set signal_delay_ms to 0 or remove the client")
        cap = wl.max_concurrency if wl.max_concurrency is not None else \
            (wl.closed_loop.concurrency if wl.closed_loop is not None else None)
        if cap is not None:
            # A static batcher with no timer starts a batch only when it is full (or arrivals end). If
            # every request the client lets out can sit in such a batcher short of a full batch, the
            # client waits for a response that never comes: a deadlock, in the model as in a real
            # deployment. Pigeonhole: more than sum(max_num_seqs - 1) in flight always fills one.
            batchings = [self.batching] if self.cluster.groups() is None else \
                [s.batching or self.batching for s in self.cluster.groups() for _ in range(s.count)]
            if self.cluster.groups() is None:
                batchings *= self.cluster.replicas
            stuck = sum(b.max_num_seqs - 1 for b in batchings if b.mode == "static" and b.max_wait_ms is None)
            if stuck and cap <= stuck:
                which = "max_concurrency" if wl.max_concurrency is not None else "closed_loop.concurrency"
                raise ValueError(f"workload.{which} ({cap}) can deadlock static batching without max_wait_ms: "
                                 f"up to {stuck} requests can wait for batches that never fill while the client "
                                 f"waits for them; set batching.max_wait_ms, or {which} to at least {stuck + 1}")
        return self

    @model_validator(mode="after")
    def _disaggregated(self) -> Scenario:
        pools = self.cluster.disaggregated
        if pools is None:
            return self
        for name, spec in (("prefill", pools.prefill), ("decode", pools.decode)):
            where = f"cluster.disaggregated.{name}"
            mode = (spec.batching or self.batching).mode
            if mode != "continuous":
                raise ValueError(f"{where} runs batching.mode {mode}: disaggregated pools hand requests over "
                                 "between steps, which needs iteration-level scheduling; use batching.mode: continuous")
        if (pools.decode.kv_cache or self.kv_cache).enable_prefix_caching:
            raise ValueError("cluster.disaggregated.decode has kv_cache.enable_prefix_caching: a decode replica "
                             "receives its prompts' KV whole, it never looks a prefix up; enable it on the prefill "
                             "pool only (disaggregated.prefill.kv_cache, or the scenario's kv_cache with a "
                             "decode.kv_cache of its own)")
        wl = self.workload
        if wl.max_concurrency is not None or wl.closed_loop is not None:
            raise ValueError("workload.max_concurrency / closed_loop with cluster.disaggregated is not modelled; "
                             "use an open-loop workload (arrival rate or trace)")
        if self.cluster.signal_delay_ms > 0:
            raise ValueError(f"cluster.signal_delay_ms ({self.cluster.signal_delay_ms:g}) with "
                             "cluster.disaggregated is not modelled; set it to 0")
        if pools.kv_bytes_per_token is None and (pools.prefill.device or self.device).deployment() is None:
            raise ValueError("cluster.disaggregated.kv_bytes_per_token is missing and the prefill pool's device "
                             "has no preset to derive it from; give kv_bytes_per_token (e.g. 131072 for "
                             "llama-3.1-8b in bf16) or set device.preset")
        return self

    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token as a disaggregated cluster transfers it: the setting, or the prefill
        pool's preset (all layers, keys and values, one GPU's share)."""
        pools = self.cluster.disaggregated
        if pools.kv_bytes_per_token is not None:
            return pools.kv_bytes_per_token
        return (pools.prefill.device or self.device).deployment().kv_bytes_per_token

    def resolve(self, path: Path) -> Path:
        """A data path as the scenario means it: relative to the scenario file's folder."""
        if path.is_absolute() or self._base_dir is None:
            return path
        return self._base_dir / path

    def data_files(self) -> dict[str, Path]:
        """Every data file the scenario reads, by the dotted key naming it: ``{"workload.trace.path": ...}``.

        Paths are as written in the scenario (see :meth:`resolve` for where they point).
        """
        wl = self.workload
        files = {} if wl.trace is None else {"workload.trace.path": wl.trace.path}
        dists = [("workload.prompt_tokens", wl.prompt_tokens), ("workload.output_tokens", wl.output_tokens)]
        for i, cls in enumerate(wl.classes or []):
            dists += [(f"workload.classes.{i}.prompt_tokens", cls.prompt_tokens),
                      (f"workload.classes.{i}.output_tokens", cls.output_tokens)]
        files |= {f"{key}.path": dist.path for key, dist in dists if isinstance(dist, Empirical)}
        return files


def _models_in(annotation) -> list[type[BaseModel]]:
    """The models a field's annotation can hold (through Optional, lists, dicts and unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def suggestion(loc: tuple) -> str | None:
    """For an unknown key at pydantic location ``loc``, the closest known key there, if one is close.

    The location is followed through the models; list indexes and union tags are stepped over.
    """
    models: list[type[BaseModel]] = [Scenario]
    for part in loc[:-1]:
        fields = {name: f for m in models for name, f in m.model_fields.items()}
        if isinstance(part, str) and part in fields:
            models = _models_in(fields[part].annotation)
    known = {name for m in models for name in m.model_fields}
    close = difflib.get_close_matches(str(loc[-1]), sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def _named_groups(cluster: Cluster) -> list[tuple[str, ReplicaSpec]]:
    """Each replica group with the dotted key that names it in a scenario file."""
    if cluster.disaggregated is not None:
        return [("cluster.disaggregated.prefill", cluster.disaggregated.prefill),
                ("cluster.disaggregated.decode", cluster.disaggregated.decode)]
    return [(f"cluster.replica_specs.{i}", spec) for i, spec in enumerate(cluster.replica_specs or [])]


def replica_scenarios(scenario: Scenario) -> list[Scenario]:
    """The scenario each replica runs, in index order.

    Alike replicas all run ``scenario``; in a heterogeneous fleet each ``replica_specs`` group runs
    it with the sections its spec gives swapped in.
    """
    specs = scenario.cluster.groups()
    if specs is None:
        return [scenario] * scenario.cluster.replicas
    out: list[Scenario] = []
    for spec in specs:
        sections = {k: getattr(spec, k) for k in ("device", "kv_cache", "batching") if getattr(spec, k) is not None}
        out += [scenario.model_copy(update=sections)] * spec.count
    return out
