"""Named length shapes: ``vllm bench serve``'s random and ShareGPT datasets, and lognormals fitted to public traces.

- ``sharegpt``: what ``vllm bench serve --dataset-name sharegpt`` sends, as (prompt, output) pairs
  resampled from ``simbatch/data/sharegpt_lengths.csv``: the lengths of 15,822 ShareGPT conversations
  under vLLM's sampling rule and the Llama 3 tokenizer (its README gives the source and licence).
  Pairs, because the two are not independent (a third of the prompts are an assistant's long text,
  answered briefly). Drawn as vLLM draws: without replacement, a shuffled pass over the rows (a new
  pass when a run needs more); a class whose prompts and outputs are both ``sharegpt`` gets the two
  lengths of the same rows. Prompts mean 221 tokens, outputs 199.

Only parameters are shipped for these, never the data:

- ``azure-conv``, ``azure-code``: maximum-likelihood lognormal fits (``mean`` = exp(mu + sigma^2/2),
  ``sigma`` = std of log-length, capped at the longest length observed) to the Azure LLM inference
  traces of 2023 (Azure/AzurePublicDataset, ``AzureLLMInferenceTrace_conv.csv`` and ``_code.csv``,
  released with Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0). Refit with
  ``scripts/fit_length_shapes.py``. conv: prompts mean 1,155 / median 1,020 tokens, outputs mean 211 /
  median 129; code: prompts mean 2,048 / median 1,469, outputs mean 28 / median 13.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from simbatch.config import DatasetShape, LogNormal, Random

SHAREGPT = Path(__file__).resolve().parent.parent / "data" / "sharegpt_lengths.csv"
PAIRED = ("sharegpt",)
"""The shapes drawn as (prompt, output) pairs of real rows, not from fits."""

# shape -> {"prompt" | "output": the lognormal}
SHAPES: dict[str, dict[str, LogNormal]] = {
    "azure-conv": {"prompt": LogNormal(dist="lognormal", mean=1234.7, sigma=0.985, max=14050),
                   "output": LogNormal(dist="lognormal", mean=218.8, sigma=0.859, max=1000)},
    "azure-code": {"prompt": LogNormal(dist="lognormal", mean=2762.0, sigma=1.36, max=7437),
                   "output": LogNormal(dist="lognormal", mean=23.3, sigma=0.847, max=1899)},
}


@functools.cache
def sharegpt_pairs() -> np.ndarray:
    """The shipped (prompt, output) rows, int64, shape (15822, 2); read once."""
    pairs = np.loadtxt(SHAREGPT, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    pairs.flags.writeable = False
    return pairs


def pair_lengths(dist: DatasetShape, part: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths of ``part`` (``prompt`` or ``output``) of rows drawn without replacement, a shuffled
    pass over the rows after another: the same ``rng`` state gives the same rows for both parts."""
    pairs = sharegpt_pairs()
    rows = np.concatenate([rng.permutation(len(pairs)) for _ in range(-(-n // len(pairs)))])[:n] if n else \
        np.zeros(0, np.int64)
    return pairs[rows, 0 if part == "prompt" else 1].copy()


def shape_of(dist: DatasetShape, part: str) -> LogNormal:
    """The fitted distribution of ``dist``'s dataset for ``part`` (``prompt`` or ``output``)."""
    return SHAPES[dist.dist][part]


def random_lengths(dist: Random, n: int, rng: np.random.Generator) -> np.ndarray:
    """vLLM's random dataset: integers uniform on [floor(len (1 - r)), ceil(len (1 + r))], at least 1."""
    low = max(math.floor(dist.len * (1 - dist.range_ratio)), 1)
    high = max(math.ceil(dist.len * (1 + dist.range_ratio)), 1)
    return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
