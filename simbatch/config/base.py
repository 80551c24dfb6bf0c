"""What every section of a scenario is made of: the strict base model, bounded numbers, and units.

A scenario is data, checked once, at the door. Three rules make a typo an error instead of a silent
default or an absurd figure much later:

- every section is a :class:`_Model`, which forbids unknown keys (``extra="forbid"``: ``max_num_seq``
  is refused, with the closest known key suggested) and infinities or NaNs;
- every count is a bounded type (``PosInt``, ``Tokens``, ...): ``strict`` integers, so ``16.5`` blocks
  or ``"8"`` sequences are refused rather than rounded or parsed;
- every plausible range has a named bound (``MAX_*``): a value beyond it is an exponent too many, far
  beyond anything real (the reason is beside each) and near enough that nothing derived from a value
  inside it overflows or wraps: a step of 1e305 ms or a KV transfer of 1e300 ms is refused here, as one
  line naming the field, never carried into a mean TPOT of 6.7e297 ms or an OverflowError mid-run;
- every time fits the simulation clock, int64 nanoseconds (``MAX_TIME_S``, the ``Clock*`` types).

Scenario files speak milliseconds and the model runs in seconds; :func:`seconds` is the one
conversion, used by the sections' ``*_s`` properties.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError, core_schema

from simbatch.registry import Registry

MAX_TOKENS = 10_000_000
"""The longest prompt or output a length may have: ten times the longest context windows there are.
A larger value is a typo (an exponent too many), and would make every figure derived from it absurd."""

MAX_RATE = 1e6
"""The highest finite arrival rate, requests/s: a thousand times a large fleet's; above it, a typo."""

MAX_COST_MS = 1e6
"""The largest cost of one term of a step, ms: a thousand seconds (the slowest preset's tau0 is 632 ms)."""

MAX_CONTEXT_COST_MS = MAX_COST_MS
"""The largest context cost per 1k tokens or 1M pairs, ms: a thousand seconds; above it, a typo."""

MAX_TIME_S = 2**62 / 1e9
"""The latest time a scenario may name, s (about 4.6e9 s, 146 years): the clock counts int64 nanoseconds
(2^63 ns, 292 years), and half of that is left for serving what arrives last (simbatch.model.clock)."""

MAX_FRONTEND_MS = 60_000.0
"""The longest frontend latency, ms: a minute; above it, a typo (and an overflow risk on the ns clock)."""

PosInt = Annotated[int, Field(gt=0, strict=True)]
NonNegInt = Annotated[int, Field(ge=0, strict=True)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Tokens = Annotated[int, Field(gt=0, le=MAX_TOKENS, strict=True)]
MeanTokens = Annotated[float, Field(gt=0, le=MAX_TOKENS)]


def on_the_clock(seconds: float) -> float:
    """A duration or instant the simulation clock can hold (``MAX_TIME_S``), or ValueError saying so."""
    if seconds > MAX_TIME_S:
        raise ValueError(f"{seconds:.3g} s is past the {MAX_TIME_S:.2g} s the simulation clock holds "
                         "(int64 nanoseconds)")
    return seconds


def ms_on_the_clock(ms: float) -> float:
    """:func:`on_the_clock` for a setting in milliseconds."""
    on_the_clock(ms / 1e3)
    return ms


ClockS = Annotated[float, Field(gt=0), AfterValidator(on_the_clock)]
ClockNonNegS = Annotated[float, Field(ge=0), AfterValidator(on_the_clock)]
ClockMs = Annotated[float, Field(ge=0), AfterValidator(ms_on_the_clock)]
CostMs = Annotated[float, Field(ge=0, le=MAX_COST_MS)]


class Registered:
    """Annotation metadata: a name of one of a registry's entries (:mod:`simbatch.registry`), as in
    ``Annotated[str, Registered(POLICIES)]``.

    A Literal of the names would be fixed when this module is imported; this checks the registry as
    it stands when a scenario is validated, so an entry registered by a module of your own is a valid
    value with no edit here, and the JSON Schema and docs/scenarios.md list the registry's names. The
    error is pydantic's own for a Literal.
    """

    __slots__ = ("registry",)

    def __init__(self, registry: Registry):
        self.registry = registry

    def _check(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.registry:
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": self.registry.expected()})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self._check)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict:
        return {"type": "string", "enum": list(self.registry.names())}


def seconds(ms: float | None) -> float | None:
    """A setting in ms, as the model reads it: in seconds. Scenario files speak milliseconds, the model
    runs in seconds; the sections' ``*_s`` properties are the one place where one becomes the other."""
    return None if ms is None else ms / 1e3


class _Model(BaseModel):
    # Every number is finite: an infinity or NaN is a typo that would surface much later, in a plot
    # or a verdict. The one setting where infinity means something (rate: inf) says so itself.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


MIN_LINK_GB_S, MAX_LINK_GB_S = 1e-3, 1e5
"""A KV link between 1 MB/s (a slow WAN) and 100 TB/s (fifty times NVLink 5's 1.8 TB/s per GPU)."""

MAX_KV_BYTES_PER_TOKEN = 1e9
"""One token's KV at most 1 GB (GPT-3 175B without grouped-query attention holds 4.7 MB per token)."""
