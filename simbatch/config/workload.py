"""``workload``: the traffic, as arrivals and lengths, a trace, or closed-loop users.

Every request is drawn up front from seeded streams independent of how it is served
(:mod:`simbatch.workload`), so two scenarios that differ only in batching see the same requests.
The checks here are about the traffic alone: what would be ignored (lengths beside a trace), what
never ends (no count and no duration), and what cannot be sent (no arrivals and no users).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from simbatch.config.base import (
    MAX_RATE,
    ClockNonNegS,
    ClockS,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    PosInt,
    _Model,
)
from simbatch.config.lengths import Fixed, LengthDist
from simbatch.config.lora import Adapters


class RequestClass(_Model):
    """One class of traffic in a mixture: a tenant with its priority and, optionally, its own lengths."""

    name: str = Field(description="Tenant name (fair policy, requests frame); classes sharing a name are one tenant.")
    share: PosFloat = Field(default=1.0, description="Relative share of arrivals.")
    priority: int = Field(default=0, description="Lower is served first under the `priority` policy.")
    prompt_tokens: LengthDist | None = Field(default=None, description="Overrides workload.prompt_tokens.")
    output_tokens: LengthDist | None = Field(default=None, description="Overrides workload.output_tokens.")


class Trace(_Model):
    """Replay a trace: one row (a CSV line, or a JSON line) per request, with its arrival time and token
    counts, and optionally what its prompt shares with others (simbatch/workload/trace.py).

    ``format`` names a public trace's layout and sets the column defaults: ``azure`` (the Azure LLM
    inference traces of 2023 and 2024: ``TIMESTAMP,ContextTokens,GeneratedTokens``), ``burstgpt``
    (``Timestamp`` in s, ``Request tokens``, ``Response tokens``, ``Session ID`` when the file has it;
    rows with 0 response tokens, failures, are dropped), ``mooncake`` (JSON lines: ``timestamp`` in ms,
    ``input_length``, ``output_length``, ``hash_ids`` of 512-token blocks), ``qwen-bailian`` (JSON
    lines: ``timestamp`` in s, ``hash_ids`` of 16-token blocks, conversations by ``chat_id`` /
    ``parent_chat_id``). A key given here overrides the format's.
    """

    path: Path = Field(description="The trace file; relative paths are resolved against the scenario file.")
    format: Literal["azure", "burstgpt", "mooncake", "qwen-bailian"] = Field(
        default="azure", description="The trace's layout: azure, burstgpt (CSV), mooncake, qwen-bailian (JSON lines).")
    time_scale: PosFloat = Field(
        default=1.0, description="Multiplies every inter-arrival gap (2.0 halves the rate)."
    )
    timestamp_column: str | None = Field(
        default=None, description="Arrival time: numbers (in time_unit), or date-times (offsets from the first "
        "row); the format's when omitted (azure: TIMESTAMP).")
    time_unit: Literal["s", "ms"] | None = Field(
        default=None, description="Unit of numeric timestamps; the format's when omitted (mooncake: ms, else s).")
    prompt_column: str | None = Field(default=None, description="Prompt length column, tokens (azure: ContextTokens).")
    output_column: str | None = Field(default=None, description="Output length column, tokens (azure: GeneratedTokens).")
    priority_column: str | None = Field(
        default=None, description="Per-request priority (whole numbers, lower is served first); "
        "replaces the priorities classes assign."
    )
    tenant_column: str | None = Field(
        default=None, description="Per-request tenant name; replaces classes (leave `classes` out)."
    )
    session_column: str | None = Field(
        default=None, description="Conversation id: rows sharing it are one conversation's turns, each prompt "
        "beginning with the previous turn's prompt and output (so prefix caching finds the history); also the "
        "session for session_affinity routing. burstgpt: Session ID, when the file has it.")
    turn_column: str | None = Field(
        default=None, description="A conversation's turn number, ordering turns whose timestamps tie.")
    prompt_id_column: str | None = Field(
        default=None, description="Prompt id: rows sharing it send the same prompt, so a re-sent prompt finds "
        "the first one's blocks cached.")
    hash_ids_column: str | None = Field(
        default=None, description="Per-request list of block ids, one per hash_block_tokens tokens of the prompt "
        "(Mooncake's hash_ids: equal ids mean the same block after the same prefix); the format's when omitted.")
    hash_block_tokens: PosInt | None = Field(
        default=None, description="Tokens per block of hash_ids (mooncake 512, qwen-bailian 16).")
    adapter_column: str | None = Field(
        default=None, description="Per-request LoRA adapter name (vLLM bench serve's --lora-modules names); an "
        "empty cell is the base model; lora_id numbers the names 0, 1, ... in order of first arrival. Replaces "
        "workload.adapters, and needs the lora section.")
    keep_time_origin: bool = Field(
        default=False, description="false: the first arrival is at t = 0. true: times as the trace gives "
        "them: numbers as seconds from t = 0, date-times as seconds from midnight (UTC) of the first row's day."
    )

    @model_validator(mode="after")
    def _one_kind_of_sharing(self) -> Trace:
        given = [k for k in ("session_column", "prompt_id_column", "hash_ids_column") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: each says on its own what prompts share (turns of a "
                             "conversation, a re-sent prompt, block ids); give one")
        return self


DAY_S = 86_400.0


class PiecewiseCurve(_Model):
    """A rate given at points in time, linear between them and held at the last point after it (or, with
    ``period_s``, repeated every period: a daily curve of a few hours' points)."""

    kind: Literal["piecewise"]
    points: list[tuple[ClockNonNegS, NonNegFloat]] = Field(
        min_length=1, description="(time_s, requests/s) pairs, times increasing; the first time is the rate's "
        "from t = 0 until then.")
    period_s: ClockS | None = Field(default=None, description="Repeat the points every period_s (e.g. 86400 for "
                                    "a day); the last point's time must be below it. Held after the last point "
                                    "when omitted.")

    @model_validator(mode="after")
    def _ordered(self) -> PiecewiseCurve:
        times = [t for t, _ in self.points]
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError(f"points: times {times} must increase strictly; sort them and merge repeats")
        if max(r for _, r in self.points) > MAX_RATE:
            raise ValueError(f"points: a rate above {MAX_RATE:,.0f} requests/s is beyond any fleet; lower it")
        if all(r == 0 for _, r in self.points):
            raise ValueError("points: every rate is 0, so nothing ever arrives; give a positive rate")
        if self.period_s is not None and times[-1] >= self.period_s:
            raise ValueError(f"points: the last time ({times[-1]:g} s) is not below period_s ({self.period_s:g} s); "
                             "drop it or lengthen the period")
        return self


class SinusoidalCurve(_Model):
    """A daily curve: ``mean (1 + amplitude cos(2 pi (t - peak_s) / period_s))`` requests/s."""

    kind: Literal["sinusoidal"]
    mean: PosFloat = Field(le=MAX_RATE, description="The rate averaged over a period, requests/s.")
    amplitude: float = Field(default=0.5, ge=0, le=1, description="Swing as a share of the mean: the rate goes from "
                             "mean (1 - amplitude) to mean (1 + amplitude).")
    period_s: ClockS = Field(default=DAY_S, description="Length of one cycle, s (a day by default).")
    peak_s: ClockNonNegS = Field(default=14 * 3600.0, description="Time of the peak within the period, s "
                                 "(14:00 by default, the afternoon peak of public chat traces).")

    @model_validator(mode="after")
    def _bounded(self) -> SinusoidalCurve:
        if self.mean * (1 + self.amplitude) > MAX_RATE:
            raise ValueError(f"mean {self.mean:g} x (1 + amplitude) passes {MAX_RATE:,.0f} requests/s at the peak; "
                             "lower the mean or the amplitude")
        return self


class TraceCurve(_Model):
    """The rate of a trace, counted per window: its arrivals in each ``window_s``, divided by the window,
    as a piecewise-constant rate (the trace's daily shape, with fresh Poisson arrivals under it)."""

    kind: Literal["trace"]
    trace: Trace = Field(description="The trace whose arrival times are counted (as workload.trace reads it).")
    window_s: ClockS = Field(default=300.0, description="Width of the counting windows, s.")
    scale: PosFloat = Field(default=1.0, description="Multiplies the trace's rate (2.0: twice its traffic).")


RateCurve = Annotated[PiecewiseCurve | SinusoidalCurve | TraceCurve, Field(discriminator="kind")]


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
    rate_curve: RateCurve | None = Field(
        default=None, description="A rate that changes over time (piecewise points, a sinusoidal daily curve, or "
        "a trace's rate per window), replacing `rate`: a non-homogeneous Poisson process (process: poisson).")

    @model_validator(mode="after")
    def _one_rate(self) -> Arrival:
        if self.rate_curve is not None:
            if "rate" in self.model_fields_set:
                raise ValueError(f"rate ({self.rate:g}) with rate_curve: the curve gives the rate at every instant; "
                                 "remove rate")
            if self.process != "poisson":
                raise ValueError(f"rate_curve with process {self.process}: a curve's arrivals are a "
                                 "non-homogeneous Poisson process; set process: poisson or remove rate_curve")
        return self

    @field_validator("rate")
    @classmethod
    def _plausible(cls, rate: float) -> float:
        if math.isnan(rate):
            raise ValueError("rate is NaN; give requests/s, or inf to send every request at t=0")
        if math.isfinite(rate) and rate > MAX_RATE:
            raise ValueError(f"rate {rate:.3g} requests/s is beyond any fleet (at most {MAX_RATE:,.0f}); "
                             "use inf to send every request at t=0")
        return rate


class ClosedLoop(_Model):
    """A closed-loop client: ``concurrency`` users, each sending its next request when its previous one ends.

    As GenAI-Perf's ``--concurrency`` and GuideLLM's concurrent profile: the load is set by the
    number of users, not by a rate, so requests have no intended arrival times (no client wait).
    """

    concurrency: PosInt = Field(description="Users, each with at most one request in flight.")
    think_time_s: ClockNonNegS = Field(
        default=0.0, description="A user's pause between a response ending and its next request, s.")


class Prefix(_Model):
    """What requests' prompts have in common, for prefix caching (``kv_cache.enable_prefix_caching``).

    A shared system prompt: a share of the requests, drawn at random, start with the same
    ``shared_tokens`` tokens, prepended to the prompt the lengths section draws (with a trace: the
    first ``shared_tokens`` of the trace's prompt, whose length the trace gives; vLLM's
    ``--random-prefix-len`` is ``shared_tokens`` with ``share: 1``). Multi-turn sessions:
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
    duration_s: ClockS | None = Field(default=None, description="Stop arrivals after this much time, s.")
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
    adapters: Adapters | None = Field(
        default=None, description="The LoRA adapter each request names (needs the lora section); none when omitted.")
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
            if self.trace.adapter_column is not None and self.adapters is not None:
                raise ValueError("workload.adapters would be ignored: trace.adapter_column names every request's "
                                 "adapter; remove adapters or remove adapter_column")
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
        curve = self.arrival.rate_curve if self.arrival is not None else None
        if isinstance(curve, PiecewiseCurve) and curve.period_s is None and curve.points[-1][1] == 0 \
                and self.duration_s is None:
            raise ValueError(f"arrival.rate_curve ends at rate 0 (at {curve.points[-1][0]:g} s) and only num_requests "
                             "ends the workload, which may never come; set duration_s, a period_s, or a last rate above 0")
        if self.closed_loop is not None:
            clash = [k for k in ("trace", "max_concurrency") if k in self.model_fields_set]
            clash += ["arrival"] if "arrival" in self.model_fields_set and self.arrival is not None else []
            if clash:
                raise ValueError(f"closed_loop with {', '.join(clash)}: closed-loop users send when their previous "
                                 "request ends, so there are no arrival times; remove it (set arrival to null)")
            if self.num_requests is None:
                raise ValueError("closed_loop needs num_requests: the users send that many requests in all")
        if self.prefix is not None:
            if self.trace is not None and self.prefix.multi_turn:
                raise ValueError("prefix.multi_turn with a trace: the trace's own rows are the turns; say which "
                                 "rows are one conversation with trace.session_column, or remove multi_turn")
            hashed = self.trace is not None and (self.trace.hash_ids_column is not None or (
                self.trace.format in ("mooncake", "qwen-bailian") and self.trace.session_column is None
                and self.trace.prompt_id_column is None))
            if hashed:
                raise ValueError("prefix with a trace's hash_ids: the block ids already say what every prompt "
                                 "shares, its system prompt included; remove prefix")
            if self.prefix.multi_turn and self.num_sessions is None:
                raise ValueError("prefix.multi_turn needs num_sessions: a conversation is a session's requests; "
                                 "set num_sessions")
        return self
