"""Token-length distributions: how long prompts and outputs are.

Lengths drive everything downstream: a prompt's length is the prefill work and the KV blocks it
needs on admission, an output's length is how many decode steps the request occupies a slot. The
shape of the distribution matters as much as its mean. A heavy tail is what makes static batching
waste slots on padding and what makes shortest-job-first pay off.

Each distribution is one small pure function of ``(dist, n, rng)``; every value returned is an
int64 >= 1, because a request always has at least one prompt token and produces at least one token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from simbatch.config import (
    DATASET_SHAPES,
    Choice,
    Empirical,
    Exponential,
    Fixed,
    LengthDist,
    LogNormal,
    Scenario,
    Uniform,
    Zipf,
)
from simbatch.workload import csvfile
from simbatch.workload.shapes import PAIRED, pair_lengths, random_lengths, shape_of


def _fixed(dist: Fixed, n: int, rng: np.random.Generator) -> np.ndarray:
    """Every request the same length: the controlled setting of a benchmark sweep, no variance at all."""
    return np.full(n, dist.value, dtype=np.int64)


def _uniform(dist: Uniform, n: int, rng: np.random.Generator) -> np.ndarray:
    """Bounded variety with no tail; ``low`` and ``high`` are both possible lengths."""
    return rng.integers(dist.low, dist.high, size=n, endpoint=True, dtype=np.int64)


def _choice(dist: Choice, n: int, rng: np.random.Generator) -> np.ndarray:
    """A few known request types (e.g. short chat turns and long summaries) in a given mix."""
    values = np.asarray(dist.values, dtype=np.int64)
    if dist.weights is None:
        return values[rng.integers(0, len(values), size=n)]
    weights = np.asarray(dist.weights, dtype=np.float64)
    return rng.choice(values, size=n, p=weights / weights.sum())


def _exponential(dist: Exponential, n: int, rng: np.random.Generator) -> np.ndarray:
    """Memoryless lengths: whether generation stops is independent of how long it has run.

    ``ceil`` makes the length geometric (mean about ``mean + 0.5``); ``max`` plays the part of a
    request's ``max_tokens``, so the capped tail piles up at exactly ``max``.
    """
    return np.clip(np.ceil(rng.exponential(dist.mean, size=n)), 1, dist.max).astype(np.int64)


def _lognormal(dist: LogNormal, n: int, rng: np.random.Generator) -> np.ndarray:
    """The usual fit to real prompt and output lengths: most short, a long right tail.

    ``mean`` is the mean of the length itself, not of its log: with log-length ~ N(mu, sigma^2) the
    mean is exp(mu + sigma^2 / 2), so mu = ln(mean) - sigma^2 / 2. Rounding to the nearest integer
    and the cap move the sample mean slightly away from ``mean`` (down, for a cap that bites).
    """
    mu = np.log(dist.mean) - dist.sigma**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, dist.sigma, size=n)), 1, dist.max).astype(np.int64)


def _zipf(dist: Zipf, n: int, rng: np.random.Generator) -> np.ndarray:
    """Power-law lengths on ``min..max``: P(k) proportional to k**-a, so short is common, long never rare.

    Sampled by inverse CDF over the explicit support, so memory is O(max - min): fine up to
    millions of tokens, which is already beyond any context window.
    """
    support = np.arange(dist.min, dist.max + 1, dtype=np.int64)
    cdf = np.cumsum(support.astype(np.float64) ** -dist.a)
    cdf /= cdf[-1]  # x / x is exactly 1.0, so every u in [0, 1) lands inside the support
    return support[np.searchsorted(cdf, rng.random(n), side="right")]


def _empirical(dist: Empirical, n: int, rng: np.random.Generator, scenario: Scenario, where: str) -> np.ndarray:
    """Lengths as observed: resample a measured column with replacement (a bootstrap of the traffic).

    The rows drawn depend only on ``rng`` and the file's number of rows, not on the column, which is
    what lets a prompt and an output column of one file be drawn as pairs (see :func:`paired`).
    """
    path: Path = scenario.resolve(dist.path)
    frame = csvfile.read_table(path, f"{where}.path", max_bytes=csvfile.MAX_LENGTH_FILE_BYTES)
    raw = csvfile.column(frame, dist.column, path, f"{where}.column")
    observed = csvfile.positive_ints(raw, path, f"{where}.path",
                                     "fix or delete that row, or point column at token counts")
    drawn = observed[rng.integers(0, len(observed), size=n)]
    return drawn if dist.max is None else np.minimum(drawn, dist.max)


def paired(prompt: LengthDist, output: LengthDist, scenario: Scenario) -> bool:
    """Whether prompt and output lengths resample one file, and so are drawn a row at a time, as pairs.

    Real prompts and outputs are not independent (a long document asks for a long summary, a code
    completion gets a short answer); resampling the two columns of one trace separately would
    replace its pairs by the product of its marginals.
    """
    return (isinstance(prompt, Empirical) and isinstance(output, Empirical)
            and scenario.resolve(prompt.path) == scenario.resolve(output.path))


_SAMPLERS: dict[str, Callable[..., np.ndarray]] = {
    "fixed": _fixed,
    "uniform": _uniform,
    "choice": _choice,
    "exponential": _exponential,
    "lognormal": _lognormal,
    "zipf": _zipf,
    "random": random_lengths,
}


def sample_lengths(dist: LengthDist, n: int, rng: np.random.Generator, scenario: Scenario,
                   where: str = "workload") -> np.ndarray:
    """``n`` token lengths (int64, all >= 1) drawn from ``dist`` with ``rng``.

    ``scenario`` resolves an empirical file's path; ``where`` is the dotted scenario field the
    distribution came from (e.g. ``workload.classes.0.prompt_tokens``), named in data-file errors.
    """
    if dist.dist == "empirical":
        return _empirical(dist, n, rng, scenario, where)
    if dist.dist in DATASET_SHAPES:  # the field it is under says which of the dataset's columns or fits
        part = "prompt" if where.endswith("prompt_tokens") else "output"
        return pair_lengths(dist, part, n, rng) if dist.dist in PAIRED else _lognormal(shape_of(dist, part), n, rng)
    return _SAMPLERS[dist.dist](dist, n, rng)
