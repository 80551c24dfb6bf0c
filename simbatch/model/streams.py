"""Named, independent random streams derived from one root seed.

Each consumer of randomness (arrivals, lengths, routing, ...) draws from its own stream, so changing
how one of them draws cannot shift another's numbers. That is what gives common random numbers:
two batching modes run with the same seed see the identical workload.
"""

from __future__ import annotations

import numpy as np

# Stable stream identifiers: never renumber, only append.
ARRIVALS = 0
CLASSES = 1
PROMPT_TOKENS = 2
OUTPUT_TOKENS = 3
ROUTING = 4
SESSIONS = 5
SHARED_PREFIX = 6
SPECULATIVE = 7
DECODE_ROUTING = 8
DATASET_ROWS = 9  # rows of a paired dataset (workload.shapes.PAIRED): one draw for prompts and outputs
ADAPTERS = 10  # the LoRA adapter each request names (workload.adapters)


def rng(seed: int, stream: int, *sub: int) -> np.random.Generator:
    """The generator for ``stream`` (and optional sub-streams, e.g. a class index) under ``seed``."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream, *sub)))
