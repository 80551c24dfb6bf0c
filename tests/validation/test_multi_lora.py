"""14: Multi-LoRA: adapter loads against the hit rate of an LRU cache under independent references

Requests come one at a time (one a second, each done within milliseconds), each naming one of N
adapters independently with popularity p (simbatch.workload.adapters). The GPU's max_loras slots are
then an LRU cache of adapters fed the independent reference model, and a request's admission loads its
adapter exactly when the cache misses: the load rate tends to 1 - h(C), with h(C) = C / N for uniform
use (exact) and, for Zipf popularity, Che's approximation h(C) = sum_k p_k (1 - exp(-p_k T)), T the root
of sum_k (1 - exp(-p_k T)) = C (simbatch.features.lora.lru_hit_rate). Host memory's max_cpu_loras slots
are a second LRU cache holding the GPU's: a load reads storage when it misses, at rate 1 - h(C_cpu).
The first 100 requests of each replication are left out: an empty cache misses more (warm-up).
"""

from __future__ import annotations

import numpy as np
import pytest

from simbatch.config.lora import Adapters
from simbatch.features.lora import lru_hit_rate
from simbatch.workload.adapters import popularity

WARM_UP = 100


def _spec(seed: int, n: int, adapters: dict, max_loras: int, max_cpu_loras: int) -> dict:
    return {"seed": seed,
            "workload": {"num_requests": n, "arrival": {"process": "constant", "rate": 1.0},
                         "prompt_tokens": {"dist": "fixed", "value": 32}, "output_tokens": {"dist": "fixed", "value": 4},
                         "adapters": adapters},
            "device": {"tau0_ms": 1.0, "beta_ms": 0.0},
            "lora": {"max_loras": max_loras, "max_cpu_loras": max_cpu_loras, "adapter_bytes": 1e6,
                     "host_link_gb_s": 25.0}}


def _rates(result) -> tuple[float, float]:
    rq = result.requests
    rq = rq[rq["request_id"] >= WARM_UP]
    return float(rq["lora_loads"].mean()), float(rq["lora_storage_loads"].mean())


@pytest.mark.validation
@pytest.mark.parametrize(("adapters", "gpu", "cpu"), [
    ({"count": 10, "popularity": "uniform"}, 4, 6),
    ({"count": 30, "popularity": "zipf", "zipf_exponent": 1.0}, 5, 12),
])
def test_adapter_loads_are_lru_misses(sim, check, mode, adapters, gpu, cpu):
    """Uniform over 10 adapters, 4 GPU and 6 host slots: loads 1 - 4/10 = 0.6, storage reads 0.4; Zipf(1)
    over 30, 5 and 12 slots: Che's approximation; per request, over the replications."""
    seeds = range(mode.pick(4, 20))
    n = mode.pick(600, 4000)
    loads, reads = zip(*sim.map(_rates, [_spec(s, n, adapters, gpu, cpu) for s in seeds]), strict=True)
    p = popularity(Adapters(**adapters))
    name = f"{adapters['popularity']} over {adapters['count']}"
    check.ci(f"adapter loads per request, {name}, {gpu} GPU slots: 1 - h({gpu})", 1 - lru_hit_rate(p, gpu),
             loads, seeds)
    check.ci(f"storage reads per request, {name}, {cpu} host slots: 1 - h({cpu})", 1 - lru_hit_rate(p, cpu),
             reads, seeds)
    assert np.all(np.asarray(reads) <= np.asarray(loads))
