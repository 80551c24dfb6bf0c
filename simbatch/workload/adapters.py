"""Which LoRA adapter each request names: independent draws from a popularity law (``workload.adapters``).

Adapter k (from 0) is named with probability p_k proportional to ``1 / (k + 1)^s`` (Zipf, exponent s;
s = 0 or ``popularity: uniform`` makes them alike), and a share ``base_share`` of the requests name none
(the base model, id -1). The draws are independent of one another (the independent reference model),
which is what the closed forms of an LRU cache of adapters assume (:func:`simbatch.features.lora.lru_hit_rate`).
"""

from __future__ import annotations

import numpy as np

from simbatch.config.lora import Adapters

BASE_MODEL = -1
"""The adapter id of a request for the base model."""


def popularity(adapters: Adapters) -> np.ndarray:
    """p_k, k = 0 .. count - 1: the probability that a request naming an adapter names adapter k."""
    s = 0.0 if adapters.popularity == "uniform" else adapters.zipf_exponent
    weights = np.arange(1, adapters.count + 1, dtype=np.float64) ** -s
    return weights / weights.sum()


def adapter_ids(adapters: Adapters, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` requests' adapters (int32; -1: the base model), drawn independently from ``rng``."""
    ids = rng.choice(adapters.count, size=n, p=popularity(adapters)).astype(np.int32)
    if adapters.base_share:
        ids[rng.random(n) < adapters.base_share] = BASE_MODEL
    return ids
