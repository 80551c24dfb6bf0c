"""``prompt_tokens`` and ``output_tokens``: how long requests are, one model per distribution.

A length field holds one mapping whose ``dist`` key picks the distribution (pydantic's discriminated
union :data:`LengthDist`), so an error names the distribution's own fields, not every member of the
union. Every length is a whole number of tokens, at least 1 and at most ``MAX_TOKENS``. The
sampling itself is :mod:`simbatch.workload.lengths`; the datasets (``dist: sharegpt``, ...) are
:mod:`simbatch.workload.shapes`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from simbatch.config.base import MeanTokens, PosFloat, PosInt, Tokens, _Model


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
    """``dist: sharegpt``, ``azure-conv`` or ``azure-code``: a dataset's lengths.

    ``sharegpt``: what ``vllm bench serve --dataset-name sharegpt`` sends, real (prompt, output) pairs
    resampled (prompts mean 221 tokens, outputs 199); ``azure-*``: lognormals fitted to the Azure 2023
    traces. The field decides which part: under ``prompt_tokens`` the prompts, under ``output_tokens``
    the outputs. Sources in :mod:`simbatch.workload.shapes`.
    """

    dist: Literal["sharegpt", "azure-conv", "azure-code"]


DATASET_SHAPES: tuple[str, ...] = get_args(DatasetShape.model_fields["dist"].annotation)

LengthDist = Annotated[
    Fixed | Uniform | Choice | Exponential | LogNormal | Zipf | Empirical | Random | DatasetShape,
    Field(discriminator="dist"),
]
