"""Named length shapes: ``vllm bench serve``'s random dataset, and lognormals fitted to public datasets.

Only parameters are shipped here, never the data:

- ``azure-conv``, ``azure-code``: maximum-likelihood lognormal fits (``mean`` = exp(mu + sigma^2/2),
  ``sigma`` = std of log-length, capped at the longest length observed) to the Azure LLM inference
  traces of 2023 (Azure/AzurePublicDataset, ``AzureLLMInferenceTrace_conv.csv`` and ``_code.csv``,
  released with Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0). Refit with
  ``scripts/fit_length_shapes.py``. conv: prompts mean 1,155 / median 1,020 tokens, outputs mean 211 /
  median 129; code: prompts mean 2,048 / median 1,469, outputs mean 28 / median 13.
- ``sharegpt``: the means of the ShareGPT lengths used to evaluate vLLM (Kwon et al., "Efficient
  Memory Management for Large Language Model Serving with PagedAttention", SOSP 2023, Fig. 11:
  inputs 161.31, outputs 337.99 tokens on average). The paper gives no spread as a number;
  ``sigma = 1.0`` is an assumption (a right-skewed shape like the Azure fits'). Prompts and outputs
  are capped at 1,024 tokens each, so that a pair never exceeds the 2,048 tokens vLLM's ShareGPT
  sampling keeps (it drops prompts over 1,024 and pairs over 2,048; prompts and outputs are drawn
  independently here, so the cap is on each).
"""

from __future__ import annotations

import math

import numpy as np

from simbatch.config import DatasetShape, LogNormal, Random

# shape -> {"prompt" | "output": the lognormal}
SHAPES: dict[str, dict[str, LogNormal]] = {
    "azure-conv": {"prompt": LogNormal(dist="lognormal", mean=1234.7, sigma=0.985, max=14050),
                   "output": LogNormal(dist="lognormal", mean=218.8, sigma=0.859, max=1000)},
    "azure-code": {"prompt": LogNormal(dist="lognormal", mean=2762.0, sigma=1.36, max=7437),
                   "output": LogNormal(dist="lognormal", mean=23.3, sigma=0.847, max=1899)},
    "sharegpt": {"prompt": LogNormal(dist="lognormal", mean=161.31, sigma=1.0, max=1024),
                 "output": LogNormal(dist="lognormal", mean=337.99, sigma=1.0, max=1024)},
}


def shape_of(dist: DatasetShape, part: str) -> LogNormal:
    """The fitted distribution of ``dist``'s dataset for ``part`` (``prompt`` or ``output``)."""
    return SHAPES[dist.dist][part]


def random_lengths(dist: Random, n: int, rng: np.random.Generator) -> np.ndarray:
    """vLLM's random dataset: integers uniform on [floor(len (1 - r)), ceil(len (1 + r))], at least 1."""
    low = max(math.floor(dist.len * (1 - dist.range_ratio)), 1)
    high = max(math.ceil(dist.len * (1 + dist.range_ratio)), 1)
    return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
